// Package server implements the server role of csisupd: a small
// hashicorp/raft cluster that knows every node, plugin and volume.
//
// A Server wires the parts below and serves three gRPC services on a
// grpc.Server owned by the caller: the public Control API
// (csisupd.v1.Control), the ACL API (csisupd.v1.ACL), and the internal
// Cluster API (csisupd.v1.Cluster) that servers use to find each other
// and agents use to register their node and resolve tokens. A follower
// forwards leader-only requests to the leader, once. The leader loop runs
// the leader's duties for each term this server leads. The parts, each a
// package of its own (arrows: what a package may import):
//
//	server     services, forwarding, the leader loop, metrics; wires:
//	 |-> volumeops  every volume operation (create, claim, release,
//	 |              snapshots, expansion, health, drain, placement and
//	 |              routing of controller calls) behind one type, Ops
//	 |-> leader     leader duties: node heartbeat timers, volume watcher
//	 |              (which reaches the volume operations through one
//	 |              interface, VolumeWork)
//	 |-> raftnode   raft setup, TLS stream layer, bootstrap, join,
//	 |              autopilot, peers.json recovery, write batching
//	 '-> fsm        raft log commands -> state writes and cluster events
//	      |-> rules   pure rules of volumes and claims
//	      '-> state   memdb schema, reads, pages, ACL tables, snapshots
//
// volumeops may import leader (the watchdog beats a context carries),
// rules and state; leader rules and state, and fsm rules and state;
// state imports neither raft nor gRPC.
//
// The replicated state is held in the storage messages of package statepb:
// raft log entries, snapshots (and the files of `operator snapshot save`)
// and the rows of package state. They are wire-compatible with the public
// messages stored by earlier releases, so an older data_dir and snapshot
// file load unchanged. The services convert between them and the public
// messages with statepb's converters, where they read rows to answer and
// where a request's message becomes a command (a node's plugins, a
// registered volume); requests and responses that are never stored are
// used as they are.
//
// The volume calls of the Control service check their request, forward
// it to the leader, and there call package volumeops, which runs one
// volume at a time and records every step through raft (its package
// documentation holds the claim and release steps and the rules they
// keep across crashes). Its clients of the agents' ClientCSI and
// NodeVolumes services are implemented here, with gRPC over the pool of
// connections to agents. Secrets of claims and releases go to the plugin
// only: never into raft, events or logs.
//
// Control.WatchEvents reads the FSM's event buffer at the reader's pace:
// the buffer keeps the newest Config.EventBufferSize batches, and a stream
// that trails the newest by more than Config.EventMaxLag batches is ended
// with the EventsFellBehind error naming the index to resume from. A
// stream whose events were dropped, or predate a snapshot restore, is
// ended with EventsGone.
//
// ACL policies and tokens are replicated state like nodes and volumes;
// a token's secret id is kept only as its SHA-256, so no secret is in a
// raft entry, a snapshot or an event (ACL writes cause no events).
// Writes and consistent reads of the ACL service run on the leader, like
// Control's. ResolveToken, TokenSelf and Cluster.ResolveToken answer from
// the local state of whichever server is asked. The first management
// token comes from ACL.Bootstrap, once per cluster; a second is refused
// with the bootstrap index, and an operator who lost the token writes that
// index into ACLBootstrapResetFile in the leader's data dir to allow one
// more (the file is removed once used). Which caller may call which
// method is checked by the gRPC interceptor (package acl has the table),
// not by these services.
//
// With Config.Metrics, the server exports its raft and cluster state as
// gauges read at scrape time (csisupd_server_* and csisupd_cluster_*:
// leadership, raft indexes and peers, nodes by status, plugins, volumes,
// claims by state, heartbeat timers), counts the heartbeats it handles and
// the requests it forwards to the leader, and routes raft's own go-metrics
// to the same registry as csisupd_raft_*. Raft reports those to
// go-metrics' process-wide global only, so the last server created in a
// process owns that global. With Config.Watchdog, its long-running loops
// beat a watchdog.Loop each: the leadership monitor, the write batcher and
// the join loop for the server's life, the leader loop and the volume
// watcher for each term this server leads.
//
// The agent-side half, which registers a node and reports its plugins, is
// package nodeclient.
package server
