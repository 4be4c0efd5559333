// Package server implements the server role of csisupd: a small
// hashicorp/raft cluster that knows every node, plugin and volume.
//
// A Server owns a raft instance (raft-boltdb log store, file snapshot store,
// TCP transport), a finite state machine over a go-memdb state store, and
// three gRPC services registered on a grpc.Server owned by the caller: the
// public Control API (csisupd.v1.Control), the ACL API (csisupd.v1.ACL),
// and the internal Cluster API (csisupd.v1.Cluster) that servers use to
// find each other and agents use to register their node and resolve
// tokens.
//
// Clusters form only through BootstrapExpect: a server first tries to join a
// cluster that already has a leader, and otherwise bootstraps only by a rule
// that cannot split. Each server keeps a known set in memory: its own id,
// the ids of the servers it reached through RetryJoin (or DiscoverServers)
// and the known sets those servers reported in PeerInfo. The set only grows
// while the server runs. A server bootstraps when its known set has exactly
// BootstrapExpect ids and, in one attempt, it reached every one of them and
// each reported the same BootstrapExpect, no raft state and a known set
// equal to its own; the configuration is that set sorted by server id, all
// voters, so every server that bootstraps computes the same one. A server
// whose known set grew past BootstrapExpect refuses to bootstrap and says
// so once per change, naming the servers it knows: the operator stops the
// surplus servers and restarts the others, and starts the surplus ones
// again once a leader exists, when they join it. A server with raft state
// never bootstraps again.
// A server that joins a formed cluster is added as a non-voter; autopilot
// promotes it once it has been healthy for ServerStabilizationTime, so a
// join naming an unreachable address never counts toward the quorum.
//
// Why it is safe: if two servers bootstrap sets V and W that share a member
// C, C reported V to one and W to the other as its known set; that set only
// grows and V and W have the same size, so V = W. With fewer than twice
// BootstrapExpect servers, any two sets of BootstrapExpect of them share a
// member. The guarantee has two limits. With twice BootstrapExpect servers
// or more, two groups that never hear of each other look exactly like two
// separate clusters, and no rule can tell them apart: each group may form
// its own cluster. And a server forgets its known set when it restarts, so
// the argument covers only servers that do not restart while the cluster
// forms.
//
// Node heartbeats follow Nomad's model: the leader keeps one in-memory TTL
// timer per node and writes to raft only when a node's status changes.
//
// Cluster events are kept in an event buffer (package stream): the FSM
// publishes the events of each applied raft entry as one batch at the
// entry's raft index, on the topics "node", "plugin" and "volume" keyed by
// the id. Control.WatchEvents reads it at the reader's pace: the buffer
// keeps the newest Config.EventBufferSize batches, and a stream that trails
// the newest by more than Config.EventMaxLag batches is ended with the
// EventsFellBehind error naming the index to resume from; the batches after
// it are still buffered then, so a prompt resume has no gap. A stream whose
// events were dropped is ended with EventsGone. A snapshot restore
// replaces the state without events, so it starts a new buffer: the
// streams open at that moment get what was buffered and then EventsGone,
// and so does a later stream from an index before the restore. The
// restored state's index is past every index applied before, so a reader
// that reads the state again follows from its index.
//
// Volume claims run on the leader, one volume at a time (a lock per
// volume, which create and delete take too). A claim is admitted against
// the node (ready, plugin healthy there), the volume's capabilities and
// accessible topology, the node plugin's max_volumes and the access modes
// of the volume's other claims (both claims' modes are respected), then
// recorded taken; the raft index of that write becomes its claim_index,
// set by the FSM. Controller publish (shared by the claims of one node)
// and the mount through the node's NodeVolumes service follow, each
// result recorded through raft before the next step. A release walks back
// (unpublishing, node-unpublished, controller-unpublished, then the claim
// is removed), also recorded step by step, so that the leader's volume
// watcher (Config.VolumeWatchInterval, with a per-claim backoff after a
// failure) finishes any release that a failed step, a failed claim or a
// leader change left behind, from the replicated state alone. A claim
// whose node has been down for longer than Config.ClaimGCGrace is marked
// node_gone and released through the controller only; the node's agent
// removes its mounts when it returns (Cluster.NodeClaims). Secrets of
// claims and releases go to the plugin only: never into raft, events or
// logs.
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
