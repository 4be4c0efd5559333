//go:build fault

package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// lifecycleCluster is 3 servers and 2 agents, each with a monolith test
// plugin "tp" configured by cfg (NodeID csi-node-<i>).
func lifecycleCluster(t *testing.T, cfg testplugin.Config) *claimCluster {
	t.Helper()
	cc := &claimCluster{c: testcluster.New(t, testcluster.Config{Servers: 3, Agents: 2, Configure: fastVolumeWatcher})}
	for i, a := range cc.c.Agents() {
		c := cfg
		c.NodeID = fmt.Sprintf("csi-node-%d", i)
		cc.plugins = append(cc.plugins, a.StartPlugin("tp", c))
	}
	testutil.WaitFor(t, 30*time.Second, "plugin tp healthy on both agents", func() bool {
		p, err := cc.control(t).GetPlugin(context.Background(), &csisupdv1.PluginGetRequest{Id: "tp"})
		return err == nil && p.GetPlugin().GetNodesHealthy() == 2 && p.GetPlugin().GetControllersHealthy() == 2
	})
	return cc
}

// staleVolume reads a volume from the local state of one server, or
// returns nil.
func (cc *claimCluster) staleVolume(t *testing.T, server int, id string) *csisupdv1.Volume {
	t.Helper()
	resp, err := cc.c.Control(server).GetVolume(context.Background(), &csisupdv1.VolumeGetRequest{Id: id, Stale: true})
	if err != nil {
		return nil
	}
	return resp.GetVolume()
}

// TestExpansionFinishesAfterLeaderKill kills the leader after
// ControllerExpandVolume was recorded and while the node expansions are
// under way; the new leader's volume watcher expands every node that was
// not done yet, with that node's paths, and records the new capacity.
func TestExpansionFinishesAfterLeaderKill(t *testing.T) {
	cc := lifecycleCluster(t, testplugin.Config{NodeExpansionRequired: true})
	cc.create(t, "grow", "MULTI_NODE_MULTI_WRITER")
	for i := range 2 {
		if _, err := cc.claim(t, "grow", i, "w", &csisupdv1.VolumeUsage{AccessMode: "MULTI_NODE_MULTI_WRITER"}); err != nil {
			t.Fatalf("claim on agent %d: %v", i, err)
		}
	}
	hang := testplugin.Faults{Delays: map[string]time.Duration{"NodeExpandVolume": time.Hour}}
	for _, p := range cc.plugins {
		p.SetFaults(hang)
	}
	old := cc.c.WaitForLeader(t, 30*time.Second)
	ctl := cc.c.Control(old.Index)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := ctl.ExpandVolume(ctx, &csisupdv1.VolumeExpandRequest{Id: "grow", CapacityMinBytes: 4 << 20})
		done <- err
	}()
	testutil.WaitFor(t, 30*time.Second, "a node expansion under way", func() bool {
		for _, p := range cc.plugins {
			if p.Stats().InFlight["NodeExpandVolume"] > 0 {
				return true
			}
		}
		return false
	})
	other := (old.Index + 1) % 3
	testutil.WaitFor(t, 10*time.Second, "the controller step replicated before the kill", func() bool {
		v := cc.staleVolume(t, other, "grow")
		return v.GetExpansion().GetState() == "nodes" && v.GetCapacityBytes() == 4<<20
	})
	for _, p := range cc.plugins {
		p.SetFaults(testplugin.Faults{})
	}
	cc.c.Kill(old.Index)
	<-done // the old leader's call ends with its server

	testutil.WaitFor(t, 30*time.Second, "the new leader to finish the expansion", func() bool {
		v := cc.staleVolume(t, other, "grow")
		return v != nil && v.GetExpansion() == nil && v.GetCapacityBytes() == 4<<20
	})
	for i, p := range cc.plugins {
		var publish, expand []testplugin.NodeCall
		for _, c := range p.NodeLog() {
			switch c.Method {
			case "NodePublishVolume":
				publish = append(publish, c)
			case "NodeExpandVolume":
				expand = append(expand, c)
			}
		}
		if len(expand) == 0 || len(publish) == 0 {
			t.Fatalf("agent %d: node log %v, want a finished NodeExpandVolume", i, methods(p.NodeLog()))
		}
		if e := expand[len(expand)-1]; e.Path != publish[0].Path || e.StagingPath != publish[0].StagingPath || e.RequiredBytes != 4<<20 {
			t.Errorf("agent %d: NodeExpandVolume(%q, %q, %d), want this node's mount (%q, %q) and %d bytes",
				i, e.Path, e.StagingPath, e.RequiredBytes, publish[0].Path, publish[0].StagingPath, 4<<20)
		}
	}
}

// TestSnapshotNeverOrphanedAfterLeaderKill kills the leader after
// CreateSnapshot did its work in the plugin and before its answer was
// recorded: the new leader completes the snapshot from the record written
// before the call (CreateSnapshot is idempotent by name), so it ends
// recorded, with the plugin's one snapshot, never orphaned.
func TestSnapshotNeverOrphanedAfterLeaderKill(t *testing.T) {
	cc := lifecycleCluster(t, testplugin.Config{})
	cc.create(t, "origin", "SINGLE_NODE_WRITER")
	lost := testplugin.Faults{AnswerDelays: map[string]time.Duration{"CreateSnapshot": time.Hour}}
	for _, p := range cc.plugins {
		p.SetFaults(lost)
	}
	old := cc.c.WaitForLeader(t, 30*time.Second)
	ctl := cc.c.Control(old.Index)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err := ctl.CreateVolumeSnapshot(ctx, &csisupdv1.VolumeSnapshotCreateRequest{VolumeId: "origin", Id: "snap"})
		done <- err
	}()
	holder := -1
	testutil.WaitFor(t, 30*time.Second, "the plugin to make the snapshot", func() bool {
		for i, p := range cc.plugins {
			if len(p.Snapshots()) > 0 {
				holder = i
				return true
			}
		}
		return false
	})
	other := (old.Index + 1) % 3
	testutil.WaitFor(t, 10*time.Second, "the snapshot recorded as creating before the kill", func() bool {
		r, err := cc.c.Control(other).GetVolumeSnapshot(context.Background(), &csisupdv1.VolumeSnapshotGetRequest{Id: "snap", Stale: true})
		return err == nil && r.GetSnapshot().GetState() == "creating"
	})
	for _, p := range cc.plugins {
		p.SetFaults(testplugin.Faults{})
	}
	cc.c.Kill(old.Index)
	<-done

	var snap *csisupdv1.VolumeSnapshot
	testutil.WaitFor(t, 30*time.Second, "the new leader to complete the snapshot", func() bool {
		r, err := cc.c.Control(other).GetVolumeSnapshot(context.Background(), &csisupdv1.VolumeSnapshotGetRequest{Id: "snap", Stale: true})
		snap = r.GetSnapshot()
		return err == nil && snap.GetState() == "created"
	})
	ps := cc.plugins[holder].Snapshots()
	if len(ps) != 1 || ps[0].ID != snap.GetExternalId() || ps[0].Name != "snap" {
		t.Fatalf("plugin snapshots %v, recorded %v: want the one snapshot, recorded", ps, snap)
	}
	if n := len(cc.plugins[1-holder].Snapshots()); n != 0 {
		t.Errorf("the other plugin instance has %d snapshots, want 0", n)
	}
}
