package testplugin

import (
	"fmt"
	"slices"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
)

func TestCreateVolume(t *testing.T) {
	p := startPlugin(t, Config{Capacity: 10 << 30})
	c := dial(t, p.Socket())
	first := createVolume(t, c, "idem", 1<<30)

	block := &csi.VolumeCapability{
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
	}
	tests := []struct {
		name     string
		req      *csi.CreateVolumeRequest
		code     codes.Code
		wantSize int64
		sameID   bool
	}{
		{"same request is idempotent", &csi.CreateVolumeRequest{Name: "idem",
			CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}, VolumeCapabilities: []*csi.VolumeCapability{snw}},
			codes.OK, 1 << 30, true},
		{"smaller required size fits the existing volume", &csi.CreateVolumeRequest{Name: "idem",
			CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20}, VolumeCapabilities: []*csi.VolumeCapability{snw}},
			codes.OK, 1 << 30, true},
		{"larger size", &csi.CreateVolumeRequest{Name: "idem",
			CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 30}, VolumeCapabilities: []*csi.VolumeCapability{snw}},
			codes.AlreadyExists, 0, false},
		{"different parameters", &csi.CreateVolumeRequest{Name: "idem", Parameters: map[string]string{"k": "v"},
			CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}, VolumeCapabilities: []*csi.VolumeCapability{snw}},
			codes.AlreadyExists, 0, false},
		{"no name", &csi.CreateVolumeRequest{VolumeCapabilities: []*csi.VolumeCapability{snw}}, codes.InvalidArgument, 0, false},
		{"no capabilities", &csi.CreateVolumeRequest{Name: "x"}, codes.InvalidArgument, 0, false},
		{"block access", &csi.CreateVolumeRequest{Name: "x", VolumeCapabilities: []*csi.VolumeCapability{block}}, codes.InvalidArgument, 0, false},
		{"required above limit", &csi.CreateVolumeRequest{Name: "x", VolumeCapabilities: []*csi.VolumeCapability{snw},
			CapacityRange: &csi.CapacityRange{RequiredBytes: 2, LimitBytes: 1}}, codes.InvalidArgument, 0, false},
		{"larger than the pool", &csi.CreateVolumeRequest{Name: "x", VolumeCapabilities: []*csi.VolumeCapability{snw},
			CapacityRange: &csi.CapacityRange{RequiredBytes: 100 << 30}}, codes.OutOfRange, 0, false},
		{"no capacity range", &csi.CreateVolumeRequest{Name: "default-size", VolumeCapabilities: []*csi.VolumeCapability{snw}},
			codes.OK, DefaultVolumeSize, false},
		{"limit only", &csi.CreateVolumeRequest{Name: "limited", VolumeCapabilities: []*csi.VolumeCapability{snw},
			CapacityRange: &csi.CapacityRange{LimitBytes: 1 << 20}}, codes.OK, 1 << 20, false},
		{"unknown source snapshot", &csi.CreateVolumeRequest{Name: "from-snap", VolumeCapabilities: []*csi.VolumeCapability{snw},
			VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
				Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: "snap-none"}}}}, codes.NotFound, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := c.ctrl.CreateVolume(ctx(t), tt.req)
			wantCode(t, err, tt.code)
			if err != nil {
				return
			}
			if got := resp.GetVolume().GetCapacityBytes(); got != tt.wantSize {
				t.Errorf("capacity = %d, want %d", got, tt.wantSize)
			}
			if same := resp.GetVolume().GetVolumeId() == first.GetVolumeId(); same != tt.sameID {
				t.Errorf("volume id %s, same as first: %v, want %v", resp.GetVolume().GetVolumeId(), same, tt.sameID)
			}
		})
	}
}

