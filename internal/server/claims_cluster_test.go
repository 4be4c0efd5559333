package server_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/server/statepb"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// claimCluster is a real cluster for claims: 3 servers and 2 agents, each
// agent with a monolith test plugin "tp" whose CSI node id is
// csi-node-<i>.
type claimCluster struct {
	c       *testcluster.Cluster
	plugins []*testplugin.Plugin
}

func newClaimCluster(t *testing.T, controllerCaps ...csi.ControllerServiceCapability_RPC_Type) *claimCluster {
	t.Helper()
	return newClaimClusterWith(t, nil, controllerCaps...)
}

// newClaimClusterWith is newClaimCluster with the servers' configuration
// changed by configure (after fastVolumeWatcher's).
func newClaimClusterWith(t *testing.T, configure func(cfg *server.Config), controllerCaps ...csi.ControllerServiceCapability_RPC_Type) *claimCluster {
	t.Helper()
	c := testcluster.New(t, testcluster.Config{Servers: 3, Agents: 2, Configure: func(i int, cfg *server.Config) {
		fastVolumeWatcher(i, cfg)
		if configure != nil {
			configure(cfg)
		}
	}})
	cc := &claimCluster{c: c}
	for i, a := range c.Agents() {
		cc.plugins = append(cc.plugins, a.StartPlugin("tp", testplugin.Config{
			NodeID: fmt.Sprintf("csi-node-%d", i), ControllerCapabilities: controllerCaps,
		}))
	}
	testutil.WaitFor(t, 30*time.Second, "plugin tp healthy on both agents", func() bool {
		p, err := cc.control(t).GetPlugin(context.Background(), &csisupdv1.PluginGetRequest{Id: "tp"})
		return err == nil && p.GetPlugin().GetNodesHealthy() == 2 && p.GetPlugin().GetControllersHealthy() == 2
	})
	return cc
}

// fastVolumeWatcher makes the leader's volume watcher look every 100 ms.
func fastVolumeWatcher(_ int, c *server.Config) {
	c.VolumeWatchInterval = 100 * time.Millisecond
}

// control is a Control client of the current leader.
func (cc *claimCluster) control(t *testing.T) csisupdv1.ControlClient {
	t.Helper()
	return cc.c.Control(cc.c.WaitForLeader(t, 30*time.Second).Index)
}

func (cc *claimCluster) create(t *testing.T, id, mode string) *csisupdv1.Volume {
	t.Helper()
	resp, err := cc.control(t).CreateVolume(context.Background(), &csisupdv1.VolumeCreateRequest{
		Id: id, PluginId: "tp", CapacityMinBytes: 1 << 20,
		Capabilities: []*csisupdv1.VolumeCapability{{AccessType: "mount", AccessMode: mode}},
	})
	if err != nil {
		t.Fatalf("create %s: %v", id, err)
	}
	return resp.GetVolume()
}

func (cc *claimCluster) claim(t *testing.T, vol string, agent int, workload string, usage *csisupdv1.VolumeUsage) (*csisupdv1.VolumeClaim, error) {
	t.Helper()
	resp, err := cc.control(t).ClaimVolume(context.Background(), &csisupdv1.VolumeClaimRequest{
		Id: vol, NodeId: cc.c.Agent(agent).NodeID(), WorkloadId: workload, Usage: usage,
	})
	return resp.GetClaim(), err
}

func (cc *claimCluster) release(t *testing.T, vol string, agent int, workload string) error {
	t.Helper()
	_, err := cc.control(t).ReleaseVolume(context.Background(), &csisupdv1.VolumeReleaseRequest{
		Id: vol, NodeId: cc.c.Agent(agent).NodeID(), WorkloadId: workload,
	})
	return err
}

func (cc *claimCluster) volume(t *testing.T, id string) *csisupdv1.Volume {
	t.Helper()
	resp, err := cc.control(t).GetVolume(context.Background(), &csisupdv1.VolumeGetRequest{Id: id})
	if err != nil {
		t.Fatalf("get volume %s: %v", id, err)
	}
	return resp.GetVolume()
}

// methods lists the methods of a node log.
func methods(log []testplugin.NodeCall) []string {
	var out []string
	for _, c := range log {
		out = append(out, c.Method)
	}
	return out
}

