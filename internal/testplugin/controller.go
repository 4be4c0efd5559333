package testplugin

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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

// CreateVolume creates a volume record and directory, idempotently by
// name. A volume with a content source starts with a copy of the
// snapshot's content or of the source volume's current content.
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
	if len(req.GetMutableParameters()) > 0 {
		if err := s.checkMutable(req.GetMutableParameters()); err != nil {
			return nil, err
		}
	}
	var sourceSnap, sourceVol string
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
	case *csi.VolumeContentSource_Volume:
		if err := s.require(csi.ControllerServiceCapability_RPC_CLONE_VOLUME); err != nil {
			return nil, status.Error(codes.InvalidArgument, "volume content source of type volume is not supported: CLONE_VOLUME is not advertised")
		}
		sourceVol = src.Volume.GetVolumeId()
		if sourceVol == "" {
			return nil, status.Error(codes.InvalidArgument, "volume content source: volume_id is required")
		}
	default:
		return nil, status.Errorf(codes.InvalidArgument, "volume content source of type %T is not supported", src)
	}
	// A node-local plugin creates on its own node whatever the requisite
	// topology says, as node-local drivers do; the answer's accessible
	// topology tells the CO where the volume is.
	if reqs := req.GetAccessibilityRequirements().GetRequisite(); !s.p.cfg.NodeLocal && len(s.p.topology) > 0 && len(reqs) > 0 &&
		!slices.ContainsFunc(reqs, s.p.topologyMatches) {
		return nil, status.Errorf(codes.ResourceExhausted, "no requisite topology matches the plugin's topology %v", s.p.topology)
	}

	st := s.p.st
	st.mu.Lock()
	defer st.mu.Unlock()
	if v := st.volumeByName(req.GetName()); v != nil {
		if !fits(v.CapacityBytes, req.GetCapacityRange()) || !maps.Equal(v.Parameters, req.GetParameters()) ||
			!maps.Equal(v.CreateMutableParameters, req.GetMutableParameters()) ||
			v.SourceSnapshotID != sourceSnap || v.SourceVolumeID != sourceVol {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q exists as %s with different capacity (%d bytes), parameters, mutable parameters or content source", req.GetName(), v.ID, v.CapacityBytes)
		}
		return &csi.CreateVolumeResponse{Volume: s.p.csiVolume(v)}, nil
	}
	var srcDir, srcName string
	var srcSize int64
	switch {
	case sourceSnap != "":
		snap, ok := st.snapshots[sourceSnap]
		if !ok {
			return nil, status.Errorf(codes.NotFound, "source snapshot %q does not exist", sourceSnap)
		}
		srcDir, srcName, srcSize = st.snapDataPath(snap.ID), "source snapshot "+snap.ID, snap.SizeBytes
	case sourceVol != "":
		src, ok := st.volumes[sourceVol]
		if !ok {
			return nil, status.Errorf(codes.NotFound, "source volume %q does not exist", sourceVol)
		}
		srcDir, srcName, srcSize = st.dataPath(src.ID), "source volume "+src.ID, src.CapacityBytes
	}
	if srcSize > size {
		if !fits(srcSize, req.GetCapacityRange()) {
			return nil, status.Errorf(codes.OutOfRange, "%s has %d bytes, more than the capacity range allows", srcName, srcSize)
		}
		size = srcSize
	}
	if avail := s.p.cfg.Capacity - st.usedCapacity(); size > avail {
		return nil, status.Errorf(codes.OutOfRange, "volume of %d bytes does not fit, %d bytes available", size, avail)
	}
	v := &volume{
		ID:                      newID("vol-"),
		Name:                    req.GetName(),
		CapacityBytes:           size,
		Parameters:              maps.Clone(req.GetParameters()),
		SourceSnapshotID:        sourceSnap,
		SourceVolumeID:          sourceVol,
		CreateMutableParameters: maps.Clone(req.GetMutableParameters()),
		MutableParameters:       maps.Clone(req.GetMutableParameters()),
		Topology:                maps.Clone(s.p.topology),
		CreatedAt:               time.Now().UTC(),
	}
	if srcDir != "" {
		if err := copyContent(srcDir, st.dataPath(v.ID), s.p.cfg.MaxContentBytes, MaxContentEntries); err != nil {
			return nil, contentStatus("copy the content of "+srcName, err)
		}
	} else if err := os.MkdirAll(st.dataPath(v.ID), 0o755); err != nil {
		return nil, status.Errorf(codes.Internal, "create volume directory: %v", err)
	}
	if err := st.putVolume(v); err != nil {
		_ = os.RemoveAll(st.dataPath(v.ID))
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.CreateVolumeResponse{Volume: s.p.csiVolume(v)}, nil
}

