package rules

import (
	"fmt"
	"maps"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// The claim state machine. Every change of a claim is one typed command
// of the raft log: claim_take adds it (CheckTake), claim_step moves it
// along a transition below or records a step's result or error in the
// same state (ApplyStep), and claim_remove frees it (CheckRemove). The
// leader builds the commands from the state it read; the FSM applies one
// only when the claim is still the one the leader read (its claim_index)
// in the state the command starts from, so a command computed from a
// stale state, by a leader that lost its term or by a step that another
// step overtook, is refused with the "stale" rule and changes nothing.
var transitions = map[[2]string]bool{
	// The results of taking the claim: controller publication, mount.
	{StateTaken, StateTaken}: true,
	// A release, or a failed claim, starts.
	{StateTaken, StateUnpublishing}: true,
	// A failed node step, or the node released without it.
	{StateUnpublishing, StateUnpublishing}:    true,
	{StateUnpublishing, StateNodeUnpublished}: true,
	// A failed controller step.
	{StateNodeUnpublished, StateNodeUnpublished}:             true,
	{StateNodeUnpublished, StateControllerUnpublished}:       true,
	{StateControllerUnpublished, StateControllerUnpublished}: true,
}

// Legal reports whether a claim may go from state from to state to.
func Legal(from, to string) bool { return transitions[[2]string{from, to}] }

// Take returns the command that records claim c of volume v taken; v is
// the volume as the leader read it.
func Take(v *statepb.Volume, c *statepb.VolumeClaim) *statepb.ClaimTakeCommand {
	return &statepb.ClaimTakeCommand{VolumeId: v.GetId(), Claim: c, VolumeIndex: v.GetModifyIndex()}
}

// step returns a command that moves claim c of volume v to state to.
func step(v *statepb.Volume, c *statepb.VolumeClaim, to string) *statepb.ClaimStepCommand {
	return &statepb.ClaimStepCommand{
		VolumeId: v.GetId(), NodeId: c.GetNodeId(), WorkloadId: c.GetWorkloadId(),
		ClaimIndex: c.GetClaimIndex(), VolumeIndex: v.GetModifyIndex(),
		From: c.GetState(), To: to,
	}
}

// Published returns the step that records the controller publication of
// a taken claim: publish context pc.
func Published(v *statepb.Volume, c *statepb.VolumeClaim, pc map[string]string) *statepb.ClaimStepCommand {
	cmd := step(v, c, StateTaken)
	cmd.ControllerPublished, cmd.PublishContext = true, pc
	return cmd
}

// Mounted returns the step that records the mount of a taken claim on its
// node, with its controller publication when published: the end of taking
// it.
func Mounted(v *statepb.Volume, c *statepb.VolumeClaim, published bool, pc map[string]string, hostPath, stagingPath string) *statepb.ClaimStepCommand {
	cmd := step(v, c, StateTaken)
	if published {
		cmd.ControllerPublished, cmd.PublishContext = true, pc
	}
	cmd.Mounted, cmd.HostPath, cmd.StagingPath = true, hostPath, stagingPath
	return cmd
}

// StartRelease returns the step that starts the release of a taken claim
// for reason (one of the Reason constants).
func StartRelease(v *statepb.Volume, c *statepb.VolumeClaim, reason string) *statepb.ClaimStepCommand {
	cmd := step(v, c, StateUnpublishing)
	cmd.ReleaseReason = reason
	return cmd
}

// Fail returns the step that records why a claim's taking, or a step of
// its release, failed: a taken claim starts its release, a claim being
// released stays where it is.
func Fail(v *statepb.Volume, c *statepb.VolumeClaim, msg string) *statepb.ClaimStepCommand {
	to := c.GetState()
	if to == StateTaken {
		to = StateUnpublishing
	}
	cmd := step(v, c, to)
	cmd.Error = msg
	if c.GetState() == StateTaken {
		cmd.ReleaseReason = ReasonFailed
	}
	return cmd
}

// ReleaseWithoutNode returns the step that marks a claim whose node is
// gone and starts (or goes on with) its release through the controller
// alone.
func ReleaseWithoutNode(v *statepb.Volume, c *statepb.VolumeClaim) *statepb.ClaimStepCommand {
	cmd := step(v, c, StateUnpublishing)
	cmd.NodeGone = true
	cmd.ReleaseReason = ReasonNodeGone
	return cmd
}

// CheckNodeGone refuses a step that releases a claim without its node
// while the node is stored and not down. Such a step skips the node's
// unpublish and unstage, which only a node that is gone may skip: a
// leader that decided on a view the node has since left (it came back
// between the decision and the write) would otherwise free a volume that
// is still mounted there, for another writer to take.
func CheckNodeGone(node *statepb.ClusterNode, ref Ref) error {
	if node == nil || node.GetStatus() == state.NodeStatusDown {
		return nil
	}
	return status.Errorf(codes.FailedPrecondition,
		"claim of %s: its node is %s, not down, so the claim cannot be released without it", ref, node.GetStatus())
}

// NodeUnpublished returns the step that records that the node no longer
// mounts the claim.
func NodeUnpublished(v *statepb.Volume, c *statepb.VolumeClaim) *statepb.ClaimStepCommand {
	return step(v, c, StateNodeUnpublished)
}

// ControllerUnpublished returns the step that records that the controller
// no longer publishes the volume to the claim's node.
func ControllerUnpublished(v *statepb.Volume, c *statepb.VolumeClaim) *statepb.ClaimStepCommand {
	return step(v, c, StateControllerUnpublished)
}

// Remove returns the command that frees a released claim.
func Remove(v *statepb.Volume, c *statepb.VolumeClaim) *statepb.ClaimRemoveCommand {
	return &statepb.ClaimRemoveCommand{
		VolumeId: v.GetId(), NodeId: c.GetNodeId(), WorkloadId: c.GetWorkloadId(),
		ClaimIndex: c.GetClaimIndex(), VolumeIndex: v.GetModifyIndex(),
	}
}

// staleError refuses a command whose claim is not the one it was computed
// from.
func staleError(volumeID, nodeID, workloadID, why string) error {
	return csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleStale,
		fmt.Sprintf("claim of %s: %s; read the volume again", Ref{VolumeID: volumeID, NodeID: nodeID, WorkloadID: workloadID}, why))
}