// TestClaimsShareOneStaging claims one volume for two workloads on one
// node: one NodeStageVolume, two NodePublishVolume, one controller
// publish; the unstage and the controller unpublish wait for the second
// release.
func TestClaimsShareOneStaging(t *testing.T) {
	cc := newClaimCluster(t)
	cc.create(t, "shared", "MULTI_NODE_MULTI_WRITER")
	node := cc.plugins[1]
	var paths []string
	for _, w := range []string{"w1", "w2"} {
		claim, err := cc.claim(t, "shared", 1, w, &csisupdv1.VolumeUsage{AccessMode: "MULTI_NODE_MULTI_WRITER"})
		if err != nil {
			t.Fatalf("claim for %s: %v", w, err)
		}
		paths = append(paths, claim.GetHostPath())
	}
	if paths[0] == paths[1] {
		t.Fatalf("both workloads got host path %s", paths[0])
	}
	if got, want := methods(node.NodeLog()), []string{"NodeStageVolume", "NodePublishVolume", "NodePublishVolume"}; !slices.Equal(got, want) {
		t.Fatalf("node calls after two claims: %v, want %v", got, want)
	}
	publishes := func() int64 {
		var n int64
		for _, p := range cc.plugins {
			n += p.Stats().Calls["ControllerPublishVolume"]
		}
		return n
	}
	if n := publishes(); n != 1 {
		t.Fatalf("%d ControllerPublishVolume calls for two claims on one node, want 1", n)
	}

	if err := cc.release(t, "shared", 1, "w1"); err != nil {
		t.Fatal(err)
	}
	if got, want := methods(node.NodeLog()), []string{"NodeStageVolume", "NodePublishVolume", "NodePublishVolume", "NodeUnpublishVolume"}; !slices.Equal(got, want) {
		t.Fatalf("node calls after the first release: %v, want %v", got, want)
	}
	unpublishes := func() int64 {
		var n int64
		for _, p := range cc.plugins {
			n += p.Stats().Calls["ControllerUnpublishVolume"]
		}
		return n
	}
	if n := unpublishes(); n != 0 {
		t.Fatalf("the controller unpublished while w2 still uses the volume (%d calls)", n)
	}
	if err := cc.release(t, "shared", 1, "w2"); err != nil {
		t.Fatal(err)
	}
	log := node.NodeLog()
	if got := methods(log[4:]); !slices.Equal(got, []string{"NodeUnpublishVolume", "NodeUnstageVolume"}) {
		t.Fatalf("node calls of the second release: %v, want unpublish then unstage", got)
	}
	if n := unpublishes(); n != 1 {
		t.Fatalf("%d ControllerUnpublishVolume calls after the last release, want 1", n)
	}
	if left := node.NodeVolumes(); len(left) != 0 {
		t.Fatalf("the node plugin still has %+v", left)
	}
	if v := cc.volume(t, "shared"); len(v.GetClaims()) != 0 {
		t.Fatalf("claims left: %v", v.GetClaims())
	}
}

