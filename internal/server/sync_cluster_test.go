package server_test

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/acl"
	"github.com/csisupd/csisupd/internal/rpc"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// claimOwned claims vol for workload on agent's node with owner.
func (cc *claimCluster) claimOwned(t *testing.T, vol string, agent int, workload, owner string) *csisupdv1.VolumeClaim {
	t.Helper()
	resp, err := cc.control(t).ClaimVolume(context.Background(), &csisupdv1.VolumeClaimRequest{
		Id: vol, NodeId: cc.c.Agent(agent).NodeID(), WorkloadId: workload, Usage: mnmw, Owner: owner,
	})
	if err != nil {
		t.Fatalf("claim %s for %s (owner %q): %v", vol, workload, owner, err)
	}
	if resp.GetClaim().GetOwner() != owner {
		t.Fatalf("claim of %s holds owner %q, want %q", workload, resp.GetClaim().GetOwner(), owner)
	}
	return resp.GetClaim()
}

// refNames lists claim refs as volume/workload.
func refNames(refs []*csisupdv1.ClaimRef) []string {
	var out []string
	for _, r := range refs {
		out = append(out, r.GetVolumeId()+"/"+r.GetWorkloadId())
	}
	return out
}

// TestSyncNodeClaims: a scheduler ("sched") that lists 1 of its 3 live
// workloads on agent 0 releases the other 2 with release_reason
// not_in_sync, and keeps its claim taken after known_index; the claims of
// another owner and of none stay. The released claims are freed through
// the node once it unpublishes again.
func TestSyncNodeClaims(t *testing.T) {
	cc := newClaimCluster(t)
	ctx := context.Background()
	for _, v := range []string{"v1", "v2", "v3"} {
		cc.create(t, v, "MULTI_NODE_MULTI_WRITER")
	}
	var known uint64
	for _, c := range []struct{ vol, workload, owner string }{
		{"v1", "w1", "sched"}, {"v2", "w2", "sched"}, {"v3", "w3", "sched"},
		{"v1", "w4", "other"}, {"v2", "w5", ""},
	} {
		known = max(known, cc.claimOwned(t, c.vol, 0, c.workload, c.owner).GetClaimIndex())
	}
	late := cc.claimOwned(t, "v3", 0, "w6", "sched")
	if late.GetClaimIndex() <= known {
		t.Fatalf("the late claim's index %d is not above %d", late.GetClaimIndex(), known)
	}
	// The sync's claims stay releasing, with their reason, until the node
	// unpublishes again.
	cc.plugins[0].SetFaults(testplugin.Faults{Errors: map[string]codes.Code{"NodeUnpublishVolume": codes.Internal}})

	node := cc.c.Agent(0).NodeID()
	leader := cc.c.WaitForLeader(t, 30*time.Second)
	viaFollower := cc.c.Control((leader.Index + 1) % 3)
	sync := func(known uint64, live ...string) *csisupdv1.SyncNodeClaimsResponse {
		t.Helper()
		resp, err := viaFollower.SyncNodeClaims(ctx, &csisupdv1.SyncNodeClaimsRequest{NodeId: node, Owner: "sched", WorkloadIds: live, KnownIndex: known})
		if err != nil {
			t.Fatalf("sync: %v", err)
		}
		return resp
	}
	resp := sync(known, "w1")
	if got, want := refNames(resp.GetReleased()), []string{"v2/w2", "v3/w3"}; !slices.Equal(got, want) {
		t.Fatalf("released %v, want %v", got, want)
	}
	if got, want := refNames(resp.GetKeptByIndex()), []string{"v3/w6"}; !slices.Equal(got, want) {
		t.Fatalf("kept by index %v, want %v", got, want)
	}
	if r := resp.GetKeptByIndex()[0]; r.GetClaimIndex() != late.GetClaimIndex() || r.GetNodeId() != node {
		t.Errorf("kept claim %v, want index %d on node %s", r, late.GetClaimIndex(), node)
	}

	testutil.WaitFor(t, 20*time.Second, "the node unpublish of the synced claims to fail", func() bool {
		for _, ref := range [][2]string{{"v2", "w2"}, {"v3", "w3"}} {
			if c := claimOf(cc.volume(t, ref[0]), node, ref[1]); c == nil || c.GetLastError() == "" {
				return false
			}
		}
		return true
	})
	for _, ref := range [][2]string{{"v2", "w2"}, {"v3", "w3"}} {
		c := claimOf(cc.volume(t, ref[0]), node, ref[1])
		if !rules.Releasing(c.GetState()) || c.GetReleaseReason() != rules.ReasonNotInSync {
			t.Errorf("synced claim %s/%s: state %s, reason %q; want releasing with %q", ref[0], ref[1], c.GetState(), c.GetReleaseReason(), rules.ReasonNotInSync)
		}
	}
	for _, ref := range [][2]string{{"v1", "w1"}, {"v1", "w4"}, {"v2", "w5"}, {"v3", "w6"}} {
		if c := claimOf(cc.volume(t, ref[0]), node, ref[1]); c.GetState() != rules.StateTaken || c.GetReleaseReason() != "" {
			t.Errorf("claim %s/%s: state %s, reason %q; want it taken, untouched", ref[0], ref[1], c.GetState(), c.GetReleaseReason())
		}
	}

	// Claims being released are not released again; known_index 0 keeps
	// every claim the list leaves out.
	if again := sync(known, "w1"); len(again.GetReleased()) != 0 || !slices.Equal(refNames(again.GetKeptByIndex()), []string{"v3/w6"}) {
		t.Errorf("second sync: released %v, kept %v; want none released, v3/w6 kept", refNames(again.GetReleased()), refNames(again.GetKeptByIndex()))
	}
	if zero := sync(0); len(zero.GetReleased()) != 0 || !slices.Equal(refNames(zero.GetKeptByIndex()), []string{"v1/w1", "v3/w6"}) {
		t.Errorf("sync at known_index 0: released %v, kept %v; want none released, v1/w1 and v3/w6 kept",
			refNames(zero.GetReleased()), refNames(zero.GetKeptByIndex()))
	}

	cc.plugins[0].SetFaults(testplugin.Faults{})
	testutil.WaitFor(t, 30*time.Second, "the synced claims freed", func() bool {
		return claimOf(cc.volume(t, "v2"), node, "w2") == nil && claimOf(cc.volume(t, "v3"), node, "w3") == nil
	})
	unpublished := map[string]bool{}
	for _, call := range cc.plugins[0].NodeLog() {
		if call.Method == "NodeUnpublishVolume" {
			unpublished[call.VolumeID] = true
		}
	}
	for vol, want := range map[string]bool{"v1": false, "v2": true, "v3": true} {
		if got := unpublished[cc.volume(t, vol).GetExternalId()]; got != want {
			t.Errorf("agent 0's plugin unpublished %s: %v, want %v", vol, got, want)
		}
	}
	for _, ref := range [][2]string{{"v1", "w1"}, {"v1", "w4"}, {"v2", "w5"}, {"v3", "w6"}} {
		if c := claimOf(cc.volume(t, ref[0]), node, ref[1]); c.GetState() != rules.StateTaken {
			t.Errorf("claim %s/%s after the releases: %v, want it taken", ref[0], ref[1], c)
		}
	}

	// Refusals.
	for _, tt := range []struct {
		req  *csisupdv1.SyncNodeClaimsRequest
		code codes.Code
	}{
		{&csisupdv1.SyncNodeClaimsRequest{NodeId: node}, codes.InvalidArgument},
		{&csisupdv1.SyncNodeClaimsRequest{NodeId: node, Owner: "a b"}, codes.InvalidArgument},
		{&csisupdv1.SyncNodeClaimsRequest{NodeId: node, Owner: "sched", WorkloadIds: []string{"../x"}}, codes.InvalidArgument},
		{&csisupdv1.SyncNodeClaimsRequest{NodeId: "nope", Owner: "sched", KnownIndex: known}, codes.NotFound},
	} {
		if _, err := viaFollower.SyncNodeClaims(ctx, tt.req); status.Code(err) != tt.code {
			t.Errorf("sync %v: %v, want %s", tt.req, err, tt.code)
		}
	}
}

