package testplugin

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// nodeServer is the CSI Node service. With MountsMarker nothing is mounted:
// staging is only recorded, and publishing creates the target path as a
// symbolic link to the volume's directory. With MountsBind staging
// bind-mounts the volume's directory on the staging path, and publishing
// bind-mounts the staging path on the target. Both keep the same records.
type nodeServer struct {
	csi.UnimplementedNodeServer
	p *Plugin
}

// NodeGetCapabilities reports STAGE_UNSTAGE_VOLUME, GET_VOLUME_STATS and
// EXPAND_VOLUME.
func (s *nodeServer) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	resp := &csi.NodeGetCapabilitiesResponse{}
	for _, c := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
	} {
		resp.Capabilities = append(resp.Capabilities, &csi.NodeServiceCapability{
			Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: c}},
		})
	}
	return resp, nil
}

// NodeGetInfo reports the configured node id, volume limit and topology.
func (s *nodeServer) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	resp := &csi.NodeGetInfoResponse{
		NodeId:            s.p.cfg.NodeID,
		MaxVolumesPerNode: s.p.cfg.MaxVolumes,
	}
	if t := s.p.accessible(); t != nil {
		resp.AccessibleTopology = t[0]
	}
	return resp, nil
}

// known reports whether the node can serve volume id. A plugin that creates
// volumes itself knows exactly which exist; a node-only plugin, or one
// with Config.ForeignVolumes, trusts the controller and accepts every
// well-formed id. Callers hold st.mu.
func (s *nodeServer) known(id string) bool {
	st := s.p.st
	if _, ok := st.node[id]; ok {
		return true
	}
	if s.p.hasCtrl && !s.p.cfg.ForeignVolumes && slices.Contains(s.p.caps, csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME) {
		_, ok := st.volumes[id]
		return ok
	}
	return idRE.MatchString(id)
}

// record returns a copy of the node record of id, or a new one, for the
// caller to change and store with putNode. A record without a size takes the
// controller's, when this plugin has the volume. Callers hold st.mu.
func (s *nodeServer) record(id string) *nodeVolume {
	st := s.p.st
	n := &nodeVolume{ID: id}
	if old, ok := st.node[id]; ok {
		*n = *old
		n.Targets = maps.Clone(old.Targets)
	}
	if v, ok := st.volumes[id]; ok && n.CapacityBytes == 0 {
		n.CapacityBytes = v.CapacityBytes
	}
	return n
}

// NodeStageVolume records the volume as staged at the staging path, which it
// creates when missing, and with MountsBind mounts the volume there.
func (s *nodeServer) NodeStageVolume(_ context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	case req.GetStagingTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "staging_target_path is required")
	}
	if err := checkCapability(req.GetVolumeCapability()); err != nil {
		return nil, err
	}
	if !filepath.IsAbs(req.GetStagingTargetPath()) {
		return nil, status.Errorf(codes.InvalidArgument, "staging_target_path %q is not absolute", req.GetStagingTargetPath())
	}
	staging := filepath.Clean(req.GetStagingTargetPath())
	mode := int32(req.GetVolumeCapability().GetAccessMode().GetMode())
	st := s.p.st
	st.mu.Lock()
	defer st.mu.Unlock()
	if !s.known(req.GetVolumeId()) {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist", req.GetVolumeId())
	}
	n := s.record(req.GetVolumeId())
	switch {
	case n.StagingPath == staging && n.StageMode == mode:
		// A repeated stage mounts again what UnmountAll took away.
		if err := s.bind(st.dataPath(n.ID), staging, false, true); err != nil {
			return nil, err
		}
		return &csi.NodeStageVolumeResponse{}, nil
	case n.StagingPath == staging:
		return nil, status.Errorf(codes.AlreadyExists, "volume %s is staged at %q with a different access mode", n.ID, staging)
	case n.StagingPath != "":
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is already staged at %q", n.ID, n.StagingPath)
	}
	if err := os.MkdirAll(staging, 0o755); err != nil {
		return nil, status.Errorf(codes.Internal, "create staging path: %v", err)
	}
	if err := os.MkdirAll(st.dataPath(n.ID), 0o755); err != nil {
		return nil, status.Errorf(codes.Internal, "create volume directory: %v", err)
	}
	if err := s.bind(st.dataPath(n.ID), staging, false, false); err != nil {
		return nil, err
	}
	n.StagingPath, n.StageMode = staging, mode
	if err := st.putNode(n); err != nil {
		return nil, status.Error(codes.Internal, errors.Join(err, s.unmount(staging)).Error())
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

// NodeUnstageVolume forgets the staging of a volume that is no longer
// published, and with MountsBind unmounts the staging path. A volume that is
// not staged succeeds.
func (s *nodeServer) NodeUnstageVolume(_ context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	case req.GetStagingTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "staging_target_path is required")
	}
	staging := filepath.Clean(req.GetStagingTargetPath())
	st := s.p.st
	st.mu.Lock()
	defer st.mu.Unlock()
	n := s.record(req.GetVolumeId())
	switch {
	case n.StagingPath == "":
		return &csi.NodeUnstageVolumeResponse{}, nil
	case n.StagingPath != staging:
		return nil, status.Errorf(codes.NotFound, "volume %s is staged at %q, not at %q", n.ID, n.StagingPath, staging)
	case len(n.Targets) > 0:
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is still published at %q", n.ID, slices.Sorted(maps.Keys(n.Targets)))
	}
	if err := s.unmount(staging); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	n.StagingPath, n.StageMode = "", 0
	if err := st.putNode(n); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// NodePublishVolume makes the target path the volume: a link to the
