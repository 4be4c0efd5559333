package volumeops

import (
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// topoSeg returns a stored segment of key, value pairs.
func topoSeg(kv ...string) *statepb.TopologySegment {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &statepb.TopologySegment{Segments: m}
}

// topoCand returns a controller candidate on node with the topology of
// key, value pairs.
func topoCand(node string, kv ...string) candidate {
	return candidate{nodeID: node, plugin: &statepb.Plugin{Id: "p", NodeId: node, AccessibleTopology: topoSeg(kv...).GetSegments()}}
}

func candNodes(cs []candidate) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.nodeID)
	}
	return out
}

func TestTopologyPlacementAllows(t *testing.T) {
	tests := []struct {
		name string
		p    placement
		have map[string]string
		want bool
	}{
		{"unconstrained, no topology", placement{}, nil, true},
		{"unconstrained, any topology", placement{}, map[string]string{"zone": "a"}, true},
		{"preferred alone does not restrict", placement{preferred: []*statepb.TopologySegment{topoSeg("zone", "a")}}, map[string]string{"zone": "b"}, true},
		{"requisite met", placement{requisite: []*statepb.TopologySegment{topoSeg("zone", "a"), topoSeg("zone", "b")}}, map[string]string{"zone": "b"}, true},
		{"requisite not met", placement{requisite: []*statepb.TopologySegment{topoSeg("zone", "a")}}, map[string]string{"zone": "b"}, false},
		{"requisite, node without topology", placement{requisite: []*statepb.TopologySegment{topoSeg("zone", "a")}}, nil, false},
		{"source reached", placementAt([]*statepb.TopologySegment{topoSeg("zone", "a")}, "n1"), map[string]string{"zone": "a", "rack": "1"}, true},
		{"source not reached", placementAt([]*statepb.TopologySegment{topoSeg("zone", "a")}, "n1"), map[string]string{"zone": "b"}, false},
		{"requisite met, source not reached", placement{
			requisite: []*statepb.TopologySegment{topoSeg("zone", "a")}, source: []*statepb.TopologySegment{topoSeg("rack", "1")},
		}, map[string]string{"zone": "a", "rack": "2"}, false},
		{"requisite met and source reached", placement{
			requisite: []*statepb.TopologySegment{topoSeg("zone", "a")}, source: []*statepb.TopologySegment{topoSeg("rack", "1")},
		}, map[string]string{"zone": "a", "rack": "1"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.p.allows(tt.have); got != tt.want {
				t.Fatalf("allows(%v) = %v, want %v", tt.have, got, tt.want)
			}
		})
	}
}

func TestTopologyPlacementRank(t *testing.T) {
	cands := []candidate{
		topoCand("n1", "zone", "a"),
		topoCand("n2", "zone", "b"),
		topoCand("n3", "zone", "c"),
		topoCand("n4", "zone", "b"),
		topoCand("n5"),
	}
	zone := func(z string) *statepb.TopologySegment { return topoSeg("zone", z) }
	tests := []struct {
		name  string
		p     placement
		cands []candidate
		want  []string // nil: none qualifies
	}{
		{"unconstrained keeps the order", placement{}, cands, []string{"n1", "n2", "n3", "n4", "n5"}},
		{"no candidates", placement{}, nil, nil},
		{"preferred in order, the rest stable", placement{preferred: []*statepb.TopologySegment{zone("c"), zone("b")}}, cands,
			[]string{"n3", "n2", "n4", "n1", "n5"}},
		{"a preferred segment no one meets", placement{preferred: []*statepb.TopologySegment{zone("x"), zone("b")}}, cands,
			[]string{"n2", "n4", "n1", "n3", "n5"}},
		{"requisite filters", placement{requisite: []*statepb.TopologySegment{zone("b"), zone("a")}}, cands, []string{"n1", "n2", "n4"}},
		{"requisite filters, preferred orders", placement{
			requisite: []*statepb.TopologySegment{zone("b"), zone("a")}, preferred: []*statepb.TopologySegment{zone("b")},
		}, cands, []string{"n2", "n4", "n1"}},
		{"the source's node first", placementAt([]*statepb.TopologySegment{zone("b")}, "n4"), cands, []string{"n4", "n2"}},
		{"the source's node before the preferred", placement{
			preferred: []*statepb.TopologySegment{zone("a")}, sourceNode: "n3",
		}, cands, []string{"n3", "n1", "n2", "n4", "n5"}},
		{"the source's node must reach the source too", placementAt([]*statepb.TopologySegment{zone("b")}, "n1"), cands, []string{"n2", "n4"}},
		{"none qualifies", placement{requisite: []*statepb.TopologySegment{zone("x")}}, cands, nil},
		{"source nobody reaches", placementAt([]*statepb.TopologySegment{zone("x")}, "n1"), cands, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.p.rank(tt.cands)
			if tt.want == nil {
				if got != nil {
					t.Fatalf("rank = %v, want nil", candNodes(got))
				}
				return
			}
			if !slices.Equal(candNodes(got), tt.want) {
				t.Fatalf("rank = %v, want %v", candNodes(got), tt.want)
			}
		})
	}
}