// checkRules returns CheckClaim's answer for vol as node id -> rule ("ok"
// when a claim would be admitted).
func checkRules(t *testing.T, cl csisupdv1.ControlClient, vol string, nodes ...string) map[string]string {
	t.Helper()
	resp, err := cl.CheckClaim(context.Background(), &csisupdv1.CheckClaimRequest{VolumeId: vol, Usage: mnmw, NodeIds: nodes})
	if err != nil {
		t.Fatalf("check claim of %s: %v", vol, err)
	}
	out := map[string]string{}
	for _, n := range resp.GetNodes() {
		switch {
		case n.GetOk() && (n.GetRule() != "" || n.GetMessage() != ""):
			t.Errorf("node %s is ok with rule %q: %q", n.GetNodeId(), n.GetRule(), n.GetMessage())
		case n.GetOk():
			out[n.GetNodeId()] = "ok"
		case n.GetRule() == "" || n.GetMessage() == "":
			t.Errorf("node %s is refused without a rule and a message: %v", n.GetNodeId(), n)
		default:
			out[n.GetNodeId()] = n.GetRule()
		}
	}
	return out
}

// TestCheckClaim asks, through a follower, where a claim would be
// admitted, and checks each answer against the claim itself: ok where it
// is taken, and the rule of a second writer, a node at max_volumes, a
// paused volume, a plugin drained on a node, a plugin unhealthy on a node
// and an unknown node.
func TestCheckClaim(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 3, Agents: 2, Configure: fastVolumeWatcher})
	cc := &claimCluster{c: c}
	for i, a := range c.Agents() {
		cc.plugins = append(cc.plugins, a.StartPlugin("tp", testplugin.Config{NodeID: fmt.Sprintf("csi-node-%d", i), MaxVolumes: 2}))
	}
	testutil.WaitFor(t, 30*time.Second, "plugin tp healthy on both agents", func() bool {
		p, err := cc.control(t).GetPlugin(context.Background(), &csisupdv1.PluginGetRequest{Id: "tp"})
		return err == nil && p.GetPlugin().GetNodesHealthy() == 2
	})
	ctx := context.Background()
	n0, n1 := c.Agent(0).NodeID(), c.Agent(1).NodeID()
	cl := c.Control((c.WaitForLeader(t, 30*time.Second).Index + 1) % 3)
	want := func(what string, got, want map[string]string) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: %v, want %v", what, got, want)
		}
	}

	cc.create(t, "one", "SINGLE_NODE_WRITER")
	cc.create(t, "many", "MULTI_NODE_MULTI_WRITER")
	cc.create(t, "third", "MULTI_NODE_MULTI_WRITER")
	resp, err := cl.CheckClaim(ctx, &csisupdv1.CheckClaimRequest{VolumeId: "one"})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetNodes()) != 2 || resp.GetNodes()[0].GetNodeName() != "agent-0" || resp.GetNodes()[1].GetNodeName() != "agent-1" ||
		!resp.GetNodes()[0].GetOk() || !resp.GetNodes()[1].GetOk() {
		t.Fatalf("check of a new volume on every node: %v, want agent-0 and agent-1 ok, in that order", resp.GetNodes())
	}
	// A claim on an ok node succeeds; a second writer is refused on both.
	if _, err := cc.claim(t, "one", 0, "w1", nil); err != nil {
		t.Fatalf("claim on a node found ok: %v", err)
	}
	resp, err = cl.CheckClaim(ctx, &csisupdv1.CheckClaimRequest{VolumeId: "one", NodeIds: []string{n1, n0}})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range resp.GetNodes() {
		if n.GetOk() || n.GetRule() != csisupdv1.ClaimRuleAccessMode {
			t.Errorf("second writer of a single-node-writer volume on %s: %v, want rule %s", n.GetNodeName(), n, csisupdv1.ClaimRuleAccessMode)
		}
	}

	// Agent 0 holds two volumes of tp, its max_volumes.
	if _, err := cc.claim(t, "many", 0, "w2", mnmw); err != nil {
		t.Fatal(err)
	}
	want("a node at max_volumes", checkRules(t, cl, "third"), map[string]string{n0: csisupdv1.ClaimRuleMaxVolumes, n1: "ok"})
	if _, err := cc.claim(t, "third", 0, "w3", mnmw); refusal(t, err).GetRule() != csisupdv1.ClaimRuleMaxVolumes {
		t.Fatalf("claim on a node at max_volumes: %v, want the rule the check named", err)
	}

	for _, a := range []string{"pause", "active"} {
		if _, err := cl.SetVolumeAvailability(ctx, &csisupdv1.VolumeAvailabilityRequest{Id: "third", Availability: a}); err != nil {
			t.Fatal(err)
		}
		if a == "pause" {
			want("a paused volume", checkRules(t, cl, "third"), map[string]string{n0: csisupdv1.ClaimRuleAvailability, n1: csisupdv1.ClaimRuleAvailability})
		}
	}

	drain := func(cancel bool) {
		t.Helper()
		if _, err := cl.DrainPlugin(ctx, &csisupdv1.PluginDrainRequest{PluginId: "tp", NodeId: n1, Cancel: cancel}); err != nil {
			t.Fatal(err)
		}
	}
	drain(false)
	want("a plugin drained on agent 1", checkRules(t, cl, "third", n1), map[string]string{n1: csisupdv1.ClaimRuleAvailability})
	drain(true)

	cc.plugins[1].SetFaults(testplugin.Faults{ProbeNotReady: true})
	testutil.WaitFor(t, 30*time.Second, "tp unhealthy on agent 1", func() bool {
		p, err := cl.GetPlugin(ctx, &csisupdv1.PluginGetRequest{Id: "tp"})
		return err == nil && p.GetPlugin().GetNodesHealthy() == 1
	})
	// By name, and an unknown node.
	want("a plugin unhealthy on agent 1", checkRules(t, cl, "third", "agent-1", "nope"),
		map[string]string{n1: csisupdv1.ClaimRulePlugin, "nope": rules.PlacementRuleNotFound})
	cc.plugins[1].SetFaults(testplugin.Faults{})
	testutil.WaitFor(t, 30*time.Second, "tp healthy on agent 1 again", func() bool {
		return checkRules(t, cl, "third", n1)[n1] == "ok"
	})
	if _, err := cc.claim(t, "third", 1, "w3", mnmw); err != nil {
		t.Fatalf("claim on a node found ok: %v", err)
	}

	// Errors of the request, not of a node.
	for _, tt := range []struct {
		req  *csisupdv1.CheckClaimRequest
		code codes.Code
	}{
		{&csisupdv1.CheckClaimRequest{}, codes.InvalidArgument},
		{&csisupdv1.CheckClaimRequest{VolumeId: "nope"}, codes.NotFound},
		{&csisupdv1.CheckClaimRequest{VolumeId: "one", Usage: &csisupdv1.VolumeUsage{AccessMode: "SOMETIMES"}}, codes.InvalidArgument},
		{&csisupdv1.CheckClaimRequest{VolumeId: "one", Usage: &csisupdv1.VolumeUsage{MountFlags: []string{"remount"}}}, codes.InvalidArgument},
	} {
		if _, err := cl.CheckClaim(ctx, tt.req); status.Code(err) != tt.code {
			t.Errorf("check %v: %v, want %s", tt.req, err, tt.code)
		}
	}
}

