package server_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/nodevolumes"
	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

var mnmw = &csisupdv1.VolumeUsage{AccessMode: "MULTI_NODE_MULTI_WRITER"}

// TestVolumeAvailability pauses a claimed volume (new claims refused, the
// claim stays), drains it (the watcher releases the claim, with an event
// for it) and makes it active again.
func TestVolumeAvailability(t *testing.T) {
	cc := newClaimCluster(t)
	cc.create(t, "v", "MULTI_NODE_MULTI_WRITER")
	for i, w := range []string{"w0", "w1"} {
		if _, err := cc.claim(t, "v", i, w, mnmw); err != nil {
			t.Fatal(err)
		}
	}
	set := func(a string) *csisupdv1.Volume {
		t.Helper()
		resp, err := cc.control(t).SetVolumeAvailability(context.Background(), &csisupdv1.VolumeAvailabilityRequest{Id: "v", Availability: a})
		if err != nil {
			t.Fatalf("availability %s: %v", a, err)
		}
		return resp.GetVolume()
	}
	if v := set("pause"); v.GetAvailability() != "pause" {
		t.Fatalf("availability after pause = %q", v.GetAvailability())
	}
	_, err := cc.claim(t, "v", 1, "w2", mnmw)
	if d := refusal(t, err); d.GetRule() != csisupdv1.ClaimRuleAvailability {
		t.Fatalf("claim of a paused volume refused by %q, want %q", d.GetRule(), csisupdv1.ClaimRuleAvailability)
	}
	if n := len(cc.volume(t, "v").GetClaims()); n != 2 {
		t.Fatalf("claims of the paused volume = %d, want the 2 it had", n)
	}

	set("drain")
	testutil.WaitFor(t, 20*time.Second, "the draining volume's claims released", func() bool { return len(cc.volume(t, "v").GetClaims()) == 0 })
	for i, p := range cc.plugins {
		if !slices.Contains(methods(p.NodeLog()), "NodeUnpublishVolume") {
			t.Errorf("agent %d's plugin was not unpublished: %v", i, methods(p.NodeLog()))
		}
	}
	freed := map[string]bool{}
	volumeEvents(t, cc.control(t), "v", func(e *csisupdv1.ClusterEvent) bool {
		if e.GetType() == "volume-claim-freed" {
			for _, w := range []string{"w0", "w1"} {
				if strings.Contains(e.GetDescription(), "workload "+w+" ") {
					freed[w] = true
				}
			}
		}
		return len(freed) == 2
	})
	if _, err := cc.claim(t, "v", 0, "w3", mnmw); refusal(t, err).GetRule() != csisupdv1.ClaimRuleAvailability {
		t.Fatal("a draining volume took a claim")
	}

	set("active")
	if _, err := cc.claim(t, "v", 0, "w3", mnmw); err != nil {
		t.Fatalf("claim of an active volume: %v", err)
	}
	if _, err := cc.control(t).SetVolumeAvailability(context.Background(), &csisupdv1.VolumeAvailabilityRequest{Id: "v", Availability: "off"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("availability off = %v, want InvalidArgument", err)
	}
}

// TestPluginDrain drains tp on agent 1: a new claim there is refused, one
// on agent 0 is not, and the drain reports the claim and the mount left
// until the workload releases it.
func TestPluginDrain(t *testing.T) {
	cc := newClaimCluster(t)
	cc.create(t, "v", "MULTI_NODE_MULTI_WRITER")
	if _, err := cc.claim(t, "v", 1, "w1", mnmw); err != nil {
		t.Fatal(err)
	}
	node := cc.c.Agent(1).NodeID()
	resp, err := cc.control(t).DrainPlugin(context.Background(), &csisupdv1.PluginDrainRequest{PluginId: "tp", NodeId: node})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetDraining() || len(resp.GetClaims()) != 1 || len(resp.GetMounts()) != 1 || resp.GetMountsError() != "" {
		t.Fatalf("drain = %v, want draining with the claim and its mount left", resp)
	}
	_, err = cc.claim(t, "v", 1, "w2", mnmw)
	if d := refusal(t, err); d.GetRule() != csisupdv1.ClaimRuleAvailability || !strings.Contains(d.GetDescription(), "drains on node") {
		t.Fatalf("claim on the draining node refused with %v", d)
	}
	if _, err := cc.claim(t, "v", 0, "w2", mnmw); err != nil {
		t.Fatalf("claim on another node: %v", err)
	}
	p, err := cc.control(t).GetPlugin(context.Background(), &csisupdv1.PluginGetRequest{Id: "tp"})
	if err != nil || !slices.Equal(p.GetPlugin().GetDrainingNodes(), []string{node}) {
		t.Fatalf("plugin status draining nodes = %v, %v; want [%s]", p.GetPlugin().GetDrainingNodes(), err, node)
	}
	if err := cc.release(t, "v", 1, "w1"); err != nil {
		t.Fatal(err)
	}
	after, err := cc.control(t).GetPluginDrain(context.Background(), &csisupdv1.PluginDrainGetRequest{PluginId: "tp", NodeId: node})
	if err != nil || len(after.GetClaims()) != 0 || len(after.GetMounts()) != 0 {
		t.Fatalf("drain after the release = %v, %v; want nothing left", after, err)
	}
	if _, err := cc.control(t).DrainPlugin(context.Background(), &csisupdv1.PluginDrainRequest{PluginId: "tp", NodeId: node, Cancel: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := cc.claim(t, "v", 1, "w3", mnmw); err != nil {
		t.Fatalf("claim after the drain ended: %v", err)
	}
}

// TestForcedRelease: --force is refused on a node that answers; --force
// --force there skips the failing node unpublish and records it; --force
// on a node that went down frees its claim through the controller at once.
func TestForcedRelease(t *testing.T) {
	cc := newClaimClusterWith(t, func(cfg *server.Config) {
		cfg.MinHeartbeatTTL, cfg.HeartbeatGrace = 300*time.Millisecond, 300*time.Millisecond
		cfg.ClaimGCGrace = time.Hour // the force, not the grace, frees the claim
	})
	cc.create(t, "v", "MULTI_NODE_MULTI_WRITER")
	for i, w := range []string{"w0", "w1"} {
		if _, err := cc.claim(t, "v", i, w, mnmw); err != nil {
			t.Fatal(err)
		}
	}
	release := func(agent int, w string, force uint32) error {
		_, err := cc.control(t).ReleaseVolume(context.Background(), &csisupdv1.VolumeReleaseRequest{
			Id: "v", NodeId: cc.c.Agent(agent).NodeID(), WorkloadId: w, Force: force})
		return err
	}

	// Node 0 answers: --force is refused, --force --force skips.
	if err := release(0, "w0", 1); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "--force twice") {
		t.Fatalf("--force on a node that answers = %v", err)
	}
	cc.plugins[0].SetFaults(testplugin.Faults{Errors: map[string]codes.Code{"NodeUnpublishVolume": codes.Internal}})
	if err := release(0, "w0", 2); err != nil {
		t.Fatalf("--force --force: %v", err)
	}
	cc.plugins[0].SetFaults(testplugin.Faults{})
	v := cc.volume(t, "v")
	if len(v.GetClaims()) != 1 || v.GetClaims()[0].GetWorkloadId() != "w1" {
		t.Fatalf("claims after --force --force = %v, want only w1's", v.GetClaims())
	}
	events := volumeEvents(t, cc.control(t), "v", func(e *csisupdv1.ClusterEvent) bool {
		return e.GetType() == "volume-claim-forced" && strings.Contains(e.GetDescription(), "node-unpublish")
	})
	if last := events[len(events)-1]; !strings.Contains(last.GetDescription(), "workload w0") {
		t.Errorf("forced event %q does not name the workload", last.GetDescription())
	}

	// Node 1 goes down: --force frees its claim through the controller.
	cc.c.StopAgent(1)
	testutil.WaitFor(t, 20*time.Second, "node 1 down", func() bool {
		resp, err := cc.control(t).GetNode(context.Background(), &csisupdv1.NodeGetRequest{Id: cc.c.Agent(1).NodeID()})
		return err == nil && resp.GetNode().GetStatus() == state.NodeStatusDown
	})
	unpublishes := cc.plugins[0].Stats().Calls["ControllerUnpublishVolume"]
	if err := release(1, "", 1); err != nil {
		t.Fatalf("--force on a node that is down: %v", err)
	}
	if n := len(cc.volume(t, "v").GetClaims()); n != 0 {
		t.Fatalf("claims after --force = %d, want none", n)
	}
	if got := cc.plugins[0].Stats().Calls["ControllerUnpublishVolume"] - unpublishes; got != 1 {
		t.Errorf("controller unpublishes through agent 0 = %d, want 1", got)
	}

	// Node 1's agent comes back: it unmounts what the forced release left,
	// and keeps no record of it.
	if n := len(cc.plugins[1].NodeVolumes()); n != 1 {
		t.Fatalf("agent 1's plugin holds %d volumes before the agent returns, want the forced claim's", n)
	}
	cc.c.RestartAgent(1)
	testutil.WaitFor(t, 20*time.Second, "agent 1's mount undone and its record gone", func() bool {
		n, err := nodevolumes.CountRecords(cc.c.Agent(1).DataDir)
		return err == nil && n == 0 && len(cc.plugins[1].NodeVolumes()) == 0
	})
	if !slices.Contains(methods(cc.plugins[1].NodeLog()), "NodeUnpublishVolume") {
		t.Errorf("agent 1's plugin was never unpublished: %v", methods(cc.plugins[1].NodeLog()))
	}
}
