package server_test

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
	"github.com/csisupd/csisupd/internal/server/volumeops"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testutil"
)

var _ volumeops.NodeVolumesClient = (*fakeNodeVolumes)(nil)

// claimEnv is a cluster with fake agents whose NodeVolumes services share
// one fakeNodeVolumes, and the nodes that register them.
type claimEnv struct {
	c      *testcluster.Cluster
	cl     csisupdv1.ControlClient
	nv     *fakeNodeVolumes
	agents map[string]*fakeAgent
	nodes  map[string]*agentNode
	logs   *logBuffer
}

// newClaimEnv starts servers (with a short volume watch interval, then
// configure) and one node per entry of plugins. The control client talks
// to a follower when there are several servers.
func newClaimEnv(t *testing.T, servers int, configure func(*server.Config), plugins map[string][]*csisupdv1.Plugin) *claimEnv {
	t.Helper()
	e := &claimEnv{nv: newFakeNodeVolumes(), agents: map[string]*fakeAgent{}, nodes: map[string]*agentNode{}, logs: &logBuffer{}}
	e.c = testcluster.New(t, testcluster.Config{Servers: servers, Logger: e.logs.logger(), Configure: func(_ int, cfg *server.Config) {
		cfg.VolumeWatchInterval = 50 * time.Millisecond
		if configure != nil {
			configure(cfg)
		}
	}})
	leader := checkFormed(t, e.c, servers)
	e.cl = e.c.Control((leader.Index + 1) % servers)
	for id, ps := range plugins {
		e.agents[id] = startFakeAgentNV(t, id, e.nv)
		e.nodes[id] = startNode(t, id, e.agents[id].addr, e.c.RPCAddrs(), ps...)
	}
	for id, ps := range plugins {
		testutil.WaitFor(t, 10*time.Second, "node "+id+" ready with its plugins", func() bool {
			resp, err := e.cl.GetNode(context.Background(), &csisupdv1.NodeGetRequest{Id: id})
			return err == nil && resp.GetNode().GetStatus() == state.NodeStatusReady && len(resp.GetNode().GetPlugins()) == len(ps)
		})
	}
	return e
}

func (e *claimEnv) register(t *testing.T, v *csisupdv1.Volume) {
	t.Helper()
	if _, err := e.cl.RegisterVolume(context.Background(), &csisupdv1.VolumeRegisterRequest{Volume: v}); err != nil {
		t.Fatal(err)
	}
}

func (e *claimEnv) claim(volume, node, workload string, usage *csisupdv1.VolumeUsage) (*csisupdv1.VolumeClaimResponse, error) {
	return e.cl.ClaimVolume(context.Background(), &csisupdv1.VolumeClaimRequest{Id: volume, NodeId: node, WorkloadId: workload, Usage: usage})
}

func (e *claimEnv) release(volume, node, workload string) (*csisupdv1.VolumeReleaseResponse, error) {
	return e.cl.ReleaseVolume(context.Background(), &csisupdv1.VolumeReleaseRequest{Id: volume, NodeId: node, WorkloadId: workload})
}

func (e *claimEnv) volume(t *testing.T, id string) *csisupdv1.Volume {
	t.Helper()
	resp, err := e.cl.GetVolume(context.Background(), &csisupdv1.VolumeGetRequest{Id: id})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetVolume()
}

// claimOf returns the claim of a workload on a node, or nil.
func claimOf(v *csisupdv1.Volume, node, workload string) *csisupdv1.VolumeClaim {
	for _, c := range v.GetClaims() {
		if c.GetNodeId() == node && c.GetWorkloadId() == workload {
			return c
		}
	}
	return nil
}

// refusal returns the ClaimRefused detail of err, or fails the test.
func refusal(t *testing.T, err error) *csisupdv1.ClaimRefused {
	t.Helper()
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("claim: %v, want FailedPrecondition with ClaimRefused", err)
	}
	d, ok := csisupdv1.ErrorDetail[*csisupdv1.ClaimRefused](err)
	if !ok {
		t.Fatalf("claim: %v has no ClaimRefused detail", err)
	}
	return d
}

