package testplugin

import (
	"context"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Publish context keys returned by ControllerPublishVolume.
const (
	PublishContextNodeID   = "testplugin/node-id"
	PublishContextReadonly = "testplugin/readonly"
)

// tokenPrefix starts every pagination token; a token is the prefix and the
// last id of the previous page, so deletions between pages are harmless.
const tokenPrefix = "after:"

// controllerServer is the CSI Controller service.
type controllerServer struct {
	csi.UnimplementedControllerServer
	p *Plugin
}

// require returns Unimplemented unless capability c is advertised.
func (s *controllerServer) require(c csi.ControllerServiceCapability_RPC_Type) error {
	if !slices.Contains(s.p.caps, c) {
		return status.Errorf(codes.Unimplemented, "controller capability %s is not advertised", c)
	}
	return nil
}

// ControllerGetCapabilities reports the advertised controller capabilities.
func (s *controllerServer) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	resp := &csi.ControllerGetCapabilitiesResponse{}
	for _, c := range s.p.caps {
		resp.Capabilities = append(resp.Capabilities, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: c}},
		})
	}
	return resp, nil
}

// CreateVolume creates a volume record and directory, idempotently by name.
func (s *controllerServer) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if err := s.require(csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME); err != nil {
		return nil, err
	}
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return nil, err
	}
	size, err := requestedSize(req.GetCapacityRange(), DefaultVolumeSize)
	if err != nil {
		return nil, err
	}
	var sourceSnap string
	switch src := req.GetVolumeContentSource().GetType().(type) {
	case nil:
	case *csi.VolumeContentSource_Snapshot:
		if err := s.require(csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT); err != nil {
			return nil, status.Error(codes.InvalidArgument, "volume content source of type snapshot is not supported")
		}
		sourceSnap = src.Snapshot.GetSnapshotId()
		if sourceSnap == "" {
			return nil, status.Error(codes.InvalidArgument, "volume content source: snapshot_id is required")
		}
	default:
		return nil, status.Errorf(codes.InvalidArgument, "volume content source of type %T is not supported", src)
	}
	if reqs := req.GetAccessibilityRequirements().GetRequisite(); len(s.p.cfg.Topology) > 0 && len(reqs) > 0 &&
		!slices.ContainsFunc(reqs, s.p.topologyMatches) {
		return nil, status.Errorf(codes.ResourceExhausted, "no requisite topology matches the plugin's topology %v", s.p.cfg.Topology)
	}

	st := s.p.st
	st.mu.Lock()
	defer st.mu.Unlock()
	if v := st.volumeByName(req.GetName()); v != nil {
		if !fits(v.CapacityBytes, req.GetCapacityRange()) || !maps.Equal(v.Parameters, req.GetParameters()) || v.SourceSnapshotID != sourceSnap {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q exists as %s with different capacity (%d bytes), parameters or content source", req.GetName(), v.ID, v.CapacityBytes)
		}
		return &csi.CreateVolumeResponse{Volume: s.p.csiVolume(v)}, nil
	}
	if sourceSnap != "" {
		snap, ok := st.snapshots[sourceSnap]
		if !ok {
			return nil, status.Errorf(codes.NotFound, "source snapshot %q does not exist", sourceSnap)
		}
		if snap.SizeBytes > size {
			if !fits(snap.SizeBytes, req.GetCapacityRange()) {
				return nil, status.Errorf(codes.OutOfRange, "source snapshot %s has %d bytes, more than the capacity range allows", snap.ID, snap.SizeBytes)
			}
			size = snap.SizeBytes
		}
	}
	if avail := s.p.cfg.Capacity - st.usedCapacity(); size > avail {
		return nil, status.Errorf(codes.OutOfRange, "volume of %d bytes does not fit, %d bytes available", size, avail)
	}
	v := &volume{
		ID:               newID("vol-"),
		Name:             req.GetName(),
		CapacityBytes:    size,
		Parameters:       maps.Clone(req.GetParameters()),
		SourceSnapshotID: sourceSnap,
		Topology:         maps.Clone(s.p.cfg.Topology),
		CreatedAt:        time.Now().UTC(),
	}
	if err := os.MkdirAll(st.dataPath(v.ID), 0o755); err != nil {
		return nil, status.Errorf(codes.Internal, "create volume directory: %v", err)
	}
	if err := st.putVolume(v); err != nil {
		_ = os.RemoveAll(st.dataPath(v.ID))
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.CreateVolumeResponse{Volume: s.p.csiVolume(v)}, nil
}

