package testplugin

import (
	"context"
	"os"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// CreateSnapshot copies the content of an existing volume into a new
// snapshot, idempotently by name: the same name and source return the
// same snapshot, another source is AlreadyExists.
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
		cs, err := s.report(snap)
		if err != nil {
			return nil, err
		}
		return &csi.CreateSnapshotResponse{Snapshot: cs}, nil
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
	if n := s.p.cfg.SnapshotReadyAfter; n > 0 {
		// This answer is the first of the n+1 that say not ready.
		snap.NotReadyReports = n + 1
	}
	if err := copyContent(st.dataPath(v.ID), st.snapDataPath(snap.ID), s.p.cfg.MaxContentBytes, MaxContentEntries); err != nil {
		return nil, contentStatus("copy the content of volume "+v.ID, err)
	}
	if err := st.putSnapshot(snap); err != nil {
		_ = os.RemoveAll(st.snapDataPath(snap.ID))
		return nil, status.Error(codes.Internal, err.Error())
	}
	cs, err := s.report(snap)
	if err != nil {
		return nil, err
	}
	return &csi.CreateSnapshotResponse{Snapshot: cs}, nil
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
	cs, err := s.report(snap)
	if err != nil {
		return nil, err
	}
	return &csi.GetSnapshotResponse{Snapshot: cs}, nil
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
		cs, err := s.report(st.snapshots[id])
		if err != nil {
			return nil, err
		}
		resp.Entries = append(resp.Entries, &csi.ListSnapshotsResponse_Entry{Snapshot: cs})
	}
	return resp, nil
}

// report converts a snapshot for an answer, counting the answer against
// Config.SnapshotReadyAfter: the snapshot is not ready while reports are
// left. A new snapshot is stored here, with its first report counted.
// Callers hold st.mu.
func (s *controllerServer) report(snap *snapshot) (*csi.Snapshot, error) {
	cs := csiSnapshot(snap)
	if snap.NotReadyReports == 0 {
		return cs, nil
	}
	cs.ReadyToUse = false
	old := *snap
	snap.NotReadyReports--
	if err := s.p.st.putSnapshot(snap); err != nil {
		*snap = old
		return nil, status.Error(codes.Internal, err.Error())
	}
	return cs, nil
}

// csiSnapshot converts a snapshot record for the wire, ready to use; see
// report for snapshots that are not ready yet.
func csiSnapshot(s *snapshot) *csi.Snapshot {
	return &csi.Snapshot{
		SnapshotId:     s.ID,
		SourceVolumeId: s.SourceVolumeID,
		SizeBytes:      s.SizeBytes,
		CreationTime:   timestamppb.New(s.CreatedAt),
		ReadyToUse:     true,
	}
}
