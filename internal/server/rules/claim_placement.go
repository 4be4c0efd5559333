package rules

import (
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// The rules of a placement check (Control.CheckClaim): would a claim of a
// volume with a usage be admitted on a node now? The answer is Admit's,
// for a workload that holds no claim of the volume, so that a check and
// the claim that follows it meet the same rules, which the FSM applies
// again when it records the claim.

// PlacementRuleNotFound is the rule of a placement check on a node that
// the cluster does not know. It is not a ClaimRefused rule: a claim there
// is NotFound.
const PlacementRuleNotFound = "not-found"

// CheckPlacement checks whether a new claim of v with usage (nil: the
// volume's first capability, as a claim's) on node nodeID would be
// admitted against the state st holds now. Its errors are Admit's.
func CheckPlacement(st Reader, v *statepb.Volume, nodeID string, usage *csisupdv1.VolumeUsage, now *timestamppb.Timestamp) error {
	// No workload: no claim of v has an empty workload id, so the check
	// is the one any new workload would meet.
	_, err := Admit(st, v, &csisupdv1.VolumeClaimRequest{Id: v.GetId(), NodeId: nodeID, Usage: usage}, now)
	return err
}

// PlacementRefusal returns the rule and message a placement check names
// for err, an error of CheckPlacement: a ClaimRefused rule and its
// description, "capability" for a node capability the plugin lacks, or
// PlacementRuleNotFound. refused is false for any other error, which is
// not about the node (the caller returns it).
func PlacementRefusal(err error) (rule, message string, refused bool) {
	if err == nil {
		return "", "", false
	}
	if d, ok := csisupdv1.ErrorDetail[*csisupdv1.ClaimRefused](err); ok {
		return d.GetRule(), d.GetDescription(), true
	}
	msg := status.Convert(err).Message()
	if _, ok := csisupdv1.ErrorDetail[*csisupdv1.CapabilityMissing](err); ok {
		return csisupdv1.ClaimRuleCapability, msg, true
	}
	if status.Code(err) == codes.NotFound {
		return PlacementRuleNotFound, msg, true
	}
	return "", "", false
}

// PlacementNodes returns the nodes of nodes that run plugin pluginID with
// its node service (healthy or not), except those replaced after a
// rekey: the nodes a placement check without a list looks at.
func PlacementNodes(nodes []*statepb.ClusterNode, pluginID string) []*statepb.ClusterNode {
	var out []*statepb.ClusterNode
	for _, n := range nodes {
		p := nodePlugin(n, pluginID)
		if p == nil || n.GetReplacedBy() != "" {
			continue
		}
		if _, nodeService := plugin.Type(p.GetType()).Roles(); nodeService {
			out = append(out, n)
		}
	}
	return out
}

// ResolveNode returns the node that arg names: the node whose id it is
// (byID, nil when none), or else the one node among named (the nodes
// whose name is arg) that was not replaced after a rekey. It is NotFound
// when none is, and InvalidArgument when several carry the name.
func ResolveNode(arg string, byID *statepb.ClusterNode, named []*statepb.ClusterNode) (*statepb.ClusterNode, error) {
	if byID != nil {
		return byID, nil
	}
	var found []*statepb.ClusterNode
	for _, n := range named {
		if n.GetReplacedBy() == "" {
			found = append(found, n)
		}
	}
	switch len(found) {
	case 0:
		return nil, status.Errorf(codes.NotFound, "node %q not found (neither a node id nor a node name)", arg)
	case 1:
		return found[0], nil
	}
	list := make([]string, len(found))
	for i, n := range found {
		list[i] = n.GetId()
	}
	return nil, status.Errorf(codes.InvalidArgument, "node name %q is ambiguous: nodes %s carry it; give the node id", arg, strings.Join(list, ", "))
}