// DeleteVolume deletes a volume's record and directory. Unknown ids succeed;
// a volume still published to a node fails with FailedPrecondition.
func (s *controllerServer) DeleteVolume(_ context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if err := s.require(csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME); err != nil {
		return nil, err
	}
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	st := s.p.st
	st.mu.Lock()
	defer st.mu.Unlock()
	v, ok := st.volumes[req.GetVolumeId()]
	if !ok {
		return &csi.DeleteVolumeResponse{}, nil
	}
	if len(v.Published) > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is still published to node(s) %s", v.ID, strings.Join(slices.Sorted(maps.Keys(v.Published)), ", "))
	}
	if err := st.deleteVolume(v); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.DeleteVolumeResponse{}, nil
}

// ControllerPublishVolume attaches a volume to a known node.
func (s *controllerServer) ControllerPublishVolume(_ context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	if err := s.require(csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME); err != nil {
		return nil, err
	}
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	case req.GetNodeId() == "":
		return nil, status.Error(codes.InvalidArgument, "node_id is required")
	}
	if err := checkCapability(req.GetVolumeCapability()); err != nil {
		return nil, err
	}
	if req.GetReadonly() && s.require(csi.ControllerServiceCapability_RPC_PUBLISH_READONLY) != nil {
		return nil, status.Error(codes.InvalidArgument, "readonly is set but PUBLISH_READONLY is not advertised")
	}
	node := req.GetNodeId()
	pub := publication{
		AccessMode: int32(req.GetVolumeCapability().GetAccessMode().GetMode()),
		Readonly:   req.GetReadonly(),
	}
	st := s.p.st
	st.mu.Lock()
	defer st.mu.Unlock()
	v, ok := st.volumes[req.GetVolumeId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist", req.GetVolumeId())
	}
	if !s.p.anyNode && !s.p.known[node] {
		return nil, status.Errorf(codes.NotFound, "node %q is not known", node)
	}
	resp := &csi.ControllerPublishVolumeResponse{PublishContext: map[string]string{
		PublishContextNodeID:   node,
		PublishContextReadonly: strconv.FormatBool(pub.Readonly),
	}}
	if old, ok := v.Published[node]; ok {
		if old != pub {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s is published to node %q with a different access mode or readonly flag", v.ID, node)
		}
		return resp, nil
	}
	for other, op := range v.Published {
		if singleNode(pub.AccessMode) || singleNode(op.AccessMode) {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is published to node %q and its access mode allows a single node", v.ID, other)
		}
	}
	if limit := s.p.cfg.MaxVolumes; limit > 0 && st.publishedTo(node) >= limit {
		return nil, status.Errorf(codes.ResourceExhausted, "node %q already has the maximum of %d volumes", node, limit)
	}
	if v.Published == nil {
		v.Published = make(map[string]publication)
	}
	v.Published[node] = pub
	if err := st.putVolume(v); err != nil {
		delete(v.Published, node)
		return nil, status.Error(codes.Internal, err.Error())
	}
	return resp, nil
}

// ControllerUnpublishVolume detaches a volume from one node, or from all
// nodes when node_id is empty. Unknown volumes and nodes succeed.
func (s *controllerServer) ControllerUnpublishVolume(_ context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	if err := s.require(csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME); err != nil {
		return nil, err
	}
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	st := s.p.st
	st.mu.Lock()
	defer st.mu.Unlock()
	v, ok := st.volumes[req.GetVolumeId()]
	if !ok {
		return &csi.ControllerUnpublishVolumeResponse{}, nil
	}
	old := maps.Clone(v.Published)
	if req.GetNodeId() == "" {
		clear(v.Published)
	} else {
		delete(v.Published, req.GetNodeId())
	}
	if len(old) == len(v.Published) {
		return &csi.ControllerUnpublishVolumeResponse{}, nil
	}
	if err := st.putVolume(v); err != nil {
		v.Published = old
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}

// ValidateVolumeCapabilities confirms capabilities the plugin can serve for
// an existing volume.
func (s *controllerServer) ValidateVolumeCapabilities(_ context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume_capabilities is required")
	}
	st := s.p.st
	st.mu.Lock()
	v, ok := st.volumes[req.GetVolumeId()]
	var params map[string]string
	if ok {
		params = v.Parameters
	}
	st.mu.Unlock()
	if !ok {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist", req.GetVolumeId())
	}
	for _, c := range req.GetVolumeCapabilities() {
		if problem := capabilityProblem(c); problem != "" {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: problem}, nil
		}
	}
	if len(req.GetParameters()) > 0 && !maps.Equal(req.GetParameters(), params) {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: "parameters differ from the volume's"}, nil
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// ListVolumes lists volumes ordered by id, in pages.
func (s *controllerServer) ListVolumes(_ context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	if err := s.require(csi.ControllerServiceCapability_RPC_LIST_VOLUMES); err != nil {
		return nil, err
	}
	after, err := parseToken(req.GetStartingToken(), req.GetMaxEntries())
	if err != nil {
		return nil, err
	}
	withNodes := slices.Contains(s.p.caps, csi.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES)
	st := s.p.st
	st.mu.Lock()
	defer st.mu.Unlock()
	ids, next := page(slices.Collect(maps.Keys(st.volumes)), after, req.GetMaxEntries())
	resp := &csi.ListVolumesResponse{NextToken: next}
	for _, id := range ids {
		v := st.volumes[id]
		e := &csi.ListVolumesResponse_Entry{Volume: s.p.csiVolume(v)}
		if withNodes {
			e.Status = &csi.ListVolumesResponse_VolumeStatus{PublishedNodeIds: slices.Sorted(maps.Keys(v.Published))}
		}
		resp.Entries = append(resp.Entries, e)
	}
	return resp, nil
}

