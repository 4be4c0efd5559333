package server_test

import (
	"context"
	"fmt"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testplugin"
)

// TestPluginCapacityPerSegment asks a node-local plugin's capacity: one
// answer per node's segment, each the pool of that node's controller, and
// a volume created on one node takes from its segment only.
func TestPluginCapacityPerSegment(t *testing.T) {
	const gib = int64(1) << 30
	nc := newNodeLocalCluster(t, func(i int, cfg *testplugin.Config) { cfg.Capacity = int64(i+1) * 10 * gib })
	capacity := func() map[string]*csisupdv1.PluginCapacity {
		t.Helper()
		resp, err := nc.control(t).GetPluginCapacity(context.Background(), &csisupdv1.PluginCapacityRequest{PluginId: "nl"})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]*csisupdv1.PluginCapacity{}
		for _, c := range resp.GetCapacities() {
			out[c.GetSegment().GetSegments()[testplugin.DefaultTopologyKey]] = c
		}
		if len(out) != 2 || len(resp.GetCapacities()) != 2 {
			t.Fatalf("capacities = %v, want one per node's segment", resp.GetCapacities())
		}
		return out
	}
	before := capacity()
	for i := range 2 {
		c := before[fmt.Sprintf("csi-node-%d", i)]
		if want := int64(i+1) * 10 * gib; c.GetAvailableBytes() != want || c.GetMaximumVolumeBytes() != want || c.GetError() != "" {
			t.Errorf("segment csi-node-%d: available %d, max %d, error %q; want %d from its own controller",
				i, c.GetAvailableBytes(), c.GetMaximumVolumeBytes(), c.GetError(), want)
		}
		if c.GetControllerNodeId() != nc.c.Agent(i).NodeID() {
			t.Errorf("segment csi-node-%d answered by node %s, want agent %d's", i, c.GetControllerNodeId(), i)
		}
	}
	if _, err := nc.createOn(t, "big", 0, nil); err != nil {
		t.Fatal(err)
	}
	after := capacity()
	if used := before["csi-node-0"].GetAvailableBytes() - after["csi-node-0"].GetAvailableBytes(); used <= 0 {
		t.Errorf("a volume on node 0 took %d bytes of its segment", used)
	}
	if after["csi-node-1"].GetAvailableBytes() != before["csi-node-1"].GetAvailableBytes() {
		t.Error("a volume on node 0 took from node 1's segment")
	}
	if _, err := nc.control(t).GetPluginCapacity(context.Background(), &csisupdv1.PluginCapacityRequest{PluginId: "nope"}); err == nil {
		t.Error("the capacity of an unknown plugin was answered")
	}
}

// TestExternalVolumesAndSnapshots lists what a node-local plugin holds
// beside what the cluster knows: a volume made through the cluster is
// known, one made in a plugin directly is unknown until registered, and
// one the plugin lost is missing. Snapshots likewise.
func TestExternalVolumesAndSnapshots(t *testing.T) {
	nc := newNodeLocalCluster(t, nil)
	ctx := context.Background()
	known, err := nc.createOn(t, "known", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	gone, err := nc.createOn(t, "gone", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	stray, err := nc.directCSI(t, 1).CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "stray", VolumeCapabilities: mountCaps})
	if err != nil {
		t.Fatal(err)
	}
	// The plugin loses "gone" behind the cluster's back.
	if _, err := nc.directCSI(t, 1).DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: gone.GetExternalId()}); err != nil {
		t.Fatal(err)
	}
	list := func() map[string]*csisupdv1.ExternalVolume {
		t.Helper()
		resp, err := nc.control(t).ListExternalVolumes(ctx, &csisupdv1.ExternalListRequest{PluginId: "nl"})
		if err != nil {
			t.Fatal(err)
		}
		if !resp.GetComplete() || len(resp.GetErrors()) > 0 {
			t.Fatalf("listing incomplete: %v", resp.GetErrors())
		}
		out := map[string]*csisupdv1.ExternalVolume{}
		for _, v := range resp.GetVolumes() {
			out[v.GetExternalId()] = v
		}
		return out
	}
	got := list()
	want := map[string][2]string{ // external id -> state, cluster id
		known.GetExternalId():           {"known", "known"},
		stray.GetVolume().GetVolumeId(): {"unknown", ""},
		gone.GetExternalId():            {"missing", "gone"},
	}
	for id, w := range want {
		if v := got[id]; v.GetState() != w[0] || v.GetClusterId() != w[1] {
			t.Errorf("volume %s: state %q cluster id %q, want %q %q", id, v.GetState(), v.GetClusterId(), w[0], w[1])
		}
	}
	if len(got) != len(want) {
		t.Errorf("listed %d volumes, want %d: %v", len(got), len(want), got)
	}
	if v := got[stray.GetVolume().GetVolumeId()]; len(v.GetControllerNodeIds()) != 1 || v.GetControllerNodeIds()[0] != nc.c.Agent(1).NodeID() {
		t.Errorf("the stray volume was listed by %v, want agent 1's controller only", v.GetControllerNodeIds())
	}

	// Adopting the stray volume makes it known.
	if _, err := nc.control(t).RegisterVolume(ctx, &csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{
		Id: "adopted", PluginId: "nl", ExternalId: stray.GetVolume().GetVolumeId(),
		Capabilities:       []*csisupdv1.VolumeCapability{{AccessType: "mount", AccessMode: "SINGLE_NODE_WRITER"}},
		AccessibleTopology: []*csisupdv1.TopologySegment{nodeSegment(1)},
	}}); err != nil {
		t.Fatal(err)
	}
	if v := list()[stray.GetVolume().GetVolumeId()]; v.GetState() != "known" || v.GetClusterId() != "adopted" {
		t.Errorf("after register: %v, want known as adopted", v)
	}

	// Snapshots: one through the cluster, one made in the plugin.
	if _, err := nc.control(t).CreateVolumeSnapshot(ctx, &csisupdv1.VolumeSnapshotCreateRequest{Id: "snap", VolumeId: "known"}); err != nil {
		t.Fatal(err)
	}
	straySnap, err := nc.directCSI(t, 0).CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "stray-snap", SourceVolumeId: known.GetExternalId()})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := nc.control(t).ListExternalSnapshots(ctx, &csisupdv1.ExternalListRequest{PluginId: "nl"})
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, s := range resp.GetSnapshots() {
		states[s.GetExternalId()] = s.GetState() + ":" + s.GetClusterId()
		if s.GetSourceExternalId() != known.GetExternalId() {
			t.Errorf("snapshot %s: source %q, want %q", s.GetExternalId(), s.GetSourceExternalId(), known.GetExternalId())
		}
	}
	if len(states) != 2 || states[straySnap.GetSnapshot().GetSnapshotId()] != "unknown:" {
		t.Errorf("snapshots = %v, want the cluster's known and the stray one unknown", states)
	}
	for id, st := range states {
		if id != straySnap.GetSnapshot().GetSnapshotId() && st != "known:snap" {
			t.Errorf("snapshot %s is %s, want known:snap", id, st)
		}
	}
}
