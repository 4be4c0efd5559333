package volumes

import (
	"context"

	"google.golang.org/grpc"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// Service implements csisupd.v1.NodeVolumes over a Manager.
type Service struct {
	csisupdv1.UnimplementedNodeVolumesServer
	m *Manager
}

// NewService returns the NodeVolumes service of m.
func NewService(m *Manager) *Service { return &Service{m: m} }

// Register adds the NodeVolumes service of m to a gRPC server.
func (m *Manager) Register(r grpc.ServiceRegistrar) {
	csisupdv1.RegisterNodeVolumesServer(r, NewService(m))
}

// MountVolume calls Manager.Mount.
func (s *Service) MountVolume(ctx context.Context, in *csisupdv1.MountVolumeRequest) (*csisupdv1.MountVolumeResponse, error) {
	mnt, err := s.m.Mount(ctx, in)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.MountVolumeResponse{Mount: mnt}, nil
}

// UnmountVolume calls Manager.Unmount.
func (s *Service) UnmountVolume(ctx context.Context, in *csisupdv1.UnmountVolumeRequest) (*csisupdv1.UnmountVolumeResponse, error) {
	return s.m.Unmount(ctx, in)
}

// ExpandVolume calls Manager.Expand.
func (s *Service) ExpandVolume(ctx context.Context, in *csisupdv1.ExpandVolumeRequest) (*csisupdv1.ExpandVolumeResponse, error) {
	return s.m.Expand(ctx, in)
}

// VolumeStats calls Manager.Stats.
func (s *Service) VolumeStats(ctx context.Context, in *csisupdv1.VolumeStatsRequest) (*csisupdv1.VolumeStatsResponse, error) {
	return s.m.Stats(ctx, in)
}

// ListMounts calls Manager.List.
func (s *Service) ListMounts(_ context.Context, in *csisupdv1.ListMountsRequest) (*csisupdv1.ListMountsResponse, error) {
	return &csisupdv1.ListMountsResponse{Mounts: s.m.List(in.GetPluginId(), in.GetVolumeId())}, nil
}
