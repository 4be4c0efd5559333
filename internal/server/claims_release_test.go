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
	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
	"github.com/csisupd/csisupd/internal/testutil"
)

func TestReleaseEveryClaimOfANode(t *testing.T) {
	e := newClaimEnv(t, 1, nil, map[string][]*csisupdv1.Plugin{"node-a": {monolith("p1", "node-a")}})
	e.register(t, &csisupdv1.Volume{Id: "v", PluginId: "p1", ExternalId: "x-v",
		Capabilities: []*csisupdv1.VolumeCapability{{AccessType: "mount", AccessMode: "SINGLE_NODE_MULTI_WRITER"}}})
	for _, w := range []string{"w1", "w2"} {
		if _, err := e.claim("v", "node-a", w, nil); err != nil {
			t.Fatal(err)
		}
	}
	rel, err := e.release("v", "node-a", "")
	if err != nil || len(rel.GetVolume().GetClaims()) != 0 {
		t.Fatalf("release of every claim: %v, %v", rel, err)
	}
	if got := e.nv.journal.matching("unpublish"); len(got) != 1 {
		t.Fatalf("controller unpublish calls %q, want one after the last claim", got)
	}
	if e.nv.mounted() != 0 {
		t.Fatalf("%d mounts left", e.nv.mounted())
	}
}

func TestFailedStepsAreFinishedByTheWatcher(t *testing.T) {
	e := newClaimEnv(t, 1, nil, map[string][]*csisupdv1.Plugin{"node-a": {monolith("p1", "node-a")}})
	e.register(t, &csisupdv1.Volume{Id: "v", PluginId: "p1", ExternalId: "x-v"})
	addr := e.agents["node-a"].addr

	// A mount that fails releases the claim; the error is returned.
	e.nv.setFail(status.Error(codes.Internal, "fake: stage failed"), nil)
	_, err := e.claim("v", "node-a", "w1", nil)
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "stage failed") {
		t.Fatalf("claim with a failing mount: %v, want the mount's error", err)
	}
	e.nv.setFail(nil, nil)
	testutil.WaitFor(t, 10*time.Second, "the failed claim released", func() bool { return len(e.volume(t, "v").GetClaims()) == 0 })
	want := []string{"publish x-v csi-node-a", "mount v w1 " + addr, "unmount v w1 " + addr, "unpublish x-v csi-node-a"}
	if got := e.nv.journal.claimCalls(); !slices.Equal(got, want) {
		t.Fatalf("calls %q, want %q", got, want)
	}

	// A failing unmount stops the release in unpublishing with the error.
	if _, err := e.claim("v", "node-a", "w1", nil); err != nil {
		t.Fatal(err)
	}
	e.nv.setFail(nil, status.Error(codes.Unavailable, "fake: plugin restarting"))
	if _, err := e.release("v", "node-a", "w1"); status.Code(err) != codes.Unavailable {
		t.Fatalf("release with a failing unmount: %v, want Unavailable", err)
	}
	c := claimOf(e.volume(t, "v"), "node-a", "w1")
	if c.GetState() != rules.StateUnpublishing || !strings.Contains(c.GetLastError(), "plugin restarting") || !c.GetMounted() {
		t.Fatalf("claim after a failed unmount: %v", c)
	}
	// Claiming it again while it is released is refused.
	_, err = e.claim("v", "node-a", "w1", nil)
	if d := refusal(t, err); d.GetRule() != csisupdv1.ClaimRuleReleasing {
		t.Fatalf("refusal %v, want releasing", d)
	}
	// A failing controller unpublish stops it in node-unpublished.
	e.agents["node-a"].setFail(status.Error(codes.Internal, "fake: backend down"))
	e.nv.setFail(nil, nil)
	testutil.WaitFor(t, 10*time.Second, "the claim node-unpublished with the controller's error", func() bool {
		c := claimOf(e.volume(t, "v"), "node-a", "w1")
		return c.GetState() == rules.StateNodeUnpublished && strings.Contains(c.GetLastError(), "backend down") && !c.GetMounted()
	})
	e.agents["node-a"].setFail(nil)
	testutil.WaitFor(t, 10*time.Second, "the watcher to free the claim", func() bool { return len(e.volume(t, "v").GetClaims()) == 0 })
	if got := e.nv.journal.matching("unpublish"); len(got) < 3 {
		t.Fatalf("unpublish calls %q: want the failed ones and the last", got)
	}
	if n := e.logs.lines("resuming volume claim release", "workload=w1"); n != 2 {
		t.Fatalf("%d resumed-release log lines, want one per release the watcher took over (2)\n%s", n, e.logs.String())
	}
}