func TestCreateVolumeTopology(t *testing.T) {
	p := startPlugin(t, Config{Topology: map[string]string{"zone": "z1"}})
	c := dial(t, p.Socket())
	req := func(zone string) *csi.CreateVolumeRequest {
		return &csi.CreateVolumeRequest{
			Name:               "topo-" + zone,
			VolumeCapabilities: []*csi.VolumeCapability{snw},
			AccessibilityRequirements: &csi.TopologyRequirement{
				Requisite: []*csi.Topology{{Segments: map[string]string{"zone": zone}}},
			},
		}
	}
	resp, err := c.ctrl.CreateVolume(ctx(t), req("z1"))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetVolume().GetAccessibleTopology(); len(got) != 1 || got[0].GetSegments()["zone"] != "z1" {
		t.Fatalf("accessible topology = %v, want zone z1", got)
	}
	_, err = c.ctrl.CreateVolume(ctx(t), req("z2"))
	wantCode(t, err, codes.ResourceExhausted)

	capResp, err := c.ctrl.GetCapacity(ctx(t), &csi.GetCapacityRequest{AccessibleTopology: &csi.Topology{Segments: map[string]string{"zone": "z2"}}})
	if err != nil || capResp.GetAvailableCapacity() != 0 {
		t.Fatalf("GetCapacity in another zone = %v, %v; want 0", capResp, err)
	}
}

func TestUnknownIDs(t *testing.T) {
	p := startPlugin(t, Config{})
	c := dial(t, p.Socket())
	const id = "vol-unknown"
	calls := map[string]func() error{
		"ControllerGetVolume": func() error {
			_, err := c.ctrl.ControllerGetVolume(ctx(t), &csi.ControllerGetVolumeRequest{VolumeId: id})
			return err
		},
		"ControllerExpandVolume": func() error {
			_, err := c.ctrl.ControllerExpandVolume(ctx(t), &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 1}})
			return err
		},
		"ControllerPublishVolume": func() error {
			_, err := c.ctrl.ControllerPublishVolume(ctx(t), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-a", VolumeCapability: snw})
			return err
		},
		"ValidateVolumeCapabilities": func() error {
			_, err := c.ctrl.ValidateVolumeCapabilities(ctx(t), &csi.ValidateVolumeCapabilitiesRequest{VolumeId: id, VolumeCapabilities: []*csi.VolumeCapability{snw}})
			return err
		},
		"CreateSnapshot": func() error {
			_, err := c.ctrl.CreateSnapshot(ctx(t), &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: id})
			return err
		},
		"NodeStageVolume": func() error {
			_, err := c.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: t.TempDir(), VolumeCapability: snw})
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) { wantCode(t, call(), codes.NotFound) })
	}
	// Deleting what does not exist succeeds.
	if _, err := c.ctrl.DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Errorf("DeleteVolume of an unknown volume: %v", err)
	}
	if _, err := c.ctrl.DeleteSnapshot(ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: "snap-unknown"}); err != nil {
		t.Errorf("DeleteSnapshot of an unknown snapshot: %v", err)
	}
	if _, err := c.ctrl.ControllerUnpublishVolume(ctx(t), &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "node-a"}); err != nil {
		t.Errorf("ControllerUnpublishVolume of an unknown volume: %v", err)
	}
}