// volumeEvents replays the events of a volume from the start of the
// buffer until one satisfies until.
func volumeEvents(t *testing.T, cl csisupdv1.ControlClient, volume string, until func(*csisupdv1.ClusterEvent) bool) []*csisupdv1.ClusterEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	st, err := cl.WatchEvents(ctx, &csisupdv1.ClusterEventWatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var out []*csisupdv1.ClusterEvent
	for {
		e, err := st.Recv()
		if err != nil {
			t.Fatalf("events of volume %s so far %v: %v", volume, out, err)
		}
		if e.GetVolumeId() != volume {
			continue
		}
		out = append(out, e)
		if until(e) {
			return out
		}
	}
}

func typeIs(typ string) func(*csisupdv1.ClusterEvent) bool {
	return func(e *csisupdv1.ClusterEvent) bool { return e.GetType() == typ }
}

// monolithWith is a monolith plugin with a topology and a volume limit.
func monolithWith(id, nodeID string, topology map[string]string, maxVolumes int32) *csisupdv1.Plugin {
	p := monolith(id, nodeID)
	p.AccessibleTopology, p.MaxVolumes = topology, maxVolumes
	return p
}

func TestClaimAndReleaseThroughFollower(t *testing.T) {
	e := newClaimEnv(t, 3, nil, map[string][]*csisupdv1.Plugin{
		"node-a": {monolith("p1", "node-a")}, "node-b": {monolith("p1", "node-b")},
	})
	ctx := context.Background()
	const secret = "s3cr3t-claim-value"
	if _, err := e.cl.CreateVolume(ctx, &csisupdv1.VolumeCreateRequest{Id: "vol-1", PluginId: "p1",
		Capabilities: []*csisupdv1.VolumeCapability{{AccessType: "mount", AccessMode: "SINGLE_NODE_WRITER"}}}); err != nil {
		t.Fatal(err)
	}
	resp, err := e.cl.ClaimVolume(ctx, &csisupdv1.VolumeClaimRequest{Id: "vol-1", NodeId: "node-b", WorkloadId: "w1",
		Secrets: map[string]string{"token": secret}})
	if err != nil {
		t.Fatal(err)
	}
	cl := resp.GetClaim()
	if cl.GetState() != rules.StateTaken || !cl.GetMounted() || !cl.GetControllerPublished() || cl.GetHostPath() == "" ||
		cl.GetCsiNodeId() != "csi-node-b" || cl.GetPublishContext()["device"] != "/dev/fake-csi-node-b" || cl.GetClaimIndex() == 0 ||
		cl.GetUsage().GetAccessMode() != "SINGLE_NODE_WRITER" || cl.GetUsage().GetAccessType() != "mount" || cl.GetReadOnly() {
		t.Fatalf("claim: %v", cl)
	}
	want := []string{"publish ext-vol-1 csi-node-b", "mount vol-1 w1 " + e.agents["node-b"].addr}
	if got := e.nv.journal.claimCalls(); !slices.Equal(got, want) {
		t.Fatalf("calls %q, want %q", got, want)
	}
	if m := e.nv.lastMount(); !m.GetCluster() || m.GetClaimIndex() != cl.GetClaimIndex() || m.GetExternalId() != "ext-vol-1" ||
		m.GetPublishContext()["device"] != "/dev/fake-csi-node-b" || m.GetVolumeContext()["created-by"] == "" || m.GetSecrets()["token"] != secret {
		t.Fatalf("mount request: %v", m)
	}

	// Claiming again returns the claim and calls nothing.
	again, err := e.claim("vol-1", "node-b", "w1", nil)
	if err != nil || !proto.Equal(claimOf(again.GetVolume(), "node-b", "w1"), cl) {
		t.Fatalf("repeated claim: %v, %v", again, err)
	}
	if n := len(e.nv.journal.claimCalls()); n != 2 {
		t.Fatalf("a repeated claim made calls: %q", e.nv.journal.claimCalls())
	}

	// NodeClaims through a follower answers from the leader.
	cluster := csisupdv1.NewClusterClient(e.c.Conn((e.c.Leader().Index + 1) % 3))
	nc, err := cluster.NodeClaims(asNode(ctx, "node-b"), &csisupdv1.NodeClaimsRequest{NodeId: "node-b"})
	if err != nil {
		t.Fatal(err)
	}
	if len(nc.GetClaims()) != 1 || nc.GetClaims()[0].GetVolumeId() != "vol-1" || nc.GetClaims()[0].GetWorkloadId() != "w1" ||
		nc.GetClaims()[0].GetClaimIndex() != cl.GetClaimIndex() || nc.GetIndex() < cl.GetClaimIndex() {
		t.Fatalf("node claims of node-b: %v", nc)
	}
	if nc, err := cluster.NodeClaims(asNode(ctx, "node-a"), &csisupdv1.NodeClaimsRequest{NodeId: "node-a"}); err != nil || len(nc.GetClaims()) != 0 {
		t.Fatalf("node claims of node-a: %v, %v", nc, err)
	}

	// A snapshot keeps the claim, and no secret.
	snap := saveSnapshot(t, e.cl)
	if bytes.Contains(snap, []byte(secret)) {
		t.Fatal("a claim secret was stored in the replicated state")
	}
	var st statepb.StateSnapshot
	if err := proto.Unmarshal(snap, &st); err != nil {
		t.Fatal(err)
	}
	if len(st.GetVolumes()) != 1 || !proto.Equal(claimOf(statepb.VolumeToAPI(st.GetVolumes()[0]), "node-b", "w1"), cl) {
		t.Fatalf("snapshot volumes: %v", st.GetVolumes())
	}

	if _, err := e.cl.DeleteVolume(ctx, &csisupdv1.VolumeDeleteRequest{Id: "vol-1"}); status.Code(err) != codes.FailedPrecondition ||
		!strings.Contains(err.Error(), "release them first") {
		t.Fatalf("delete of a claimed volume: %v, want FailedPrecondition", err)
	}

	rel, err := e.release("vol-1", "node-b", "w1")
	if err != nil || len(rel.GetVolume().GetClaims()) != 0 {
		t.Fatalf("release: %v, %v", rel, err)
	}
	want = append(want, "unmount vol-1 w1 "+e.agents["node-b"].addr, "unpublish ext-vol-1 csi-node-b")
	if got := e.nv.journal.claimCalls(); !slices.Equal(got, want) {
		t.Fatalf("calls %q, want %q", got, want)
	}
	// Releasing again, or a claim that never was, succeeds.
	if _, err := e.release("vol-1", "node-b", "w1"); err != nil {
		t.Fatalf("repeated release: %v", err)
	}
	if _, err := e.release("vol-1", "node-a", ""); err != nil {
		t.Fatalf("release of no claim: %v", err)
	}

	// The events tell each step, in order.
	events := volumeEvents(t, e.cl, "vol-1", typeIs("volume-claim-freed"))
	var steps []string
	for _, ev := range events {
		if strings.HasPrefix(ev.GetType(), "volume-claim") {
			if ev.GetNodeId() != "node-b" || !strings.Contains(ev.GetDescription(), "w1") {
				t.Errorf("event %v does not name the node and workload", ev)
			}
			step := ev.GetType()
			if i := strings.Index(ev.GetDescription(), "state "); i >= 0 && ev.GetType() != "volume-claim-freed" {
				step += " " + strings.Fields(ev.GetDescription()[i:])[1]
			}
			steps = append(steps, strings.TrimSuffix(step, ","))
		}
	}
	wantSteps := []string{
		"volume-claimed taken",
		"volume-claim-updated taken", // controller published and mounted
		"volume-claim-updated unpublishing",
		"volume-claim-updated node-unpublished",
		"volume-claim-updated controller-unpublished",
		"volume-claim-freed",
	}
	if !slices.Equal(steps, wantSteps) {
		t.Fatalf("claim events %q, want %q", steps, wantSteps)
	}
	// A release is two raft writes: its start, then one entry that records
	// the node's step and the controller's and frees the claim.
	var claimEvents []*csisupdv1.ClusterEvent
	for _, ev := range events {
		if strings.HasPrefix(ev.GetType(), "volume-claim") {
			claimEvents = append(claimEvents, ev)
		}
	}
	if unpublishing, freed := claimEvents[2], claimEvents[3:]; freed[0].GetIndex() == unpublishing.GetIndex() ||
		freed[1].GetIndex() != freed[0].GetIndex() || freed[2].GetIndex() != freed[0].GetIndex() {
		t.Fatalf("release events at indexes %d, %d, %d, %d; want the last three in one raft entry after the first",
			unpublishing.GetIndex(), freed[0].GetIndex(), freed[1].GetIndex(), freed[2].GetIndex())
	}
	for _, ev := range events {
		if strings.Contains(ev.GetDescription(), secret) {
			t.Fatalf("event %v holds a secret", ev)
		}
	}
	if strings.Contains(e.logs.String(), secret) {
		t.Fatal("a claim secret was logged")
	}
	if !slices.Contains(e.agents["node-a"].seenSecrets(), secret) && !slices.Contains(e.agents["node-b"].seenSecrets(), secret) {
		t.Fatal("the secret did not reach the controller")
	}

	if _, err := e.cl.DeleteVolume(ctx, &csisupdv1.VolumeDeleteRequest{Id: "vol-1"}); err != nil {
		t.Fatalf("delete after release: %v", err)
	}
	if _, err := e.claim("vol-1", "node-b", "w1", nil); status.Code(err) != codes.NotFound {
		t.Fatalf("claim of a deleted volume: %v, want NotFound", err)
	}
}

