package testplugin

import (
	"maps"
	"strings"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
)

// hasPluginService reports whether caps hold service capability want.
func hasPluginService(caps []*csi.PluginCapability, want csi.PluginCapability_Service_Type) bool {
	for _, c := range caps {
		if c.GetService().GetType() == want {
			return true
		}
	}
	return false
}

func TestNodeLocal(t *testing.T) {
	cfg := func(node string) Config {
		return Config{NodeID: node, NodeLocal: true, KnownNodeIDs: []string{AnyNode},
			ControllerCapabilities: SupportedControllerCapabilities, VolumeHealth: true}
	}
	a := startPlugin(t, cfg("node-a"))
	b := startPlugin(t, cfg("node-b"))
	ca, cb := dial(t, a.Socket()), dial(t, b.Socket())
	wantTopology := func(node string) map[string]string { return map[string]string{DefaultTopologyKey: node} }

	caps, err := ca.id.GetPluginCapabilities(ctx(t), &csi.GetPluginCapabilitiesRequest{})
	if err != nil || !hasPluginService(caps.GetCapabilities(), csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS) {
		t.Fatalf("plugin capabilities = %v, %v; want VOLUME_ACCESSIBILITY_CONSTRAINTS", caps, err)
	}
	info, err := cb.node.NodeGetInfo(ctx(t), &csi.NodeGetInfoRequest{})
	if err != nil || !maps.Equal(info.GetAccessibleTopology().GetSegments(), wantTopology("node-b")) {
		t.Fatalf("NodeGetInfo = %v, %v; want topology %v", info, err, wantTopology("node-b"))
	}

	// The requisite topology names node B; node A creates on itself anyway.
	resp, err := ca.ctrl.CreateVolume(ctx(t), &csi.CreateVolumeRequest{
		Name: "local", VolumeCapabilities: []*csi.VolumeCapability{snw},
		AccessibilityRequirements: &csi.TopologyRequirement{
			Requisite: []*csi.Topology{{Segments: wantTopology("node-b")}},
			Preferred: []*csi.Topology{{Segments: wantTopology("node-b")}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	vol := resp.GetVolume()
	if got := vol.GetAccessibleTopology(); len(got) != 1 || !maps.Equal(got[0].GetSegments(), wantTopology("node-a")) {
		t.Fatalf("accessible topology = %v, want %v", got, wantTopology("node-a"))
	}
	if v, _ := a.Volume(vol.GetVolumeId()); !maps.Equal(v.Topology, wantTopology("node-a")) {
		t.Fatalf("Volume().Topology = %v", v.Topology)
	}
	snap, err := ca.ctrl.CreateSnapshot(ctx(t), &csi.CreateSnapshotRequest{Name: "local-snap", SourceVolumeId: vol.GetVolumeId()})
	if err != nil {
		t.Fatal(err)
	}
	id, snapID := vol.GetVolumeId(), snap.GetSnapshot().GetSnapshotId()

	// Node B knows nothing of node A's volume and snapshot.
	staging, targetPath := nodePaths(t)
	calls := []struct {
		name string
		call func() error
	}{
		{"ControllerPublishVolume", func() error {
			_, err := cb.ctrl.ControllerPublishVolume(ctx(t), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-b", VolumeCapability: snw})
			return err
		}},
		{"ControllerExpandVolume", func() error {
			_, err := cb.ctrl.ControllerExpandVolume(ctx(t), &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 40}})
			return err
		}},
		{"ControllerGetVolume", func() error {
			_, err := cb.ctrl.ControllerGetVolume(ctx(t), &csi.ControllerGetVolumeRequest{VolumeId: id})
			return err
		}},
		{"ControllerModifyVolume", func() error {
			_, err := cb.ctrl.ControllerModifyVolume(ctx(t), &csi.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: map[string]string{"iops": "1"}})
			return err
		}},
		{"ControllerGetVolumeHealth", func() error {
			_, err := cb.ctrl.ControllerGetVolumeHealth(ctx(t), &csi.ControllerGetVolumeHealthRequest{VolumeId: id})
			return err
		}},
		{"ValidateVolumeCapabilities", func() error {
			_, err := cb.ctrl.ValidateVolumeCapabilities(ctx(t), &csi.ValidateVolumeCapabilitiesRequest{VolumeId: id, VolumeCapabilities: []*csi.VolumeCapability{snw}})
			return err
		}},
		{"CreateSnapshot of the volume", func() error {
			_, err := cb.ctrl.CreateSnapshot(ctx(t), &csi.CreateSnapshotRequest{Name: "b-snap", SourceVolumeId: id})
			return err
		}},
		{"CreateVolume cloning the volume", func() error {
			_, err := createFrom(t, cb, "b-clone", volumeSource(id))
			return err
		}},
		{"CreateVolume restoring the snapshot", func() error {
			_, err := createFrom(t, cb, "b-restore", snapshotSource(snapID))
			return err
		}},
		{"GetSnapshot", func() error {
			_, err := cb.ctrl.GetSnapshot(ctx(t), &csi.GetSnapshotRequest{SnapshotId: snapID})
			return err
		}},
		{"NodeStageVolume", func() error {
			_, err := cb.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: snw})
			return err
		}},
		{"NodePublishVolume", func() error {
			_, err := cb.node.NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: targetPath, VolumeCapability: snw})
			return err
		}},
		{"NodeGetVolumeHealth", func() error {
			_, err := cb.node.NodeGetVolumeHealth(ctx(t), &csi.NodeGetVolumeHealthRequest{VolumeId: id})
			return err
		}},
	}
	for _, tt := range calls {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			wantCode(t, err, codes.NotFound)
			if !strings.Contains(err.Error(), id) && !strings.Contains(err.Error(), snapID) {
				t.Fatalf("error %q names neither %s nor %s", err, id, snapID)
			}
		})
	}
	// Listings leave it out, and deleting what is not there succeeds.
	list, err := cb.ctrl.ListSnapshots(ctx(t), &csi.ListSnapshotsRequest{SnapshotId: snapID})
	if err != nil || len(list.GetEntries()) != 0 {
		t.Fatalf("ListSnapshots on node B = %v, %v; want nothing", list, err)
	}
	if _, err := cb.ctrl.DeleteSnapshot(ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: snapID}); err != nil {
		t.Fatalf("DeleteSnapshot of another node's snapshot: %v", err)
	}
	if _, err := cb.ctrl.DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatalf("DeleteVolume of another node's volume: %v", err)
	}
	if _, ok := a.Volume(id); !ok || len(a.Snapshots()) != 1 {
		t.Fatal("deletes on node B removed node A's volume or snapshot")
	}

	// Node A publishes its volume to itself only.
	_, err = ca.ctrl.ControllerPublishVolume(ctx(t), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-b", VolumeCapability: snw})
	wantCode(t, err, codes.FailedPrecondition)
	if _, err := ca.ctrl.ControllerPublishVolume(ctx(t), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-a", VolumeCapability: snw}); err != nil {
		t.Fatalf("publish to its own node: %v", err)
	}
	if _, err := ca.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: snw}); err != nil {
		t.Fatalf("stage on its own node: %v", err)
	}
	// Its node service serves no volume id it did not create.
	_, err = ca.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: "vol-elsewhere", StagingTargetPath: staging + "2", VolumeCapability: snw})
	wantCode(t, err, codes.NotFound)
}

func TestNodeLocalTopologyKey(t *testing.T) {
	p := startPlugin(t, Config{NodeID: "n1", NodeLocal: true, TopologyKey: "example.com/host"})
	c := dial(t, p.Socket())
	if got := p.Config().TopologyKey; got != "example.com/host" {
		t.Fatalf("Config().TopologyKey = %q", got)
	}
	vol := createVolume(t, c, "keyed", 1<<20)
	want := map[string]string{"example.com/host": "n1"}
	if got := vol.GetAccessibleTopology(); len(got) != 1 || !maps.Equal(got[0].GetSegments(), want) {
		t.Fatalf("accessible topology = %v, want %v", got, want)
	}
	// GetCapacity answers for its own node only.
	for _, tt := range []struct {
		node string
		zero bool
	}{{"n1", false}, {"n2", true}} {
		resp, err := c.ctrl.GetCapacity(ctx(t), &csi.GetCapacityRequest{AccessibleTopology: &csi.Topology{Segments: map[string]string{"example.com/host": tt.node}}})
		if err != nil || (resp.GetAvailableCapacity() == 0) != tt.zero {
			t.Fatalf("GetCapacity on %s = %v, %v; want zero: %v", tt.node, resp, err, tt.zero)
		}
	}
}
