package volumeops

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
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// CreateSnapshot runs on the leader. The snapshot is recorded in
// state creating before the plugin is called, so that whatever happens to
// this leader the volume watcher finds it and completes it (CreateSnapshot
// is idempotent by name: the snapshot's id) or deletes it.
func (o *Ops) CreateSnapshot(ctx context.Context, req *csisupdv1.VolumeSnapshotCreateRequest) (*statepb.VolumeSnapshot, error) {
	if req.GetId() == "" || req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "create snapshot: id and volume_id are required")
	}
	if err := checkVolumeID("create snapshot", req.GetId()); err != nil {
		return nil, err
	}
	unlock, err := o.snapshotLocks.Lock(ctx, req.GetId())
	if err != nil {
		return nil, ctxStatus(err)
	}
	defer unlock()
	v := o.cfg.State().Volume(req.GetVolumeId())
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "create snapshot %q: volume %q not found", req.GetId(), req.GetVolumeId())
	}
	snap := o.cfg.State().VolumeSnapshot(req.GetId())
	switch {
	case snap == nil:
		if snap, err = o.recordSnapshotIntent(ctx, req); err != nil {
			return nil, err
		}
	case snap.GetSourceVolumeId() != v.GetId():
		return nil, status.Errorf(codes.AlreadyExists, "snapshot %q already exists, of volume %q", req.GetId(), snap.GetSourceVolumeId())
	case snap.GetState() == rules.SnapshotDeleting:
		return nil, status.Errorf(codes.FailedPrecondition, "snapshot %q is being deleted", req.GetId())
	case snap.GetState() == rules.SnapshotCreated:
		return snap, nil
	}
	return o.completeSnapshot(ctx, snap, req.GetSecrets())
}