func TestClaimAccessModes(t *testing.T) {
	e := newClaimEnv(t, 1, nil, map[string][]*csisupdv1.Plugin{
		"node-a": {monolith("p1", "node-a")}, "node-b": {monolith("p1", "node-b")},
	})
	type claimSpec struct {
		node     string
		readOnly bool
		mode     string // "" uses the volume's first capability
	}
	tests := []struct {
		name          string
		modes         []string // the volume's capabilities
		first, second claimSpec
		firstRefused  bool // the first claim alone is refused
		allowed       bool // the second claim is allowed
	}{
		{name: "single node writer: reader on the same node", modes: []string{"SINGLE_NODE_WRITER"},
			first: claimSpec{node: "node-a"}, second: claimSpec{node: "node-a", readOnly: true}, allowed: true},
		{name: "single node writer: second writer on the same node", modes: []string{"SINGLE_NODE_WRITER"},
			first: claimSpec{node: "node-a"}, second: claimSpec{node: "node-a"}},
		{name: "single node writer: reader on another node", modes: []string{"SINGLE_NODE_WRITER"},
			first: claimSpec{node: "node-a"}, second: claimSpec{node: "node-b", readOnly: true}},
		{name: "single node single writer: second writer", modes: []string{"SINGLE_NODE_SINGLE_WRITER"},
			first: claimSpec{node: "node-a"}, second: claimSpec{node: "node-a"}},
		{name: "single node single writer: two readers", modes: []string{"SINGLE_NODE_SINGLE_WRITER"},
			first: claimSpec{node: "node-a", readOnly: true}, second: claimSpec{node: "node-a", readOnly: true}, allowed: true},
		{name: "single node multi writer: writers on one node", modes: []string{"SINGLE_NODE_MULTI_WRITER"},
			first: claimSpec{node: "node-a"}, second: claimSpec{node: "node-a"}, allowed: true},
		{name: "single node multi writer: writer on another node", modes: []string{"SINGLE_NODE_MULTI_WRITER"},
			first: claimSpec{node: "node-a"}, second: claimSpec{node: "node-b"}},
		{name: "single node reader only: readers on one node", modes: []string{"SINGLE_NODE_READER_ONLY"},
			first: claimSpec{node: "node-a", readOnly: true}, second: claimSpec{node: "node-a", readOnly: true}, allowed: true},
		{name: "single node reader only: reader on another node", modes: []string{"SINGLE_NODE_READER_ONLY"},
			first: claimSpec{node: "node-a", readOnly: true}, second: claimSpec{node: "node-b", readOnly: true}},
		{name: "single node reader only: a writer", modes: []string{"SINGLE_NODE_READER_ONLY"},
			first: claimSpec{node: "node-a"}, firstRefused: true},
		{name: "multi node reader only: readers on two nodes", modes: []string{"MULTI_NODE_READER_ONLY"},
			first: claimSpec{node: "node-a", readOnly: true}, second: claimSpec{node: "node-b", readOnly: true}, allowed: true},
		{name: "multi node reader only: a writer", modes: []string{"MULTI_NODE_READER_ONLY"},
			first: claimSpec{node: "node-a"}, firstRefused: true},
		{name: "multi node single writer: writer and a reader elsewhere", modes: []string{"MULTI_NODE_SINGLE_WRITER"},
			first: claimSpec{node: "node-a"}, second: claimSpec{node: "node-b", readOnly: true}, allowed: true},
		{name: "multi node single writer: second writer elsewhere", modes: []string{"MULTI_NODE_SINGLE_WRITER"},
			first: claimSpec{node: "node-a"}, second: claimSpec{node: "node-b"}},
		{name: "multi node single writer: second writer on the same node", modes: []string{"MULTI_NODE_SINGLE_WRITER"},
			first: claimSpec{node: "node-a"}, second: claimSpec{node: "node-a"}},
		{name: "multi node multi writer: writers on two nodes", modes: []string{"MULTI_NODE_MULTI_WRITER"},
			first: claimSpec{node: "node-a"}, second: claimSpec{node: "node-b"}, allowed: true},
		{name: "the new claim's stricter mode wins", modes: []string{"MULTI_NODE_MULTI_WRITER", "SINGLE_NODE_WRITER"},
			first: claimSpec{node: "node-a", mode: "MULTI_NODE_MULTI_WRITER"}, second: claimSpec{node: "node-b", mode: "SINGLE_NODE_WRITER"}},
		{name: "the existing claim's stricter mode wins", modes: []string{"MULTI_NODE_MULTI_WRITER", "SINGLE_NODE_WRITER"},
			first: claimSpec{node: "node-a", mode: "SINGLE_NODE_WRITER"}, second: claimSpec{node: "node-b", mode: "MULTI_NODE_MULTI_WRITER"}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := fmt.Sprintf("am-%d", i)
			v := &csisupdv1.Volume{Id: id, PluginId: "p1", ExternalId: "ext-" + id}
			for _, m := range tt.modes {
				v.Capabilities = append(v.Capabilities, &csisupdv1.VolumeCapability{AccessType: "mount", AccessMode: m})
			}
			e.register(t, v)
			usage := func(c claimSpec) *csisupdv1.VolumeUsage {
				return &csisupdv1.VolumeUsage{AccessMode: c.mode, ReadOnly: c.readOnly}
			}
			_, err := e.claim(id, tt.first.node, "first", usage(tt.first))
			if tt.firstRefused {
				if d := refusal(t, err); d.GetRule() != csisupdv1.ClaimRuleAccessMode || !strings.Contains(d.GetDescription(), "read-only") {
					t.Fatalf("refusal %v, want access-mode naming read-only", d)
				}
				return
			}
			if err != nil {
				t.Fatalf("first claim: %v", err)
			}
			_, err = e.claim(id, tt.second.node, "second", usage(tt.second))
			if tt.allowed {
				if err != nil {
					t.Fatalf("second claim: %v", err)
				}
				return
			}
			d := refusal(t, err)
			if d.GetRule() != csisupdv1.ClaimRuleAccessMode || !strings.Contains(d.GetDescription(), `"first"`) ||
				!strings.Contains(d.GetDescription(), tt.first.node) {
				t.Fatalf("refusal %v, want access-mode naming the first claim", d)
			}
			if got := claimOf(e.volume(t, id), tt.second.node, "second"); got != nil {
				t.Fatalf("a refused claim was recorded: %v", got)
			}
		})
	}
}

