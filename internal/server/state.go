package server

import (
	"errors"
	"fmt"
	"sort"

	"github.com/hashicorp/go-memdb"
	"google.golang.org/protobuf/proto"

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
	pluginTypeController = "controller"
	pluginTypeNode       = "node"
	pluginTypeMonolith   = "monolith"
)

const (
	tableNodes   = "nodes"
	tablePlugins = "plugins"
	tableVolumes = "volumes"
	tableServers = "servers"
	tableIndex   = "index"
)

// ErrNotFound is returned (wrapped) by state operations on a missing object.
var ErrNotFound = errors.New("not found")

// instanceRow is one plugin on one node, as stored in the plugins table.
// A plugin id exists in the cluster while it has at least one row, so a
// plugin whose last instance goes away is collected with that row.
type instanceRow struct {
	PluginID string
	NodeID   string
	Plugin   *csisupdv1.Plugin
}

// indexRow records the raft index of the latest write.
type indexRow struct {
	Key   string
	Value uint64
}

func stateSchema() *memdb.DBSchema {
	id := func(field string) *memdb.IndexSchema {
		return &memdb.IndexSchema{Name: "id", Unique: true, Indexer: &memdb.StringFieldIndex{Field: field}}
	}
	tables := map[string]*memdb.TableSchema{
		tableNodes: {Name: tableNodes, Indexes: map[string]*memdb.IndexSchema{"id": id("Id")}},
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
	}
	for name, t := range aclTables() {
		tables[name] = t
	}
	return &memdb.DBSchema{Tables: tables}
}

// StateStore is the replicated state of the cluster: nodes, plugins, volumes,
// servers, and ACL policies and tokens (secrets only as hashes), held in
// go-memdb. Only the FSM writes to it. Objects returned
// by its read methods are shared and must not be modified.
type StateStore struct {
	db *memdb.MemDB
}

// NewStateStore returns an empty state store.
func NewStateStore() (*StateStore, error) {
	db, err := memdb.NewMemDB(stateSchema())
	if err != nil {
		return nil, fmt.Errorf("create state store: %w", err)
	}
	return &StateStore{db: db}, nil
}

// LatestIndex returns the raft index of the latest write applied.
func (s *StateStore) LatestIndex() uint64 {
	raw, err := s.db.Txn(false).First(tableIndex, "id", "latest")
	if err != nil || raw == nil {
		return 0
	}
	return raw.(*indexRow).Value
}