// checkMutable returns InvalidArgument, naming the key, unless every key of
// params is one of Config.MutableParameters with a value of at most the
// CSI string size.
func (s *controllerServer) checkMutable(params map[string]string) error {
	if err := s.require(csi.ControllerServiceCapability_RPC_MODIFY_VOLUME); err != nil {
		return status.Error(codes.InvalidArgument, "mutable_parameters are given but MODIFY_VOLUME is not advertised")
	}
	for _, k := range slices.Sorted(maps.Keys(params)) {
		if !s.p.mutable[k] {
			return status.Errorf(codes.InvalidArgument, "mutable parameter %q is not supported; supported: %s", k, strings.Join(s.p.cfg.MutableParameters, ", "))
		}
		if len(params[k]) > maxParameterValue {
			return status.Errorf(codes.InvalidArgument, "mutable parameter %q: value of %d bytes is longer than %d", k, len(params[k]), maxParameterValue)
		}
	}
	return nil
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
	s.p.forgetHealth(v.ID)
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
	if s.p.cfg.NodeLocal && node != s.p.cfg.NodeID {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is node-local: it is accessible only on node %q, not on %q", v.ID, s.p.cfg.NodeID, node)
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
	var params, mutable map[string]string
	if ok {
		params, mutable = v.Parameters, maps.Clone(v.MutableParameters)
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
	for k, val := range req.GetMutableParameters() {
		if cur, ok := mutable[k]; !ok || cur != val {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: fmt.Sprintf("mutable parameter %q differs from the volume's", k)}, nil
		}
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
		MutableParameters:  req.GetMutableParameters(),
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
	if t := req.GetAccessibleTopology(); t != nil && len(s.p.topology) > 0 && !s.p.topologyMatches(t) {
		return &csi.GetCapacityResponse{}, nil
	}
	st := s.p.st
	st.mu.Lock()
	avail := max(s.p.cfg.Capacity-st.usedCapacity(), 0)
	st.mu.Unlock()
	return &csi.GetCapacityResponse{AvailableCapacity: avail, MaximumVolumeSize: wrapperspb.Int64(avail)}, nil
}

// ControllerExpandVolume grows a volume. Asking for no more than its size
// succeeds without change, as CSI says, unless limit_bytes is below its
// size: volumes do not shrink, so that is OutOfRange. With
// ExpansionOffline a volume published to a node is FailedPrecondition.
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
	if limit := req.GetCapacityRange().GetLimitBytes(); limit > 0 && limit < v.CapacityBytes {
		return nil, status.Errorf(codes.OutOfRange, "volume %s has %d bytes, more than limit_bytes %d: volumes do not shrink", v.ID, v.CapacityBytes, limit)
	}
	if size <= v.CapacityBytes {
		return &csi.ControllerExpandVolumeResponse{CapacityBytes: v.CapacityBytes, NodeExpansionRequired: s.p.cfg.NodeExpansionRequired}, nil
	}
	if s.p.cfg.Expansion == ExpansionOffline && len(v.Published) > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is published to node(s) %s and the plugin has only OFFLINE expansion", v.ID, strings.Join(slices.Sorted(maps.Keys(v.Published)), ", "))
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
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: size, NodeExpansionRequired: s.p.cfg.NodeExpansionRequired}, nil
}

// ControllerModifyVolume sets the mutable parameters it is given on a
// volume, key by key; keys it is not given keep their values.
func (s *controllerServer) ControllerModifyVolume(_ context.Context, req *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	if err := s.require(csi.ControllerServiceCapability_RPC_MODIFY_VOLUME); err != nil {
		return nil, err
	}
	switch {
	case req.GetVolumeId() == "":
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	case len(req.GetMutableParameters()) == 0:
		return nil, status.Error(codes.InvalidArgument, "mutable_parameters is required")
	}
	if err := s.checkMutable(req.GetMutableParameters()); err != nil {
		return nil, err
	}
	st := s.p.st
	st.mu.Lock()
	defer st.mu.Unlock()
	v, ok := st.volumes[req.GetVolumeId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist", req.GetVolumeId())
	}
	old := v.MutableParameters
	v.MutableParameters = maps.Clone(old)
	if v.MutableParameters == nil {
		v.MutableParameters = make(map[string]string)
	}
	maps.Copy(v.MutableParameters, req.GetMutableParameters())
	if err := st.putVolume(v); err != nil {
		v.MutableParameters = old
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.ControllerModifyVolumeResponse{}, nil
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
	switch {
	case v.SourceSnapshotID != "":
		cv.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: v.SourceSnapshotID},
		}}
	case v.SourceVolumeID != "":
		cv.ContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
			Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: v.SourceVolumeID},
		}}
	}
	return cv
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
