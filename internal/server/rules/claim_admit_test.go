package rules

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// fakeState is a Reader over fixed rows, so that the rules are tested
// without a store or raft.
type fakeState struct {
	nodes   map[string]*statepb.ClusterNode
	plugin  *state.ClusterPlugin
	volumes []*statepb.Volume
}

func (f *fakeState) Node(id string) *statepb.ClusterNode { return f.nodes[id] }
func (f *fakeState) ControllerAdvertises(pluginID, capability string) bool {
	if f.plugin == nil || f.plugin.ID != pluginID {
		return false
	}
	return slices.ContainsFunc(f.plugin.Instances, func(inst *state.PluginInstance) bool {
		ctrl, _ := plugin.Type(inst.Plugin.GetType()).Roles()
		return ctrl && slices.Contains(inst.Plugin.GetControllerCapabilities(), capability)
	})
}
func (f *fakeState) Volumes(pluginID string) []*statepb.Volume {
	var out []*statepb.Volume
	for _, v := range f.volumes {
		if v.GetPluginId() == pluginID {
			out = append(out, v)
		}
	}
	return out
}

// admitFixture is two ready nodes with the node plugin p (topology
// zone=a on n1, zone=b on n2, max_volumes 2) and a controller of p that
// can publish read-only.
func admitFixture() *fakeState {
	node := func(id, zone string) *statepb.ClusterNode {
		return &statepb.ClusterNode{Id: id, Status: state.NodeStatusReady, Plugins: []*statepb.Plugin{{
			Id: "p", Type: "node", Healthy: true, NodeId: "csi-" + id, MaxVolumes: 2,
			AccessibleTopology: map[string]string{"zone": zone},
		}}}
	}
	return &fakeState{
		nodes: map[string]*statepb.ClusterNode{"n1": node("n1", "a"), "n2": node("n2", "b")},
		plugin: &state.ClusterPlugin{ID: "p", Instances: []*state.PluginInstance{{NodeID: "c", Healthy: true,
			Plugin: &statepb.Plugin{Id: "p", Type: "controller", ControllerCapabilities: []string{CapPublishReadonly}}}}},
	}
}

func claimOn(node, workload, mode string, readOnly bool) *statepb.VolumeClaim {
	return &statepb.VolumeClaim{
		NodeId: node, CsiNodeId: "csi-" + node, WorkloadId: workload, State: StateTaken, ReadOnly: readOnly,
		Usage: &statepb.VolumeUsage{AccessType: "mount", AccessMode: mode, ReadOnly: readOnly},
	}
}

func vol(mode string, claims ...*statepb.VolumeClaim) *statepb.Volume {
	return &statepb.Volume{Id: "v", PluginId: "p", Claims: claims,
		Capabilities: []*statepb.VolumeCapability{{AccessType: "mount", AccessMode: mode}}}
}

const (
	snw  = "SINGLE_NODE_WRITER"
	mnsw = "MULTI_NODE_SINGLE_WRITER"
	mnmw = "MULTI_NODE_MULTI_WRITER"
	mnro = "MULTI_NODE_READER_ONLY"
	snmw = "SINGLE_NODE_MULTI_WRITER"
)

