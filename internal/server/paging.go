package server

import (
	"encoding/base64"
	"unicode/utf8"

	"github.com/hashicorp/go-memdb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// MaxListPageSize is the largest page_size a Control list accepts: a
// bigger page would hold the leader's CPU and a message buffer for one
// call as long as an unbounded list does.
const MaxListPageSize = 1000

// listPage is one page request, checked: limit 0 means no limit, from is
// the id the page starts at ("" for the first page).
type listPage struct {
	limit int
	from  string
}

// parsePage checks page_size and decodes next_token. The token is the id
// the next page starts at, encoded so clients treat it as opaque; resuming
// from an id, not an offset, keeps paging stable while objects are added
// or removed between pages.
func parsePage(pageSize uint32, token string) (listPage, error) {
	if pageSize > MaxListPageSize {
		return listPage{}, status.Errorf(codes.InvalidArgument, "page_size %d is above the maximum of %d", pageSize, MaxListPageSize)
	}
	p := listPage{limit: int(pageSize)}
	if token == "" {
		return p, nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(token)
	if err != nil || len(raw) == 0 || !utf8.Valid(raw) {
		return listPage{}, status.Errorf(codes.InvalidArgument, "next_token %q is not a token of a previous page", token)
	}
	p.from = string(raw)
	return p, nil
}

// pageToken encodes the id the next page starts at; "" when none remains.
func pageToken(nextID string) string {
	if nextID == "" {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString([]byte(nextID))
}

// responseToken is the next_token field of a list response: unset on the
// last page, so the JSON of a complete list keeps its fields.
func responseToken(nextID string) *string {
	if nextID == "" {
		return nil
	}
	return proto.String(pageToken(nextID))
}

// NodesPage returns, sorted by id, up to limit nodes (0: every node) whose
// id is at least from and for which keep (nil keeps all) is true, and the id
// of the next such node when more remain.
func (s *StateStore) NodesPage(from string, limit int, keep func(*csisupdv1.ClusterNode) bool) ([]*csisupdv1.ClusterNode, string) {
	return tablePage(s.db.Txn(false), tableNodes, from, limit, keep, (*csisupdv1.ClusterNode).GetId)
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
func (s *StateStore) PluginsPage(from string, limit int) ([]*csisupdv1.ClusterPlugin, string) {
	txn := s.db.Txn(false)
	// The plugins table is keyed by (plugin, node); an empty node id sorts
	// before every real one, so this starts at the first row of from.
	it, err := txn.LowerBound(tablePlugins, "id", from, "")
	if err != nil {
		return nil, ""
	}
	var out []*csisupdv1.ClusterPlugin
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
func (s *StateStore) VolumesPage(pluginID, from string, limit int) ([]*csisupdv1.Volume, string) {
	var keep func(*csisupdv1.Volume) bool
	if pluginID != "" {
		keep = func(v *csisupdv1.Volume) bool { return v.GetPluginId() == pluginID }
	}
	return tablePage(s.db.Txn(false), tableVolumes, from, limit, keep, (*csisupdv1.Volume).GetId)
}

// nodeFilter returns the filter of a node list request, nil when it
// keeps every node.
func nodeFilter(pluginID, nodeStatus string, statusOf func(*csisupdv1.ClusterNode) string) func(*csisupdv1.ClusterNode) bool {
	if pluginID == "" && nodeStatus == "" {
		return nil
	}
	return func(n *csisupdv1.ClusterNode) bool {
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
