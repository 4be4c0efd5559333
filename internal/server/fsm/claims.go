package fsm

import (
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// applyClaimCommand applies the commands that change one claim of a
// volume: its take (checked by rules.CheckTake against every other claim
// and node), each step of its claim or release (rules.ApplyStep), and its
// removal once released (rules.CheckRemove).
func (f *FSM) applyClaimCommand(txn *state.Txn, index uint64, ts *timestamppb.Timestamp, cmd any, ev eventFunc) error {
	switch c := cmd.(type) {
	case *statepb.LogEntry_ClaimTake:
		v, err := volumeOf(txn, c.ClaimTake.GetVolumeId())
		if err != nil {
			return err
		}
		claim := proto.Clone(c.ClaimTake.GetClaim()).(*statepb.VolumeClaim)
		if err := f.checkTake(txn, v, claim); err != nil {
			return err
		}
		// The claim's index is the index of the write that took it, and
		// its times are the entry's, so that every server stores the same.
		claim.ClaimIndex, claim.ClaimedAt, claim.StateUpdatedAt = index, ts, ts
		nv := proto.Clone(v).(*statepb.Volume)
		nv.Claims = append(nv.Claims, claim)
		return putVolume(txn, index, ts, v, nv, ev)
	case *statepb.LogEntry_ClaimStep:
		v, err := volumeOf(txn, c.ClaimStep.GetVolumeId())
		if err != nil {
			return err
		}
		claim, err := rules.ApplyStep(v, c.ClaimStep, ts)
		if err != nil {
			return err
		}
		if step := c.ClaimStep; step.GetNodeGone() {
			// Checked when the step makes the claim node_gone; a repeat
			// of a decision already stored is no new decision.
			if _, old := rules.Find(v, step.GetNodeId(), step.GetWorkloadId()); !old.GetNodeGone() {
				ref := rules.Ref{VolumeID: v.GetId(), NodeID: step.GetNodeId(), WorkloadID: step.GetWorkloadId()}
				if err := rules.CheckNodeGone(txn.Node(step.GetNodeId()), ref); err != nil {
					return err
				}
			}
		}
		nv := proto.Clone(v).(*statepb.Volume)
		i, old := rules.Find(nv, claim.GetNodeId(), claim.GetWorkloadId())
		nv.Claims[i] = claim
		if err := putVolume(txn, index, ts, v, nv, ev); err != nil {
			return err
		}
		// One event per expiry: only the step out of taken carries it,
		// and a claim leaves taken once.
		if c.ClaimStep.GetReleaseReason() == rules.ReasonLeaseExpired && old.GetState() == rules.StateTaken && claim.GetState() != rules.StateTaken {
			ev("volume-claim-expired", claim.GetNodeId(), nv.GetPluginId(), nv.GetId(), fmt.Sprintf(
				"lease of workload %s (lease_ttl %s) expired; releasing the claim", claim.GetWorkloadId(), claim.GetLeaseTtl().AsDuration()))
		}
		switch step := c.ClaimStep; {
		case step.GetSkipped() != "":
			ev("volume-claim-forced", claim.GetNodeId(), nv.GetPluginId(), nv.GetId(), fmt.Sprintf(
				"release of workload %s forced past a failed step: %s", claim.GetWorkloadId(), step.GetSkipped()))
		case step.GetForced() && !old.GetForced():
			how := "on a node that answers"
			if claim.GetNodeGone() {
				how = "without its node"
			}
			ev("volume-claim-forced", claim.GetNodeId(), nv.GetPluginId(), nv.GetId(), fmt.Sprintf(
				"release of workload %s forced %s", claim.GetWorkloadId(), how))
		}
		return nil
	case *statepb.LogEntry_ClaimRemove:
		v, err := volumeOf(txn, c.ClaimRemove.GetVolumeId())
		if err != nil {
			return err
		}
		i, err := rules.CheckRemove(v, c.ClaimRemove)
		if err != nil {
			return err
		}
		nv := proto.Clone(v).(*statepb.Volume)
		nv.Claims = slices.Delete(nv.Claims, i, i+1)
		nv.Conditions = rules.NodeConditionsLeft(nv, c.ClaimRemove.GetNodeId())
		return putVolume(txn, index, ts, v, nv, ev)
	}
	return fmt.Errorf("unknown claim command %T", cmd)
}
