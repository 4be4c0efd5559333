package rules

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// Volume claim states, as VolumeClaim.state names them. A claim walks
// taken -> unpublishing -> node-unpublished -> controller-unpublished and
// is then removed from its volume (freed).
const (
	StateTaken                 = "taken"
	StateUnpublishing          = "unpublishing"
	StateNodeUnpublished       = "node-unpublished"
	StateControllerUnpublished = "controller-unpublished"
)

// Release reasons, as VolumeClaim.release_reason names them: why a
// claim left state taken. A claim keeps the first reason, except that an
// operator's force and a node gone for good replace it: they say what the
// release did last.
const (
	// ReasonReleased: a ReleaseVolume of the claim.
	ReasonReleased = "released"
	// ReasonForced: an operator's forced release (`volume release --force`).
	ReasonForced = "forced"
	// ReasonNodeGone: the node was down for longer than claim_gc_grace.
	ReasonNodeGone = "node_gone"
	// ReasonLeaseExpired: the claim's lease was not renewed in time.
	ReasonLeaseExpired = "lease_expired"
	// ReasonNotInSync: a SyncNodeClaims of the claim's owner did not
	// list its workload.
	ReasonNotInSync = "not_in_sync"
	// ReasonDrained: its volume is drained (`volume availability drain`).
	ReasonDrained = "drained"
	// ReasonFailed: a step of taking the claim failed.
	ReasonFailed = "failed"
)

// ValidReleaseReason reports whether r is a release reason, or empty.
func ValidReleaseReason(r string) bool {
	switch r {
	case "", ReasonReleased, ReasonForced, ReasonNodeGone, ReasonLeaseExpired, ReasonNotInSync, ReasonDrained, ReasonFailed:
		return true
	}
	return false
}

// Releasing reports whether a claim state is one of a release.
func Releasing(state string) bool {
	switch state {
	case StateUnpublishing, StateNodeUnpublished, StateControllerUnpublished:
		return true
	}
	return false
}

// Ref names one claim of a volume: a volume has at most one claim per
// node and workload.
type Ref struct {
	VolumeID, NodeID, WorkloadID string
}

// RefOf returns the reference of claim c of volume volumeID.
func RefOf(volumeID string, c *statepb.VolumeClaim) Ref {
	return Ref{VolumeID: volumeID, NodeID: c.GetNodeId(), WorkloadID: c.GetWorkloadId()}
}

// String names the claim for errors and logs.
func (r Ref) String() string {
	return fmt.Sprintf("volume %q, node %q, workload %q", r.VolumeID, r.NodeID, r.WorkloadID)
}

// Find returns the index and the claim of v for a node and workload,
// or -1 and nil.
func Find(v *statepb.Volume, nodeID, workloadID string) (int, *statepb.VolumeClaim) {
	for i, c := range v.GetClaims() {
		if c.GetNodeId() == nodeID && c.GetWorkloadId() == workloadID {
			return i, c
		}
	}
	return -1, nil
}

// ScrubSecrets replaces the secret values in msg, so that a plugin's error
// that repeats one is neither logged nor stored.
func ScrubSecrets(msg string, secrets map[string]string) string {
	for _, val := range secrets {
		if val != "" {
			msg = strings.ReplaceAll(msg, val, "[redacted]")
		}
	}
	return msg
}

// SharedPublication returns another claim of v on the claim's node whose
// controller publication the claim can share, or nil. A read-write
// publication serves every claim; a read-only one serves read-only claims
// (Admit refused the others), so a read-write one is preferred.
func SharedPublication(v *statepb.Volume, claim *statepb.VolumeClaim) *statepb.VolumeClaim {
	var shared *statepb.VolumeClaim
	for _, c := range v.GetClaims() {
		if c != claim && c.GetNodeId() == claim.GetNodeId() && c.GetControllerPublished() &&
			(shared == nil || !c.GetReadOnly()) {
			shared = c
		}
	}
	return shared
}

// OthersOnNode reports whether v has claims on c's node besides c, which
// keep the node published.
func OthersOnNode(v *statepb.Volume, c *statepb.VolumeClaim) bool {
	return slices.ContainsFunc(v.GetClaims(), func(o *statepb.VolumeClaim) bool {
		return o != c && o.GetNodeId() == c.GetNodeId()
	})
}

// NodeGoneDue reports whether a claim must be released without its node:
// it is taken or unpublishing, and its node (nil: not known to the cluster
// any more) is down and has been seen down for downFor, longer than grace.
// downFor is measured by the caller on its monotonic clock, not from the
// node's replicated status time, which is another server's wall clock.
func NodeGoneDue(c *statepb.VolumeClaim, node *statepb.ClusterNode, downFor, grace time.Duration) bool {
	if c.GetNodeGone() || (c.GetState() != StateTaken && c.GetState() != StateUnpublishing) {
		return false
	}
	if node == nil {
		return true
	}
	return node.GetStatus() == state.NodeStatusDown && downFor > grace
}
