package rules

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// TestCheckPlacement checks that a placement check meets Admit's rules
// and names them as CheckClaim answers them: each case breaks one rule
// (or none) on node n1.
func TestCheckPlacement(t *testing.T) {
	tests := []struct {
		name   string
		change func(st *fakeState, v *statepb.Volume)
		usage  *csisupdv1.VolumeUsage
		rule   string // "": admitted
	}{
		{"admitted", nil, nil, ""},
		{"a workload of the volume on the node does not refuse a reader", func(_ *fakeState, v *statepb.Volume) {
			v.Claims = []*statepb.VolumeClaim{claimOn("n1", "w", snw, false)}
		}, &csisupdv1.VolumeUsage{ReadOnly: true}, ""},
		{"second writer", func(_ *fakeState, v *statepb.Volume) {
			v.Claims = []*statepb.VolumeClaim{claimOn("n1", "w", snw, false)}
		}, nil, csisupdv1.ClaimRuleAccessMode},
		{"node down", func(st *fakeState, _ *statepb.Volume) { st.nodes["n1"].Status = state.NodeStatusDown }, nil, csisupdv1.ClaimRuleNodeNotReady},
		{"plugin unhealthy", func(st *fakeState, _ *statepb.Volume) { st.nodes["n1"].Plugins[0].Healthy = false }, nil, csisupdv1.ClaimRulePlugin},
		{"volume paused", func(_ *fakeState, v *statepb.Volume) { v.Availability = AvailabilityPause }, nil, csisupdv1.ClaimRuleAvailability},
		{"plugin drains on the node", func(st *fakeState, _ *statepb.Volume) { st.nodes["n1"].DrainingPlugins = []string{"p"} }, nil, csisupdv1.ClaimRuleAvailability},
		{"usage is no capability", nil, &csisupdv1.VolumeUsage{AccessMode: mnmw}, csisupdv1.ClaimRuleCapability},
		{"mount group without the node capability", nil, &csisupdv1.VolumeUsage{VolumeMountGroup: "1000"}, csisupdv1.ClaimRuleCapability},
		{"topology", func(_ *fakeState, v *statepb.Volume) {
			v.AccessibleTopology = []*statepb.TopologySegment{{Segments: map[string]string{"zone": "b"}}}
		}, nil, csisupdv1.ClaimRuleTopology},
		{"max volumes", func(st *fakeState, _ *statepb.Volume) {
			st.volumes = []*statepb.Volume{
				{Id: "o1", PluginId: "p", Claims: []*statepb.VolumeClaim{claimOn("n1", "x", snw, false)}},
				{Id: "o2", PluginId: "p", Claims: []*statepb.VolumeClaim{claimOn("n1", "y", snw, false)}},
			}
		}, nil, csisupdv1.ClaimRuleMaxVolumes},
		{"unknown node", func(st *fakeState, _ *statepb.Volume) { delete(st.nodes, "n1") }, nil, PlacementRuleNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, v := admitFixture(), vol(snw)
			if tt.change != nil {
				tt.change(st, v)
			}
			err := CheckPlacement(st, v, "n1", tt.usage, timestamppb.Now())
			if tt.rule == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			rule, msg, refused := PlacementRefusal(err)
			if !refused || rule != tt.rule || msg == "" {
				t.Fatalf("refusal (%q, %q, %v) of %v, want rule %s with a message", rule, msg, refused, err, tt.rule)
			}
		})
	}
}

// TestPlacementRefusal checks that errors that are not about a node are
// not turned into a node's answer.
func TestPlacementRefusal(t *testing.T) {
	for _, err := range []error{nil, status.Error(codes.InvalidArgument, "bad usage"), status.Error(codes.Unavailable, "no leader")} {
		if rule, _, refused := PlacementRefusal(err); refused {
			t.Errorf("PlacementRefusal(%v) = rule %q, want no refusal", err, rule)
		}
	}
}

// TestPlacementNodes checks which nodes a check without a list looks at.
func TestPlacementNodes(t *testing.T) {
	nodes := []*statepb.ClusterNode{
		{Id: "a", Plugins: []*statepb.Plugin{{Id: "p", Type: string(plugin.TypeNode)}}},
		{Id: "b", Plugins: []*statepb.Plugin{{Id: "p", Type: string(plugin.TypeMonolith), Healthy: false}}},
		{Id: "c", Plugins: []*statepb.Plugin{{Id: "p", Type: string(plugin.TypeController)}}},
		{Id: "d", Plugins: []*statepb.Plugin{{Id: "other", Type: string(plugin.TypeNode)}}},
		{Id: "e", ReplacedBy: "f", Plugins: []*statepb.Plugin{{Id: "p", Type: string(plugin.TypeNode)}}},
	}
	var got []string
	for _, n := range PlacementNodes(nodes, "p") {
		got = append(got, n.GetId())
	}
	if want := []string{"a", "b"}; !slices.Equal(got, want) {
		t.Fatalf("placement nodes %v, want %v", got, want)
	}
}

// TestResolveNode checks how a node id or name is resolved.
func TestResolveNode(t *testing.T) {
	n1 := &statepb.ClusterNode{Id: "id-1", Name: "web"}
	old := &statepb.ClusterNode{Id: "id-0", Name: "web", ReplacedBy: "id-1"}
	n2 := &statepb.ClusterNode{Id: "id-2", Name: "web"}
	tests := []struct {
		name  string
		byID  *statepb.ClusterNode
		named []*statepb.ClusterNode
		want  string
		code  codes.Code
	}{
		{"an id", n2, []*statepb.ClusterNode{n1}, "id-2", codes.OK},
		{"a name", nil, []*statepb.ClusterNode{old, n1}, "id-1", codes.OK},
		{"unknown", nil, nil, "", codes.NotFound},
		{"only a replaced node", nil, []*statepb.ClusterNode{old}, "", codes.NotFound},
		{"two nodes", nil, []*statepb.ClusterNode{n1, n2}, "", codes.InvalidArgument},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := ResolveNode("web", tt.byID, tt.named)
			if status.Code(err) != tt.code || n.GetId() != tt.want {
				t.Fatalf("ResolveNode: %v, %v; want %q, %s", n.GetId(), err, tt.want, tt.code)
			}
			if tt.code == codes.InvalidArgument && !strings.Contains(err.Error(), "id-1, id-2") {
				t.Errorf("ambiguity %v does not list the nodes", err)
			}
		})
	}
}
