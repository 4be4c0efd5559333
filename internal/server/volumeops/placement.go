package volumeops

import (
	"cmp"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// CheckClaim answers, for each node of the request (ids or names; none:
// every node that runs the volume's plugin with its node service), whether
// a claim of the volume with the request's usage would be admitted there
// now, or the rule and message it would meet (rules.CheckPlacement, the
// rules of Admit and the FSM). It reads the state and writes nothing; its
// caller routes it to the leader as a consistent read, so that the answer
// is the one a claim sent now would get. The answer is sorted by node
// name, then id.
func (o *Ops) CheckClaim(req *csisupdv1.CheckClaimRequest) (*csisupdv1.CheckClaimResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "check claim: volume_id is required")
	}
	st := o.cfg.State()
	v := st.Volume(req.GetVolumeId())
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %q not found", req.GetVolumeId())
	}
	// A usage the volume cannot take is wrong on every node: the request's
	// error, not a node's answer.
	if _, err := rules.Usage(v, &csisupdv1.VolumeClaimRequest{Usage: req.GetUsage()}); err != nil {
		return nil, err
	}
	resp := &csisupdv1.CheckClaimResponse{}
	var nodes []*statepb.ClusterNode
	if len(req.GetNodeIds()) == 0 {
		nodes = rules.PlacementNodes(st.Nodes(), v.GetPluginId())
	}
	seen := map[string]bool{}
	for _, arg := range req.GetNodeIds() {
		n, err := rules.ResolveNode(arg, st.Node(arg), st.NodesNamed(arg))
		if status.Code(err) == codes.NotFound {
			resp.Nodes = append(resp.Nodes, &csisupdv1.NodeClaimCheck{NodeId: arg, Rule: rules.PlacementRuleNotFound, Message: status.Convert(err).Message()})
			continue
		}
		if err != nil {
			return nil, err
		}
		if !seen[n.GetId()] {
			seen[n.GetId()] = true
			nodes = append(nodes, n)
		}
	}
	now := timestamppb.Now()
	for _, n := range nodes {
		check := &csisupdv1.NodeClaimCheck{NodeId: n.GetId(), NodeName: n.GetName()}
		err := rules.CheckPlacement(st, v, n.GetId(), req.GetUsage(), now)
		if err == nil {
			check.Ok = true
		} else {
			rule, msg, refused := rules.PlacementRefusal(err)
			if !refused {
				return nil, err
			}
			check.Rule, check.Message = rule, msg
		}
		resp.Nodes = append(resp.Nodes, check)
	}
	slices.SortFunc(resp.Nodes, func(a, b *csisupdv1.NodeClaimCheck) int {
		return cmp.Or(strings.Compare(a.GetNodeName(), b.GetNodeName()), strings.Compare(a.GetNodeId(), b.GetNodeId()))
	})
	return resp, nil
}