// volume's directory with MountsMarker, a bind mount of the staging path
// (read-only when asked) with MountsBind. The volume must be staged at the
// given staging path.
func (s *nodeServer) NodePublishVolume(_ context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	case req.GetTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "target_path is required")
	}
	if err := checkCapability(req.GetVolumeCapability()); err != nil {
		return nil, err
	}
	if req.GetStagingTargetPath() == "" {
		return nil, status.Error(codes.InvalidArgument, "staging_target_path is required: the plugin has STAGE_UNSTAGE_VOLUME")
	}
	if !filepath.IsAbs(req.GetTargetPath()) {
		return nil, status.Errorf(codes.InvalidArgument, "target_path %q is not absolute", req.GetTargetPath())
	}
	targetPath := filepath.Clean(req.GetTargetPath())
	t := target{AccessMode: int32(req.GetVolumeCapability().GetAccessMode().GetMode()), Readonly: req.GetReadonly()}
	st := s.p.st
	st.mu.Lock()
	defer st.mu.Unlock()
	if !s.known(req.GetVolumeId()) {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist", req.GetVolumeId())
	}
	n := s.record(req.GetVolumeId())
	if n.StagingPath != filepath.Clean(req.GetStagingTargetPath()) {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged at %q", n.ID, req.GetStagingTargetPath())
	}
	if old, ok := n.Targets[targetPath]; ok && old != t {
		return nil, status.Errorf(codes.AlreadyExists, "volume %s is published at %q with a different access mode or readonly flag", n.ID, targetPath)
	}
	_, published := n.Targets[targetPath]
	if err := s.place(n, targetPath, t.Readonly, published); err != nil {
		return nil, err
	}
	if published {
		return &csi.NodePublishVolumeResponse{}, nil
	}
	if n.Targets == nil {
		n.Targets = make(map[string]target)
	}
	n.Targets[targetPath] = t
	if err := st.putNode(n); err != nil {
		return nil, status.Error(codes.Internal, errors.Join(err, s.removeTarget(targetPath)).Error())
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// place makes targetPath the volume n, staged at n.StagingPath. published
// tells that the plugin published it there before: a repeated call.
func (s *nodeServer) place(n *nodeVolume, targetPath string, readonly, published bool) error {
	if s.p.cfg.Mounts != MountsBind {
		return s.link(s.p.st.dataPath(n.ID), targetPath)
	}
	// For a mount volume the plugin creates the target directory; the
	// orchestrator creates its parent, which is created here too, as the
	// link does.
	fi, err := os.Lstat(targetPath)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := os.MkdirAll(targetPath, 0o755); err != nil {
			return status.Errorf(codes.Internal, "create target path: %v", err)
		}
	case err != nil:
		return status.Errorf(codes.Internal, "target path: %v", err)
	case !fi.IsDir():
		return status.Errorf(codes.FailedPrecondition, "target path %q exists and is not a directory", targetPath)
	}
	return s.bind(n.StagingPath, targetPath, readonly, published)
}

// bind bind-mounts source on path, read-only when readonly is set. A path
// that is a mount point already is kept when the plugin mounted it (made:
// the call repeats one that succeeded) and refused otherwise. With
// MountsMarker it does nothing.
func (s *nodeServer) bind(source, path string, readonly, made bool) error {
	if s.p.cfg.Mounts != MountsBind {
		return nil
	}
	mounted, err := IsMountPoint(path)
	switch {
	case err != nil:
		return status.Error(codes.Internal, err.Error())
	case mounted && made:
		return nil
	case mounted:
		return status.Errorf(codes.FailedPrecondition, "%q is a mount point the plugin did not make", path)
	}
	if err := bindMount(source, path, readonly); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	return nil
}

// unmount unmounts path with MountsBind; with MountsMarker it does
// nothing. A path that is not mounted succeeds.
func (s *nodeServer) unmount(path string) error {
	if s.p.cfg.Mounts != MountsBind {
		return nil
	}
	return unmount(path, 0)
}

// removeTarget undoes place: it unmounts targetPath and removes it. A
// target that is not mounted, or missing, succeeds.
func (s *nodeServer) removeTarget(targetPath string) error {
	if err := s.unmount(targetPath); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	if err := os.Remove(targetPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return status.Errorf(codes.Internal, "remove target path: %v", err)
	}
	return nil
}

