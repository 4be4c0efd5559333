package server

import (
	"context"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

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
}

// grpcNodeVolumes implements NodeVolumesClient with the NodeVolumes gRPC
// service.
type grpcNodeVolumes struct {
	conns *connPool
}

func (g *grpcNodeVolumes) client(addr string) (csisupdv1.NodeVolumesClient, error) {
	return agentClient(g.conns, addr, csisupdv1.NewNodeVolumesClient)
}

func (g *grpcNodeVolumes) MountVolume(ctx context.Context, addr string, req *csisupdv1.MountVolumeRequest) (*csisupdv1.Mount, error) {
	c, err := g.client(addr)
	if err != nil {
		return nil, err
	}
	resp, err := c.MountVolume(ctx, req)
	if err != nil {
		return nil, err
	}
	return resp.GetMount(), nil
}

func (g *grpcNodeVolumes) UnmountVolume(ctx context.Context, addr string, req *csisupdv1.UnmountVolumeRequest) error {
	c, err := g.client(addr)
	if err != nil {
		return err
	}
	_, err = c.UnmountVolume(ctx, req)
	return err
}
