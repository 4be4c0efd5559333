package state

import (
	"errors"
	"fmt"

	"github.com/hashicorp/go-memdb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// Node statuses. Only ready and down are stored; initializing is how the
// leader reports a node stored ready that has not heartbeated to it since
// it took over or restored a snapshot.
const (
	NodeStatusReady        = "ready"
	NodeStatusDown         = "down"
	NodeStatusInitializing = "initializing"
)

// Plugin types as reported by agents.
const (
	PluginTypeController = "controller"
	PluginTypeNode       = "node"
	PluginTypeMonolith   = "monolith"
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
func (s *Store) Node(id string) *csisupdv1.ClusterNode {
	return getNode(s.db.Txn(false), id)
}

func getNode(txn *memdb.Txn, id string) *csisupdv1.ClusterNode {
	raw, err := txn.First(tableNodes, "id", id)
	if err != nil || raw == nil {
		return nil
	}
	return raw.(*csisupdv1.ClusterNode)
}

// Nodes returns every node sorted by id.
func (s *Store) Nodes() []*csisupdv1.ClusterNode {
	out, _ := s.NodesPage("", 0, nil)
	return out
}

// Plugin returns the cluster-wide view of one plugin, or nil.
func (s *Store) Plugin(id string) *csisupdv1.ClusterPlugin {
	txn := s.db.Txn(false)
	it, err := txn.Get(tablePlugins, "id_prefix", id)
	if err != nil {
		return nil
	}
	var rows []*instanceRow
	for raw := it.Next(); raw != nil; raw = it.Next() {
		if r := raw.(*instanceRow); r.PluginID == id {
			rows = append(rows, r)
		}
	}
	if len(rows) == 0 {
		return nil
	}
	return buildPlugin(txn, rows)
}

// Plugins returns the cluster-wide view of every plugin, sorted by id.
func (s *Store) Plugins() []*csisupdv1.ClusterPlugin {
	out, _ := s.PluginsPage("", 0)
	return out
}

// buildPlugin aggregates the instance rows of one plugin, sorted by node
// id. An instance is healthy only when the plugin reports healthy and its
// node is ready.
func buildPlugin(txn *memdb.Txn, rows []*instanceRow) *csisupdv1.ClusterPlugin {
	out := &csisupdv1.ClusterPlugin{Id: rows[0].PluginID}
	for _, row := range rows {
		p := row.Plugin
		inst := &csisupdv1.PluginInstance{
			NodeId:            row.NodeID,
			Healthy:           p.GetHealthy(),
			HealthDescription: p.GetHealthDescription(),
			Plugin:            p,
		}
		node := getNode(txn, row.NodeID)
		if node != nil {
			inst.NodeName = node.GetName()
		}
		if node == nil || node.GetStatus() != NodeStatusReady {
			inst.Healthy = false
			inst.HealthDescription = "node is down"
		}
		controller, nodeService := PluginRoles(p.GetType())
		if controller {
			out.ControllersExpected++
			if inst.Healthy {
				out.ControllersHealthy++
			}
		}
		if nodeService {
			out.NodesExpected++
			if inst.Healthy {
				out.NodesHealthy++
			}
		}
		if out.Provider == "" || (inst.Healthy && !instHealthy(out.Instances)) {
			out.Provider, out.Version = p.GetVendorName(), p.GetVendorVersion()
		}
		out.Instances = append(out.Instances, inst)
	}
	return out
}

func instHealthy(insts []*csisupdv1.PluginInstance) bool {
	for _, i := range insts {
		if i.Healthy {
			return true
		}
	}
	return false
}

// PluginRoles reports whether a plugin type serves the controller and the
// node service.
func PluginRoles(typ string) (controller, node bool) {
	switch typ {
	case PluginTypeController:
		return true, false
	case PluginTypeNode:
		return false, true
	case PluginTypeMonolith:
		return true, true
	}
	return false, false
}

// Volume returns one volume or nil.
func (s *Store) Volume(id string) *csisupdv1.Volume {
	return getVolume(s.db.Txn(false), id)
}

func getVolume(txn *memdb.Txn, id string) *csisupdv1.Volume {
	raw, err := txn.First(tableVolumes, "id", id)
	if err != nil || raw == nil {
		return nil
	}
	return raw.(*csisupdv1.Volume)
}

// Volumes returns the volumes of one plugin, or all when pluginID is empty,
// sorted by id.
func (s *Store) Volumes(pluginID string) []*csisupdv1.Volume {
	out, _ := s.VolumesPage(pluginID, "", 0)
	return out
}

// Server returns the record of one server or nil.
func (s *Store) Server(id string) *csisupdv1.ServerRecord {
	raw, err := s.db.Txn(false).First(tableServers, "id", id)
	if err != nil || raw == nil {
		return nil
	}
	return raw.(*csisupdv1.ServerRecord)
}

// Servers returns every server record sorted by id.
func (s *Store) Servers() []*csisupdv1.ServerRecord {
	it, err := s.db.Txn(false).Get(tableServers, "id")
	if err != nil {
		return nil
	}
	var out []*csisupdv1.ServerRecord
	for raw := it.Next(); raw != nil; raw = it.Next() {
		out = append(out, raw.(*csisupdv1.ServerRecord))
	}
	return out
}
