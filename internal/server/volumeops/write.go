package volumeops

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/statepb"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// The raft writes of the volume operations, the locks they take, and the
// leadership check of an answer given without a write. Config.Apply
// returns gRPC status errors; a lock not taken in time is the status of
// its context's error.

// applyVolume writes one typed volume command through raft and returns
// the volume as stored after it (nil once deleted). The FSM refuses a
// command that no longer holds against the state (package rules), with
// the error the caller sees.
func (o *Ops) applyVolume(volumeID string, e *statepb.LogEntry) (*statepb.Volume, error) {
	if _, err := o.cfg.Apply(e); err != nil {
		return nil, err
	}
	return o.cfg.State().Volume(volumeID), nil
}

// confirmLeader checks, with a quorum, that this server still leads, for
// an answer it gives from its own state without a raft write (a release
// with nothing left to release, a claim already mounted, a volume that
// exists). A leader that was paused and lost its term unnoticed would
// otherwise acknowledge, from a state the new leader has moved past, a
// release of a claim it never saw.
func (o *Ops) confirmLeader() error {
	return o.cfg.ConfirmLeader()
}

// lockPluginAndVolume takes the plugin's lock, then the volume's, in
// the order every operation that writes a volume row takes them (create,
// register, delete), and returns what releases both.
func (o *Ops) lockPluginAndVolume(ctx context.Context, pluginID, volumeID string) (func(), error) {
	unlockPlugin, err := o.pluginLocks.Lock(ctx, pluginID)
	if err != nil {
		return nil, ctxStatus(err)
	}
	unlockVolume, err := o.volumeLocks.Lock(ctx, volumeID)
	if err != nil {
		unlockPlugin()
		return nil, ctxStatus(err)
	}
	return func() { unlockVolume(); unlockPlugin() }, nil
}

// lockVolume takes the lock of volume id and returns the volume as
// stored under it, with the function that releases the lock; an unknown
// volume is NotFound, with the lock already released.
func (o *Ops) lockVolume(ctx context.Context, id string) (*statepb.Volume, func(), error) {
	unlock, err := o.volumeLocks.Lock(ctx, id)
	if err != nil {
		return nil, nil, ctxStatus(err)
	}
	v := o.cfg.State().Volume(id)
	if v == nil {
		unlock()
		return nil, nil, status.Errorf(codes.NotFound, "volume %q not found", id)
	}
	return v, unlock, nil
}

// stepClaim writes one claim_step command and returns the volume and the
// claim as stored after it.
func (o *Ops) stepClaim(cmd *statepb.ClaimStepCommand) (*statepb.Volume, *statepb.VolumeClaim, error) {
	v, err := o.applyVolume(cmd.GetVolumeId(), &statepb.LogEntry{Command: &statepb.LogEntry_ClaimStep{ClaimStep: cmd}})
	if err != nil {
		return nil, nil, err
	}
	_, c := rules.Find(v, cmd.GetNodeId(), cmd.GetWorkloadId())
	if c == nil {
		return nil, nil, status.Errorf(codes.NotFound, "claim of %s not found", rules.Ref{VolumeID: cmd.GetVolumeId(), NodeID: cmd.GetNodeId(), WorkloadID: cmd.GetWorkloadId()})
	}
	return v, c, nil
}

// readClaim returns the stored volume and claim of ref, or nil and nil.
func (o *Ops) readClaim(ref rules.Ref) (*statepb.Volume, *statepb.VolumeClaim) {
	v := o.cfg.State().Volume(ref.VolumeID)
	if v == nil {
		return nil, nil
	}
	_, c := rules.Find(v, ref.NodeID, ref.WorkloadID)
	if c == nil {
		return v, nil
	}
	return v, c
}

// busyWriting tells the watchdog loop ctx carries (the volume watcher's)
// that a raft write, bounded by ApplyTimeout, follows.
func (o *Ops) busyWriting(ctx context.Context) {
	watchdog.Busy(ctx, time.Now().Add(o.cfg.ApplyTimeout))
}

// applySnapshot writes a snapshot_put command and returns the snapshot as
// stored.
func (o *Ops) applySnapshot(snap *statepb.VolumeSnapshot, index uint64) (*statepb.VolumeSnapshot, error) {
	if _, err := o.cfg.Apply(&statepb.LogEntry{Command: &statepb.LogEntry_SnapshotPut{
		SnapshotPut: &statepb.SnapshotPutCommand{Snapshot: snap, SnapshotIndex: index},
	}}); err != nil {
		return nil, err
	}
	stored := o.cfg.State().VolumeSnapshot(snap.GetId())
	if stored == nil {
		return nil, status.Errorf(codes.Internal, "snapshot %q: not stored after it was written", snap.GetId())
	}
	return stored, nil
}

// forgetSnapshot writes a snapshot_delete command for the stored row snap.
func (o *Ops) forgetSnapshot(snap *statepb.VolumeSnapshot) error {
	_, err := o.cfg.Apply(&statepb.LogEntry{Command: &statepb.LogEntry_SnapshotDelete{
		SnapshotDelete: &statepb.SnapshotDeleteCommand{SnapshotId: snap.GetId(), SnapshotIndex: snap.GetModifyIndex()},
	}})
	return err
}

// applyExpansion writes one volume_expand command and returns the volume
// as stored after it.
func (o *Ops) applyExpansion(cmd *statepb.VolumeExpandCommand) (*statepb.Volume, error) {
	return o.applyVolume(cmd.GetVolumeId(), &statepb.LogEntry{Command: &statepb.LogEntry_VolumeExpand{VolumeExpand: cmd}})
}

// ctxStatus turns the error of a context that ended (a lock not taken in
// time, a caller gone) into its gRPC status.
func ctxStatus(err error) error {
	return status.FromContextError(err).Err()
}
