package claims

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

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

// SetState moves a claim to state and stamps the time of the change.
func SetState(c *statepb.VolumeClaim, state string) {
	if c.State != state {
		c.State = state
		c.StateUpdatedAt = timestamppb.Now()
	}
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

// StartRelease moves a taken claim to unpublishing, the first step of its
// release, and forgets its last error.
func StartRelease(c *statepb.VolumeClaim) {
	SetState(c, StateUnpublishing)
	c.LastError = ""
}

// Fail records why a claim's taking failed, and starts its release when
// it is still taken.
func Fail(c *statepb.VolumeClaim, msg string) {
	if c.State == StateTaken {
		SetState(c, StateUnpublishing)
	}
	c.LastError = msg
}

// ReleaseWithoutNode marks a claim whose node is gone and starts its
// release through the controller alone.
func ReleaseWithoutNode(c *statepb.VolumeClaim) {
	c.NodeGone = true
	SetState(c, StateUnpublishing)
}

// NodeUnpublished records that the node no longer mounts the claim.
func NodeUnpublished(c *statepb.VolumeClaim) {
	SetState(c, StateNodeUnpublished)
	c.Mounted, c.LastError = false, ""
}

// ControllerUnpublished records that the controller no longer publishes
// the volume to the claim's node.
func ControllerUnpublished(c *statepb.VolumeClaim) {
	SetState(c, StateControllerUnpublished)
	c.ControllerPublished, c.LastError = false, ""
}

// Free removes a claim from its volume: the end of its release.
func Free(v *statepb.Volume, nodeID, workloadID string) {
	if i, _ := Find(v, nodeID, workloadID); i >= 0 {
		v.Claims = slices.Delete(v.Claims, i, i+1)
	}
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
// any more) has been down for longer than grace at now.
func NodeGoneDue(c *statepb.VolumeClaim, node *statepb.ClusterNode, now time.Time, grace time.Duration) bool {
	if c.GetNodeGone() || (c.GetState() != StateTaken && c.GetState() != StateUnpublishing) {
		return false
	}
	if node == nil {
		return true
	}
	return node.GetStatus() == state.NodeStatusDown && now.Sub(node.GetStatusUpdatedAt().AsTime()) > grace
}