func TestClaimRefusals(t *testing.T) {
	e := newClaimEnv(t, 1, nil, map[string][]*csisupdv1.Plugin{
		"node-a": {monolithWith("p1", "node-a", map[string]string{"zone": "z1", "rack": "r1"}, 0), monolithWith("lim", "node-a", nil, 1)},
		"node-b": {monolithWith("p1", "node-b", map[string]string{"zone": "z2"}, 0), monolithWith("lim", "node-b", nil, 1)},
		"node-c": {monolith("other", "node-c")},
	})
	ctx := context.Background()

	// The topology CreateVolume returned is recorded and checked.
	created, err := e.cl.CreateVolume(ctx, &csisupdv1.VolumeCreateRequest{Id: "zoned", PluginId: "p1", Parameters: map[string]string{"zone": "z1"}})
	if err != nil {
		t.Fatal(err)
	}
	if segs := created.GetVolume().GetAccessibleTopology(); len(segs) != 1 || segs[0].GetSegments()["zone"] != "z1" {
		t.Fatalf("recorded topology %v, want zone z1", segs)
	}
	_, err = e.claim("zoned", "node-b", "w1", nil)
	if d := refusal(t, err); d.GetRule() != csisupdv1.ClaimRuleTopology || !strings.Contains(d.GetDescription(), "node-b") {
		t.Fatalf("refusal %v, want topology naming node-b", d)
	}
	if _, err := e.claim("zoned", "node-a", "w1", nil); err != nil {
		t.Fatalf("claim where the topology fits: %v", err)
	}
	e.register(t, &csisupdv1.Volume{Id: "two-zones", PluginId: "p1", ExternalId: "x-two", AccessibleTopology: []*csisupdv1.TopologySegment{
		{Segments: map[string]string{"zone": "z9"}}, {Segments: map[string]string{"zone": "z2"}},
	}})
	if _, err := e.claim("two-zones", "node-b", "w1", nil); err != nil {
		t.Fatalf("claim where the second segment fits: %v", err)
	}

	// A block usage of a volume that has only a mount capability.
	e.register(t, &csisupdv1.Volume{Id: "fs", PluginId: "p1", ExternalId: "x-fs"})
	_, err = e.claim("fs", "node-a", "w1", &csisupdv1.VolumeUsage{AccessType: "block"})
	if d := refusal(t, err); d.GetRule() != csisupdv1.ClaimRuleCapability || !strings.Contains(d.GetDescription(), "block") {
		t.Fatalf("refusal %v, want capability naming block", d)
	}
	if _, err := e.claim("fs", "node-a", "w1", &csisupdv1.VolumeUsage{AccessType: "sideways"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("claim with a bad access type: %v, want InvalidArgument", err)
	}

	// max_volumes 1: a second volume on the node is refused; the same
	// volume for another workload, or another node, is not.
	for _, id := range []string{"lim-1", "lim-2"} {
		e.register(t, &csisupdv1.Volume{Id: id, PluginId: "lim", ExternalId: "x-" + id,
			Capabilities: []*csisupdv1.VolumeCapability{{AccessType: "mount", AccessMode: "MULTI_NODE_MULTI_WRITER"}}})
	}
	if _, err := e.claim("lim-1", "node-a", "w1", nil); err != nil {
		t.Fatal(err)
	}
	_, err = e.claim("lim-2", "node-a", "w2", nil)
	if d := refusal(t, err); d.GetRule() != csisupdv1.ClaimRuleMaxVolumes || !strings.Contains(d.GetDescription(), "node-a") {
		t.Fatalf("refusal %v, want max-volumes naming node-a", d)
	}
	if _, err := e.claim("lim-1", "node-a", "w2", nil); err != nil {
		t.Fatalf("same volume, another workload: %v", err)
	}
	if _, err := e.claim("lim-2", "node-b", "w2", nil); err != nil {
		t.Fatalf("another node: %v", err)
	}

	// A node without the plugin, and a node that does not exist.
	_, err = e.claim("fs", "node-c", "w1", nil)
	if d := refusal(t, err); d.GetRule() != csisupdv1.ClaimRulePlugin || !strings.Contains(d.GetDescription(), "node-c") {
		t.Fatalf("refusal %v, want plugin-missing naming node-c", d)
	}
	if _, err := e.claim("fs", "node-z", "w1", nil); status.Code(err) != codes.NotFound {
		t.Fatalf("claim on an unknown node: %v, want NotFound", err)
	}
	if _, err := e.claim("nope", "node-a", "w1", nil); status.Code(err) != codes.NotFound {
		t.Fatalf("claim of an unknown volume: %v, want NotFound", err)
	}
	if _, err := e.claim("fs", "node-a", "", nil); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("claim without a workload: %v, want InvalidArgument", err)
	}
}