func TestListVolumesPagination(t *testing.T) {
	p := startPlugin(t, Config{})
	c := dial(t, p.Socket())
	want := map[string]bool{}
	for i := range 5 {
		want[createVolume(t, c, fmt.Sprintf("page-%d", i), 1<<20).GetVolumeId()] = true
	}
	seen := map[string]bool{}
	token, pages := "", 0
	for {
		resp, err := c.ctrl.ListVolumes(ctx(t), &csi.ListVolumesRequest{MaxEntries: 2, StartingToken: token})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if len(resp.GetEntries()) > 2 {
			t.Fatalf("page of %d entries, max_entries 2", len(resp.GetEntries()))
		}
		for _, e := range resp.GetEntries() {
			id := e.GetVolume().GetVolumeId()
			if seen[id] || !want[id] {
				t.Fatalf("unexpected or repeated volume %s", id)
			}
			seen[id] = true
		}
		if token = resp.GetNextToken(); token == "" {
			break
		}
		// A volume deleted between pages does not break the next token.
		if pages == 1 {
			last := resp.GetEntries()[1].GetVolume().GetVolumeId()
			if _, err := c.ctrl.DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: last}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if pages != 3 || len(seen) != 5 {
		t.Fatalf("listed %d volumes in %d pages, want 5 in 3", len(seen), pages)
	}

	_, err := c.ctrl.ListVolumes(ctx(t), &csi.ListVolumesRequest{StartingToken: "bogus"})
	wantCode(t, err, codes.Aborted)
	_, err = c.ctrl.ListVolumes(ctx(t), &csi.ListVolumesRequest{MaxEntries: -1})
	wantCode(t, err, codes.InvalidArgument)
}

func TestSnapshots(t *testing.T) {
	p := startPlugin(t, Config{})
	c := dial(t, p.Socket())
	v1 := createVolume(t, c, "snap-src-1", 1<<20)
	v2 := createVolume(t, c, "snap-src-2", 1<<20)

	s1, err := c.ctrl.CreateSnapshot(ctx(t), &csi.CreateSnapshotRequest{Name: "s1", SourceVolumeId: v1.GetVolumeId()})
	if err != nil {
		t.Fatal(err)
	}
	if s1.GetSnapshot().GetSizeBytes() != 1<<20 || !s1.GetSnapshot().GetReadyToUse() || s1.GetSnapshot().GetCreationTime() == nil {
		t.Fatalf("snapshot = %v", s1.GetSnapshot())
	}
	again, err := c.ctrl.CreateSnapshot(ctx(t), &csi.CreateSnapshotRequest{Name: "s1", SourceVolumeId: v1.GetVolumeId()})
	if err != nil || again.GetSnapshot().GetSnapshotId() != s1.GetSnapshot().GetSnapshotId() {
		t.Fatalf("repeated CreateSnapshot = %v, %v; want the same snapshot", again, err)
	}
	_, err = c.ctrl.CreateSnapshot(ctx(t), &csi.CreateSnapshotRequest{Name: "s1", SourceVolumeId: v2.GetVolumeId()})
	wantCode(t, err, codes.AlreadyExists)
	if _, err := c.ctrl.CreateSnapshot(ctx(t), &csi.CreateSnapshotRequest{Name: "s2", SourceVolumeId: v2.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}

	bySource, err := c.ctrl.ListSnapshots(ctx(t), &csi.ListSnapshotsRequest{SourceVolumeId: v1.GetVolumeId()})
	if err != nil || len(bySource.GetEntries()) != 1 || bySource.GetEntries()[0].GetSnapshot().GetSnapshotId() != s1.GetSnapshot().GetSnapshotId() {
		t.Fatalf("ListSnapshots by source = %v, %v; want only s1", bySource, err)
	}
	all, err := c.ctrl.ListSnapshots(ctx(t), &csi.ListSnapshotsRequest{})
	if err != nil || len(all.GetEntries()) != 2 {
		t.Fatalf("ListSnapshots = %v, %v; want 2", all, err)
	}

	// A volume restored from a snapshot names its source.
	restored, err := c.ctrl.CreateVolume(ctx(t), &csi.CreateVolumeRequest{
		Name: "restored", VolumeCapabilities: []*csi.VolumeCapability{snw},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: s1.GetSnapshot().GetSnapshotId()}}},
	})
	if err != nil || restored.GetVolume().GetContentSource().GetSnapshot().GetSnapshotId() != s1.GetSnapshot().GetSnapshotId() {
		t.Fatalf("CreateVolume from snapshot = %v, %v", restored, err)
	}

	if _, err := c.ctrl.DeleteSnapshot(ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: s1.GetSnapshot().GetSnapshotId()}); err != nil {
		t.Fatal(err)
	}
	byID, err := c.ctrl.ListSnapshots(ctx(t), &csi.ListSnapshotsRequest{SnapshotId: s1.GetSnapshot().GetSnapshotId()})
	if err != nil || len(byID.GetEntries()) != 0 {
		t.Fatalf("ListSnapshots of a deleted snapshot = %v, %v; want none", byID, err)
	}
}

