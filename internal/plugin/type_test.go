package plugin

import (
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
)

func TestTypeOfAndRoles(t *testing.T) {
	tests := []struct {
		controller, node bool
		want             Type
		text             string // as the external contract prints it
	}{
		{false, false, TypeUnknown, "unknown"},
		{true, false, TypeController, "controller"},
		{false, true, TypeNode, "node"},
		{true, true, TypeMonolith, "monolith"},
	}
	for _, tt := range tests {
		got := TypeOf(tt.controller, tt.node)
		if got != tt.want || string(got) != tt.text {
			t.Errorf("TypeOf(%t, %t) = %q, want %q", tt.controller, tt.node, got, tt.text)
		}
		if c, n := got.Roles(); c != tt.controller || n != tt.node {
			t.Errorf("%q.Roles() = %t, %t, want %t, %t", got, c, n, tt.controller, tt.node)
		}
	}
	for _, other := range []Type{"", "Controller", "both"} {
		if c, n := other.Roles(); c || n {
			t.Errorf("%q.Roles() = %t, %t, want neither", other, c, n)
		}
	}
	if got := Type("").OrUnknown(); got != TypeUnknown {
		t.Errorf(`Type("").OrUnknown() = %q`, got)
	}
	if got := TypeNode.OrUnknown(); got != TypeNode {
		t.Errorf("TypeNode.OrUnknown() = %q", got)
	}
}

// TestCapabilityNames checks the names against the CSI enums whose names
// fingerprints record.
func TestCapabilityNames(t *testing.T) {
	tests := []struct{ name, enum string }{
		{CapControllerService, csi.PluginCapability_Service_CONTROLLER_SERVICE.String()},
		{CapPublishUnpublishVolume, csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME.String()},
		{CapCreateDeleteVolume, csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME.String()},
		{CapListVolumes, csi.ControllerServiceCapability_RPC_LIST_VOLUMES.String()},
		{CapGetVolume, csi.ControllerServiceCapability_RPC_GET_VOLUME.String()},
		{CapGetCapacity, csi.ControllerServiceCapability_RPC_GET_CAPACITY.String()},
		{CapCreateDeleteSnapshot, csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT.String()},
		{CapListSnapshots, csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS.String()},
		{CapExpandVolume, csi.ControllerServiceCapability_RPC_EXPAND_VOLUME.String()},
		{CapExpandVolume, csi.NodeServiceCapability_RPC_EXPAND_VOLUME.String()},
		{CapStageUnstageVolume, csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME.String()},
		{CapGetVolumeStats, csi.NodeServiceCapability_RPC_GET_VOLUME_STATS.String()},
		{CapCloneVolume, csi.ControllerServiceCapability_RPC_CLONE_VOLUME.String()},
		{CapModifyVolume, csi.ControllerServiceCapability_RPC_MODIFY_VOLUME.String()},
		{CapGetSnapshot, csi.ControllerServiceCapability_RPC_GET_SNAPSHOT.String()},
		{CapListVolumeHealth, csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH.String()},
		{CapGetVolumeHealth, csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH.String()},
		{CapGetVolumeHealth, csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH.String()},
		{CapSingleNodeMultiWriter, csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER.String()},
		{CapSingleNodeMultiWriter, csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER.String()},
		{CapVolumeMountGroup, csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP.String()},
		{CapGetStorageHealth, csi.NodeServiceCapability_RPC_GET_STORAGE_HEALTH.String()},
	}
	for _, tt := range tests {
		if tt.name != tt.enum {
			t.Errorf("capability %q, CSI names it %q", tt.name, tt.enum)
		}
	}
}
