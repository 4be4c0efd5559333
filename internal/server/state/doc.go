// Package state is the replicated state of a csisupd cluster, held in
// go-memdb: nodes, their plugin instances, volumes with their claims,
// server records, and ACL policies and tokens.
//
// The rows are the storage messages of package statepb (ClusterNode,
// Plugin, Volume, ServerRecord, ACLPolicy, ACLTokenRecord), never the
// API's: the services convert what they read with statepb's converters.
// The cluster-wide view of a plugin (ClusterPlugin) is a Go type of this
// package, built at read time and never stored. Plugin types and roles
// are those of package plugin.
//
// A Store is read by anyone and written only by the FSM (package fsm),
// through a write transaction (Txn) whose methods each write one kind of
// row. Objects returned by the read methods are shared and must not be
// modified. The cluster-wide view of a plugin is built from its instance
// rows at read time: an instance is healthy only when the plugin reports
// healthy and its node is ready.
//
// Lists come in pages (NodesPage, PluginsPage, VolumesPage) that resume
// from an id, not an offset, so paging stays stable while objects are
// added or removed between pages.
//
// ACL policies are kept with their parsed rules, so resolving a token
// parses no HCL; a token's secret id is kept only as its SHA-256, looked
// up by the hash and compared in constant time, so no secret is in a row,
// a raft entry, a snapshot or an event.
//
// Snapshot and FromSnapshot turn the state into one message
// (statepb.StateSnapshot) and back, for raft snapshots and operator
// backups; snapshots written before the storage messages existed decode
// into it unchanged (same wire format). A restored policy whose rules this
// version no longer accepts is kept and grants nothing.
//
// The package knows nothing of raft or gRPC.
package state
