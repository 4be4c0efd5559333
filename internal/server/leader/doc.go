// Package leader holds the duties only the raft leader runs: the node
// heartbeat timers, the claim lease timers and the volume watcher. Each takes what it reads and
// calls in its Config (the current state, a func that writes through
// raft, the volume locks) and holds no server; the watcher reaches the
// volume operations only through one interface, VolumeWork, which
// package volumeops implements.
//
// Node heartbeats follow Nomad's model: the leader keeps one in-memory TTL
// timer per node and writes to raft only when a node's status changes.
// The TTL it hands out grows with the node count, so that it sees at most
// MaxPerSecond heartbeats, with a random stagger. A new leader, or one
// that restored a snapshot, gives every node not down a failover TTL long
// enough to cover any TTL a previous leader handed out, and until a node
// heartbeats to it, or its agent answers one of the leader's calls
// (Confirm), the node shows as initializing (View): its stored status,
// ready, is what an earlier leader or a backup said.
//
// Claim leases (Leases) are timers in the leader's memory too: a renewal
// (RenewClaims, one call per node) resets them and is never written to
// raft; an expiry starts the claim's release through LeaseWork, one raft
// write. Renewals seen by an earlier leader were never replicated, so a
// new leader (and one that restored a snapshot) gives every taken leased
// claim a full TTL from the moment it took over. A lease that expires
// while its node is down waits, like every claim of a down node, for the
// node to come back or for the claim gc grace.
//
// The volume watcher (WatcherConfig.Interval, with a per-claim backoff
// after a failure) finishes any release that a failed step, a failed
// claim or a leader change left behind, from the replicated state alone,
// and releases through the controller only the claims whose node has been
// down for longer than the claim gc grace. It skips a volume whose lock
// is taken, and looks again at the next pass or when kicked.
//
// With a watchdog, the volume watcher beats a watchdog.Loop for each
// term; watchdog.WithLoop lets the release steps it runs beat that loop
// between their calls to agents.
package leader