func TestControllerPublish(t *testing.T) {
	p := startPlugin(t, Config{KnownNodeIDs: []string{"node-b"}, MaxVolumes: 2})
	c := dial(t, p.Socket())
	v1 := createVolume(t, c, "pub-1", 1<<20)
	v2 := createVolume(t, c, "pub-2", 1<<20)
	v3 := createVolume(t, c, "pub-3", 1<<20)
	publish := func(vol *csi.Volume, node string, mode csi.VolumeCapability_AccessMode_Mode, readonly bool) (*csi.ControllerPublishVolumeResponse, error) {
		return c.ctrl.ControllerPublishVolume(ctx(t), &csi.ControllerPublishVolumeRequest{
			VolumeId: vol.GetVolumeId(), NodeId: node, VolumeCapability: mountCap(mode), Readonly: readonly,
		})
	}
	const sw = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER

	resp, err := publish(v1, "node-a", sw, false)
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetPublishContext()[PublishContextNodeID]; got != "node-a" {
		t.Fatalf("publish context = %v, want node id node-a", resp.GetPublishContext())
	}
	if _, err := publish(v1, "node-a", sw, false); err != nil {
		t.Fatalf("repeated publish: %v", err)
	}
	_, err = publish(v1, "node-b", sw, false)
	wantCode(t, err, codes.FailedPrecondition)
	_, err = publish(v1, "node-c", sw, false)
	wantCode(t, err, codes.NotFound)
	_, err = publish(v1, "node-a", sw, true)
	wantCode(t, err, codes.InvalidArgument) // PUBLISH_READONLY is not advertised by default

	if _, err := publish(v2, "node-a", sw, false); err != nil {
		t.Fatal(err)
	}
	_, err = publish(v3, "node-a", sw, false)
	wantCode(t, err, codes.ResourceExhausted)

	_, err = c.ctrl.DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: v1.GetVolumeId()})
	wantCode(t, err, codes.FailedPrecondition)

	listed, err := c.ctrl.ListVolumes(ctx(t), &csi.ListVolumesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range listed.GetEntries() {
		published := e.GetStatus().GetPublishedNodeIds()
		if e.GetVolume().GetVolumeId() == v1.GetVolumeId() && !slices.Equal(published, []string{"node-a"}) {
			t.Fatalf("ListVolumes published nodes of v1 = %v, want [node-a]", published)
		}
	}

	if _, err := c.ctrl.ControllerUnpublishVolume(ctx(t), &csi.ControllerUnpublishVolumeRequest{VolumeId: v1.GetVolumeId(), NodeId: "node-a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ctrl.DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: v1.GetVolumeId()}); err != nil {
		t.Fatalf("DeleteVolume after unpublish: %v", err)
	}
	if _, err := publish(v3, "node-a", sw, false); err != nil {
		t.Fatalf("publish after a slot was freed: %v", err)
	}
}

func TestAnyNode(t *testing.T) {
	p := startPlugin(t, Config{KnownNodeIDs: []string{AnyNode}})
	c := dial(t, p.Socket())
	v := createVolume(t, c, "any", 1<<20)
	if _, err := c.ctrl.ControllerPublishVolume(ctx(t), &csi.ControllerPublishVolumeRequest{
		VolumeId: v.GetVolumeId(), NodeId: "whatever", VolumeCapability: snw,
	}); err != nil {
		t.Fatalf("publish to any node: %v", err)
	}
}

func TestCapabilityOverride(t *testing.T) {
	p := startPlugin(t, Config{ControllerCapabilities: []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
	}})
	c := dial(t, p.Socket())
	caps, err := c.ctrl.ControllerGetCapabilities(ctx(t), &csi.ControllerGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(caps.GetCapabilities()) != 1 || caps.GetCapabilities()[0].GetRpc().GetType() != csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME {
		t.Fatalf("capabilities = %v, want only CREATE_DELETE_VOLUME", caps)
	}
	v := createVolume(t, c, "only-create", 1<<20)
	_, err = c.ctrl.ControllerPublishVolume(ctx(t), &csi.ControllerPublishVolumeRequest{VolumeId: v.GetVolumeId(), NodeId: "node-a", VolumeCapability: snw})
	wantCode(t, err, codes.Unimplemented)
	_, err = c.ctrl.ListVolumes(ctx(t), &csi.ListVolumesRequest{})
	wantCode(t, err, codes.Unimplemented)
	_, err = c.ctrl.CreateSnapshot(ctx(t), &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: v.GetVolumeId()})
	wantCode(t, err, codes.Unimplemented)
	// ValidateVolumeCapabilities needs no capability.
	valid, err := c.ctrl.ValidateVolumeCapabilities(ctx(t), &csi.ValidateVolumeCapabilitiesRequest{VolumeId: v.GetVolumeId(), VolumeCapabilities: []*csi.VolumeCapability{snw}})
	if err != nil || valid.GetConfirmed() == nil {
		t.Fatalf("ValidateVolumeCapabilities = %v, %v; want confirmed", valid, err)
	}
}