func TestReleaseResumesAfterLeaderFailover(t *testing.T) {
	e := newClaimEnv(t, 3, nil, map[string][]*csisupdv1.Plugin{"node-a": {monolith("p1", "node-a")}})
	e.register(t, &csisupdv1.Volume{Id: "v", PluginId: "p1", ExternalId: "x-v"})
	if _, err := e.claim("v", "node-a", "w1", nil); err != nil {
		t.Fatal(err)
	}
	e.nv.setFail(nil, status.Error(codes.Unavailable, "fake: agent busy"))
	if _, err := e.release("v", "node-a", "w1"); err == nil {
		t.Fatal("release with a failing unmount succeeded")
	}
	old := e.c.Leader()
	e.c.Kill(old.Index)
	leader := e.c.WaitForLeader(t, 20*time.Second)
	if leader.Index == old.Index {
		t.Fatal("the killed server leads")
	}
	if c := claimOf(statepb.VolumeToAPI(leader.Server().State().Volume("v")), "node-a", "w1"); c.GetState() != rules.StateUnpublishing {
		t.Fatalf("claim on the new leader: %v, want unpublishing", c)
	}
	e.nv.setFail(nil, nil)
	testutil.WaitFor(t, 20*time.Second, "the new leader to free the claim", func() bool {
		v := leader.Server().State().Volume("v")
		return v != nil && len(v.GetClaims()) == 0
	})
	if got := e.nv.journal.matching("unpublish"); len(got) != 1 || e.nv.mounted() != 0 {
		t.Fatalf("after the failover: unpublish calls %q, %d mounts", got, e.nv.mounted())
	}
}

func TestClaimGCGraceReleasesWithoutTheNode(t *testing.T) {
	e := newClaimEnv(t, 1, func(cfg *server.Config) {
		cfg.MinHeartbeatTTL, cfg.HeartbeatGrace = 300*time.Millisecond, 300*time.Millisecond
		cfg.ClaimGCGrace = 500 * time.Millisecond
	}, map[string][]*csisupdv1.Plugin{"node-a": {monolith("p1", "node-a")}, "node-b": {monolith("p1", "node-b")}})
	e.register(t, &csisupdv1.Volume{Id: "v", PluginId: "p1", ExternalId: "x-v"})
	if _, err := e.claim("v", "node-b", "w1", nil); err != nil {
		t.Fatal(err)
	}
	e.nodes["node-b"].stop()
	testutil.WaitFor(t, 20*time.Second, "node-b down", func() bool {
		resp, err := e.cl.GetNode(context.Background(), &csisupdv1.NodeGetRequest{Id: "node-b"})
		return err == nil && resp.GetNode().GetStatus() == state.NodeStatusDown
	})
	_, err := e.claim("v", "node-b", "w2", nil)
	if d := refusal(t, err); d.GetRule() != csisupdv1.ClaimRuleNodeNotReady {
		t.Fatalf("refusal %v, want node-not-ready", d)
	}
	testutil.WaitFor(t, 20*time.Second, "the claim freed without node-b", func() bool { return len(e.volume(t, "v").GetClaims()) == 0 })
	if got := e.nv.journal.matching("unmount"); len(got) != 0 {
		t.Fatalf("unmount calls %q for a node that is gone", got)
	}
	if got := e.agents["node-a"].callCount("unpublish x-v csi-node-b"); got != 1 {
		t.Fatalf("controller unpublish through node-a: %d calls, want 1", got)
	}
	events := volumeEvents(t, e.cl, "v", typeIs("volume-claim-freed"))
	if !slices.ContainsFunc(events, func(ev *csisupdv1.ClusterEvent) bool {
		return strings.Contains(ev.GetDescription(), "released without its node")
	}) {
		t.Fatalf("no event tells the claim was released without its node: %v", events)
	}
}
