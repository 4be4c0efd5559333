package nodevolumes

import (
	"context"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/volreq"
)

// Service implements csisupd.v1.NodeVolumes over a Manager. It checks
// every request that reaches a plugin (package volreq) before the manager
// records or calls anything.
type Service struct {
	csisupdv1.UnimplementedNodeVolumesServer
	m *Manager
	// allowMountFlags are the privileged mount flags (suid, dev) this
	// node's operator allows: client.allow_mount_flags.
	allowMountFlags []string
}

// NewService returns the NodeVolumes service of m. allowMountFlags are the
// privileged mount flags (volreq.FlagSuid, volreq.FlagDev) it passes to
// plugins; it refuses the others with InvalidArgument.
func NewService(m *Manager, allowMountFlags ...string) *Service {
	return &Service{m: m, allowMountFlags: slices.Clone(allowMountFlags)}
}

// Register adds the NodeVolumes service of m to a gRPC server, with the
// privileged mount flags it allows (client.allow_mount_flags).
func (m *Manager) Register(r grpc.ServiceRegistrar, allowMountFlags ...string) {
	csisupdv1.RegisterNodeVolumesServer(r, NewService(m, allowMountFlags...))
}

// invalidRequest turns a refusal of package volreq into InvalidArgument.
func invalidRequest(err error) error {
	if err == nil {
		return nil
	}
	return status.Error(codes.InvalidArgument, err.Error())
}

// MountVolume checks the request and calls Manager.Mount.
func (s *Service) MountVolume(ctx context.Context, in *csisupdv1.MountVolumeRequest) (*csisupdv1.MountVolumeResponse, error) {
	if err := invalidRequest(volreq.MountVolume(in, s.allowMountFlags)); err != nil {
		return nil, err
	}
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

// ExpandVolume checks the request and calls Manager.Expand.
func (s *Service) ExpandVolume(ctx context.Context, in *csisupdv1.ExpandVolumeRequest) (*csisupdv1.ExpandVolumeResponse, error) {
	if err := invalidRequest(volreq.ExpandVolume(in)); err != nil {
		return nil, err
	}
	return s.m.Expand(ctx, in)
}

// VolumeStats calls Manager.Stats.
func (s *Service) VolumeStats(ctx context.Context, in *csisupdv1.VolumeStatsRequest) (*csisupdv1.VolumeStatsResponse, error) {
	return s.m.Stats(ctx, in)
}

// VolumeHealth calls Manager.VolumeHealth.
func (s *Service) VolumeHealth(ctx context.Context, in *csisupdv1.VolumeHealthRequest) (*csisupdv1.VolumeHealthResponse, error) {
	return s.m.VolumeHealth(ctx, in)
}

// StorageHealth checks the request and calls Manager.StorageHealth.
func (s *Service) StorageHealth(ctx context.Context, in *csisupdv1.StorageHealthRequest) (*csisupdv1.StorageHealthResponse, error) {
	if err := invalidRequest(volreq.StorageHealth(in)); err != nil {
		return nil, err
	}
	return s.m.StorageHealth(ctx, in)
}

// ListMounts calls Manager.List.
func (s *Service) ListMounts(_ context.Context, in *csisupdv1.ListMountsRequest) (*csisupdv1.ListMountsResponse, error) {
	return &csisupdv1.ListMountsResponse{Mounts: s.m.List(in.GetPluginId(), in.GetVolumeId())}, nil
}
