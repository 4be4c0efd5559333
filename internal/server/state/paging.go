package state

import (
	"github.com/hashicorp/go-memdb"

	"github.com/csisupd/csisupd/internal/server/statepb"
)

// NodesPage returns, sorted by id, up to limit nodes (0: every node) whose
// id is at least from and for which keep (nil keeps all) is true, and the id
// of the next such node when more remain.
func (s *Store) NodesPage(from string, limit int, keep func(*statepb.ClusterNode) bool) ([]*statepb.ClusterNode, string) {
	return tablePage(s.db.Txn(false), tableNodes, from, limit, keep, (*statepb.ClusterNode).GetId)
}

// tablePage reads a table keyed by id from the first id at least from, and
// returns up to limit rows (0: every row) for which keep (nil keeps all)
// is true, and the id of the next such row when more remain.
func tablePage[T any](txn *memdb.Txn, table, from string, limit int, keep func(T) bool, id func(T) string) ([]T, string) {
	it, err := txn.LowerBound(table, "id", from)
	if err != nil {
		return nil, ""
	}
	var out []T
	for raw := it.Next(); raw != nil; raw = it.Next() {
		row := raw.(T)
		if keep != nil && !keep(row) {
			continue
		}
		if limit > 0 && len(out) == limit {
			return out, id(row)
		}
		out = append(out, row)
	}
	return out, ""
}

// PluginsPage returns, sorted by id, up to limit plugins (0: every
// plugin) whose id is at least from, and the id of the next plugin when
// more remain.
func (s *Store) PluginsPage(from string, limit int) ([]*ClusterPlugin, string) {
	txn := s.db.Txn(false)
	// The plugins table is keyed by (plugin, node); an empty node id sorts
	// before every real one, so this starts at the first row of from.
	it, err := txn.LowerBound(tablePlugins, "id", from, "")
	if err != nil {
		return nil, ""
	}
	var out []*ClusterPlugin
	var rows []*instanceRow
	for raw := it.Next(); ; raw = it.Next() {
		if raw == nil || (len(rows) > 0 && raw.(*instanceRow).PluginID != rows[0].PluginID) {
			if len(rows) > 0 {
				out = append(out, buildPlugin(txn, rows))
			}
			rows = rows[:0]
		}
		if raw == nil {
			return out, ""
		}
		row := raw.(*instanceRow)
		if len(rows) == 0 && limit > 0 && len(out) == limit {
			return out, row.PluginID
		}
		rows = append(rows, row)
	}
}

// VolumesPage returns, sorted by id, up to limit volumes (0: every volume)
// of one plugin (all when pluginID is empty) whose id is at least from, and
// the id of the next such volume when more remain.
func (s *Store) VolumesPage(pluginID, from string, limit int) ([]*statepb.Volume, string) {
	return volumesPage(s.db.Txn(false), pluginID, from, limit)
}

func volumesPage(txn *memdb.Txn, pluginID, from string, limit int) ([]*statepb.Volume, string) {
	var keep func(*statepb.Volume) bool
	if pluginID != "" {
		keep = func(v *statepb.Volume) bool { return v.GetPluginId() == pluginID }
	}
	return tablePage(txn, tableVolumes, from, limit, keep, (*statepb.Volume).GetId)
}

// NodeFilter returns the filter of a node list: the nodes that run a
// plugin (any when pluginID is empty) and whose status, as statusOf tells
// it, is nodeStatus (any when empty). It is nil when it keeps every node.
func NodeFilter(pluginID, nodeStatus string, statusOf func(*statepb.ClusterNode) string) func(*statepb.ClusterNode) bool {
	if pluginID == "" && nodeStatus == "" {
		return nil
	}
	return func(n *statepb.ClusterNode) bool {
		if nodeStatus != "" && statusOf(n) != nodeStatus {
			return false
		}
		if pluginID == "" {
			return true
		}
		for _, p := range n.GetPlugins() {
			if p.GetId() == pluginID {
				return true
			}
		}
		return false
	}
}