// TestClaimRefusalsInCluster checks that a refused claim names its rule and leaves
// nothing behind on the node.
func TestClaimRefusalsInCluster(t *testing.T) {
	cc := newClaimCluster(t)
	cc.create(t, "one-writer", "SINGLE_NODE_WRITER")
	if _, err := cc.claim(t, "one-writer", 0, "w1", nil); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		vol      string
		agent    int
		workload string
		usage    *csisupdv1.VolumeUsage
		code     codes.Code
		rule     string
	}{
		{"second writer", "one-writer", 0, "w2", nil, codes.FailedPrecondition, csisupdv1.ClaimRuleAccessMode},
		{"other node", "one-writer", 1, "w3", &csisupdv1.VolumeUsage{ReadOnly: true}, codes.FailedPrecondition, csisupdv1.ClaimRuleAccessMode},
		{"block on a mount volume", "one-writer", 0, "w4", &csisupdv1.VolumeUsage{AccessType: "block"}, codes.FailedPrecondition, csisupdv1.ClaimRuleCapability},
		{"unknown volume", "nope", 0, "w5", nil, codes.NotFound, ""},
		{"workload with a slash", "one-writer", 0, "a/b", nil, codes.InvalidArgument, ""},
		{"workload dot dot", "one-writer", 0, "..", nil, codes.InvalidArgument, ""},
	}
	for _, tt := range tests {
		_, err := cc.claim(t, tt.vol, tt.agent, tt.workload, tt.usage)
		if got := status.Code(err); got != tt.code {
			t.Errorf("%s: %v, want %s", tt.name, err, tt.code)
			continue
		}
		if tt.rule != "" {
			d, ok := csisupdv1.ErrorDetail[*csisupdv1.ClaimRefused](err)
			if !ok || d.GetRule() != tt.rule {
				t.Errorf("%s: detail %v, want rule %s", tt.name, d, tt.rule)
			}
		}
	}
	// A node that runs no instance of the plugin.
	leader := cc.c.WaitForLeader(t, 30*time.Second)
	if _, err := csisupdv1.NewClusterClient(cc.c.Conn(leader.Index)).NodeRegister(asNode(context.Background(), "bare"), &csisupdv1.NodeRegisterRequest{
		NodeId: "bare", Name: "bare", Address: "127.0.0.1:1",
	}); err != nil {
		t.Fatal(err)
	}
	_, err := cc.control(t).ClaimVolume(context.Background(), &csisupdv1.VolumeClaimRequest{Id: "one-writer", NodeId: "bare", WorkloadId: "w7"})
	if d, ok := csisupdv1.ErrorDetail[*csisupdv1.ClaimRefused](err); !ok || d.GetRule() != csisupdv1.ClaimRulePlugin {
		t.Errorf("claim on a node without the plugin: %v, want rule %s", err, csisupdv1.ClaimRulePlugin)
	}
	if got := methods(cc.plugins[0].NodeLog()); !slices.Equal(got, []string{"NodeStageVolume", "NodePublishVolume"}) {
		t.Fatalf("node calls on agent 0: %v, want only the first claim's", got)
	}
	if n := len(cc.plugins[1].NodeLog()); n != 0 {
		t.Fatalf("agent 1's plugin saw %d node calls", n)
	}
	if v := cc.volume(t, "one-writer"); len(v.GetClaims()) != 1 {
		t.Fatalf("claims after the refusals: %v", v.GetClaims())
	}
}

