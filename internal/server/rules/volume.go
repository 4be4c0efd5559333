package rules

import (
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// CheckCreate checks a volume_create command: v is new (old, the stored
// volume of its id, is nil) and has no claims yet. The leader checks the
// same before it calls a controller; the FSM checks it again, so that two
// leaders cannot both add a volume of one id.
func CheckCreate(old, v *statepb.Volume) error {
	if old != nil {
		return status.Errorf(codes.AlreadyExists, "volume %q already exists (plugin %q, external id %q)", v.GetId(), old.GetPluginId(), old.GetExternalId())
	}
	if len(v.GetClaims()) > 0 {
		return status.Errorf(codes.InvalidArgument, "volume %q: a new volume has no claims", v.GetId())
	}
	return nil
}

// CheckDelete checks the removal of volume v by cmd: v has no claims, in
// any state, unless cmd is forced (an operator forgets a volume whose
// claims cannot be released); and when cmd's volume_index is not 0, v is
// still the row the leader decided on (its modify index).
func CheckDelete(v *statepb.Volume, cmd *statepb.VolumeDeleteCommand) error {
	if n := len(v.GetClaims()); n > 0 && !cmd.GetForced() {
		return status.Errorf(codes.FailedPrecondition, "volume %q has %d claims; release them first, or deregister it with --force", v.GetId(), n)
	}
	if idx := cmd.GetVolumeIndex(); idx != 0 && v.GetModifyIndex() != idx {
		return csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleStale,
			fmt.Sprintf("volume %q changed at index %d after the delete was decided at index %d", v.GetId(), v.GetModifyIndex(), idx))
	}
	return nil
}

// checkNew refuses a claim_take whose claim is not a new one: taken,
// neither published nor mounted, its node not gone.
func checkNew(v *statepb.Volume, c *statepb.VolumeClaim) error {
	if c.GetState() != StateTaken || c.GetMounted() || c.GetControllerPublished() || c.GetNodeGone() {
		return status.Errorf(codes.InvalidArgument, "claim of %s: a new claim is taken, unpublished and unmounted (state %q)",
			RefOf(v.GetId(), c), c.GetState())
	}
	return nil
}

// Describe names each claim by node, workload and state, with the paths
// the node mounts it at: what a forced deregistration leaves on the
// nodes.
func Describe(cs []*statepb.VolumeClaim) string {
	parts := make([]string, 0, len(cs))
	for _, c := range cs {
		s := fmt.Sprintf("node %s workload %s (%s", c.GetNodeId(), c.GetWorkloadId(), c.GetState())
		if c.GetHostPath() != "" {
			s += ", at " + c.GetHostPath()
		}
		if c.GetStagingPath() != "" {
			s += ", staged at " + c.GetStagingPath()
		}
		parts = append(parts, s+")")
	}
	return strings.Join(parts, "; ")
}
