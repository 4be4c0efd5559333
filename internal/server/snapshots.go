package server

import (
	"context"
	"errors"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/server/leader"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// applySnapshot writes a snapshot_put command and returns the snapshot as
// stored.
func (s *Server) applySnapshot(snap *statepb.VolumeSnapshot, index uint64) (*statepb.VolumeSnapshot, error) {
	if _, err := s.node.Apply(&statepb.LogEntry{Command: &statepb.LogEntry_SnapshotPut{
		SnapshotPut: &statepb.SnapshotPutCommand{Snapshot: snap, SnapshotIndex: index},
	}}); err != nil {
		return nil, toStatus(err)
	}
	stored := s.State().VolumeSnapshot(snap.GetId())
	if stored == nil {
		return nil, status.Errorf(codes.Internal, "snapshot %q: not stored after it was written", snap.GetId())
	}
	return stored, nil
}

// forgetSnapshot writes a snapshot_delete command for the stored row snap.
func (s *Server) forgetSnapshot(snap *statepb.VolumeSnapshot) error {
	_, err := s.node.Apply(&statepb.LogEntry{Command: &statepb.LogEntry_SnapshotDelete{
		SnapshotDelete: &statepb.SnapshotDeleteCommand{SnapshotId: snap.GetId(), SnapshotIndex: snap.GetModifyIndex()},
	}})
	return toStatus(err)
}

// createVolumeSnapshot runs on the leader. The snapshot is recorded in
// state creating before the plugin is called, so that whatever happens to
// this leader the volume watcher finds it and completes it (CreateSnapshot
// is idempotent by name: the snapshot's id) or deletes it.
func (s *Server) createVolumeSnapshot(ctx context.Context, req *csisupdv1.VolumeSnapshotCreateRequest) (*statepb.VolumeSnapshot, error) {
	if req.GetId() == "" || req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "create snapshot: id and volume_id are required")
	}
	if err := checkVolumeID("create snapshot", req.GetId()); err != nil {
		return nil, err
	}
	unlock, err := s.snapshotLocks.Lock(ctx, req.GetId())
	if err != nil {
		return nil, toStatus(err)
	}
	defer unlock()
	v := s.State().Volume(req.GetVolumeId())
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "create snapshot %q: volume %q not found", req.GetId(), req.GetVolumeId())
	}
	snap := s.State().VolumeSnapshot(req.GetId())
	switch {
	case snap == nil:
		if snap, err = s.recordSnapshotIntent(ctx, req); err != nil {
			return nil, err
		}
	case snap.GetSourceVolumeId() != v.GetId():
		return nil, status.Errorf(codes.AlreadyExists, "snapshot %q already exists, of volume %q", req.GetId(), snap.GetSourceVolumeId())
	case snap.GetState() == rules.SnapshotDeleting:
		return nil, status.Errorf(codes.FailedPrecondition, "snapshot %q is being deleted", req.GetId())
	case snap.GetState() == rules.SnapshotCreated:
		return snap, nil
	}
	return s.completeSnapshot(ctx, snap, req.GetSecrets())
}

