package state

import (
	"fmt"

	"github.com/hashicorp/go-memdb"

	"github.com/csisupd/csisupd/internal/server/statepb"
)

// tableVolumeSnapshots holds the snapshots of volumes, by id.
const tableVolumeSnapshots = "volume_snapshots"

// volumeSnapshotsTable is the schema of the volume snapshots table.
func volumeSnapshotsTable() *memdb.TableSchema {
	return &memdb.TableSchema{Name: tableVolumeSnapshots, Indexes: map[string]*memdb.IndexSchema{
		"id": {Name: "id", Unique: true, Indexer: &memdb.StringFieldIndex{Field: "Id"}},
	}}
}

// VolumeSnapshot returns one volume snapshot, or nil.
func (s *Store) VolumeSnapshot(id string) *statepb.VolumeSnapshot {
	return getVolumeSnapshot(s.db.Txn(false), id)
}

func getVolumeSnapshot(txn *memdb.Txn, id string) *statepb.VolumeSnapshot {
	raw, err := txn.First(tableVolumeSnapshots, "id", id)
	if err != nil || raw == nil {
		return nil
	}
	return raw.(*statepb.VolumeSnapshot)
}

// VolumeSnapshots returns every volume snapshot, sorted by id.
func (s *Store) VolumeSnapshots() []*statepb.VolumeSnapshot {
	out, _ := s.VolumeSnapshotsPage("", 0, nil)
	return out
}

// VolumeSnapshotsPage returns, sorted by id, up to limit snapshots (0:
// all) that keep keeps (all when nil) whose id is at least from, and the
// id of the next such snapshot when more remain.
func (s *Store) VolumeSnapshotsPage(from string, limit int, keep func(*statepb.VolumeSnapshot) bool) ([]*statepb.VolumeSnapshot, string) {
	return tablePage(s.db.Txn(false), tableVolumeSnapshots, from, limit, keep, (*statepb.VolumeSnapshot).GetId)
}

// VolumeSnapshot returns one volume snapshot as the transaction sees it,
// or nil.
func (t *Txn) VolumeSnapshot(id string) *statepb.VolumeSnapshot { return getVolumeSnapshot(t.txn, id) }

// VolumeSnapshots returns every volume snapshot as the transaction sees
// them, sorted by id.
func (t *Txn) VolumeSnapshots() []*statepb.VolumeSnapshot {
	out, _ := tablePage(t.txn, tableVolumeSnapshots, "", 0, nil, (*statepb.VolumeSnapshot).GetId)
	return out
}

// PutVolumeSnapshot writes a volume snapshot.
func (t *Txn) PutVolumeSnapshot(s *statepb.VolumeSnapshot) error {
	if err := t.txn.Insert(tableVolumeSnapshots, s); err != nil {
		return fmt.Errorf("write volume snapshot %q: %w", s.GetId(), err)
	}
	return nil
}

// DeleteVolumeSnapshot deletes a volume snapshot read from this
// transaction.
func (t *Txn) DeleteVolumeSnapshot(s *statepb.VolumeSnapshot) error {
	if err := t.txn.Delete(tableVolumeSnapshots, s); err != nil {
		return fmt.Errorf("delete volume snapshot %q: %w", s.GetId(), err)
	}
	return nil
}

// restoreVolumeSnapshots inserts a state snapshot's volume snapshots.
func restoreVolumeSnapshots(txn *memdb.Txn, snap *statepb.StateSnapshot) error {
	for _, s := range snap.GetVolumeSnapshots() {
		if err := txn.Insert(tableVolumeSnapshots, s); err != nil {
			return fmt.Errorf("restore volume snapshot %q: %w", s.GetId(), err)
		}
	}
	return nil
}
