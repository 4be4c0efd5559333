package claims

import (
	"fmt"

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

// CheckDelete checks the removal of volume v: it has no claims, in any
// state, and when volumeIndex is not 0, v is still the row the leader
// decided on (its modify index).
func CheckDelete(v *statepb.Volume, volumeIndex uint64) error {
	if n := len(v.GetClaims()); n > 0 {
		return status.Errorf(codes.FailedPrecondition, "volume %q has %d claims; release them first", v.GetId(), n)
	}
	if volumeIndex != 0 && v.GetModifyIndex() != volumeIndex {
		return csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleStale,
			fmt.Sprintf("volume %q changed at index %d after the delete was decided at index %d", v.GetId(), v.GetModifyIndex(), volumeIndex))
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
