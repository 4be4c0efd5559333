package testplugin

import (
	"slices"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
)

// capabilitiesOf returns the plugin's volume expansion type and whether
// the controller and the node advertise EXPAND_VOLUME.
func capabilitiesOf(t *testing.T, c *client) (expansion csi.PluginCapability_VolumeExpansion_Type, ctrl, node bool) {
	t.Helper()
	pc, err := c.id.GetPluginCapabilities(ctx(t), &csi.GetPluginCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range pc.GetCapabilities() {
		if e := c.GetVolumeExpansion(); e != nil {
			expansion = e.GetType()
		}
	}
	cc, err := c.ctrl.ControllerGetCapabilities(ctx(t), &csi.ControllerGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cc.GetCapabilities() {
		ctrl = ctrl || c.GetRpc().GetType() == csi.ControllerServiceCapability_RPC_EXPAND_VOLUME
	}
	nc, err := c.node.NodeGetCapabilities(ctx(t), &csi.NodeGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range nc.GetCapabilities() {
		node = node || c.GetRpc().GetType() == csi.NodeServiceCapability_RPC_EXPAND_VOLUME
	}
	return expansion, ctrl, node
}

func TestExpansionModes(t *testing.T) {
	noCtrlExpand := slices.DeleteFunc(slices.Clone(DefaultControllerCapabilities), func(c csi.ControllerServiceCapability_RPC_Type) bool {
		return c == csi.ControllerServiceCapability_RPC_EXPAND_VOLUME
	})
	tests := []struct {
		name       string
		cfg        Config
		expansion  csi.PluginCapability_VolumeExpansion_Type
		ctrl, node bool
		// published is the code of ControllerExpandVolume on a published
		// volume, unpublished on one that is not.
		published, unpublished codes.Code
		nodeExpand             codes.Code
	}{
		{"default is online", Config{}, csi.PluginCapability_VolumeExpansion_ONLINE, true, true, codes.OK, codes.OK, codes.OK},
		{"offline", Config{Expansion: ExpansionOffline}, csi.PluginCapability_VolumeExpansion_OFFLINE, true, true,
			codes.FailedPrecondition, codes.OK, codes.OK},
		{"none", Config{Expansion: ExpansionNone}, csi.PluginCapability_VolumeExpansion_UNKNOWN, false, false,
			codes.Unimplemented, codes.Unimplemented, codes.Unimplemented},
		{"node only", Config{ControllerCapabilities: noCtrlExpand}, csi.PluginCapability_VolumeExpansion_ONLINE, false, true,
			codes.Unimplemented, codes.Unimplemented, codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			staging, targetPath := nodePaths(t)
			p := startPlugin(t, tt.cfg)
			c := dial(t, p.Socket())
			expansion, ctrl, node := capabilitiesOf(t, c)
			if expansion != tt.expansion || ctrl != tt.ctrl || node != tt.node {
				t.Fatalf("expansion %s, controller EXPAND_VOLUME %v, node EXPAND_VOLUME %v; want %s, %v, %v",
					expansion, ctrl, node, tt.expansion, tt.ctrl, tt.node)
			}
			id := createVolume(t, c, "grow", 1<<20).GetVolumeId()
			expand := func(size int64) error {
				_, err := c.ctrl.ControllerExpandVolume(ctx(t), &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: size}})
				return err
			}
			if _, err := c.ctrl.ControllerPublishVolume(ctx(t), &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "node-a", VolumeCapability: snw}); err != nil {
				t.Fatal(err)
			}
			wantCode(t, expand(2<<20), tt.published)
			if _, err := c.ctrl.ControllerUnpublishVolume(ctx(t), &csi.ControllerUnpublishVolumeRequest{VolumeId: id}); err != nil {
				t.Fatal(err)
			}
			wantCode(t, expand(3<<20), tt.unpublished)

			// Node expansion to 4 MiB: after the controller's when it has
			// one, alone otherwise.
			stagePublish(t, c, id, staging, targetPath)
			if tt.ctrl {
				if err := expand(4 << 20); err != nil {
					t.Fatal(err)
				}
			}
			resp, err := c.node.NodeExpandVolume(ctx(t), &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: targetPath, StagingTargetPath: staging,
				CapacityRange: &csi.CapacityRange{RequiredBytes: 4 << 20}})
			wantCode(t, err, tt.nodeExpand)
			if err != nil {
				return
			}
			if resp.GetCapacityBytes() != 4<<20 {
				t.Fatalf("NodeExpandVolume capacity = %d, want %d", resp.GetCapacityBytes(), 4<<20)
			}
			// The volume's record and the controller's answers have the size.
			if v, _ := p.Volume(id); v.CapacityBytes != 4<<20 {
				t.Fatalf("Volume().CapacityBytes = %d, want %d", v.CapacityBytes, 4<<20)
			}
			got, err := c.ctrl.ControllerGetVolume(ctx(t), &csi.ControllerGetVolumeRequest{VolumeId: id})
			if err != nil || got.GetVolume().GetCapacityBytes() != 4<<20 {
				t.Fatalf("ControllerGetVolume = %v, %v; want %d bytes", got, err, 4<<20)
			}
			if nv := p.NodeVolumes()[id]; nv.CapacityBytes != 4<<20 {
				t.Fatalf("NodeVolumes capacity = %d, want %d", nv.CapacityBytes, 4<<20)
			}
			log := p.NodeLog()
			want := NodeCall{Method: "NodeExpandVolume", VolumeID: id, Path: targetPath, StagingPath: staging, RequiredBytes: 4 << 20}
			if last := log[len(log)-1]; last != want {
				t.Fatalf("last node call = %+v, want %+v", last, want)
			}
		})
	}
}