// TestSyncNodeClaimsNeedsVolumeWrite runs one server behind the real
// Authorizer with ACLs on: a token that allows volume:read may check a
// claim but not sync a node; one that allows volume:write may.
func TestSyncNodeClaimsNeedsVolumeWrite(t *testing.T) {
	var cluster atomic.Pointer[testcluster.Cluster]
	resolver := rpc.TokenResolverFunc(func(_ context.Context, secret string) (*acl.ACL, error) {
		c := cluster.Load()
		if c == nil || c.Member(0).Server() == nil {
			return nil, status.Error(codes.Unavailable, "the server is not running yet")
		}
		a, _, err := c.Member(0).Server().ResolveToken(secret)
		return a, err
	})
	auth, err := rpc.NewAuthorizer(rpc.AuthConfig{ACL: true, Resolver: resolver})
	if err != nil {
		t.Fatal(err)
	}
	c := testcluster.New(t, testcluster.Config{Servers: 1, ServerOptions: func(int) []grpc.ServerOption { return auth.ServerOptions() }})
	cluster.Store(c)
	c.WaitForLeader(t, 30*time.Second)
	ctx := context.Background()
	boot, err := csisupdv1.NewACLClient(c.Conn(0)).Bootstrap(ctx, &csisupdv1.ACLBootstrapRequest{})
	if err != nil {
		t.Fatal(err)
	}
	admin := csisupdv1.NewACLClient(c.Conn(0))
	mgmt := acl.WithToken(ctx, boot.GetToken().GetSecretId())
	token := func(level string) context.Context {
		t.Helper()
		if _, err := admin.UpsertPolicy(mgmt, &csisupdv1.ACLUpsertPolicyRequest{Policy: &csisupdv1.ACLPolicy{
			Name: "volume-" + level, Rules: `volume { policy = "` + level + `" }`,
		}}); err != nil {
			t.Fatal(err)
		}
		tok, err := admin.CreateToken(mgmt, &csisupdv1.ACLCreateTokenRequest{Policies: []string{"volume-" + level}})
		if err != nil {
			t.Fatal(err)
		}
		return acl.WithToken(ctx, tok.GetToken().GetSecretId())
	}
	reader, writer := token("read"), token("write")
	cl := c.Control(0)
	sync := &csisupdv1.SyncNodeClaimsRequest{NodeId: "n1", Owner: "sched"}
	if _, err := cl.SyncNodeClaims(reader, sync); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("sync with a volume:read token: %v, want PermissionDenied", err)
	}
	if _, err := cl.SyncNodeClaims(ctx, sync); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("sync without a token: %v, want Unauthenticated", err)
	}
	// Let through: the node is unknown.
	if _, err := cl.SyncNodeClaims(writer, sync); status.Code(err) != codes.NotFound {
		t.Fatalf("sync with a volume:write token: %v, want NotFound (the node is unknown)", err)
	}
	if _, err := cl.CheckClaim(reader, &csisupdv1.CheckClaimRequest{VolumeId: "v"}); status.Code(err) != codes.NotFound {
		t.Fatalf("check with a volume:read token: %v, want NotFound (the volume is unknown)", err)
	}
}
