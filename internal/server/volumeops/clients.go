package volumeops

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// ControllerClient calls a controller RPC of plugin pluginID through the
// ClientCSI service of the agent at addr.
// Errors should keep the gRPC status the agent returned, so IsRetryable can
// judge them.
type ControllerClient interface {
	// CreateVolume calls the plugin's CreateVolume.
	CreateVolume(ctx context.Context, addr, pluginID string, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error)
	// DeleteVolume calls the plugin's DeleteVolume.
	DeleteVolume(ctx context.Context, addr, pluginID string, req *csi.DeleteVolumeRequest) error
	// PublishVolume calls the plugin's ControllerPublishVolume.
	PublishVolume(ctx context.Context, addr, pluginID string, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error)
	// UnpublishVolume calls the plugin's ControllerUnpublishVolume.
	UnpublishVolume(ctx context.Context, addr, pluginID string, req *csi.ControllerUnpublishVolumeRequest) error
	// ExpandVolume calls the plugin's ControllerExpandVolume.
	ExpandVolume(ctx context.Context, addr, pluginID string, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error)
	// CreateSnapshot calls the plugin's CreateSnapshot.
	CreateSnapshot(ctx context.Context, addr, pluginID string, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error)
	// DeleteSnapshot calls the plugin's DeleteSnapshot.
	DeleteSnapshot(ctx context.Context, addr, pluginID string, req *csi.DeleteSnapshotRequest) error
	// ListSnapshots calls the plugin's ListSnapshots.
	ListSnapshots(ctx context.Context, addr, pluginID string, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error)
	// GetSnapshot calls the plugin's GetSnapshot.
	GetSnapshot(ctx context.Context, addr, pluginID string, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error)
	// ModifyVolume calls the plugin's ControllerModifyVolume.
	ModifyVolume(ctx context.Context, addr, pluginID string, req *csi.ControllerModifyVolumeRequest) error
	// ListVolumes calls the plugin's ListVolumes.
	ListVolumes(ctx context.Context, addr, pluginID string, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error)
	// GetVolumeHealth calls the plugin's ControllerGetVolumeHealth.
	GetVolumeHealth(ctx context.Context, addr, pluginID string, req *csi.ControllerGetVolumeHealthRequest) (*csi.ControllerGetVolumeHealthResponse, error)
	// ListVolumeHealth calls the plugin's ControllerListVolumeHealth.
	ListVolumeHealth(ctx context.Context, addr, pluginID string, req *csi.ControllerListVolumeHealthRequest) (*csi.ControllerListVolumeHealthResponse, error)
	// GetCapacity calls the plugin's GetCapacity.
	GetCapacity(ctx context.Context, addr, pluginID string, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error)
}

// NodeVolumesClient mounts and unmounts volumes through the NodeVolumes
// service of the agent at addr, for volume claims.
// Errors should keep the gRPC status the agent returned.
type NodeVolumesClient interface {
	// MountVolume stages (when needed) and publishes a volume for a
	// workload, and returns the mount.
	MountVolume(ctx context.Context, addr string, req *csisupdv1.MountVolumeRequest) (*csisupdv1.Mount, error)
	// UnmountVolume unpublishes a volume for a workload (and unstages it
	// after its last workload). A mount that does not exist succeeds.
	UnmountVolume(ctx context.Context, addr string, req *csisupdv1.UnmountVolumeRequest) error
	// ExpandVolume calls NodeExpandVolume on a mount of the volume on the
	// node, with that mount's paths, and returns the size the plugin
	// reported.
	ExpandVolume(ctx context.Context, addr string, req *csisupdv1.ExpandVolumeRequest) (int64, error)
	// VolumeHealth calls NodeGetVolumeHealth on a mount of the volume on
	// the node.
	VolumeHealth(ctx context.Context, addr string, req *csisupdv1.VolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error)
	// ListMounts returns the mounts the node's agent holds.
	ListMounts(ctx context.Context, addr string, req *csisupdv1.ListMountsRequest) ([]*csisupdv1.Mount, error)
}

// Nodes is what the leader knows of the nodes it heard from since it
// took over or restored a snapshot (package leader's Heartbeats): a
// controller on a node not heard from yet is tried after the others, and
// a node whose agent answers a call is confirmed, as a heartbeat would.
type Nodes interface {
	// Confirm records that the node's agent answered this leader.
	Confirm(nodeID string)
	// Confirmed reports whether the node heartbeated to, or answered,
	// this leader since it took over or restored a snapshot.
	Confirmed(nodeID string) bool
}