func TestTopologyPlacementOf(t *testing.T) {
	p := placementOf(&csisupdv1.TopologyRequirement{
		Requisite: []*csisupdv1.TopologySegment{{Segments: map[string]string{"zone": "a"}}},
		Preferred: []*csisupdv1.TopologySegment{{Segments: map[string]string{"zone": "b"}}, {Segments: map[string]string{"zone": "a"}}},
	})
	if len(p.requisite) != 1 || p.requisite[0].GetSegments()["zone"] != "a" || len(p.preferred) != 2 || p.preferred[0].GetSegments()["zone"] != "b" {
		t.Fatalf("placement %+v", p)
	}
	if !p.constrained() || p.source != nil || p.sourceNode != "" {
		t.Fatalf("placement %+v: want constrained by its requisite, without a source", p)
	}
	tests := []struct {
		name string
		p    placement
		want bool
	}{
		{"no requirement", placementOf(nil), false},
		{"preferred only", placementOf(&csisupdv1.TopologyRequirement{Preferred: []*csisupdv1.TopologySegment{{Segments: map[string]string{"zone": "b"}}}}), false},
		{"a source", placementAt([]*statepb.TopologySegment{topoSeg("zone", "a")}, ""), true},
		{"a source node alone", placementAt(nil, "n1"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.p.constrained(); got != tt.want {
				t.Fatalf("constrained = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestTopologyCSIRequirement(t *testing.T) {
	a, b, c := topoSeg("zone", "a"), topoSeg("zone", "b"), topoSeg("zone", "c", "rack", "1")
	csiTopo := func(segs ...*statepb.TopologySegment) []*csi.Topology {
		var out []*csi.Topology
		for _, s := range segs {
			out = append(out, &csi.Topology{Segments: s.GetSegments()})
		}
		return out
	}
	tests := []struct {
		name string
		p    placement
		want *csi.TopologyRequirement
	}{
		{"nothing asked", placement{}, nil},
		{"a source node alone", placementAt(nil, "n1"), nil},
		{"the caller's requisite", placement{requisite: []*statepb.TopologySegment{a, b}}, &csi.TopologyRequirement{Requisite: csiTopo(a, b)}},
		{"the caller's requisite over the source's", placement{requisite: []*statepb.TopologySegment{a}, source: []*statepb.TopologySegment{c}},
			&csi.TopologyRequirement{Requisite: csiTopo(a)}},
		{"the source's when the caller has none", placementAt([]*statepb.TopologySegment{c}, "n1"), &csi.TopologyRequirement{Requisite: csiTopo(c)}},
		{"preferred only", placement{preferred: []*statepb.TopologySegment{b, a}}, &csi.TopologyRequirement{Preferred: csiTopo(b, a)}},
		{"both", placement{requisite: []*statepb.TopologySegment{a, b}, preferred: []*statepb.TopologySegment{b}},
			&csi.TopologyRequirement{Requisite: csiTopo(a, b), Preferred: csiTopo(b)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.p.csiRequirement()
			if !proto.Equal(got, tt.want) || (got == nil) != (tt.want == nil) {
				t.Fatalf("requirement %v, want %v", got, tt.want)
			}
			if got == nil {
				return
			}
			// The requirement is a copy: changing it leaves the placement.
			for _, topo := range append(got.GetRequisite(), got.GetPreferred()...) {
				topo.Segments["zone"] = "changed"
			}
			for _, s := range append(append(slices.Clone(tt.p.requisite), tt.p.source...), tt.p.preferred...) {
				if s.GetSegments()["zone"] == "changed" {
					t.Fatal("the requirement shares its segments with the placement")
				}
			}
		})
	}
}

func TestTopologyCreatedWithin(t *testing.T) {
	requisite := placement{requisite: []*statepb.TopologySegment{topoSeg("zone", "a"), topoSeg("zone", "b", "rack", "1")}}
	tests := []struct {
		name string
		p    placement
		got  []*statepb.TopologySegment
		want bool
	}{
		{"no requisite", placement{}, []*statepb.TopologySegment{topoSeg("zone", "x")}, true},
		{"a source is no requisite", placementAt([]*statepb.TopologySegment{topoSeg("zone", "a")}, ""), []*statepb.TopologySegment{topoSeg("zone", "x")}, true},
		{"accessible from everywhere", requisite, nil, true},
		{"within the first segment", requisite, []*statepb.TopologySegment{topoSeg("zone", "a")}, true},
		{"within a segment, with more keys", requisite, []*statepb.TopologySegment{topoSeg("zone", "b", "rack", "1", "row", "3")}, true},
		{"one of its segments within", requisite, []*statepb.TopologySegment{topoSeg("zone", "x"), topoSeg("zone", "a")}, true},
		{"outside", requisite, []*statepb.TopologySegment{topoSeg("zone", "x")}, false},
		{"a segment's keys only in part", requisite, []*statepb.TopologySegment{topoSeg("zone", "b")}, false},
		{"keys spread over two segments do not add up", requisite, []*statepb.TopologySegment{topoSeg("zone", "b"), topoSeg("rack", "1")}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.p.createdWithin(tt.got); got != tt.want {
				t.Fatalf("createdWithin = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestTopologyDescribe(t *testing.T) {
	tests := []struct {
		name string
		p    placement
		want []string
	}{
		{"nothing", placement{}, nil},
		{"preferred is not required", placement{preferred: []*statepb.TopologySegment{topoSeg("zone", "a")}}, nil},
		{"requisite then source, keys in order", placement{
			requisite: []*statepb.TopologySegment{topoSeg("zone", "a", "rack", "1"), topoSeg("zone", "b")},
			source:    []*statepb.TopologySegment{topoSeg("row", "3", "hall", "2")},
		}, []string{"rack=1,zone=a", "zone=b", "hall=2,row=3"}},
		{"an empty segment", placement{requisite: []*statepb.TopologySegment{{}}}, []string{""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.p.describe(); !slices.Equal(got, tt.want) {
				t.Fatalf("describe = %q, want %q", got, tt.want)
			}
		})
	}
	if got := segmentString(map[string]string{"b": "2", "a": "1", "c": "3"}); got != "a=1,b=2,c=3" {
		t.Fatalf("segmentString = %q", got)
	}
	if got := segmentString(nil); got != "" {
		t.Fatalf("segmentString(nil) = %q", got)
	}
}

func TestTopologyUnsatisfiable(t *testing.T) {
	p := placement{requisite: []*statepb.TopologySegment{topoSeg("zone", "x")}, source: []*statepb.TopologySegment{topoSeg("rack", "1")}}
	tests := []struct {
		name       string
		cands      []candidate
		wantReason []string
		notReason  []string
	}{
		{"no controllers", nil, []string{"no healthy controller"}, []string{"controllers:"}},
		{"controllers named with their topology", []candidate{topoCand("n1", "zone", "a", "rack", "2"), topoCand("n2")},
			[]string{"no healthy controller", "controllers: n1 {rack=2,zone=a}; n2 {}"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := p.unsatisfiable("p", tt.cands)
			if status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("error %v: want FailedPrecondition", err)
			}
			d, ok := csisupdv1.ErrorDetail[*csisupdv1.TopologyUnsatisfiable](err)
			if !ok {
				t.Fatalf("error %v has no TopologyUnsatisfiable detail", err)
			}
			if d.GetPluginId() != "p" || !slices.Equal(d.GetRequisite(), []string{"zone=x", "rack=1"}) {
				t.Fatalf("detail %v: want plugin p, requisite [zone=x rack=1]", d)
			}
			for _, s := range tt.wantReason {
				if !strings.Contains(d.GetReason(), s) {
					t.Errorf("reason %q lacks %q", d.GetReason(), s)
				}
			}
			for _, s := range tt.notReason {
				if strings.Contains(d.GetReason(), s) {
					t.Errorf("reason %q has %q", d.GetReason(), s)
				}
			}
			if csisupdv1.IsRetryable(err) {
				t.Error("an unsatisfiable topology is marked retryable")
			}
		})
	}
}
