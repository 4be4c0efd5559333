package state

import (
	"github.com/hashicorp/go-memdb"

	"github.com/csisupd/csisupd/internal/server/statepb"
)

const (
	tableNodes   = "nodes"
	tablePlugins = "plugins"
	tableVolumes = "volumes"
	tableServers = "servers"
	tableIndex   = "index"

	// indexLatest is the key in the index table of the raft index of the
	// latest write.
	indexLatest = "latest"
)

// instanceRow is one plugin on one node, as stored in the plugins table.
// A plugin id exists in the cluster while it has at least one row, so a
// plugin whose last instance goes away is collected with that row.
type instanceRow struct {
	PluginID string
	NodeID   string
	Plugin   *statepb.Plugin
}

// indexRow records a raft index: of the latest write, or of the ACL
// bootstrap.
type indexRow struct {
	Key   string
	Value uint64
}

// schema returns the memdb schema. An index names a field by its Go name:
// that of the row types here, or of the statepb messages stored as rows
// (Id, PluginId), which protoc-gen-go derives from the .proto files of statepb.
func schema() *memdb.DBSchema {
	id := func(field string) *memdb.IndexSchema {
		return &memdb.IndexSchema{Name: "id", Unique: true, Indexer: &memdb.StringFieldIndex{Field: field}}
	}
	tables := map[string]*memdb.TableSchema{
		tableNodes: {Name: tableNodes, Indexes: map[string]*memdb.IndexSchema{
			"id": id("Id"),
			// Names are unique among the nodes that hold them (see
			// rules.CheckNodeRegister), but rows of earlier releases may
			// share one, and nodes without a name have none.
			"name": {Name: "name", AllowMissing: true, Indexer: &memdb.StringFieldIndex{Field: "Name"}},
			// The volume watchers of every server look for the down nodes
			// every second; at 10,000 nodes, reading them all was most of
			// an idle leader's work.
			"status": {Name: "status", AllowMissing: true, Indexer: &memdb.StringFieldIndex{Field: "Status"}},
		}},
		tablePlugins: {Name: tablePlugins, Indexes: map[string]*memdb.IndexSchema{
			"id": {Name: "id", Unique: true, Indexer: &memdb.CompoundIndex{Indexes: []memdb.Indexer{
				&memdb.StringFieldIndex{Field: "PluginID"}, &memdb.StringFieldIndex{Field: "NodeID"},
			}}},
		}},
		tableVolumes: {Name: tableVolumes, Indexes: map[string]*memdb.IndexSchema{
			"id": id("Id"),
			"plugin_id": {Name: "plugin_id", AllowMissing: true,
				Indexer: &memdb.StringFieldIndex{Field: "PluginId"}},
		}},
		tableServers: {Name: tableServers, Indexes: map[string]*memdb.IndexSchema{"id": id("Id")}},
		tableIndex:   {Name: tableIndex, Indexes: map[string]*memdb.IndexSchema{"id": id("Key")}},

		tableVolumeSnapshots: volumeSnapshotsTable(),
	}
	for name, t := range aclTables() {
		tables[name] = t
	}
	return &memdb.DBSchema{Tables: tables}
}