// Node returns one node or nil.
func (s *StateStore) Node(id string) *csisupdv1.ClusterNode {
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
func (s *StateStore) Nodes() []*csisupdv1.ClusterNode {
	out, _ := s.NodesPage("", 0, nil)
	return out
}

// Plugin returns the cluster-wide view of one plugin, or nil.
func (s *StateStore) Plugin(id string) *csisupdv1.ClusterPlugin {
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
func (s *StateStore) Plugins() []*csisupdv1.ClusterPlugin {
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
		controller, nodeService := pluginRoles(p.GetType())
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

// pluginRoles reports whether a plugin type serves the controller and the
// node service.
func pluginRoles(typ string) (controller, node bool) {
	switch typ {
	case pluginTypeController:
		return true, false
	case pluginTypeNode:
		return false, true
	case pluginTypeMonolith:
		return true, true
	}
	return false, false
}

// Volume returns one volume or nil.
func (s *StateStore) Volume(id string) *csisupdv1.Volume {
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
func (s *StateStore) Volumes(pluginID string) []*csisupdv1.Volume {
	out, _ := s.VolumesPage(pluginID, "", 0)
	return out
}

// Server returns the record of one server or nil.
func (s *StateStore) Server(id string) *csisupdv1.ServerRecord {
	raw, err := s.db.Txn(false).First(tableServers, "id", id)
	if err != nil || raw == nil {
		return nil
	}
	return raw.(*csisupdv1.ServerRecord)
}

// Servers returns every server record sorted by id.
func (s *StateStore) Servers() []*csisupdv1.ServerRecord {
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

// snapshot returns the state as one message for a raft snapshot.
func (s *StateStore) snapshot() *csisupdv1.StateSnapshot {
	return &csisupdv1.StateSnapshot{
		Version: 1,
		Nodes:   s.Nodes(),
		Volumes: s.Volumes(""),
		Servers: s.Servers(),
		Index:   s.LatestIndex(),

		AclPolicies:       s.ACLPolicies(),
		AclTokens:         s.ACLTokens(),
		AclBootstrapIndex: s.ACLBootstrapIndex(),
	}
}

// restore replaces the state with a snapshot.
func (s *StateStore) restore(snap *csisupdv1.StateSnapshot, index uint64) error {
	if snap.GetVersion() != 1 {
		return fmt.Errorf("restore snapshot: unsupported version %d", snap.GetVersion())
	}
	db, err := memdb.NewMemDB(stateSchema())
	if err != nil {
		return fmt.Errorf("restore snapshot: %w", err)
	}
	txn := db.Txn(true)
	defer txn.Abort()
	for _, n := range snap.GetNodes() {
		if err := txn.Insert(tableNodes, n); err != nil {
			return fmt.Errorf("restore node %q: %w", n.GetId(), err)
		}
		if err := setNodePlugins(txn, n.GetId(), nil, n.GetPlugins()); err != nil {
			return err
		}
	}
	for _, v := range snap.GetVolumes() {
		if err := txn.Insert(tableVolumes, v); err != nil {
			return fmt.Errorf("restore volume %q: %w", v.GetId(), err)
		}
	}
	for _, r := range snap.GetServers() {
		if err := txn.Insert(tableServers, r); err != nil {
			return fmt.Errorf("restore server %q: %w", r.GetId(), err)
		}
	}
	if err := restoreACL(txn, snap); err != nil {
		return err
	}
	if err := txn.Insert(tableIndex, &indexRow{Key: "latest", Value: index}); err != nil {
		return fmt.Errorf("restore index: %w", err)
	}
	txn.Commit()
	s.db = db
	return nil
}

// setNodePlugins moves a node's plugin instances from old to new in the
// plugins table.
func setNodePlugins(txn *memdb.Txn, nodeID string, old, new []*csisupdv1.Plugin) error {
	_, err := setNodePluginsGC(txn, nodeID, old, new)
	return err
}

// setNodePluginsGC is setNodePlugins that also returns the ids of plugins
// left without any instance, which are thereby collected.
func setNodePluginsGC(txn *memdb.Txn, nodeID string, old, new []*csisupdv1.Plugin) ([]string, error) {
	oldByID := make(map[string]*csisupdv1.Plugin, len(old))
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

// sortedPlugins sorts plugins by id in place and returns them. The FSM owns
// the messages of a freshly decoded log entry, so they are not copied.
func sortedPlugins(in []*csisupdv1.Plugin) []*csisupdv1.Plugin {
	sort.Slice(in, func(i, j int) bool { return in[i].GetId() < in[j].GetId() })
	return in
}

// copyNode returns a copy of n that shares its plugin messages, which are
// never modified once stored.
func copyNode(n *csisupdv1.ClusterNode) *csisupdv1.ClusterNode {
	return &csisupdv1.ClusterNode{
		Id: n.Id, Name: n.Name, Address: n.Address, Status: n.Status, StatusDescription: n.StatusDescription,
		StatusUpdatedAt: n.StatusUpdatedAt, RegisteredAt: n.RegisteredAt, Plugins: n.Plugins,
		CreateIndex: n.CreateIndex, ModifyIndex: n.ModifyIndex,
	}
}

// applyResult is what the FSM returns for one log entry. For a LogBatch,
// Errs holds one result per batched entry.
type applyResult struct {
	Index uint64
	Err   error
	Errs  []error
}

// applyEntry applies one log entry to txn and appends the events it causes.
func applyEntry(txn *memdb.Txn, index uint64, e *csisupdv1.LogEntry, events *[]*csisupdv1.ClusterEvent) error {
	ts := e.GetTime()
	ev := func(typ, node, plugin, volume, desc string) {
		*events = append(*events, &csisupdv1.ClusterEvent{
			Index: index, Time: ts, Type: typ,
			NodeId: node, PluginId: plugin, VolumeId: volume, Description: desc,
		})
	}
	switch c := e.GetCommand().(type) {
	case *csisupdv1.LogEntry_Batch:
		var firstErr error
		for _, sub := range c.Batch.GetEntries() {
			if err := applyEntry(txn, index, sub, events); err != nil && firstErr == nil {
				firstErr = err
			}
		}
		return firstErr
	case *csisupdv1.LogEntry_Noop:
		return nil
	case *csisupdv1.LogEntry_NodeUpsert:
		n := c.NodeUpsert
		n.Plugins = sortedPlugins(n.Plugins)
		n.ModifyIndex = index
		n.CreateIndex = index
		n.Status = NodeStatusReady
		n.StatusUpdatedAt = ts
		n.RegisteredAt = ts
		var oldPlugins []*csisupdv1.Plugin
		if old := getNode(txn, n.GetId()); old != nil {
			n.CreateIndex = old.GetCreateIndex()
			oldPlugins = old.GetPlugins()
		}
		if err := txn.Insert(tableNodes, n); err != nil {
			return fmt.Errorf("write node %q: %w", n.GetId(), err)
		}
		gc, err := setNodePluginsGC(txn, n.GetId(), oldPlugins, n.Plugins)
		if err != nil {
			return err
		}
		ev("node-registered", n.GetId(), "", "", fmt.Sprintf("node %s registered with %d plugins", n.GetName(), len(n.Plugins)))
		for _, id := range gc {
			ev("plugin-gc", n.GetId(), id, "", "plugin has no instances left")
		}
	case *csisupdv1.LogEntry_NodePlugins:
		old := getNode(txn, c.NodePlugins.GetNodeId())
		if old == nil {
			return fmt.Errorf("node %q: %w", c.NodePlugins.GetNodeId(), ErrNotFound)
		}
		n := copyNode(old)
		n.Plugins = sortedPlugins(c.NodePlugins.GetPlugins())
		n.ModifyIndex = index
		if err := txn.Insert(tableNodes, n); err != nil {
			return fmt.Errorf("write node %q: %w", n.GetId(), err)
		}
		gc, err := setNodePluginsGC(txn, n.GetId(), old.GetPlugins(), n.Plugins)
		if err != nil {
			return err
		}
		ev("node-plugins-updated", n.GetId(), "", "", fmt.Sprintf("%d plugins", len(n.Plugins)))
		for _, id := range gc {
			ev("plugin-gc", n.GetId(), id, "", "plugin has no instances left")
		}
	case *csisupdv1.LogEntry_NodeStatus:
		old := getNode(txn, c.NodeStatus.GetNodeId())
		if old == nil {
			return fmt.Errorf("node %q: %w", c.NodeStatus.GetNodeId(), ErrNotFound)
		}
		if old.GetStatus() == c.NodeStatus.GetStatus() {
			return nil
		}
		n := copyNode(old)
		n.Status = c.NodeStatus.GetStatus()
		n.StatusDescription = c.NodeStatus.GetDescription()
		n.StatusUpdatedAt = ts
		n.ModifyIndex = index
		if err := txn.Insert(tableNodes, n); err != nil {
			return fmt.Errorf("write node %q: %w", n.GetId(), err)
		}
		ev("node-"+n.Status, n.GetId(), "", "", n.StatusDescription)
	case *csisupdv1.LogEntry_VolumeUpsert:
		v := c.VolumeUpsert
		v.ModifyIndex = index
		// A claim is given the index of the write that added it.
		for _, cl := range v.GetClaims() {
			if cl.GetClaimIndex() == 0 {
				cl.ClaimIndex = index
			}
		}
		old := getVolume(txn, v.GetId())
		var changes []volumeEvent
		if old != nil {
			v.CreateIndex = old.GetCreateIndex()
			v.CreatedAt = old.GetCreatedAt()
			changes = volumeChanges(old, v)
		} else {
			v.CreateIndex = index
			if v.CreatedAt == nil {
				v.CreatedAt = ts
			}
			changes = []volumeEvent{{typ: "volume-created"}}
		}
		if err := txn.Insert(tableVolumes, v); err != nil {
			return fmt.Errorf("write volume %q: %w", v.GetId(), err)
		}
		for _, ch := range changes {
			ev(ch.typ, ch.nodeID, v.GetPluginId(), v.GetId(), ch.desc)
		}
	case *csisupdv1.LogEntry_VolumeDelete:
		old := getVolume(txn, c.VolumeDelete)
		if old == nil {
			return fmt.Errorf("volume %q: %w", c.VolumeDelete, ErrNotFound)
		}
		if err := txn.Delete(tableVolumes, old); err != nil {
			return fmt.Errorf("delete volume %q: %w", c.VolumeDelete, err)
		}
		ev("volume-deleted", "", old.GetPluginId(), old.GetId(), "")
	case *csisupdv1.LogEntry_AclPolicyUpsert, *csisupdv1.LogEntry_AclPolicyDelete, *csisupdv1.LogEntry_AclTokenUpsert,
		*csisupdv1.LogEntry_AclTokenDelete, *csisupdv1.LogEntry_AclBootstrap:
		return applyACL(txn, index, ts, c)
	case *csisupdv1.LogEntry_ServerUpsert:
		if err := txn.Insert(tableServers, c.ServerUpsert); err != nil {
			return fmt.Errorf("write server %q: %w", c.ServerUpsert.GetId(), err)
		}
	default:
		return fmt.Errorf("unknown log entry command %T", c)
	}
	return nil
}

// volumeEvent is one event of a volume update.
type volumeEvent struct {
	typ, nodeID, desc string
}

// volumeChanges names the events of a volume update: volume-claimed for
// each claim added, volume-claim-updated for each claim changed,
// volume-claim-freed for each claim removed, and volume-updated when no
// claim changed. Claims are matched by node and workload.
func volumeChanges(old, new *csisupdv1.Volume) []volumeEvent {
	type key struct{ node, workload string }
	before := make(map[key]*csisupdv1.VolumeClaim, len(old.GetClaims()))
	for _, c := range old.GetClaims() {
		before[key{c.GetNodeId(), c.GetWorkloadId()}] = c
	}
	var out []volumeEvent
	for _, c := range new.GetClaims() {
		k := key{c.GetNodeId(), c.GetWorkloadId()}
		prev, had := before[k]
		delete(before, k)
		switch {
		case !had:
			out = append(out, volumeEvent{"volume-claimed", c.GetNodeId(), claimDescription("claimed", c)})
		case !proto.Equal(prev, c):
			out = append(out, volumeEvent{"volume-claim-updated", c.GetNodeId(), claimDescription("updated", c)})
		}
	}
	for _, c := range old.GetClaims() {
		if _, gone := before[key{c.GetNodeId(), c.GetWorkloadId()}]; gone {
			out = append(out, volumeEvent{"volume-claim-freed", c.GetNodeId(),
				fmt.Sprintf("claim of workload %s on node %s freed", c.GetWorkloadId(), c.GetNodeId())})
		}
	}
	if len(out) == 0 {
		out = append(out, volumeEvent{typ: "volume-updated"})
	}
	return out
}

// claimDescription describes a claim for an event: node, workload, state
// and what is done. It holds no secret: a claim has none.
func claimDescription(what string, c *csisupdv1.VolumeClaim) string {
	d := fmt.Sprintf("claim of workload %s on node %s %s: state %s, %s %s",
		c.GetWorkloadId(), c.GetNodeId(), what, c.GetState(), c.GetUsage().GetAccessMode(), rw(c.GetReadOnly()))
	if c.GetControllerPublished() {
		d += ", controller published"
	}
	if c.GetMounted() {
		d += ", mounted"
	}
	if c.GetNodeGone() {
		d += ", released without its node"
	}
	if c.GetLastError() != "" {
		d += ", last error: " + c.GetLastError()
	}
	return d
}