// recordSnapshotIntent records a new snapshot of a volume in state
// creating. It holds the volume's lock while it does, so that a delete of
// the volume either sees the snapshot (and is refused) or is over (and
// the snapshot is refused).
func (s *Server) recordSnapshotIntent(ctx context.Context, req *csisupdv1.VolumeSnapshotCreateRequest) (*statepb.VolumeSnapshot, error) {
	v, unlock, err := s.lockVolume(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	// Refuse early what would fail anyway, before anything is recorded.
	if _, err := s.placedControllers(v.GetPluginId(), plugin.CapCreateDeleteSnapshot, placementAt(v.GetAccessibleTopology(), v.GetControllerNodeId())); err != nil {
		return nil, err
	}
	return s.applySnapshot(&statepb.VolumeSnapshot{
		Id:                 req.GetId(),
		PluginId:           v.GetPluginId(),
		SourceVolumeId:     v.GetId(),
		Parameters:         req.GetParameters(),
		State:              rules.SnapshotCreating,
		AccessibleTopology: v.GetAccessibleTopology(),
	}, 0)
}

// completeSnapshot calls CreateSnapshot for a snapshot recorded in state
// creating and records the plugin's answer. A refusal by the plugin
// forgets the snapshot, since the plugin made none; any other failure is
// recorded on it for the volume watcher to try again. The caller holds
// the snapshot's lock.
func (s *Server) completeSnapshot(ctx context.Context, snap *statepb.VolumeSnapshot, secrets map[string]string) (*statepb.VolumeSnapshot, error) {
	v := s.State().Volume(snap.GetSourceVolumeId())
	if v == nil {
		// The FSM refuses to delete a volume while a snapshot of it is
		// being created, so this is a snapshot of an earlier volume.
		err := status.Errorf(codes.FailedPrecondition, "snapshot %q: its volume %q is gone", snap.GetId(), snap.GetSourceVolumeId())
		return nil, errors.Join(err, s.forgetSnapshot(snap))
	}
	cands, err := s.placedControllers(v.GetPluginId(), plugin.CapCreateDeleteSnapshot, placementAt(v.GetAccessibleTopology(), v.GetControllerNodeId()))
	if err != nil {
		return nil, s.snapshotFailed(snap, err, false)
	}
	csiReq := &csi.CreateSnapshotRequest{Name: snap.GetId(), SourceVolumeId: v.GetExternalId(), Parameters: snap.GetParameters(), Secrets: secrets}
	var resp *csi.CreateSnapshotResponse
	used, err := s.callControllers(ctx, "CreateSnapshot", cands, func(ctx context.Context, c candidate) error {
		var err error
		resp, err = s.controllers.CreateSnapshot(ctx, c.addr, v.GetPluginId(), csiReq)
		return err
	})
	if err != nil {
		return nil, s.snapshotFailed(snap, scrubbed(err, secrets), true)
	}
	done := proto.Clone(snap).(*statepb.VolumeSnapshot)
	done.State = rules.SnapshotCreated
	done.ExternalId = resp.GetSnapshot().GetSnapshotId()
	done.SizeBytes = resp.GetSnapshot().GetSizeBytes()
	done.ReadyToUse = resp.GetSnapshot().GetReadyToUse()
	done.ControllerNodeId = used.nodeID
	done.LastError = ""
	return s.applySnapshot(done, snap.GetModifyIndex())
}

// snapshotFailed handles a failed CreateSnapshot of a snapshot in state
// creating: a refusal the plugin answered (answered is set) and would
// give again forgets the snapshot, since the plugin made none; anything
// else, a controller that could not be found or reached among them (the
// plugin may have made it), is recorded as its last error, and the volume
// watcher tries again.
func (s *Server) snapshotFailed(snap *statepb.VolumeSnapshot, callErr error, answered bool) error {
	if answered && pluginRefusal(callErr) {
		if err := s.forgetSnapshot(snap); err != nil {
			return errors.Join(callErr, fmt.Errorf("forget snapshot %q: %w", snap.GetId(), err))
		}
		return callErr
	}
	failed := proto.Clone(snap).(*statepb.VolumeSnapshot)
	failed.LastError = status.Convert(callErr).Message()
	if _, err := s.applySnapshot(failed, snap.GetModifyIndex()); err != nil {
		return errors.Join(callErr, err)
	}
	return status.Errorf(status.Code(callErr), "create snapshot %q: %s (the snapshot is recorded as being created; the cluster keeps trying)", snap.GetId(), failed.GetLastError())
}

// deleteVolumeSnapshot runs on the leader: it records that the snapshot
// is being deleted, deletes it through a controller that reaches it, and
// forgets it. A snapshot the plugin no longer has is forgotten.
func (s *Server) deleteVolumeSnapshot(ctx context.Context, req *csisupdv1.VolumeSnapshotDeleteRequest) error {
	unlock, err := s.snapshotLocks.Lock(ctx, req.GetId())
	if err != nil {
		return toStatus(err)
	}
	defer unlock()
	snap := s.State().VolumeSnapshot(req.GetId())
	if snap == nil {
		return status.Errorf(codes.NotFound, "snapshot %q not found", req.GetId())
	}
	return s.finishSnapshotDelete(ctx, snap, req.GetSecrets())
}

// finishSnapshotDelete deletes a recorded snapshot in the plugin and
// forgets it; the caller holds its lock.
func (s *Server) finishSnapshotDelete(ctx context.Context, snap *statepb.VolumeSnapshot, secrets map[string]string) error {
	if snap.GetState() != rules.SnapshotDeleting {
		deleting := proto.Clone(snap).(*statepb.VolumeSnapshot)
		deleting.State = rules.SnapshotDeleting
		var err error
		if snap, err = s.applySnapshot(deleting, snap.GetModifyIndex()); err != nil {
			return err
		}
	}
	// A snapshot never made by the plugin (recorded before CreateSnapshot
	// answered) may still exist there under its name; only one with an
	// external id can be deleted by id. CreateSnapshot with its name finds
	// the other, and the watcher deletes it then.
	if snap.GetExternalId() == "" {
		return s.deleteUnnamedSnapshot(ctx, snap, secrets)
	}
	cands, err := s.placedControllers(snap.GetPluginId(), plugin.CapCreateDeleteSnapshot, placementAt(snap.GetAccessibleTopology(), snap.GetControllerNodeId()))
	if err != nil {
		return s.snapshotDeleteFailed(snap, err)
	}
	csiReq := &csi.DeleteSnapshotRequest{SnapshotId: snap.GetExternalId(), Secrets: secrets}
	if _, err := s.callControllers(ctx, "DeleteSnapshot", cands, func(ctx context.Context, c candidate) error {
		err := s.controllers.DeleteSnapshot(ctx, c.addr, snap.GetPluginId(), csiReq)
		if status.Code(err) == codes.NotFound && !csisupdv1.IsPluginNotFound(err) {
			return nil // already gone
		}
		return err
	}); err != nil {
		return s.snapshotDeleteFailed(snap, scrubbed(err, secrets))
	}
	return s.forgetSnapshot(snap)
}

// deleteUnnamedSnapshot deletes a snapshot recorded before the plugin
// answered its CreateSnapshot: CreateSnapshot with the same name returns
// the plugin's snapshot if it made one (and makes it otherwise, which is
// the only way to learn its id), and then it is deleted by id.
func (s *Server) deleteUnnamedSnapshot(ctx context.Context, snap *statepb.VolumeSnapshot, secrets map[string]string) error {
	v := s.State().Volume(snap.GetSourceVolumeId())
	if v == nil {
		return s.forgetSnapshot(snap)
	}
	cands, err := s.placedControllers(v.GetPluginId(), plugin.CapCreateDeleteSnapshot, placementAt(v.GetAccessibleTopology(), v.GetControllerNodeId()))
	if err != nil {
		return s.snapshotDeleteFailed(snap, err)
	}
	var resp *csi.CreateSnapshotResponse
	used, err := s.callControllers(ctx, "CreateSnapshot", cands, func(ctx context.Context, c candidate) error {
		var err error
		resp, err = s.controllers.CreateSnapshot(ctx, c.addr, v.GetPluginId(),
			&csi.CreateSnapshotRequest{Name: snap.GetId(), SourceVolumeId: v.GetExternalId(), Parameters: snap.GetParameters(), Secrets: secrets})
		return err
	})
	if err != nil {
		switch status.Code(err) {
		case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.FailedPrecondition:
			// The plugin refuses to make it, so it has none of that name.
			return s.forgetSnapshot(snap)
		}
		return s.snapshotDeleteFailed(snap, scrubbed(err, secrets))
	}
	named := proto.Clone(snap).(*statepb.VolumeSnapshot)
	named.ExternalId = resp.GetSnapshot().GetSnapshotId()
	named.ControllerNodeId = used.nodeID
	if snap, err = s.applySnapshot(named, snap.GetModifyIndex()); err != nil {
		return err
	}
	return s.finishSnapshotDelete(ctx, snap, secrets)
}

// snapshotDeleteFailed records a failed deletion on the snapshot, for the
// volume watcher to try again, and returns the failure.
//
// A refusal of the plugin's own (a snapshot it will not delete, for
// example one that volumes still depend on) puts the snapshot back in
// state created, with the refusal as its last error: trying again would
// be refused again.
func (s *Server) snapshotDeleteFailed(snap *statepb.VolumeSnapshot, callErr error) error {
	failed := proto.Clone(snap).(*statepb.VolumeSnapshot)
	failed.LastError = status.Convert(callErr).Message()
	refused := pluginRefusal(callErr) && snap.GetExternalId() != ""
	if refused {
		failed.State = rules.SnapshotCreated
	}
	if _, err := s.applySnapshot(failed, snap.GetModifyIndex()); err != nil {
		return errors.Join(callErr, err)
	}
	if refused {
		return status.Errorf(status.Code(callErr), "delete snapshot %q: %s (the plugin refused; the snapshot is kept)", snap.GetId(), failed.GetLastError())
	}
	return status.Errorf(status.Code(callErr), "delete snapshot %q: %s (the snapshot is recorded as being deleted; the cluster keeps trying)", snap.GetId(), failed.GetLastError())
}

// pluginRefusal reports whether err is a plugin's answer that the same
// call would get again: not a failure to reach it, and not a
// TopologyUnsatisfiable of the cluster's (a node may come back).
func pluginRefusal(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.FailedPrecondition, codes.Unimplemented, codes.PermissionDenied, codes.OutOfRange:
		_, topo := csisupdv1.ErrorDetail[*csisupdv1.TopologyUnsatisfiable](err)
		return !topo
	}
	return false
}

