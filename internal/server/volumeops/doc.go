// Package volumeops holds every volume operation of the servers' leader:
// create, register and delete; claim, release and forced release;
// snapshots; expansion and modification; health; drain and
// availability; capacity; the listings of what the plugins hold; and the
// placement and routing of controller calls. One type, Ops, runs them,
// built from a Config that names only what they use: a reader of the
// replicated state, the raft apply function, the leadership check, the
// clients of the agents, the leader's record of the nodes it heard from,
// and the volume watcher's wake-up.
//
// Its clients are the servers' side of two connections to a node's
// agent: ControllerClient calls a plugin's controller RPCs through the
// agent's ClientCSI service, NodeVolumesClient calls the agent's
// NodeVolumes service (mount, unmount, expand, health, mounts). Both are
// interfaces; package server implements them with gRPC over its pool of
// connections to agents, and tests give their own.
//
// The gRPC services of package server check a request (fields, ACLs),
// forward it to the leader, and call Ops there; Ops answers with the
// storage messages of package statepb and gRPC status errors. The
// leader's volume watcher (package leader) resumes from the replicated
// state alone the steps a caller left half done, through the methods of
// its VolumeWork interface, which Ops implements.
//
// Locks. The work on one volume runs one at a time under its lock
// (claims, releases, expansion, modification, the watcher, and the
// writes of create, register and delete); the work on one snapshot
// under the snapshot's; create, register and delete also hold their
// plugin's. They are taken in that order: plugin, snapshot, volume. The
// locks only save work: every change of a claim or a volume is a typed
// command that the FSM checks against the state it applies to (package
// rules holds the rules both use), so two leaders can never both admit a
// writer.
//
// Claims. A claim is admitted by the rules of package rules, then
// recorded taken (claim_take); the raft index of that write becomes its
// claim_index, set by the FSM. Controller publish (shared by the claims
// of one node) and the mount through the node's NodeVolumes service
// follow; both results (publish context, host and staging paths) are
// recorded in one claim_step after the mount, so a claim that stops
// between them is finished again (both steps are idempotent) or
// released. A claim left taken but unmounted (its leader died in the
// middle) is finished by the volume watcher after the server's
// ClaimResumeTimeout, or released when a step fails.
//
// Releases. A release walks back (unpublishing, node-unpublished,
// controller-unpublished, then the claim is removed), each step recorded
// through raft before the next begins, so that the volume watcher
// finishes any release that a failed step, a failed claim or a leader
// change left behind. A release sends the node the claim's paths, so an
// agent that lost its record still unmounts. A claim whose node has been
// down for longer than the server's ClaimGCGrace is marked node_gone and
// released through the controller only; the node's agent removes its
// mounts when it returns. An answer given from the state without a
// write (nothing left to release, a claim mounted already) is given only
// after ConfirmLeader.
//
// Leases. A claim taken with a lease_ttl enters the leader's lease table
// (Config.AddLease) right after its take, so its lease counts from the
// take; a claim again with the same lease_ttl renews it, one with another
// lease_ttl is refused (FailedPrecondition): a claim keeps the lease it
// was taken with. When a lease expires the table calls ExpireLease, which
// starts the release with release_reason lease_expired and leaves the
// steps to the volume watcher.
//
// Snapshots and expansions are recorded before the plugin is called
// (state creating, an expansion under way), so that whatever happens to
// this leader the volume watcher completes them.
//
// Secrets of requests go to the plugin only: never into raft, events or
// logs, and they are scrubbed from the errors that are recorded.
package volumeops
