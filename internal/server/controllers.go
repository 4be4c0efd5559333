package server

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// grpcControllers implements volumeops.ControllerClient with the
// ClientCSI gRPC service of the agents, over the pool of connections to
// them.
type grpcControllers struct {
	conns *connPool
}

func (g *grpcControllers) client(addr string) (csisupdv1.ClientCSIClient, error) {
	return agentClient(g.conns, addr, csisupdv1.NewClientCSIClient)
}

// agentClient makes a client of one of the agent's services on the pooled
// connection to addr. A connection that cannot be made is Unavailable, so
// that the next candidate is tried.
func agentClient[C any](conns *connPool, addr string, newClient func(grpc.ClientConnInterface) C) (C, error) {
	conn, err := conns.get(addr)
	if err != nil {
		var zero C
		return zero, status.Errorf(codes.Unavailable, "agent %s: %v", addr, err)
	}
	return newClient(conn), nil
}

// viaAgent makes one ClientCSI call on the agent at addr and returns the
// plugin's response that the agent's answer wraps.
func viaAgent[W interface{ GetResponse() R }, R any](g *grpcControllers, addr string, call func(csisupdv1.ClientCSIClient) (W, error)) (R, error) {
	c, err := g.client(addr)
	if err != nil {
		var zero R
		return zero, err
	}
	w, err := call(c)
	if err != nil {
		var zero R
		return zero, err
	}
	return w.GetResponse(), nil
}

func (g *grpcControllers) CreateVolume(ctx context.Context, addr, pluginID string, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	return viaAgent(g, addr, func(c csisupdv1.ClientCSIClient) (*csisupdv1.ControllerCreateVolumeResponse, error) {
		return c.ControllerCreateVolume(ctx, &csisupdv1.ControllerCreateVolumeRequest{PluginId: pluginID, Request: req})
	})
}

func (g *grpcControllers) DeleteVolume(ctx context.Context, addr, pluginID string, req *csi.DeleteVolumeRequest) error {
	_, err := viaAgent(g, addr, func(c csisupdv1.ClientCSIClient) (*csisupdv1.ControllerDeleteVolumeResponse, error) {
		return c.ControllerDeleteVolume(ctx, &csisupdv1.ControllerDeleteVolumeRequest{PluginId: pluginID, Request: req})
	})
	return err
}

func (g *grpcControllers) PublishVolume(ctx context.Context, addr, pluginID string, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	return viaAgent(g, addr, func(c csisupdv1.ClientCSIClient) (*csisupdv1.ControllerAttachVolumeResponse, error) {
		return c.ControllerAttachVolume(ctx, &csisupdv1.ControllerAttachVolumeRequest{PluginId: pluginID, Request: req})
	})
}

func (g *grpcControllers) UnpublishVolume(ctx context.Context, addr, pluginID string, req *csi.ControllerUnpublishVolumeRequest) error {
	_, err := viaAgent(g, addr, func(c csisupdv1.ClientCSIClient) (*csisupdv1.ControllerDetachVolumeResponse, error) {
		return c.ControllerDetachVolume(ctx, &csisupdv1.ControllerDetachVolumeRequest{PluginId: pluginID, Request: req})
	})
	return err
}

func (g *grpcControllers) ExpandVolume(ctx context.Context, addr, pluginID string, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	return viaAgent(g, addr, func(c csisupdv1.ClientCSIClient) (*csisupdv1.ControllerExpandVolumeResponse, error) {
		return c.ControllerExpandVolume(ctx, &csisupdv1.ControllerExpandVolumeRequest{PluginId: pluginID, Request: req})
	})
}

func (g *grpcControllers) CreateSnapshot(ctx context.Context, addr, pluginID string, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	return viaAgent(g, addr, func(c csisupdv1.ClientCSIClient) (*csisupdv1.ControllerCreateSnapshotResponse, error) {
		return c.ControllerCreateSnapshot(ctx, &csisupdv1.ControllerCreateSnapshotRequest{PluginId: pluginID, Request: req})
	})
}

func (g *grpcControllers) DeleteSnapshot(ctx context.Context, addr, pluginID string, req *csi.DeleteSnapshotRequest) error {
	_, err := viaAgent(g, addr, func(c csisupdv1.ClientCSIClient) (*csisupdv1.ControllerDeleteSnapshotResponse, error) {
		return c.ControllerDeleteSnapshot(ctx, &csisupdv1.ControllerDeleteSnapshotRequest{PluginId: pluginID, Request: req})
	})
	return err
}

func (g *grpcControllers) ListSnapshots(ctx context.Context, addr, pluginID string, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	return viaAgent(g, addr, func(c csisupdv1.ClientCSIClient) (*csisupdv1.ControllerListSnapshotsResponse, error) {
		return c.ControllerListSnapshots(ctx, &csisupdv1.ControllerListSnapshotsRequest{PluginId: pluginID, Request: req})
	})
}

func (g *grpcControllers) GetSnapshot(ctx context.Context, addr, pluginID string, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	return viaAgent(g, addr, func(c csisupdv1.ClientCSIClient) (*csisupdv1.ControllerGetSnapshotResponse, error) {
		return c.ControllerGetSnapshot(ctx, &csisupdv1.ControllerGetSnapshotRequest{PluginId: pluginID, Request: req})
	})
}

func (g *grpcControllers) ModifyVolume(ctx context.Context, addr, pluginID string, req *csi.ControllerModifyVolumeRequest) error {
	_, err := viaAgent(g, addr, func(c csisupdv1.ClientCSIClient) (*csisupdv1.ControllerModifyVolumeResponse, error) {
		return c.ControllerModifyVolume(ctx, &csisupdv1.ControllerModifyVolumeRequest{PluginId: pluginID, Request: req})
	})
	return err
}

func (g *grpcControllers) GetCapacity(ctx context.Context, addr, pluginID string, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	return viaAgent(g, addr, func(c csisupdv1.ClientCSIClient) (*csisupdv1.ControllerGetCapacityResponse, error) {
		return c.ControllerGetCapacity(ctx, &csisupdv1.ControllerGetCapacityRequest{PluginId: pluginID, Request: req})
	})
}

func (g *grpcControllers) ListVolumes(ctx context.Context, addr, pluginID string, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	return viaAgent(g, addr, func(c csisupdv1.ClientCSIClient) (*csisupdv1.ControllerListVolumesResponse, error) {
		return c.ControllerListVolumes(ctx, &csisupdv1.ControllerListVolumesRequest{PluginId: pluginID, Request: req})
	})
}

func (g *grpcControllers) ListVolumeHealth(ctx context.Context, addr, pluginID string, req *csi.ControllerListVolumeHealthRequest) (*csi.ControllerListVolumeHealthResponse, error) {
	return viaAgent(g, addr, func(c csisupdv1.ClientCSIClient) (*csisupdv1.ControllerListVolumeHealthResponse, error) {
		return c.ControllerListVolumeHealth(ctx, &csisupdv1.ControllerListVolumeHealthRequest{PluginId: pluginID, Request: req})
	})
}

func (g *grpcControllers) GetVolumeHealth(ctx context.Context, addr, pluginID string, req *csi.ControllerGetVolumeHealthRequest) (*csi.ControllerGetVolumeHealthResponse, error) {
	return viaAgent(g, addr, func(c csisupdv1.ClientCSIClient) (*csisupdv1.ControllerGetVolumeHealthResponse, error) {
		return c.ControllerGetVolumeHealth(ctx, &csisupdv1.ControllerGetVolumeHealthRequest{PluginId: pluginID, Request: req})
	})
}
