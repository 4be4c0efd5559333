package volumeops

import (
	"context"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/csisupd/csisupd/internal/keylock"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// FollowSnapshot is the volume watcher's step for one snapshot: it
// completes a snapshot left in state creating, finishes one left in state
// deleting, and asks the plugin whether a snapshot not yet ready to use
// has become so (GetSnapshot when the plugin has it, ListSnapshots by id
// otherwise). It returns an error when the step should be tried again
// later, with backoff.
func (o *Ops) FollowSnapshot(ctx context.Context, id string) error {
	unlock, ok := o.snapshotLocks.TryLock(id)
	if !ok {
		return keylock.ErrHeld // its caller works on it
	}
	defer unlock()
	snap := o.cfg.State().VolumeSnapshot(id)
	switch {
	case snap == nil:
		return nil
	case snap.GetState() == rules.SnapshotCreating:
		_, err := o.completeSnapshot(ctx, snap, nil)
		return err
	case snap.GetState() == rules.SnapshotDeleting:
		return o.finishSnapshotDelete(ctx, snap, nil)
	case !snap.GetReadyToUse():
		return o.refreshSnapshot(ctx, snap)
	}
	return nil
}

// refreshSnapshot reads a created snapshot from the plugin and records
// whether it is ready to use, and its size.
func (o *Ops) refreshSnapshot(ctx context.Context, snap *statepb.VolumeSnapshot) error {
	cands, err := o.controllerCandidates(snap.GetPluginId())
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
		resp, err := o.cfg.Controllers.ListSnapshots(ctx, c.addr, snap.GetPluginId(), &csi.ListSnapshotsRequest{SnapshotId: snap.GetExternalId()})
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
			resp, err := o.cfg.Controllers.GetSnapshot(ctx, c.addr, snap.GetPluginId(), &csi.GetSnapshotRequest{SnapshotId: snap.GetExternalId()})
			got = resp.GetSnapshot()
			return err
		}
	}
	if _, err := o.callControllers(ctx, method, cands, read); err != nil {
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
	if _, err := o.applySnapshot(updated, snap.GetModifyIndex()); err != nil {
		return err
	}
	if !updated.GetReadyToUse() {
		return fmt.Errorf("snapshot %q is not ready to use yet", snap.GetId())
	}
	return nil
}