// TestCheckTake covers every admission rule: each case breaks one (or
// none) and names the rule the refusal carries.
func TestCheckTake(t *testing.T) {
	tests := []struct {
		name   string
		change func(st *fakeState)
		volume *statepb.Volume
		claim  *statepb.VolumeClaim
		rule   string // "" admits; else the rule, or the code NotFound or InvalidArgument
	}{
		{"admitted", nil, vol(snw), claimOn("n1", "w", snw, false), ""},
		{"same workload already holds a claim", nil, vol(snw, claimOn("n1", "w", snw, false)), claimOn("n1", "w", snw, false), csisupdv1.ClaimRuleStale},
		{"not a new claim", nil, vol(snw), func() *statepb.VolumeClaim {
			c := claimOn("n1", "w", snw, false)
			c.Mounted = true
			return c
		}(), "InvalidArgument"},
		{"unknown node", nil, vol(snw), claimOn("n9", "w", snw, false), "NotFound"},
		{"node down", func(st *fakeState) { st.nodes["n1"].Status = state.NodeStatusDown }, vol(snw), claimOn("n1", "w", snw, false), csisupdv1.ClaimRuleNodeNotReady},
		{"plugin not on the node", func(st *fakeState) { st.nodes["n1"].Plugins = nil }, vol(snw), claimOn("n1", "w", snw, false), csisupdv1.ClaimRulePlugin},
		{"plugin unhealthy on the node", func(st *fakeState) { st.nodes["n1"].Plugins[0].Healthy = false }, vol(snw), claimOn("n1", "w", snw, false), csisupdv1.ClaimRulePlugin},
		{"plugin without the node service", func(st *fakeState) { st.nodes["n1"].Plugins[0].Type = "controller" }, vol(snw), claimOn("n1", "w", snw, false), csisupdv1.ClaimRulePlugin},
		{"plugin's CSI node id changed", func(st *fakeState) { st.nodes["n1"].Plugins[0].NodeId = "csi-new" }, vol(snw), claimOn("n1", "w", snw, false), csisupdv1.ClaimRuleStale},
		{"usage is no capability", nil, vol(mnmw), claimOn("n1", "w", snw, false), csisupdv1.ClaimRuleCapability},
		{"topology does not reach the node", nil, func() *statepb.Volume {
			v := vol(snw)
			v.AccessibleTopology = []*statepb.TopologySegment{{Segments: map[string]string{"zone": "b"}}}
			return v
		}(), claimOn("n1", "w", snw, false), csisupdv1.ClaimRuleTopology},
		{"topology reaches the node", nil, func() *statepb.Volume {
			v := vol(snw)
			v.AccessibleTopology = []*statepb.TopologySegment{{Segments: map[string]string{"zone": "b"}}, {Segments: map[string]string{"zone": "a"}}}
			return v
		}(), claimOn("n1", "w", snw, false), ""},
		{"node at max_volumes", func(st *fakeState) {
			st.volumes = []*statepb.Volume{
				{Id: "o1", PluginId: "p", Claims: []*statepb.VolumeClaim{claimOn("n1", "x", snw, false)}},
				{Id: "o2", PluginId: "p", Claims: []*statepb.VolumeClaim{claimOn("n1", "y", snw, false)}},
			}
		}, vol(snw), claimOn("n1", "w", snw, false), csisupdv1.ClaimRuleMaxVolumes},
		{"max_volumes counts other nodes apart", func(st *fakeState) {
			st.volumes = []*statepb.Volume{
				{Id: "o1", PluginId: "p", Claims: []*statepb.VolumeClaim{claimOn("n2", "x", snw, false)}},
				{Id: "o2", PluginId: "p", Claims: []*statepb.VolumeClaim{claimOn("n2", "y", snw, false)}},
			}
		}, vol(snw), claimOn("n1", "w", snw, false), ""},
		{"second writer, single-node-writer", nil, vol(snw, claimOn("n1", "a", snw, false)), claimOn("n1", "w", snw, false), csisupdv1.ClaimRuleAccessMode},
		{"second writer held by a claim being released", nil, vol(snw, func() *statepb.VolumeClaim {
			c := claimOn("n1", "a", snw, false)
			c.State = StateNodeUnpublished
			return c
		}()), claimOn("n1", "w", snw, false), csisupdv1.ClaimRuleAccessMode},
		{"reader beside the writer on its node", nil, vol(snw, claimOn("n1", "a", snw, false)), claimOn("n1", "w", snw, true), ""},
		{"another node, single-node-writer", nil, vol(snw, claimOn("n1", "a", snw, true)), claimOn("n2", "w", snw, true), csisupdv1.ClaimRuleAccessMode},
		{"second writer, multi-node-single-writer", nil, vol(mnsw, claimOn("n1", "a", mnsw, false)), claimOn("n2", "w", mnsw, false), csisupdv1.ClaimRuleAccessMode},
		{"reader elsewhere, multi-node-single-writer", nil, vol(mnsw, claimOn("n1", "a", mnsw, false)), claimOn("n2", "w", mnsw, true), ""},
		{"writers, multi-node-multi-writer", nil, vol(mnmw, claimOn("n1", "a", mnmw, false)), claimOn("n2", "w", mnmw, false), ""},
		{"writer, reader-only mode", nil, vol(mnro), claimOn("n1", "w", mnro, false), csisupdv1.ClaimRuleAccessMode},
		{"writers on one node, single-node-multi-writer", nil, vol(snmw, claimOn("n1", "a", snmw, false)), claimOn("n1", "w", snmw, false), ""},
		{"writers on two nodes, single-node-multi-writer", nil, vol(snmw, claimOn("n1", "a", snmw, false)), claimOn("n2", "w", snmw, false), csisupdv1.ClaimRuleAccessMode},
		{"writer on a read-only publication", nil, vol(mnmw, func() *statepb.VolumeClaim {
			c := claimOn("n1", "a", mnmw, true)
			c.ControllerPublished = true
			return c
		}()), claimOn("n1", "w", mnmw, false), csisupdv1.ClaimRuleAccessMode},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := admitFixture()
			if tt.change != nil {
				tt.change(st)
			}
			err := CheckTake(st, tt.volume, tt.claim)
			switch {
			case tt.rule == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.rule == "NotFound" || tt.rule == "InvalidArgument":
				if status.Code(err).String() != tt.rule {
					t.Fatalf("%v, want %s", err, tt.rule)
				}
			case tt.rule != "" && rule(err) != tt.rule:
				t.Fatalf("%v, want the %s rule", err, tt.rule)
			}
		})
	}
}

