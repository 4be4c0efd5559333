// Package rules holds the pure rules of volumes and their claims: which
// claim a volume admits and the states a claim walks (the claim_*.go
// files), the identity of nodes (nodes.go), and the lifecycle of volumes
// and snapshots, their health and availability (the volume*.go files).
// It is pure: no raft, no gRPC connection, no goroutines; the leader's
// volume operations read the state, call the controllers and the node's
// agent, and write each result through raft.
//
// The rules read and return the storage messages of package statepb
// (Volume, VolumeClaim, VolumeUsage) as the state holds them; requests
// come as the API's messages, and refusals are the API's typed errors.
//
// A claim is one workload using one volume on one node. Admit checks a
// new claim against the node (ready, the plugin's node service healthy
// there), the volume's capabilities and
// accessible topology, the node plugin's max_volumes and the access modes
// of the volume's other claims (both claims' modes are respected: one
// writer for single-node-writer and multi-node-single-writer, readers only
// for the *-reader-only modes, one node for the single-node-* modes). A
// refused claim is FailedPrecondition with a ClaimRefused detail naming
// the rule. A node this leader has not heard from yet is no reason to
// wait: the mount through its agent confirms it, or fails the claim.
//
// CheckTake is the admission rule set, pure, over a Reader: the leader
// calls it to refuse early, and the FSM again when it applies claim_take,
// against the state of that moment. Every later change of a claim is a
// claim_step built by Published, Mounted, StartRelease, Fail,
// ReleaseWithoutNode, NodeUnpublished or ControllerUnpublished, which the
// FSM applies with ApplyStep only to the same claim (claim_index) in the
// state it was built from, along a transition of the table in
// commands.go; Remove frees a released claim. A refused command is the
// ClaimRefused "stale" error and changes nothing.
//
// A scheduler's sync of a node releases, with reason not_in_sync, the
// claims SyncSelect picks (claim_sync.go); a placement check is Admit for
// a workload without a claim (CheckPlacement, claim_placement.go), so it
// meets the rules the claim that follows it meets.
//
// A taken claim is published by the controller (shared by the claims of
// one node) and mounted by the node's agent; both results are recorded in
// one step after the mount. A release walks back, each step recorded
// before the next starts:
//
//	taken -> unpublishing -> node-unpublished -> controller-unpublished -> freed (removed)
//
// A claim whose node has been down for longer than the claim gc grace is
// released without it (NodeGoneDue, ReleaseWithoutNode): through the
// controller only. Secrets of claims and releases go to the plugin only;
// ScrubSecrets takes them out of a plugin's error before it is logged or
// stored.
package rules