// recordSnapshotIntent records a new snapshot of a volume in state
// creating. It holds the volume's lock while it does, so that a delete of
// the volume either sees the snapshot (and is refused) or is over (and
// the snapshot is refused).
func (o *Ops) recordSnapshotIntent(ctx context.Context, req *csisupdv1.VolumeSnapshotCreateRequest) (*statepb.VolumeSnapshot, error) {
	v, unlock, err := o.lockVolume(ctx, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	// Refuse early what would fail anyway, before anything is recorded.
	if _, err := o.placedControllers(v.GetPluginId(), plugin.CapCreateDeleteSnapshot, placementAt(v.GetAccessibleTopology(), v.GetControllerNodeId())); err != nil {
		return nil, err
	}
	return o.applySnapshot(&statepb.VolumeSnapshot{
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
func (o *Ops) completeSnapshot(ctx context.Context, snap *statepb.VolumeSnapshot, secrets map[string]string) (*statepb.VolumeSnapshot, error) {
	v := o.cfg.State().Volume(snap.GetSourceVolumeId())
	if v == nil {
		// The FSM refuses to delete a volume while a snapshot of it is
		// being created, so this is a snapshot of an earlier volume.
		err := status.Errorf(codes.FailedPrecondition, "snapshot %q: its volume %q is gone", snap.GetId(), snap.GetSourceVolumeId())
		return nil, errors.Join(err, o.forgetSnapshot(snap))
	}
	cands, err := o.placedControllers(v.GetPluginId(), plugin.CapCreateDeleteSnapshot, placementAt(v.GetAccessibleTopology(), v.GetControllerNodeId()))
	if err != nil {
		return nil, o.snapshotFailed(snap, err, false)
	}
	csiReq := &csi.CreateSnapshotRequest{Name: snap.GetId(), SourceVolumeId: v.GetExternalId(), Parameters: snap.GetParameters(), Secrets: secrets}
	var resp *csi.CreateSnapshotResponse
	used, err := o.callControllers(ctx, "CreateSnapshot", cands, func(ctx context.Context, c candidate) error {
		var err error
		resp, err = o.cfg.Controllers.CreateSnapshot(ctx, c.addr, v.GetPluginId(), csiReq)
		return err
	})
	if err != nil {
		return nil, o.snapshotFailed(snap, scrubbed(err, secrets), true)
	}
	done := proto.Clone(snap).(*statepb.VolumeSnapshot)
	done.State = rules.SnapshotCreated
	done.ExternalId = resp.GetSnapshot().GetSnapshotId()
	done.SizeBytes = resp.GetSnapshot().GetSizeBytes()
	done.ReadyToUse = resp.GetSnapshot().GetReadyToUse()
	done.ControllerNodeId = used.nodeID
	done.LastError = ""
	return o.applySnapshot(done, snap.GetModifyIndex())
}

// snapshotFailed handles a failed CreateSnapshot of a snapshot in state
// creating: a refusal the plugin answered (answered is set) and would
// give again forgets the snapshot, since the plugin made none; anything
// else, a controller that could not be found or reached among them (the
// plugin may have made it), is recorded as its last error, and the volume
// watcher tries again.
func (o *Ops) snapshotFailed(snap *statepb.VolumeSnapshot, callErr error, answered bool) error {
	if answered && pluginRefusal(callErr) {
		if err := o.forgetSnapshot(snap); err != nil {
			return errors.Join(callErr, fmt.Errorf("forget snapshot %q: %w", snap.GetId(), err))
		}
		return callErr
	}
	failed := proto.Clone(snap).(*statepb.VolumeSnapshot)
	failed.LastError = status.Convert(callErr).Message()
	if _, err := o.applySnapshot(failed, snap.GetModifyIndex()); err != nil {
		return errors.Join(callErr, err)
	}
	return status.Errorf(status.Code(callErr), "create snapshot %q: %s (the snapshot is recorded as being created; the cluster keeps trying)", snap.GetId(), failed.GetLastError())
}

// DeleteSnapshot runs on the leader: it records that the snapshot
// is being deleted, deletes it through a controller that reaches it, and
// forgets it. A snapshot the plugin no longer has is forgotten.
func (o *Ops) DeleteSnapshot(ctx context.Context, req *csisupdv1.VolumeSnapshotDeleteRequest) error {
	unlock, err := o.snapshotLocks.Lock(ctx, req.GetId())
	if err != nil {
		return ctxStatus(err)
	}
	defer unlock()
	snap := o.cfg.State().VolumeSnapshot(req.GetId())
	if snap == nil {
		return status.Errorf(codes.NotFound, "snapshot %q not found", req.GetId())
	}
	return o.finishSnapshotDelete(ctx, snap, req.GetSecrets())
}

// finishSnapshotDelete deletes a recorded snapshot in the plugin and
// forgets it; the caller holds its lock.
func (o *Ops) finishSnapshotDelete(ctx context.Context, snap *statepb.VolumeSnapshot, secrets map[string]string) error {
	if snap.GetState() != rules.SnapshotDeleting {
		deleting := proto.Clone(snap).(*statepb.VolumeSnapshot)
		deleting.State = rules.SnapshotDeleting
		var err error
		if snap, err = o.applySnapshot(deleting, snap.GetModifyIndex()); err != nil {
			return err
		}
	}
	// A snapshot never made by the plugin (recorded before CreateSnapshot
	// answered) may still exist there under its name; only one with an
	// external id can be deleted by id. CreateSnapshot with its name finds
	// the other, and the watcher deletes it then.
	if snap.GetExternalId() == "" {
		return o.deleteUnnamedSnapshot(ctx, snap, secrets)
	}
	cands, err := o.placedControllers(snap.GetPluginId(), plugin.CapCreateDeleteSnapshot, placementAt(snap.GetAccessibleTopology(), snap.GetControllerNodeId()))
	if err != nil {
		return o.snapshotDeleteFailed(snap, err)
	}
	csiReq := &csi.DeleteSnapshotRequest{SnapshotId: snap.GetExternalId(), Secrets: secrets}
	if _, err := o.callControllers(ctx, "DeleteSnapshot", cands, func(ctx context.Context, c candidate) error {
		err := o.cfg.Controllers.DeleteSnapshot(ctx, c.addr, snap.GetPluginId(), csiReq)
		if status.Code(err) == codes.NotFound && !csisupdv1.IsPluginNotFound(err) {
			return nil // already gone
		}
		return err
	}); err != nil {
		return o.snapshotDeleteFailed(snap, scrubbed(err, secrets))
	}
	return o.forgetSnapshot(snap)
}

// deleteUnnamedSnapshot deletes a snapshot recorded before the plugin
// answered its CreateSnapshot: CreateSnapshot with the same name returns
// the plugin's snapshot if it made one (and makes it otherwise, which is
// the only way to learn its id), and then it is deleted by id.
func (o *Ops) deleteUnnamedSnapshot(ctx context.Context, snap *statepb.VolumeSnapshot, secrets map[string]string) error {
	v := o.cfg.State().Volume(snap.GetSourceVolumeId())
	if v == nil {
		return o.forgetSnapshot(snap)
	}
	cands, err := o.placedControllers(v.GetPluginId(), plugin.CapCreateDeleteSnapshot, placementAt(v.GetAccessibleTopology(), v.GetControllerNodeId()))
	if err != nil {
		return o.snapshotDeleteFailed(snap, err)
	}
	var resp *csi.CreateSnapshotResponse
	used, err := o.callControllers(ctx, "CreateSnapshot", cands, func(ctx context.Context, c candidate) error {
		var err error
		resp, err = o.cfg.Controllers.CreateSnapshot(ctx, c.addr, v.GetPluginId(),
			&csi.CreateSnapshotRequest{Name: snap.GetId(), SourceVolumeId: v.GetExternalId(), Parameters: snap.GetParameters(), Secrets: secrets})
		return err
	})
	if err != nil {
		switch status.Code(err) {
		case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.FailedPrecondition:
			// The plugin refuses to make it, so it has none of that name.
			return o.forgetSnapshot(snap)
		}
		return o.snapshotDeleteFailed(snap, scrubbed(err, secrets))
	}
	named := proto.Clone(snap).(*statepb.VolumeSnapshot)
	named.ExternalId = resp.GetSnapshot().GetSnapshotId()
	named.ControllerNodeId = used.nodeID
	if snap, err = o.applySnapshot(named, snap.GetModifyIndex()); err != nil {
		return err
	}
	return o.finishSnapshotDelete(ctx, snap, secrets)
}

// snapshotDeleteFailed records a failed deletion on the snapshot, for the
// volume watcher to try again, and returns the failure.
//
// A refusal of the plugin's own (a snapshot it will not delete, for
// example one that volumes still depend on) puts the snapshot back in
// state created, with the refusal as its last error: trying again would
// be refused again.
func (o *Ops) snapshotDeleteFailed(snap *statepb.VolumeSnapshot, callErr error) error {
	failed := proto.Clone(snap).(*statepb.VolumeSnapshot)
	failed.LastError = status.Convert(callErr).Message()
	refused := pluginRefusal(callErr) && snap.GetExternalId() != ""
	if refused {
		failed.State = rules.SnapshotCreated
	}
	if _, err := o.applySnapshot(failed, snap.GetModifyIndex()); err != nil {
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

// scrubbed returns err with the values of secrets replaced in its
// message, keeping its gRPC code, which tells a refusal from a failure.
func scrubbed(err error, secrets map[string]string) error {
	return status.Error(status.Code(err), rules.ScrubSecrets(status.Convert(err).Message(), secrets))
}