// TestAdmitBuildsTheClaim checks the claim Admit returns for a request:
// the node's CSI node id, the usage with its defaults, taken.
func TestAdmitBuildsTheClaim(t *testing.T) {
	now := timestamppb.Now()
	c, err := Admit(admitFixture(), vol(snw), &csisupdv1.VolumeClaimRequest{Id: "v", NodeId: "n2", WorkloadId: "w"}, now)
	if err != nil {
		t.Fatal(err)
	}
	want := &statepb.VolumeClaim{NodeId: "n2", CsiNodeId: "csi-n2", WorkloadId: "w", State: StateTaken, ClaimedAt: now, StateUpdatedAt: now,
		Usage: &statepb.VolumeUsage{AccessType: "mount", AccessMode: snw}}
	if !proto.Equal(c, want) {
		t.Fatalf("claim %v, want %v", c, want)
	}
	if _, err := Admit(admitFixture(), vol(snw), &csisupdv1.VolumeClaimRequest{Id: "v", NodeId: "n9", WorkloadId: "w"}, now); status.Code(err) != codes.NotFound {
		t.Fatalf("claim on an unknown node: %v, want NotFound", err)
	}
}

// TestCheckTakeMountGroup checks that a claim with a volume mount group is
// admitted only on a node whose plugin instance has VOLUME_MOUNT_GROUP,
// and that the refusal names the capability, the node and the plugin.
func TestCheckTakeMountGroup(t *testing.T) {
	withGroup := func(group string) *statepb.VolumeClaim {
		c := claimOn("n1", "w", snw, false)
		c.Usage.VolumeMountGroup = group
		return c
	}
	tests := []struct {
		name    string
		nodeCap []string
		claim   *statepb.VolumeClaim
		refused bool
	}{
		{"group, capability", []string{"STAGE_UNSTAGE_VOLUME", plugin.CapVolumeMountGroup}, withGroup("1000"), false},
		{"group, no capability", []string{"STAGE_UNSTAGE_VOLUME"}, withGroup("1000"), true},
		{"group, no capabilities at all", nil, withGroup("0"), true},
		{"no group, no capability", nil, withGroup(""), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := admitFixture()
			st.nodes["n1"].Plugins[0].NodeCapabilities = tt.nodeCap
			err := CheckTake(st, vol(snw), tt.claim)
			if !tt.refused {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if status.Code(err) != codes.FailedPrecondition || csisupdv1.IsRetryable(err) {
				t.Fatalf("error = %v, want FailedPrecondition, not retryable", err)
			}
			d, ok := csisupdv1.ErrorDetail[*csisupdv1.CapabilityMissing](err)
			if !ok || d.GetCapability() != plugin.CapVolumeMountGroup || d.GetNode() != "n1" || d.GetPluginId() != "p" || d.GetMethod() != MethodClaimVolume {
				t.Errorf("CapabilityMissing detail = %v, want VOLUME_MOUNT_GROUP of plugin p on node n1 for ClaimVolume", d)
			}
			for _, want := range []string{`"p"`, `"n1"`, plugin.CapVolumeMountGroup} {
				if !strings.Contains(status.Convert(err).Message(), want) {
					t.Errorf("message %q does not name %s", status.Convert(err).Message(), want)
				}
			}
		})
	}
}

// TestAdmitMountGroup checks that Admit keeps the request's mount group in
// the claim's usage and refuses one on a block usage.
func TestAdmitMountGroup(t *testing.T) {
	st := admitFixture()
	st.nodes["n1"].Plugins[0].NodeCapabilities = []string{plugin.CapVolumeMountGroup}
	c, err := Admit(st, vol(snw), &csisupdv1.VolumeClaimRequest{Id: "v", NodeId: "n1", WorkloadId: "w",
		Usage: &csisupdv1.VolumeUsage{VolumeMountGroup: "2000"}}, timestamppb.Now())
	if err != nil {
		t.Fatal(err)
	}
	if got := c.GetUsage().GetVolumeMountGroup(); got != "2000" {
		t.Errorf("claim usage mount group = %q, want 2000", got)
	}
	blockVol := &statepb.Volume{Id: "v", PluginId: "p", Capabilities: []*statepb.VolumeCapability{{AccessType: "block", AccessMode: snw}}}
	_, err = Admit(st, blockVol, &csisupdv1.VolumeClaimRequest{Id: "v", NodeId: "n1", WorkloadId: "w",
		Usage: &csisupdv1.VolumeUsage{AccessType: "block", VolumeMountGroup: "2000"}}, timestamppb.Now())
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "volume_mount_group") {
		t.Errorf("block usage with a mount group: error = %v, want InvalidArgument naming volume_mount_group", err)
	}
}