func TestExpandSizes(t *testing.T) {
	staging, targetPath := nodePaths(t)
	p := startPlugin(t, Config{NodeExpansionRequired: true})
	c := dial(t, p.Socket())
	id := createVolume(t, c, "sizes", 4<<20).GetVolumeId()
	stagePublish(t, c, id, staging, targetPath)
	tests := []struct {
		name     string
		r        *csi.CapacityRange
		code     codes.Code
		wantSize int64
	}{
		{"smaller required size keeps the size", &csi.CapacityRange{RequiredBytes: 1 << 20}, codes.OK, 4 << 20},
		{"same size", &csi.CapacityRange{RequiredBytes: 4 << 20}, codes.OK, 4 << 20},
		{"limit below the size cannot shrink", &csi.CapacityRange{RequiredBytes: 1 << 20, LimitBytes: 2 << 20}, codes.OutOfRange, 0},
		{"grow", &csi.CapacityRange{RequiredBytes: 8 << 20}, codes.OK, 8 << 20},
		{"required above limit", &csi.CapacityRange{RequiredBytes: 9 << 20, LimitBytes: 8 << 20}, codes.InvalidArgument, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := c.ctrl.ControllerExpandVolume(ctx(t), &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: tt.r})
			wantCode(t, err, tt.code)
			if err != nil {
				return
			}
			if resp.GetCapacityBytes() != tt.wantSize || !resp.GetNodeExpansionRequired() {
				t.Fatalf("ControllerExpandVolume = %v; want %d bytes and node expansion required", resp, tt.wantSize)
			}
		})
	}
	// The node has not expanded yet: NodeExpansionRequired keeps its size.
	if nv := p.NodeVolumes()[id]; nv.CapacityBytes != 4<<20 {
		t.Fatalf("node capacity before NodeExpandVolume = %d, want %d", nv.CapacityBytes, 4<<20)
	}
	_, err := c.node.NodeExpandVolume(ctx(t), &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: targetPath, CapacityRange: &csi.CapacityRange{LimitBytes: 1 << 20}})
	wantCode(t, err, codes.OutOfRange)
	_, err = c.node.NodeExpandVolume(ctx(t), &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: targetPath, StagingTargetPath: "/elsewhere"})
	wantCode(t, err, codes.NotFound)
	// Without a capacity range the node takes the controller's size.
	resp, err := c.node.NodeExpandVolume(ctx(t), &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: staging})
	if err != nil || resp.GetCapacityBytes() != 8<<20 {
		t.Fatalf("NodeExpandVolume without a range = %v, %v; want %d", resp, err, 8<<20)
	}

	// Without NodeExpansionRequired the node sees the new size at once.
	q := startPlugin(t, Config{})
	qc := dial(t, q.Socket())
	qid := createVolume(t, qc, "at-once", 1<<20).GetVolumeId()
	qs, qt := nodePaths(t)
	stagePublish(t, qc, qid, qs, qt)
	exp, err := qc.ctrl.ControllerExpandVolume(ctx(t), &csi.ControllerExpandVolumeRequest{VolumeId: qid, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 20}})
	if err != nil || exp.GetNodeExpansionRequired() {
		t.Fatalf("ControllerExpandVolume = %v, %v; want no node expansion required", exp, err)
	}
	stats, err := qc.node.NodeGetVolumeStats(ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: qid, VolumePath: qt})
	if err != nil || stats.GetUsage()[0].GetTotal() != 2<<20 {
		t.Fatalf("stats after expansion = %v, %v; want a total of %d", stats, err, 2<<20)
	}
}
