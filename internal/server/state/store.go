package state

import (
	"errors"
	"fmt"

	"github.com/hashicorp/go-memdb"

	"github.com/csisupd/csisupd/internal/server/statepb"
)

// Node statuses. Only ready and down are stored; initializing is how the
// leader reports a node stored ready that has not heartbeated to it since
// it took over or restored a snapshot.
const (
	NodeStatusReady        = "ready"
	NodeStatusDown         = "down"
	NodeStatusInitializing = "initializing"
)

// ErrNotFound is returned (wrapped) by state operations on a missing object.
var ErrNotFound = errors.New("not found")

// Store is the replicated state of the cluster: nodes, plugins, volumes,
// servers, and ACL policies and tokens (secrets only as hashes), held in
// go-memdb. Only the FSM writes to it. Objects returned
// by its read methods are shared and must not be modified.
type Store struct {
	db *memdb.MemDB
}

// New returns an empty state store.
func New() (*Store, error) {
	db, err := memdb.NewMemDB(schema())
	if err != nil {
		return nil, fmt.Errorf("create state store: %w", err)
	}
	return &Store{db: db}, nil
}

// LatestIndex returns the raft index of the latest write applied.
func (s *Store) LatestIndex() uint64 {
	return getIndex(s.db.Txn(false), indexLatest)
}

// Node returns one node or nil.
func (s *Store) Node(id string) *statepb.ClusterNode {
	return getNode(s.db.Txn(false), id)
}

func getNode(txn *memdb.Txn, id string) *statepb.ClusterNode {
	raw, err := txn.First(tableNodes, "id", id)
	if err != nil || raw == nil {
		return nil
	}
	return raw.(*statepb.ClusterNode)
}

// NodesNamed returns the nodes whose name is name, sorted by id.
func (s *Store) NodesNamed(name string) []*statepb.ClusterNode {
	return nodesNamed(s.db.Txn(false), name)
}

func nodesNamed(txn *memdb.Txn, name string) []*statepb.ClusterNode {
	if name == "" {
		return nil
	}
	return nodesWhere(txn, "name", name)
}

// nodesWhere returns the nodes whose index holds value, sorted by id.
func nodesWhere(txn *memdb.Txn, index, value string) []*statepb.ClusterNode {
	it, err := txn.Get(tableNodes, index, value)
	if err != nil {
		return nil
	}
	var out []*statepb.ClusterNode
	for raw := it.Next(); raw != nil; raw = it.Next() {
		out = append(out, raw.(*statepb.ClusterNode))
	}
	return out
}

// Nodes returns every node sorted by id.
func (s *Store) Nodes() []*statepb.ClusterNode {
	out, _ := s.NodesPage("", 0, nil)
	return out
}

// NodesWithStatus returns the nodes stored with status, sorted by id.
// It reads only those nodes, not every node.
func (s *Store) NodesWithStatus(status string) []*statepb.ClusterNode {
	return nodesWhere(s.db.Txn(false), "status", status)
}

// Volume returns one volume or nil.
func (s *Store) Volume(id string) *statepb.Volume {
	return getVolume(s.db.Txn(false), id)
}

func getVolume(txn *memdb.Txn, id string) *statepb.Volume {
	raw, err := txn.First(tableVolumes, "id", id)
	if err != nil || raw == nil {
		return nil
	}
	return raw.(*statepb.Volume)
}

// Volumes returns the volumes of one plugin, or all when pluginID is empty,
// sorted by id.
func (s *Store) Volumes(pluginID string) []*statepb.Volume {
	out, _ := s.VolumesPage(pluginID, "", 0)
	return out
}

// Server returns the record of one server or nil.
func (s *Store) Server(id string) *statepb.ServerRecord {
	raw, err := s.db.Txn(false).First(tableServers, "id", id)
	if err != nil || raw == nil {
		return nil
	}
	return raw.(*statepb.ServerRecord)
}

// Servers returns every server record sorted by id.
func (s *Store) Servers() []*statepb.ServerRecord {
	it, err := s.db.Txn(false).Get(tableServers, "id")
	if err != nil {
		return nil
	}
	var out []*statepb.ServerRecord
	for raw := it.Next(); raw != nil; raw = it.Next() {
		out = append(out, raw.(*statepb.ServerRecord))
	}
	return out
}