func TestExpandAndCapacity(t *testing.T) {
	p := startPlugin(t, Config{Capacity: 10 << 20, NodeExpansionRequired: true})
	c := dial(t, p.Socket())
	available := func() int64 {
		t.Helper()
		resp, err := c.ctrl.GetCapacity(ctx(t), &csi.GetCapacityRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetAvailableCapacity()
	}
	v := createVolume(t, c, "grow", 2<<20)
	if got := available(); got != 8<<20 {
		t.Fatalf("available = %d, want %d", got, 8<<20)
	}
	resp, err := c.ctrl.ControllerExpandVolume(ctx(t), &csi.ControllerExpandVolumeRequest{VolumeId: v.GetVolumeId(), CapacityRange: &csi.CapacityRange{RequiredBytes: 4 << 20}})
	if err != nil || resp.GetCapacityBytes() != 4<<20 || !resp.GetNodeExpansionRequired() {
		t.Fatalf("expand = %v, %v", resp, err)
	}
	resp, err = c.ctrl.ControllerExpandVolume(ctx(t), &csi.ControllerExpandVolumeRequest{VolumeId: v.GetVolumeId(), CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20}})
	if err != nil || resp.GetCapacityBytes() != 4<<20 {
		t.Fatalf("shrink request = %v, %v; want the size unchanged", resp, err)
	}
	_, err = c.ctrl.ControllerExpandVolume(ctx(t), &csi.ControllerExpandVolumeRequest{VolumeId: v.GetVolumeId(), CapacityRange: &csi.CapacityRange{RequiredBytes: 20 << 20}})
	wantCode(t, err, codes.OutOfRange)
	_, err = c.ctrl.ControllerExpandVolume(ctx(t), &csi.ControllerExpandVolumeRequest{VolumeId: v.GetVolumeId()})
	wantCode(t, err, codes.InvalidArgument)
	if got := available(); got != 6<<20 {
		t.Fatalf("available = %d, want %d", got, 6<<20)
	}
	got, err := c.ctrl.ControllerGetVolume(ctx(t), &csi.ControllerGetVolumeRequest{VolumeId: v.GetVolumeId()})
	if err != nil || got.GetVolume().GetCapacityBytes() != 4<<20 {
		t.Fatalf("ControllerGetVolume = %v, %v", got, err)
	}
}
