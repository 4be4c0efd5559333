package fsm

import (
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// applySnapshotCommand applies snapshot_put and snapshot_delete, checked
// with the rules of package rules, and emits volume-snapshot-created when
// the plugin's snapshot is first recorded and volume-snapshot-deleted when
// a snapshot is forgotten.
func applySnapshotCommand(txn *state.Txn, index uint64, ts *timestamppb.Timestamp, cmd any, emit func(*csisupdv1.ClusterEvent)) error {
	switch c := cmd.(type) {
	case *statepb.LogEntry_SnapshotPut:
		s := c.SnapshotPut.GetSnapshot()
		old := txn.VolumeSnapshot(s.GetId())
		if err := rules.CheckSnapshotPut(old, txn.Volume(s.GetSourceVolumeId()), c.SnapshotPut); err != nil {
			return err
		}
		ns := proto.Clone(s).(*statepb.VolumeSnapshot)
		ns.ModifyIndex = index
		if old == nil {
			ns.CreateIndex, ns.CreatedAt = index, ts
		} else {
			ns.CreateIndex, ns.CreatedAt = old.GetCreateIndex(), old.GetCreatedAt()
		}
		if err := txn.PutVolumeSnapshot(ns); err != nil {
			return err
		}
		if old.GetState() == rules.SnapshotCreating && ns.GetState() == rules.SnapshotCreated {
			emit(snapshotEvent("volume-snapshot-created", ns, fmt.Sprintf("snapshot %s of volume %s created by the controller on node %s: external id %s, %d bytes, ready to use: %t",
				ns.GetId(), ns.GetSourceVolumeId(), ns.GetControllerNodeId(), ns.GetExternalId(), ns.GetSizeBytes(), ns.GetReadyToUse())))
		}
		return nil
	case *statepb.LogEntry_SnapshotDelete:
		id := c.SnapshotDelete.GetSnapshotId()
		old := txn.VolumeSnapshot(id)
		if err := rules.CheckSnapshotDelete(old, id, c.SnapshotDelete.GetSnapshotIndex()); err != nil {
			return err
		}
		if err := txn.DeleteVolumeSnapshot(old); err != nil {
			return err
		}
		emit(snapshotEvent("volume-snapshot-deleted", old, fmt.Sprintf("snapshot %s of volume %s deleted", old.GetId(), old.GetSourceVolumeId())))
		return nil
	}
	return fmt.Errorf("unknown snapshot command %T", cmd)
}

func snapshotEvent(typ string, s *statepb.VolumeSnapshot, desc string) *csisupdv1.ClusterEvent {
	return &csisupdv1.ClusterEvent{Type: typ, PluginId: s.GetPluginId(), VolumeId: s.GetSourceVolumeId(), SnapshotId: s.GetId(), Description: desc}
}