// TestLeaderKilledInEveryReleaseState stops a release in each of its
// states, kills the leader there, and checks that the new leader's volume
// watcher finishes it: the node and the controller end with nothing, and
// the claim is freed.
func TestLeaderKilledInEveryReleaseState(t *testing.T) {
	cc := newClaimCluster(t)
	ctx := context.Background()
	faultAll := func(f testplugin.Faults) {
		for _, p := range cc.plugins {
			p.SetFaults(f)
		}
	}
	// A new leader counts, picks and admits claims on the nodes only once
	// they have heartbeated to it.
	heardFromBoth := func(when string) {
		testutil.WaitFor(t, 30*time.Second, when+": both nodes heard from by the leader", func() bool {
			p, err := cc.control(t).GetPlugin(ctx, &csisupdv1.PluginGetRequest{Id: "tp"})
			return err == nil && p.GetPlugin().GetNodesHealthy() == 2 && p.GetPlugin().GetControllersHealthy() == 2
		})
	}
	states := []struct {
		state string
		// stop makes the step after state fail; the last state is written
		// directly instead.
		stop testplugin.Faults
	}{
		{"unpublishing", testplugin.Faults{Errors: map[string]codes.Code{"NodeUnpublishVolume": codes.Internal}}},
		{"node-unpublished", testplugin.Faults{Errors: map[string]codes.Code{"ControllerUnpublishVolume": codes.Internal}}},
		{"controller-unpublished", testplugin.Faults{}},
	}
	for i, st := range states {
		vol := fmt.Sprintf("v-%d", i)
		cc.create(t, vol, "SINGLE_NODE_WRITER")
		if _, err := cc.claim(t, vol, 1, "w", nil); err != nil {
			t.Fatalf("%s: claim: %v", st.state, err)
		}
		if st.state == "controller-unpublished" {
			// Nothing can fail between this state and freed (a raft write),
			// so write it as a release interrupted there would have left it.
			if err := cc.release(t, vol, 1, "w"); err != nil {
				t.Fatal(err)
			}
			leader := cc.c.WaitForLeader(t, 30*time.Second)
			v := statepb.VolumeFromAPI(cc.volume(t, vol))
			v.Claims = []*statepb.VolumeClaim{{
				NodeId: cc.c.Agent(1).NodeID(), CsiNodeId: "csi-node-1", WorkloadId: "w", State: st.state,
				Usage: &statepb.VolumeUsage{AccessMode: "SINGLE_NODE_WRITER", AccessType: "mount"}, StateUpdatedAt: timestamppb.Now(),
			}}
			data, err := proto.Marshal(&statepb.LogEntry{Command: &statepb.LogEntry_VolumeUpsert{VolumeUpsert: v}})
			if err != nil {
				t.Fatal(err)
			}
			if err := leader.Server().Raft().Apply(data, 5*time.Second).Error(); err != nil {
				t.Fatal(err)
			}
		} else {
			faultAll(st.stop)
			if err := cc.release(t, vol, 1, "w"); err == nil {
				t.Fatalf("%s: the release succeeded through the injected fault", st.state)
			}
			v := cc.volume(t, vol)
			if len(v.GetClaims()) != 1 || v.GetClaims()[0].GetState() != st.state || v.GetClaims()[0].GetLastError() == "" {
				t.Fatalf("%s: claims after the failed release: %v", st.state, v.GetClaims())
			}
		}
		old := cc.c.WaitForLeader(t, 30*time.Second)
		cc.c.Kill(old.Index)
		// The faults stay until the new leader has heard from both nodes:
		// before, it calls only the controllers of the nodes it heard
		// from, and each test plugin keeps its own publications.
		heardFromBoth(st.state)
		faultAll(testplugin.Faults{})
		testutil.WaitFor(t, 60*time.Second, st.state+": the new leader frees the claim", func() bool {
			l := cc.c.Leader()
			if l == nil || l.ID == old.ID {
				return false
			}
			resp, err := cc.c.Control(l.Index).GetVolume(ctx, &csisupdv1.VolumeGetRequest{Id: vol})
			return err == nil && len(resp.GetVolume().GetClaims()) == 0
		})
		if left := cc.plugins[1].NodeVolumes(); len(left) != 0 {
			t.Fatalf("%s: the node plugin still has %+v", st.state, left)
		}
		cc.c.Restart(old.Index)
		heardFromBoth(st.state + ", restarted")
	}
	if _, err := cc.control(t).DeleteVolume(ctx, &csisupdv1.VolumeDeleteRequest{Id: "v-0"}); err != nil {
		t.Fatalf("delete after the releases: %v", err)
	}
}

// TestReadOnlyPublication claims a volume read-only on a node of a plugin
// with PUBLISH_READONLY: the controller publishes it read-only, so a
// read-write claim on that node is refused until the reader is released,
// and one on another node is not.
func TestReadOnlyPublication(t *testing.T) {
	cc := newClaimCluster(t, append(slices.Clone(testplugin.DefaultControllerCapabilities),
		csi.ControllerServiceCapability_RPC_PUBLISH_READONLY)...)
	cc.create(t, "ro", "MULTI_NODE_MULTI_WRITER")
	mm := func(readOnly bool) *csisupdv1.VolumeUsage {
		return &csisupdv1.VolumeUsage{AccessMode: "MULTI_NODE_MULTI_WRITER", ReadOnly: readOnly}
	}
	if _, err := cc.claim(t, "ro", 1, "reader", mm(true)); err != nil {
		t.Fatal(err)
	}
	_, err := cc.claim(t, "ro", 1, "writer", mm(false))
	if d, ok := csisupdv1.ErrorDetail[*csisupdv1.ClaimRefused](err); !ok || d.GetRule() != csisupdv1.ClaimRuleAccessMode {
		t.Fatalf("read-write claim beside a read-only publication: %v, want an access-mode refusal", err)
	}
	if _, err := cc.claim(t, "ro", 0, "writer", mm(false)); err != nil {
		t.Fatalf("read-write claim on another node: %v", err)
	}
	if err := cc.release(t, "ro", 1, "reader"); err != nil {
		t.Fatal(err)
	}
	if _, err := cc.claim(t, "ro", 1, "writer", mm(false)); err != nil {
		t.Fatalf("read-write claim once the reader is gone: %v", err)
	}
}