// find returns the claim a command names, refusing a claim that is gone
// or was taken again (another claim_index) since the command was built.
func find(v *statepb.Volume, nodeID, workloadID string, claimIndex uint64) (int, *statepb.VolumeClaim, error) {
	i, c := Find(v, nodeID, workloadID)
	switch {
	case c == nil:
		return -1, nil, staleError(v.GetId(), nodeID, workloadID, "no such claim")
	case c.GetClaimIndex() != claimIndex:
		return -1, nil, staleError(v.GetId(), nodeID, workloadID,
			fmt.Sprintf("the claim was taken again at index %d, the command is for index %d", c.GetClaimIndex(), claimIndex))
	}
	return i, c, nil
}

// ApplyStep checks a claim_step command against volume v as stored and
// returns a copy of the claim after the step; now stamps a change of
// state. It refuses a claim that is gone or was taken again, a claim that
// is not in the command's from state, and a move that is not a transition.
func ApplyStep(v *statepb.Volume, cmd *statepb.ClaimStepCommand, now *timestamppb.Timestamp) (*statepb.VolumeClaim, error) {
	if !Legal(cmd.GetFrom(), cmd.GetTo()) {
		return nil, status.Errorf(codes.InvalidArgument, "claim of %s: %s -> %s is not a claim transition",
			Ref{VolumeID: v.GetId(), NodeID: cmd.GetNodeId(), WorkloadID: cmd.GetWorkloadId()}, cmd.GetFrom(), cmd.GetTo())
	}
	if r := cmd.GetReleaseReason(); !ValidReleaseReason(r) || r != "" && !Releasing(cmd.GetTo()) {
		return nil, status.Errorf(codes.InvalidArgument, "claim of %s: release reason %q on a step to %s",
			Ref{VolumeID: v.GetId(), NodeID: cmd.GetNodeId(), WorkloadID: cmd.GetWorkloadId()}, r, cmd.GetTo())
	}
	_, old, err := find(v, cmd.GetNodeId(), cmd.GetWorkloadId(), cmd.GetClaimIndex())
	if err != nil {
		return nil, err
	}
	if old.GetState() != cmd.GetFrom() {
		return nil, staleError(v.GetId(), cmd.GetNodeId(), cmd.GetWorkloadId(),
			fmt.Sprintf("it is %s, the step is from %s", old.GetState(), cmd.GetFrom()))
	}
	c := proto.Clone(old).(*statepb.VolumeClaim)
	if c.State != cmd.GetTo() {
		c.State, c.StateUpdatedAt = cmd.GetTo(), now
	}
	c.LastError = cmd.GetError()
	switch r := cmd.GetReleaseReason(); {
	case cmd.GetForced():
		c.ReleaseReason = ReasonForced
	case r == ReasonNodeGone || r != "" && c.ReleaseReason == "":
		c.ReleaseReason = r
	}
	// An operator's force stays on the claim, with every step it
	// skipped: the node may still hold what a skipped step left.
	c.Forced = c.Forced || cmd.GetForced()
	if s := cmd.GetSkipped(); s != "" {
		if !cmd.GetForced() {
			return nil, status.Errorf(codes.InvalidArgument, "claim of %s: only a forced release skips a step",
				Ref{VolumeID: v.GetId(), NodeID: cmd.GetNodeId(), WorkloadID: cmd.GetWorkloadId()})
		}
		c.SkippedSteps = append(slices.Clone(c.SkippedSteps), s)
	}
	switch cmd.GetTo() {
	case StateTaken:
		// Results only add: a publication or a mount is undone by a
		// release, never by a step of taking.
		if cmd.GetControllerPublished() && !c.ControllerPublished {
			c.ControllerPublished, c.PublishContext = true, maps.Clone(cmd.GetPublishContext())
		}
		if cmd.GetMounted() {
			c.Mounted, c.HostPath, c.StagingPath = true, cmd.GetHostPath(), cmd.GetStagingPath()
		}
	case StateUnpublishing:
		c.NodeGone = c.NodeGone || cmd.GetNodeGone()
	case StateNodeUnpublished:
		c.Mounted = false
	case StateControllerUnpublished:
		c.ControllerPublished = false
	}
	return c, nil
}

// CheckRemove checks a claim_remove command against volume v as stored:
// the claim exists with the command's claim_index and its release is done.
// It returns the claim's position in v.Claims.
func CheckRemove(v *statepb.Volume, cmd *statepb.ClaimRemoveCommand) (int, error) {
	i, c, err := find(v, cmd.GetNodeId(), cmd.GetWorkloadId(), cmd.GetClaimIndex())
	if err != nil {
		return -1, err
	}
	if c.GetState() != StateControllerUnpublished {
		return -1, staleError(v.GetId(), cmd.GetNodeId(), cmd.GetWorkloadId(),
			fmt.Sprintf("it is %s; only a claim in state %s is freed", c.GetState(), StateControllerUnpublished))
	}
	return i, nil
}

// Unfinished reports whether a taken claim still lacks its mount: the
// leader that took it stopped (or failed to record the result) before
// the node mounted it. The mount is recorded with the controller
// publication, so a claim that is mounted lacks nothing.
func Unfinished(c *statepb.VolumeClaim) bool {
	return c.GetState() == StateTaken && !c.GetMounted() && !c.GetNodeGone()
}