// ControllerGetVolume returns one volume and the nodes it is published to.
func (s *controllerServer) ControllerGetVolume(_ context.Context, req *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	if err := s.require(csi.ControllerServiceCapability_RPC_GET_VOLUME); err != nil {
		return nil, err
	}
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	st := s.p.st
	st.mu.Lock()
	defer st.mu.Unlock()
	v, ok := st.volumes[req.GetVolumeId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist", req.GetVolumeId())
	}
	return &csi.ControllerGetVolumeResponse{
		Volume: s.p.csiVolume(v),
		Status: &csi.ControllerGetVolumeResponse_VolumeStatus{PublishedNodeIds: slices.Sorted(maps.Keys(v.Published))},
	}, nil
}

// GetCapacity reports the free space of the pool, or 0 for capabilities or
// a topology the plugin cannot serve.
func (s *controllerServer) GetCapacity(_ context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	if err := s.require(csi.ControllerServiceCapability_RPC_GET_CAPACITY); err != nil {
		return nil, err
	}
	for _, c := range req.GetVolumeCapabilities() {
		if capabilityProblem(c) != "" {
			return &csi.GetCapacityResponse{}, nil
		}
	}
	if t := req.GetAccessibleTopology(); t != nil && len(s.p.cfg.Topology) > 0 && !s.p.topologyMatches(t) {
		return &csi.GetCapacityResponse{}, nil
	}
	st := s.p.st
	st.mu.Lock()
	avail := max(s.p.cfg.Capacity-st.usedCapacity(), 0)
	st.mu.Unlock()
	return &csi.GetCapacityResponse{AvailableCapacity: avail, MaximumVolumeSize: wrapperspb.Int64(avail)}, nil
}

// ControllerExpandVolume grows a volume; asking for less than its size
// succeeds without change.
func (s *controllerServer) ControllerExpandVolume(_ context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	if err := s.require(csi.ControllerServiceCapability_RPC_EXPAND_VOLUME); err != nil {
		return nil, err
	}
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	if req.GetCapacityRange() == nil {
		return nil, status.Error(codes.InvalidArgument, "capacity_range is required")
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
	if size == 0 {
		return nil, status.Error(codes.InvalidArgument, "capacity_range has neither required_bytes nor limit_bytes")
	}
	st := s.p.st
	st.mu.Lock()
	defer st.mu.Unlock()
	v, ok := st.volumes[req.GetVolumeId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist", req.GetVolumeId())
	}
	if size <= v.CapacityBytes {
		return &csi.ControllerExpandVolumeResponse{CapacityBytes: v.CapacityBytes}, nil
	}
	if avail := s.p.cfg.Capacity - st.usedCapacity(); size-v.CapacityBytes > avail {
		return nil, status.Errorf(codes.OutOfRange, "growing volume %s to %d bytes needs %d bytes, %d available", v.ID, size, size-v.CapacityBytes, avail)
	}
	old := v.CapacityBytes
	v.CapacityBytes = size
	if err := st.putVolume(v); err != nil {
		v.CapacityBytes = old
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: size, NodeExpansionRequired: true}, nil
}

// CreateSnapshot records a snapshot of an existing volume, idempotently by
// name.
func (s *controllerServer) CreateSnapshot(_ context.Context, req *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	if err := s.require(csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT); err != nil {
		return nil, err
	}
	switch {
	case req.GetName() == "":
		return nil, status.Error(codes.InvalidArgument, "name is required")
	case req.GetSourceVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "source_volume_id is required")
	}
	st := s.p.st
	st.mu.Lock()
	defer st.mu.Unlock()
	if snap := st.snapshotByName(req.GetName()); snap != nil {
		if snap.SourceVolumeID != req.GetSourceVolumeId() {
			return nil, status.Errorf(codes.AlreadyExists, "snapshot %q exists as %s of volume %s", req.GetName(), snap.ID, snap.SourceVolumeID)
		}
		return &csi.CreateSnapshotResponse{Snapshot: csiSnapshot(snap)}, nil
	}
	v, ok := st.volumes[req.GetSourceVolumeId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "source volume %q does not exist", req.GetSourceVolumeId())
	}
	snap := &snapshot{
		ID:             newID("snap-"),
		Name:           req.GetName(),
		SourceVolumeID: v.ID,
		SizeBytes:      v.CapacityBytes,
		CreatedAt:      time.Now().UTC(),
	}
	if err := st.putSnapshot(snap); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.CreateSnapshotResponse{Snapshot: csiSnapshot(snap)}, nil
}

