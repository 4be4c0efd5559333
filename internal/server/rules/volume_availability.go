package rules

import (
	"fmt"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// Volume availabilities, as statepb.Volume.availability stores them.
const (
	// AvailabilityActive takes new claims (stored as "").
	AvailabilityActive = ""
	// AvailabilityPause refuses new claims; the claims the volume has stay.
	AvailabilityPause = "pause"
	// AvailabilityDrain refuses new claims and releases the claims the
	// volume has, through the volume watcher.
	AvailabilityDrain = "drain"
)

// ParseAvailability returns the stored availability of an operator's
// word: active, pause or drain.
func ParseAvailability(s string) (string, error) {
	switch s {
	case "active":
		return AvailabilityActive, nil
	case AvailabilityPause, AvailabilityDrain:
		return s, nil
	}
	return "", status.Errorf(codes.InvalidArgument, "availability %q is not active, pause or drain", s)
}

// AvailabilityName is how status output and events name a stored
// availability.
func AvailabilityName(stored string) string {
	if stored == AvailabilityActive {
		return "active"
	}
	return stored
}

// CheckAvailability refuses a new claim of v on node while an operator
// keeps it from taking claims: v is paused or drains, or its plugin drains
// on node. It is part of CheckTake.
func CheckAvailability(v *statepb.Volume, node *statepb.ClusterNode) error {
	switch v.GetAvailability() {
	case AvailabilityActive:
	case AvailabilityDrain:
		return csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleAvailability,
			fmt.Sprintf("volume %q drains: it takes no new claims, and its claims are being released", v.GetId()))
	default:
		return csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleAvailability,
			fmt.Sprintf("volume %q is paused (%s): it takes no new claims", v.GetId(), v.GetAvailability()))
	}
	if slices.Contains(node.GetDrainingPlugins(), v.GetPluginId()) {
		return csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleAvailability,
			fmt.Sprintf("plugin %q drains on node %q: it takes no new claims there", v.GetPluginId(), node.GetId()))
	}
	return nil
}

// CheckSetAvailability checks the command that sets v's availability.
func CheckSetAvailability(v *statepb.Volume, availability string) error {
	if v == nil {
		return status.Error(codes.NotFound, "volume not found")
	}
	switch availability {
	case AvailabilityActive, AvailabilityPause, AvailabilityDrain:
		return nil
	}
	return status.Errorf(codes.InvalidArgument, "volume %q: availability %q is not \"\", pause or drain", v.GetId(), availability)
}
