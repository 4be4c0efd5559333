package rules

import (
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// CheckClaimCreate checks the fields of a claim request that creates its
// volume (VolumeClaimRequest create): the volume's id is the claim's, so
// create.id must be empty; create.plugin_id is required; and ephemeral
// comes only with create. Its errors are InvalidArgument naming the
// field.
func CheckClaimCreate(req *csisupdv1.VolumeClaimRequest) error {
	cr := req.GetCreate()
	switch {
	case cr == nil && req.GetEphemeral():
		return status.Error(codes.InvalidArgument, "claim volume: ephemeral is given only with create: only a volume a claim creates is deleted at its last release")
	case cr == nil:
		return nil
	case cr.GetId() != "":
		return status.Errorf(codes.InvalidArgument, "claim volume: create.id %q must be empty: the volume's id is the claim's id (%q)", cr.GetId(), req.GetId())
	case cr.GetPluginId() == "":
		return status.Error(codes.InvalidArgument, "claim volume: create.plugin_id is required")
	}
	return nil
}

// CreateTopology returns the accessible topology required of a volume
// created at its first claim on node: the topology of the node's
// instance of plugin pluginID, as the one requisite and preferred segment,
// so that a node-local driver creates the volume on that node. A node
// whose instance reports no topology requires none.
//
// A requirement given in the create is intersected with the node's
// segment, not refused: the node must satisfy one of its requisite
// segments (a create spec written for volume create may name the zones
// its volumes belong in), else the claim is refused with rule topology
// before anything is created. Its preferred segments order nothing more:
// the node's segment is the only one left. A node that does not run the
// plugin requires nothing here; the admission of the claim refuses it.
func CreateTopology(node *statepb.ClusterNode, pluginID string, given *csisupdv1.TopologyRequirement) ([]*statepb.TopologySegment, error) {
	have := nodePlugin(node, pluginID).GetAccessibleTopology()
	var requisite []*statepb.TopologySegment
	for _, s := range given.GetRequisite() {
		requisite = append(requisite, statepb.TopologySegmentFromAPI(s))
	}
	if !TopologyFits(requisite, have) {
		var segs []string
		for _, s := range requisite {
			segs = append(segs, fmt.Sprint(s.GetSegments()))
		}
		return nil, csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleTopology,
			fmt.Sprintf("create of volume for a claim on node %q: the requirement asks for %s; the node's plugin %q has topology %v",
				node.GetId(), strings.Join(segs, " or "), pluginID, have))
	}
	if len(have) == 0 {
		return nil, nil
	}
	return []*statepb.TopologySegment{{Segments: have}}, nil
}

// EphemeralDone reports whether v is an ephemeral volume whose last claim
// is gone, so that it is to be deleted. The caller holds the volume's
// lock, which a claim that creates its volume holds from the create to
// its claim_take: a volume being created for a claim is never seen
// without its claim then. A claim of an earlier leader cannot take it
// any more either: a new leader's barrier ran before its watcher.
func EphemeralDone(v *statepb.Volume) bool {
	return v.GetEphemeral() && len(v.GetClaims()) == 0
}