func TestClaimsShareOneControllerPublishPerNode(t *testing.T) {
	e := newClaimEnv(t, 1, nil, map[string][]*csisupdv1.Plugin{"node-a": {monolith("p1", "node-a")}})
	e.register(t, &csisupdv1.Volume{Id: "shared", PluginId: "p1", ExternalId: "x-shared",
		Capabilities: []*csisupdv1.VolumeCapability{{AccessType: "mount", AccessMode: "SINGLE_NODE_MULTI_WRITER"}}})
	addr := e.agents["node-a"].addr
	first, err := e.claim("shared", "node-a", "w1", nil)
	if err != nil {
		t.Fatal(err)
	}
	second, err := e.claim("shared", "node-a", "w2", nil)
	if err != nil {
		t.Fatal(err)
	}
	if !second.GetClaim().GetControllerPublished() ||
		!proto.Equal(&csisupdv1.VolumeClaim{PublishContext: second.GetClaim().GetPublishContext()}, &csisupdv1.VolumeClaim{PublishContext: first.GetClaim().GetPublishContext()}) {
		t.Fatalf("second claim %v does not share the first's publication %v", second.GetClaim(), first.GetClaim())
	}
	if _, err := e.release("shared", "node-a", "w1"); err != nil {
		t.Fatal(err)
	}
	want := []string{"publish x-shared csi-node-a", "mount shared w1 " + addr, "mount shared w2 " + addr, "unmount shared w1 " + addr}
	if got := e.nv.journal.claimCalls(); !slices.Equal(got, want) {
		t.Fatalf("calls %q, want %q (no controller unpublish while w2 uses the node)", got, want)
	}
	if _, err := e.release("shared", "node-a", "w2"); err != nil {
		t.Fatal(err)
	}
	want = append(want, "unmount shared w2 "+addr, "unpublish x-shared csi-node-a")
	if got := e.nv.journal.claimCalls(); !slices.Equal(got, want) {
		t.Fatalf("calls %q, want %q", got, want)
	}
}