// followSnapshot is the volume watcher's step for one snapshot: it
// completes a snapshot left in state creating, finishes one left in state
// deleting, and asks the plugin whether a snapshot not yet ready to use
// has become so (GetSnapshot when the plugin has it, ListSnapshots by id
// otherwise). It returns an error when the step should be tried again
// later, with backoff.
func (s *Server) followSnapshot(ctx context.Context, id string) error {
	unlock, ok := s.snapshotLocks.TryLock(id)
	if !ok {
		return leader.ErrBusy // its caller works on it
	}
	defer unlock()
	snap := s.State().VolumeSnapshot(id)
	switch {
	case snap == nil:
		return nil
	case snap.GetState() == rules.SnapshotCreating:
		_, err := s.completeSnapshot(ctx, snap, nil)
		return err
	case snap.GetState() == rules.SnapshotDeleting:
		return s.finishSnapshotDelete(ctx, snap, nil)
	case !snap.GetReadyToUse():
		return s.refreshSnapshot(ctx, snap)
	}
	return nil
}

// refreshSnapshot reads a created snapshot from the plugin and records
// whether it is ready to use, and its size.
func (s *Server) refreshSnapshot(ctx context.Context, snap *statepb.VolumeSnapshot) error {
	cands, err := s.controllerCandidates(snap.GetPluginId())
	if err != nil {
		return err
	}
	place := placementAt(snap.GetAccessibleTopology(), snap.GetControllerNodeId())
	cands = place.rank(cands)
	if len(cands) == 0 {
		return place.unsatisfiable(snap.GetPluginId(), nil)
	}
	var got *csi.Snapshot
	read := func(ctx context.Context, c candidate) error {
		resp, err := s.controllers.ListSnapshots(ctx, c.addr, snap.GetPluginId(), &csi.ListSnapshotsRequest{SnapshotId: snap.GetExternalId()})
		if err != nil {
			return err
		}
		for _, e := range resp.GetEntries() {
			if e.GetSnapshot().GetSnapshotId() == snap.GetExternalId() {
				got = e.GetSnapshot()
			}
		}
		return nil
	}
	method := "ListSnapshots"
	if withGet := withCapability(cands, plugin.CapGetSnapshot); len(withGet) > 0 {
		cands, method = withGet, "GetSnapshot"
		read = func(ctx context.Context, c candidate) error {
			resp, err := s.controllers.GetSnapshot(ctx, c.addr, snap.GetPluginId(), &csi.GetSnapshotRequest{SnapshotId: snap.GetExternalId()})
			got = resp.GetSnapshot()
			return err
		}
	}
	if _, err := s.callControllers(ctx, method, cands, read); err != nil {
		return err
	}
	if got == nil {
		return status.Errorf(codes.NotFound, "snapshot %q (external id %q): the plugin does not list it", snap.GetId(), snap.GetExternalId())
	}
	if got.GetReadyToUse() == snap.GetReadyToUse() && got.GetSizeBytes() == snap.GetSizeBytes() {
		return fmt.Errorf("snapshot %q is not ready to use yet", snap.GetId())
	}
	updated := proto.Clone(snap).(*statepb.VolumeSnapshot)
	updated.ReadyToUse, updated.SizeBytes, updated.LastError = got.GetReadyToUse(), got.GetSizeBytes(), ""
	if _, err := s.applySnapshot(updated, snap.GetModifyIndex()); err != nil {
		return err
	}
	if !updated.GetReadyToUse() {
		return fmt.Errorf("snapshot %q is not ready to use yet", snap.GetId())
	}
	return nil
}

// scrubbed returns err with the values of secrets replaced in its
// message, keeping its gRPC code, which tells a refusal from a failure.
func scrubbed(err error, secrets map[string]string) error {
	return status.Error(status.Code(err), rules.ScrubSecrets(status.Convert(err).Message(), secrets))
}
