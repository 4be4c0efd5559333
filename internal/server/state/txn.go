package state

import (
	"fmt"
	"sort"

	"github.com/hashicorp/go-memdb"
	"google.golang.org/protobuf/proto"

	"github.com/csisupd/csisupd/internal/server/statepb"
)

// Txn is a write transaction of the store. Only the FSM writes: it checks
// a command against what the transaction reads before it writes, so a
// refused command leaves no partial writes behind. Nothing is visible to
// readers until Commit.
type Txn struct {
	txn *memdb.Txn
}

// Write starts a write transaction. memdb allows one at a time; the FSM's
// one goroutine is the only writer.
func (s *Store) Write() *Txn {
	return &Txn{txn: s.db.Txn(true)}
}

// Commit makes the writes visible to readers.
func (t *Txn) Commit() { t.txn.Commit() }

// Abort drops the writes; after Commit it does nothing.
func (t *Txn) Abort() { t.txn.Abort() }

// Node returns one node as the transaction sees it, or nil.
func (t *Txn) Node(id string) *statepb.ClusterNode { return getNode(t.txn, id) }

// NodesNamed returns the nodes named name as the transaction sees them.
func (t *Txn) NodesNamed(name string) []*statepb.ClusterNode { return nodesNamed(t.txn, name) }

// Volume returns one volume as the transaction sees it, or nil.
func (t *Txn) Volume(id string) *statepb.Volume { return getVolume(t.txn, id) }

// Plugin returns the cluster-wide view of one plugin as the transaction
// sees it, or nil.
func (t *Txn) Plugin(id string) *ClusterPlugin { return getPlugin(t.txn, id) }

// ControllerAdvertises reports whether a controller instance of plugin
// id, healthy or not, advertises a controller capability, as the
// transaction sees it.
func (t *Txn) ControllerAdvertises(id, capability string) bool {
	return controllerAdvertises(t.txn, id, capability)
}

// Volumes returns the volumes of one plugin (all when pluginID is empty)
// as the transaction sees them, sorted by id.
func (t *Txn) Volumes(pluginID string) []*statepb.Volume {
	out, _ := volumesPage(t.txn, pluginID, "", 0)
	return out
}

// PutNode writes a node's row. Its plugin instances are written by
// SetNodePlugins.
func (t *Txn) PutNode(n *statepb.ClusterNode) error {
	if err := t.txn.Insert(tableNodes, n); err != nil {
		return fmt.Errorf("write node %q: %w", n.GetId(), err)
	}
	return nil
}

// SetNodePlugins moves a node's plugin instances from old to new in the
// plugins table and returns the ids of plugins left without any instance,
// which are thereby collected, sorted.
func (t *Txn) SetNodePlugins(nodeID string, old, new []*statepb.Plugin) ([]string, error) {
	return setNodePlugins(t.txn, nodeID, old, new)
}

// PutVolume writes a volume.
func (t *Txn) PutVolume(v *statepb.Volume) error {
	if err := t.txn.Insert(tableVolumes, v); err != nil {
		return fmt.Errorf("write volume %q: %w", v.GetId(), err)
	}
	return nil
}

// DeleteVolume deletes a volume read from this transaction.
func (t *Txn) DeleteVolume(v *statepb.Volume) error {
	if err := t.txn.Delete(tableVolumes, v); err != nil {
		return fmt.Errorf("delete volume %q: %w", v.GetId(), err)
	}
	return nil
}

// PutServer writes a server's record.
func (t *Txn) PutServer(r *statepb.ServerRecord) error {
	if err := t.txn.Insert(tableServers, r); err != nil {
		return fmt.Errorf("write server %q: %w", r.GetId(), err)
	}
	return nil
}

// SetLatestIndex records the raft index of the latest write.
func (t *Txn) SetLatestIndex(index uint64) error {
	if err := t.txn.Insert(tableIndex, &indexRow{Key: indexLatest, Value: index}); err != nil {
		return fmt.Errorf("write state index: %w", err)
	}
	return nil
}

// setNodePlugins is Txn.SetNodePlugins on a memdb transaction.
func setNodePlugins(txn *memdb.Txn, nodeID string, old, new []*statepb.Plugin) ([]string, error) {
	oldByID := make(map[string]*statepb.Plugin, len(old))
	for _, p := range old {
		oldByID[p.GetId()] = p
	}
	for _, p := range new {
		prev, had := oldByID[p.GetId()]
		delete(oldByID, p.GetId())
		if had && proto.Equal(prev, p) {
			continue
		}
		if err := txn.Insert(tablePlugins, &instanceRow{PluginID: p.GetId(), NodeID: nodeID, Plugin: p}); err != nil {
			return nil, fmt.Errorf("write plugin %q on node %q: %w", p.GetId(), nodeID, err)
		}
	}
	var gc []string
	for id := range oldByID {
		if _, err := txn.DeleteAll(tablePlugins, "id", id, nodeID); err != nil {
			return nil, fmt.Errorf("delete plugin %q on node %q: %w", id, nodeID, err)
		}
		if raw, err := txn.First(tablePlugins, "id_prefix", id); err == nil && (raw == nil || raw.(*instanceRow).PluginID != id) {
			gc = append(gc, id)
		}
	}
	sort.Strings(gc)
	return gc, nil
}

// CopyNode returns a copy of n that shares its plugin messages, which are
// never modified once stored.
func CopyNode(n *statepb.ClusterNode) *statepb.ClusterNode {
	return &statepb.ClusterNode{
		Id: n.Id, Name: n.Name, Address: n.Address, Status: n.Status, StatusDescription: n.StatusDescription,
		StatusUpdatedAt: n.StatusUpdatedAt, RegisteredAt: n.RegisteredAt, Plugins: n.Plugins,
		CreateIndex: n.CreateIndex, ModifyIndex: n.ModifyIndex, DrainingPlugins: n.DrainingPlugins,
		SecretHash: n.SecretHash, Rekeyed: n.Rekeyed, ReplacedBy: n.ReplacedBy,
	}
}
