package rules

import (
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// LeaseExpiry decides what the expired lease of the claim of v taken at
// claimIndex does, c being that workload's claim on the node as stored
// now (nil: none), and node the claim's node (nil: not known any more):
//
//   - nothing (nil, false) when the claim is gone, was taken again, or is
//     no longer taken: its release started for another reason;
//   - wait (nil, true) when its node is down or gone: the claim is
//     handled as every claim of a down node is, left taken until the
//     node comes back (then the lease expiry releases it through the
//     node) or until the claim gc grace releases it without the node;
//   - otherwise the step that starts its release, with release reason
//     lease_expired. An unfinished claim (taken, not mounted yet) is
//     released too: the release steps are idempotent.
func LeaseExpiry(v *statepb.Volume, c *statepb.VolumeClaim, claimIndex uint64, node *statepb.ClusterNode) (cmd *statepb.ClaimStepCommand, wait bool) {
	if c == nil || c.GetClaimIndex() != claimIndex || c.GetState() != StateTaken {
		return nil, false
	}
	if node == nil || node.GetStatus() == state.NodeStatusDown {
		return nil, true
	}
	return StartRelease(v, c, ReasonLeaseExpired), false
}
