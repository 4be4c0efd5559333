// Package fsm applies the commands of the raft log (statepb.LogEntry,
// encoded by Encode) to the state store (package state) and publishes the
// cluster events they cause. FSM is the raft.BatchingFSM of a server: a batch of
// committed entries is applied in one state transaction. Each command is
// checked before anything is written, so a refused command leaves no
// partial writes behind and returns its error in the entry's Result.
//
// Cluster events are kept in an event buffer (Events, over package
// stream): the FSM publishes the events of each applied raft entry as one
// batch at the entry's raft index, on the topics "node", "plugin" and
// "volume" keyed by the id, after the transaction commits, so a reader
// that looks at the state on an event finds the write that caused it.
// The buffer keeps a bounded number of batches, and a subscription that
// trails the newest by too many is ended as fallen behind, naming the
// index to resume from; the batches after it are still buffered then, so
// a prompt resume has no gap. A snapshot restore replaces the state
// without events, so it starts a new buffer: the subscriptions open at
// that moment get what was buffered and then end as gone, and so does a
// later one from an index before the restore. The restored state's index
// is past every index applied before, so a reader that reads the state
// again follows from its index.
//
// Events are the API's csisupd.v1.ClusterEvent messages, built where a
// command is applied: they hold ids and descriptions only, are never
// stored (not in raft, not in a snapshot), and are sent to
// Control.WatchEvents as they are, so no conversion is needed. The log
// entries, snapshots and rows are the storage messages of package
// statepb, never the API's.
//
// A volume claim is given the raft index of the write that added it as
// its claim_index, and the raft term of that write as its leader_term: a
// leader appends entries in its own term only, so the term names the
// leader that took the claim and drives its steps. ACL writes cause no events, and a second ACL bootstrap
// is refused (BootstrappedError) unless it names the current bootstrap
// index.
package fsm