// DeleteSnapshot deletes a snapshot record; unknown ids succeed.
func (s *controllerServer) DeleteSnapshot(_ context.Context, req *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	if err := s.require(csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT); err != nil {
		return nil, err
	}
	if req.GetSnapshotId() == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot_id is required")
	}
	st := s.p.st
	st.mu.Lock()
	defer st.mu.Unlock()
	if snap, ok := st.snapshots[req.GetSnapshotId()]; ok {
		if err := st.deleteSnapshot(snap); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	return &csi.DeleteSnapshotResponse{}, nil
}

// GetSnapshot returns one snapshot.
func (s *controllerServer) GetSnapshot(_ context.Context, req *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	if err := s.require(csi.ControllerServiceCapability_RPC_GET_SNAPSHOT); err != nil {
		return nil, err
	}
	if req.GetSnapshotId() == "" {
		return nil, status.Error(codes.InvalidArgument, "snapshot_id is required")
	}
	st := s.p.st
	st.mu.Lock()
	defer st.mu.Unlock()
	snap, ok := st.snapshots[req.GetSnapshotId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "snapshot %q does not exist", req.GetSnapshotId())
	}
	return &csi.GetSnapshotResponse{Snapshot: csiSnapshot(snap)}, nil
}

// ListSnapshots lists snapshots ordered by id, in pages, optionally only one
// snapshot id or the snapshots of one source volume.
func (s *controllerServer) ListSnapshots(_ context.Context, req *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	if err := s.require(csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS); err != nil {
		return nil, err
	}
	after, err := parseToken(req.GetStartingToken(), req.GetMaxEntries())
	if err != nil {
		return nil, err
	}
	st := s.p.st
	st.mu.Lock()
	defer st.mu.Unlock()
	var ids []string
	for id, snap := range st.snapshots {
		if (req.GetSnapshotId() == "" || id == req.GetSnapshotId()) &&
			(req.GetSourceVolumeId() == "" || snap.SourceVolumeID == req.GetSourceVolumeId()) {
			ids = append(ids, id)
		}
	}
	ids, next := page(ids, after, req.GetMaxEntries())
	resp := &csi.ListSnapshotsResponse{NextToken: next}
	for _, id := range ids {
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: csiSnapshot(st.snapshots[id])})
	}
	return resp, nil
}

// csiVolume converts a volume record for the wire.
func (p *Plugin) csiVolume(v *volume) *csi.Volume {
	cv := &csi.Volume{
		VolumeId:      v.ID,
		CapacityBytes: v.CapacityBytes,
	}
	if len(v.Topology) > 0 {
		cv.AccessibleTopology = []*csi.Topology{{Segments: maps.Clone(v.Topology)}}
	}
	if v.SourceSnapshotID != "" {
		cv.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: v.SourceSnapshotID},
		}}
	}
	return cv
}

// csiSnapshot converts a snapshot record for the wire.
func csiSnapshot(s *snapshot) *csi.Snapshot {
	return &csi.Snapshot{
		SnapshotId:     s.ID,
		SourceVolumeId: s.SourceVolumeID,
		SizeBytes:      s.SizeBytes,
		CreationTime:   timestamppb.New(s.CreatedAt),
		ReadyToUse:     true,
	}
}

// parseToken checks a listing request and returns the id the page starts
// after ("" for the first page).
func parseToken(token string, maxEntries int32) (string, error) {
	if maxEntries < 0 {
		return "", status.Errorf(codes.InvalidArgument, "max_entries %d is negative", maxEntries)
	}
	if token == "" {
		return "", nil
	}
	after, ok := strings.CutPrefix(token, tokenPrefix)
	if !ok || !idRE.MatchString(after) {
		return "", status.Errorf(codes.Aborted, "starting_token %q is not a token of this plugin", token)
	}
	return after, nil
}

// page sorts ids and returns at most maxEntries (0 = all) of those after
// after, with the token of the next page or "" at the end.
func page(ids []string, after string, maxEntries int32) ([]string, string) {
	slices.Sort(ids)
	if after != "" {
		i, _ := slices.BinarySearch(ids, after)
		if i < len(ids) && ids[i] == after {
			i++
		}
		ids = ids[i:]
	}
	if maxEntries > 0 && len(ids) > int(maxEntries) {
		ids = ids[:maxEntries]
		return ids, tokenPrefix + ids[len(ids)-1]
	}
	return ids, ""
}
