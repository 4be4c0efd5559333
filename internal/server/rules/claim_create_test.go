package rules

import (
	"maps"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

func TestCheckClaimCreate(t *testing.T) {
	create := &csisupdv1.VolumeCreateRequest{PluginId: "p"}
	for _, tc := range []struct {
		name string
		req  *csisupdv1.VolumeClaimRequest
		ok   bool
	}{
		{"no create", &csisupdv1.VolumeClaimRequest{Id: "v"}, true},
		{"create", &csisupdv1.VolumeClaimRequest{Id: "v", Create: create}, true},
		{"ephemeral create", &csisupdv1.VolumeClaimRequest{Id: "v", Create: create, Ephemeral: true}, true},
		{"ephemeral without create", &csisupdv1.VolumeClaimRequest{Id: "v", Ephemeral: true}, false},
		{"create with an id", &csisupdv1.VolumeClaimRequest{Id: "v", Create: &csisupdv1.VolumeCreateRequest{Id: "v", PluginId: "p"}}, false},
		{"create without a plugin", &csisupdv1.VolumeClaimRequest{Id: "v", Create: &csisupdv1.VolumeCreateRequest{}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckClaimCreate(tc.req)
			if tc.ok != (err == nil) || !tc.ok && status.Code(err) != codes.InvalidArgument {
				t.Fatalf("CheckClaimCreate = %v, want ok=%v or InvalidArgument", err, tc.ok)
			}
		})
	}
}

func TestCreateTopology(t *testing.T) {
	node := func(topology map[string]string) *statepb.ClusterNode {
		return &statepb.ClusterNode{Id: "n1", Plugins: []*statepb.Plugin{{Id: "p", AccessibleTopology: topology}}}
	}
	seg := func(kv ...string) *csisupdv1.TopologySegment {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return &csisupdv1.TopologySegment{Segments: m}
	}
	local := map[string]string{"host": "n1", "zone": "a"}
	for _, tc := range []struct {
		name  string
		node  *statepb.ClusterNode
		given *csisupdv1.TopologyRequirement
		want  map[string]string // the one segment required; nil: none
		rule  string            // the refusal's rule; "": none
	}{
		{"the node's topology", node(local), nil, local, ""},
		{"a requisite the node meets", node(local), &csisupdv1.TopologyRequirement{Requisite: []*csisupdv1.TopologySegment{seg("zone", "b"), seg("zone", "a")}}, local, ""},
		{"preferred only: the node's", node(local), &csisupdv1.TopologyRequirement{Preferred: []*csisupdv1.TopologySegment{seg("zone", "b")}}, local, ""},
		{"a requisite the node misses", node(local), &csisupdv1.TopologyRequirement{Requisite: []*csisupdv1.TopologySegment{seg("zone", "b")}}, nil, csisupdv1.ClaimRuleTopology},
		{"a node without topology", node(nil), nil, nil, ""},
		{"a node without topology and a requisite", node(nil), &csisupdv1.TopologyRequirement{Requisite: []*csisupdv1.TopologySegment{seg("zone", "a")}}, nil, csisupdv1.ClaimRuleTopology},
		{"a node without the plugin", &statepb.ClusterNode{Id: "n1"}, nil, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := CreateTopology(tc.node, "p", tc.given)
			if r := rule(err); r != tc.rule {
				t.Fatalf("CreateTopology error %v (rule %q), want rule %q", err, r, tc.rule)
			}
			if tc.rule != "" {
				return
			}
			switch {
			case tc.want == nil && len(got) != 0:
				t.Errorf("CreateTopology = %v, want none", got)
			case tc.want != nil && (len(got) != 1 || !maps.Equal(got[0].GetSegments(), tc.want)):
				t.Errorf("CreateTopology = %v, want the one segment %v", got, tc.want)
			}
		})
	}
}

func TestEphemeralDone(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    *statepb.Volume
		want bool
	}{
		{"ephemeral without claims", &statepb.Volume{Id: "v", Ephemeral: true}, true},
		{"ephemeral with a claim being released", &statepb.Volume{Id: "v", Ephemeral: true, Claims: []*statepb.VolumeClaim{claimIn(StateNodeUnpublished)}}, false},
		{"not ephemeral", &statepb.Volume{Id: "v"}, false},
		{"gone", nil, false},
	} {
		if got := EphemeralDone(tc.v); got != tc.want {
			t.Errorf("%s: EphemeralDone = %v, want %v", tc.name, got, tc.want)
		}
	}
}
