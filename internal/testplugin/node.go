package testplugin

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"

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

// NodeGetCapabilities reports STAGE_UNSTAGE_VOLUME and GET_VOLUME_STATS;
// EXPAND_VOLUME unless Config.Expansion is none; GET_VOLUME_HEALTH and
// GET_STORAGE_HEALTH with Config.VolumeHealth; VOLUME_MOUNT_GROUP with
// Config.VolumeMountGroup.
func (s *nodeServer) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	resp := &csi.NodeGetCapabilitiesResponse{}
	for _, c := range s.p.nodeCaps {
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

// require returns Unimplemented unless node capability c is advertised.
func (s *nodeServer) require(c csi.NodeServiceCapability_RPC_Type) error {
	if !slices.Contains(s.p.nodeCaps, c) {
		return status.Errorf(codes.Unimplemented, "node capability %s is not advertised", c)
	}
	return nil
}

// known reports whether the node can serve volume id. A plugin that creates
// volumes itself knows exactly which exist, and a node-local one serves
// nothing else; a node-only plugin, or one with Config.ForeignVolumes,
// trusts the controller and accepts every well-formed id. Callers hold
// st.mu.
func (s *nodeServer) known(id string) bool {
	st := s.p.st
	if _, ok := st.node[id]; ok {
		return true
	}
	if s.p.cfg.NodeLocal || (s.p.hasCtrl && !s.p.cfg.ForeignVolumes && slices.Contains(s.p.caps, csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME)) {
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
	n.CapacityBytes = s.p.nodeCapacity(n)
	return n
}

// nodeCapacity is the size of node record n as the node sees it: its
// recorded size, else the controller's when this plugin has the volume.
// Without NodeExpansionRequired a controller expansion needs nothing on
// the node, so the node sees a larger controller size at once. Callers
// hold st.mu.
func (p *Plugin) nodeCapacity(n *nodeVolume) int64 {
	c := n.CapacityBytes
	if v, ok := p.st.volumes[n.ID]; ok && (c == 0 || !p.cfg.NodeExpansionRequired && v.CapacityBytes > c) {
		c = v.CapacityBytes
	}
	return c
}

// maxGID is the highest group id a mount group may name: (gid_t)-1 means
// "no change" to chown(2).
const maxGID = 1<<32 - 2

// mountGroup returns the volume_mount_group of c, checked: InvalidArgument
// when the plugin does not advertise VOLUME_MOUNT_GROUP (CSI defines the
// field only for plugins that do, and a plugin ignoring it would leave the
// workload without the access it asked for) or when it is not a numeric
// group id.
func (s *nodeServer) mountGroup(c *csi.VolumeCapability) (string, error) {
	g := c.GetMount().GetVolumeMountGroup()
	if g == "" {
		return "", nil
	}
	if !s.p.cfg.VolumeMountGroup {
		return "", status.Errorf(codes.InvalidArgument, "volume_capability.mount.volume_mount_group %q is set but the plugin does not advertise VOLUME_MOUNT_GROUP", g)
	}
	if gid, err := strconv.ParseUint(g, 10, 32); err != nil || gid > maxGID {
		return "", status.Errorf(codes.InvalidArgument, "volume_capability.mount.volume_mount_group %q is not a numeric group id", g)
	}
	return g, nil
}

// applyGroup gives the volume's directory to group with MountsBind, as a
// driver passes the group to its mount: group ownership, group
// read-write-search, and the set-group-id bit so that new files and
// directories join the group. Only the directory itself changes, not what
// is in it. With MountsMarker, or no group, it does nothing: the group is
// only recorded.
func (s *nodeServer) applyGroup(dir, group string) error {
	if group == "" || s.p.cfg.Mounts != MountsBind {
		return nil
	}
	gid, _ := strconv.Atoi(group) // checked by mountGroup
	if err := os.Chown(dir, -1, gid); err != nil {
		return status.Errorf(codes.Internal, "give volume directory to mount group %s: %v", group, err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return status.Errorf(codes.Internal, "volume directory: %v", err)
	}
	if err := os.Chmod(dir, fi.Mode()&copyMode|0o070|os.ModeSetgid); err != nil {
		return status.Errorf(codes.Internal, "open volume directory to mount group %s: %v", group, err)
	}
	return nil
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
	group, err := s.mountGroup(req.GetVolumeCapability())
	if err != nil {
		return nil, err
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
	case n.StagingPath == staging && n.StageMode == mode && n.StageGroup == group:
		// A repeated stage mounts again what UnmountAll took away.
		if err := s.bind(st.dataPath(n.ID), staging, false, true); err != nil {
			return nil, err
		}
		return &csi.NodeStageVolumeResponse{}, nil
	case n.StagingPath == staging:
		return nil, status.Errorf(codes.AlreadyExists, "volume %s is staged at %q with a different access mode or mount group", n.ID, staging)
	case n.StagingPath != "":
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is already staged at %q", n.ID, n.StagingPath)
	}
	if err := os.MkdirAll(staging, 0o755); err != nil {
		return nil, status.Errorf(codes.Internal, "create staging path: %v", err)
	}
	if err := os.MkdirAll(st.dataPath(n.ID), 0o755); err != nil {
		return nil, status.Errorf(codes.Internal, "create volume directory: %v", err)
	}
	if err := s.applyGroup(st.dataPath(n.ID), group); err != nil {
		return nil, err
	}
	if err := s.bind(st.dataPath(n.ID), staging, false, false); err != nil {
		return nil, err
	}
	n.StagingPath, n.StageMode, n.StageGroup = staging, mode, group
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
	n.StagingPath, n.StageMode, n.StageGroup = "", 0, ""
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
	group, err := s.mountGroup(req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}
	targetPath := filepath.Clean(req.GetTargetPath())
	t := target{AccessMode: int32(req.GetVolumeCapability().GetAccessMode().GetMode()), Readonly: req.GetReadonly(), MountGroup: group}
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
		return nil, status.Errorf(codes.AlreadyExists, "volume %s is published at %q with a different access mode, readonly flag or mount group", n.ID, targetPath)
	}
	_, published := n.Targets[targetPath]
	if !published {
		if err := s.applyGroup(st.dataPath(n.ID), group); err != nil {
			return nil, err
		}
	}
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

// NodeExpandVolume records the volume's new size on this node. The volume
// must be staged or published at volume_path. When the controller cannot
// expand (no EXPAND_VOLUME controller capability: node-only expansion) and
// this plugin has the volume, it grows the controller's record too, so
// ControllerGetVolume and ListVolumes report the new size; otherwise a size
// above the controller's is OutOfRange until ControllerExpandVolume ran.
// Asking for no more than the node's size succeeds without change, unless
// limit_bytes is below it: volumes do not shrink.
func (s *nodeServer) NodeExpandVolume(_ context.Context, req *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	if err := s.require(csi.NodeServiceCapability_RPC_EXPAND_VOLUME); err != nil {
		return nil, err
	}
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
	if sp := req.GetStagingTargetPath(); sp != "" && filepath.Clean(sp) != n.StagingPath {
		return nil, status.Errorf(codes.NotFound, "volume %s is not staged at %q", n.ID, sp)
	}
	if limit := req.GetCapacityRange().GetLimitBytes(); limit > 0 && limit < n.CapacityBytes {
		return nil, status.Errorf(codes.OutOfRange, "volume %s has %d bytes on this node, more than limit_bytes %d: volumes do not shrink", n.ID, n.CapacityBytes, limit)
	}
	v, local := st.volumes[n.ID]
	if size == 0 && local {
		size = v.CapacityBytes
	}
	if size <= n.CapacityBytes {
		return &csi.NodeExpandVolumeResponse{CapacityBytes: n.CapacityBytes}, nil
	}
	if local && size > v.CapacityBytes {
		if slices.Contains(s.p.caps, csi.ControllerServiceCapability_RPC_EXPAND_VOLUME) {
			return nil, status.Errorf(codes.OutOfRange, "volume %s has %d bytes; expand it with ControllerExpandVolume first", n.ID, v.CapacityBytes)
		}
		if err := s.growVolume(v, size); err != nil {
			return nil, err
		}
	}
	n.CapacityBytes = size
	if err := st.putNode(n); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: size}, nil
}

// growVolume grows the controller record of v to size for node-only
// expansion, within the pool. Callers hold st.mu.
func (s *nodeServer) growVolume(v *volume, size int64) error {
	st := s.p.st
	if avail := s.p.cfg.Capacity - st.usedCapacity(); size-v.CapacityBytes > avail {
		return status.Errorf(codes.OutOfRange, "growing volume %s to %d bytes needs %d bytes, %d available", v.ID, size, size-v.CapacityBytes, avail)
	}
	old := v.CapacityBytes
	v.CapacityBytes = size
	if err := st.putVolume(v); err != nil {
		v.CapacityBytes = old
		return status.Error(codes.Internal, err.Error())
	}
	return nil
}

// NodeGetVolumeHealth reports the conditions set with
// Plugin.SetVolumeHealth for a volume this node serves. CSI lets a CO ask
// about a volume it only tried to stage, so the volume need not be staged;
// paths, when given, must be absolute.
func (s *nodeServer) NodeGetVolumeHealth(_ context.Context, req *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	if err := s.require(csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH); err != nil {
		return nil, err
	}
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	for name, p := range map[string]string{"volume_publish_path": req.GetVolumePublishPath(), "staging_target_path": req.GetStagingTargetPath()} {
		if p != "" && !filepath.IsAbs(p) {
			return nil, status.Errorf(codes.InvalidArgument, "%s %q is not absolute", name, p)
		}
	}
	st := s.p.st
	st.mu.Lock()
	known := s.known(req.GetVolumeId())
	st.mu.Unlock()
	if !known {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist on this node", req.GetVolumeId())
	}
	return &csi.NodeGetVolumeHealthResponse{VolumeHealth: s.p.volumeHealth(req.GetVolumeId(), s.p.fileConditions())}, nil
}

// NodeGetStorageHealth reports the conditions set with
// Plugin.SetStorageHealth; none when the storage is healthy.
func (s *nodeServer) NodeGetStorageHealth(context.Context, *csi.NodeGetStorageHealthRequest) (*csi.NodeGetStorageHealthResponse, error) {
	if err := s.require(csi.NodeServiceCapability_RPC_GET_STORAGE_HEALTH); err != nil {
		return nil, err
	}
	s.p.healthMu.Lock()
	defer s.p.healthMu.Unlock()
	resp := &csi.NodeGetStorageHealthResponse{}
	for _, h := range s.p.storage {
		resp.BackendHealth = append(resp.BackendHealth, &csi.NodeGetStorageHealthResponse_StorageBackendHealth{
			Status: h.Status, Reason: h.Reason, Message: h.Message,
		})
	}
	return resp, nil
}
