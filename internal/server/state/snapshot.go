package state

import (
	"fmt"

	"github.com/hashicorp/go-memdb"
	"google.golang.org/protobuf/proto"

	"github.com/csisupd/csisupd/internal/server/statepb"
)

// SnapshotVersion is the version of the snapshots Snapshot writes and
// FromSnapshot reads.
const SnapshotVersion = 1

// Snapshot returns the state as one message for a raft snapshot.
func (s *Store) Snapshot() *statepb.StateSnapshot {
	return &statepb.StateSnapshot{
		Version: SnapshotVersion,
		Nodes:   s.Nodes(),
		Volumes: s.Volumes(""),
		Servers: s.Servers(),
		Index:   s.LatestIndex(),

		AclPolicies:       s.ACLPolicies(),
		AclTokens:         s.ACLTokens(),
		AclBootstrapIndex: s.ACLBootstrapIndex(),

		VolumeSnapshots: s.VolumeSnapshots(),
	}
}

// EncodeSnapshot encodes a snapshot for a raft snapshot sink.
func EncodeSnapshot(snap *statepb.StateSnapshot) ([]byte, error) {
	data, err := proto.Marshal(snap)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot: %w", err)
	}
	return data, nil
}

// DecodeSnapshot decodes what EncodeSnapshot wrote. It does not check the
// version: FromSnapshot does.
func DecodeSnapshot(data []byte) (*statepb.StateSnapshot, error) {
	var snap statepb.StateSnapshot
	if err := proto.Unmarshal(data, &snap); err != nil {
		return nil, fmt.Errorf("decode snapshot: %w", err)
	}
	return &snap, nil
}

// FromSnapshot returns a store holding the state of a snapshot, with
// index as its latest index.
func FromSnapshot(snap *statepb.StateSnapshot, index uint64) (*Store, error) {
	if snap.GetVersion() != SnapshotVersion {
		return nil, fmt.Errorf("restore snapshot: unsupported version %d", snap.GetVersion())
	}
	db, err := memdb.NewMemDB(schema())
	if err != nil {
		return nil, fmt.Errorf("restore snapshot: %w", err)
	}
	txn := db.Txn(true)
	defer txn.Abort()
	for _, n := range snap.GetNodes() {
		if err := txn.Insert(tableNodes, n); err != nil {
			return nil, fmt.Errorf("restore node %q: %w", n.GetId(), err)
		}
		if _, err := setNodePlugins(txn, n.GetId(), nil, n.GetPlugins()); err != nil {
			return nil, err
		}
	}
	for _, v := range snap.GetVolumes() {
		if err := txn.Insert(tableVolumes, v); err != nil {
			return nil, fmt.Errorf("restore volume %q: %w", v.GetId(), err)
		}
	}
	for _, r := range snap.GetServers() {
		if err := txn.Insert(tableServers, r); err != nil {
			return nil, fmt.Errorf("restore server %q: %w", r.GetId(), err)
		}
	}
	if err := restoreVolumeSnapshots(txn, snap); err != nil {
		return nil, err
	}
	if err := restoreACL(txn, snap); err != nil {
		return nil, err
	}
	if err := txn.Insert(tableIndex, &indexRow{Key: indexLatest, Value: index}); err != nil {
		return nil, fmt.Errorf("restore index: %w", err)
	}
	txn.Commit()
	return &Store{db: db}, nil
}