// link makes targetPath a symbolic link to dir. An existing link to dir is
// kept, an empty directory is replaced, anything else is an error.
func (s *nodeServer) link(dir, targetPath string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return status.Errorf(codes.Internal, "create volume directory: %v", err)
	}
	if err := os.MkdirAll(filepath.Dir(targetPath), 0o755); err != nil {
		return status.Errorf(codes.Internal, "create parent of target path: %v", err)
	}
	fi, err := os.Lstat(targetPath)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return status.Errorf(codes.Internal, "target path: %v", err)
	case fi.Mode()&os.ModeSymlink != 0:
		if dest, err := os.Readlink(targetPath); err == nil && dest == dir {
			return nil
		}
		return status.Errorf(codes.FailedPrecondition, "target path %q is a link to something else", targetPath)
	case fi.IsDir():
		// Some orchestrators create the target directory themselves.
		if err := os.Remove(targetPath); err != nil {
			return status.Errorf(codes.FailedPrecondition, "target path %q is a directory that cannot be replaced: %v", targetPath, err)
		}
	default:
		return status.Errorf(codes.FailedPrecondition, "target path %q exists and is not a directory", targetPath)
	}
	if err := os.Symlink(dir, targetPath); err != nil {
		return status.Errorf(codes.Internal, "create target path: %v", err)
	}
	return nil
}

// NodeUnpublishVolume unmounts (with MountsBind) and removes the target
// path. A volume that is not published there succeeds; an unknown volume is
// NotFound.
func (s *nodeServer) NodeUnpublishVolume(_ context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	case req.GetTargetPath() == "":
		return nil, status.Error(codes.InvalidArgument, "target_path is required")
	}
	targetPath := filepath.Clean(req.GetTargetPath())
	st := s.p.st
	st.mu.Lock()
	defer st.mu.Unlock()
	if !s.known(req.GetVolumeId()) {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist", req.GetVolumeId())
	}
	n := s.record(req.GetVolumeId())
	if _, ok := n.Targets[targetPath]; !ok {
		return &csi.NodeUnpublishVolumeResponse{}, nil
	}
	if err := s.removeTarget(targetPath); err != nil {
		return nil, err
	}
	delete(n.Targets, targetPath)
	if err := st.putNode(n); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// staged returns the node record of a volume available at path (its staging
// path or a target path), or a NotFound error. Callers hold st.mu.
func (s *nodeServer) staged(id, volumePath string) (*nodeVolume, error) {
	n, ok := s.p.st.node[id]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "volume %q is not staged or published on this node", id)
	}
	p := filepath.Clean(volumePath)
	if _, ok := n.Targets[p]; !ok && n.StagingPath != p {
		return nil, status.Errorf(codes.NotFound, "volume %s is not available at %q", id, volumePath)
	}
	return s.record(id), nil
}

// NodeGetVolumeStats reports the bytes and files in the volume's directory.
func (s *nodeServer) NodeGetVolumeStats(_ context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	case req.GetVolumePath() == "":
		return nil, status.Error(codes.InvalidArgument, "volume_path is required")
	}
	st := s.p.st
	st.mu.Lock()
	defer st.mu.Unlock()
	n, err := s.staged(req.GetVolumeId(), req.GetVolumePath())
	if err != nil {
		return nil, err
	}
	used, files, err := dirUsage(st.dataPath(n.ID))
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	total := max(n.CapacityBytes, used)
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{
		{Unit: csi.VolumeUsage_BYTES, Total: total, Used: used, Available: total - used},
		{Unit: csi.VolumeUsage_INODES, Used: files},
	}}, nil
}

// NodeExpandVolume records the volume's new size on this node.
func (s *nodeServer) NodeExpandVolume(_ context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	case req.GetVolumePath() == "":
		return nil, status.Error(codes.InvalidArgument, "volume_path is required")
	}
	if c := req.GetVolumeCapability(); c != nil {
		if err := checkCapability(c); err != nil {
			return nil, err
		}
	}
	size, err := requestedSize(req.GetCapacityRange(), 0)
	if err != nil {
		return nil, err
	}
	st := s.p.st
	st.mu.Lock()
	defer st.mu.Unlock()
	n, err := s.staged(req.GetVolumeId(), req.GetVolumePath())
	if err != nil {
		return nil, err
	}
	if v, ok := st.volumes[n.ID]; ok {
		if size > v.CapacityBytes {
			return nil, status.Errorf(codes.OutOfRange, "volume %s has %d bytes; expand it with ControllerExpandVolume first", n.ID, v.CapacityBytes)
		}
		if size == 0 {
			size = v.CapacityBytes
		}
	}
	if size <= n.CapacityBytes {
		return &csi.NodeExpandVolumeResponse{CapacityBytes: n.CapacityBytes}, nil
	}
	n.CapacityBytes = size
	if err := st.putNode(n); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
}
