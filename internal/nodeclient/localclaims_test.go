package nodeclient_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/nodeclient"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// localNode is a real cluster of one server and one agent running the
// test plugin "tp", with a running node client of the agent's node (its
// id, name, address, secret and plugins: what the agent's own client
// sends), from which LocalClaims are made.
type localNode struct {
	c      *testcluster.Cluster
	plugin *testplugin.Plugin
	client *nodeclient.Client
}

func newLocalNode(t *testing.T) *localNode {
	t.Helper()
	c := testcluster.New(t, testcluster.Config{Servers: 1, Agents: 1})
	a := c.Agent(0)
	n := &localNode{c: c, plugin: a.StartPlugin("tp", testplugin.Config{NodeID: "csi-a"})}
	testutil.WaitFor(t, 30*time.Second, "plugin tp healthy in the cluster", func() bool {
		p, err := c.Control(0).GetPlugin(context.Background(), &csisupdv1.PluginGetRequest{Id: "tp"})
		return err == nil && p.GetPlugin().GetNodesHealthy() == 1 && p.GetPlugin().GetControllersHealthy() == 1
	})
	secret, err := os.ReadFile(filepath.Join(a.DataDir, "node-secret"))
	if err != nil {
		t.Fatalf("the agent's node secret: %v", err)
	}
	cfg := validConfig()
	cfg.Servers, cfg.Plugins, cfg.RPCTimeout = c.RPCAddrs(), a.Agent().Registry().Source(), 10*time.Second
	cfg.Node = nodeclient.Node{ID: a.NodeID(), Name: a.Name, Address: a.RPCAddr, Secret: strings.TrimSpace(string(secret))}
	if n.client, err = nodeclient.New(cfg, nil); err != nil {
		t.Fatal(err)
	}
	run(t, n.client)
	return n
}

// localClaims returns LocalClaims of the node whose leases are kept in
// dataDir and renewed until the test ends.
func (n *localNode) localClaims(t *testing.T, dataDir string) (*nodeclient.LocalClaims, *nodeclient.Leases) {
	t.Helper()
	leases := newLeases(t, n.client, dataDir, nil)
	runLeases(t, leases)
	lc, err := nodeclient.NewLocalClaims(nodeclient.LocalClaimsConfig{Client: n.client, Leases: leases}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return lc, leases
}

// claimOf returns the claim of workload on volume id, or nil.
func claimOf(t *testing.T, lc *nodeclient.LocalClaims, id, workload string) *csisupdv1.VolumeClaim {
	t.Helper()
	v, err := lc.GetVolume(context.Background(), id)
	if err != nil {
		t.Fatalf("get volume %s: %v", id, err)
	}
	for _, c := range v.GetClaims() {
		if c.GetWorkloadId() == workload {
			return c
		}
	}
	return nil
}

// TestLocalClaims walks the local claims of one node through a real
// server and a real plugin: volumes are created, read and listed; a
// claim is taken for this node with its owner and lease and held, and
// the holder's renewals renew it; claiming it again returns the same
// claim without a second publish; its release frees it and drops its
// hold; a sync releases an unlisted workload's claim and drops its hold,
// and keeps one taken after the known index and another owner's; a
// volume with claims is not deleted. Errors keep their gRPC status.
func TestLocalClaims(t *testing.T) {
	n := newLocalNode(t)
	lc, leases := n.localClaims(t, t.TempDir())
	ctx := context.Background()
	if lc.NodeID() != n.c.Agent(0).NodeID() {
		t.Fatalf("NodeID() = %q, want the agent's %q", lc.NodeID(), n.c.Agent(0).NodeID())
	}

	vol, err := lc.CreateVolume(ctx, &csisupdv1.VolumeCreateRequest{Id: "v1", PluginId: "tp", CapacityMinBytes: 1 << 20,
		Capabilities: []*csisupdv1.VolumeCapability{{AccessType: "mount", AccessMode: "MULTI_NODE_MULTI_WRITER"}}})
	if err != nil || vol.GetId() != "v1" || vol.GetPluginId() != "tp" {
		t.Fatalf("CreateVolume: %v, %v", vol, err)
	}
	if _, err := lc.GetVolume(ctx, "nope"); status.Code(err) != codes.NotFound {
		t.Fatalf("GetVolume of an unknown volume: %v, want NotFound", err)
	}
	if list, err := lc.ListVolumes(ctx); err != nil || len(list) != 1 || list[0].GetId() != "v1" {
		t.Fatalf("ListVolumes: %v, %v; want [v1]", list, err)
	}

	const lease = 6 * time.Second
	resp, err := lc.Claim(ctx, "v1", "w1", "docker", lease, nil)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	claim := resp.GetClaim()
	if claim.GetState() != "taken" || claim.GetHostPath() == "" || claim.GetOwner() != "docker" ||
		claim.GetLeaseTtl().AsDuration() != lease || claim.GetNodeId() != lc.NodeID() || claim.GetWorkloadId() != "w1" {
		t.Fatalf("claim: %v", claim)
	}
	if got, want := leases.Held(), []nodeclient.Hold{{VolumeID: "v1", WorkloadID: "w1", Lease: lease}}; !slices.Equal(got, want) {
		t.Fatalf("Held() = %v, want %v", got, want)
	}
	first := claimOf(t, lc, "v1", "w1").GetLeaseRenewedAt().AsTime()
	testutil.WaitFor(t, 20*time.Second, "the held lease renewed", func() bool {
		return claimOf(t, lc, "v1", "w1").GetLeaseRenewedAt().AsTime().After(first)
	})

	publishes := n.plugin.Stats().Calls["NodePublishVolume"]
	again, err := lc.Claim(ctx, "v1", "w1", "docker", lease, nil)
	if err != nil || again.GetClaim().GetHostPath() != claim.GetHostPath() || again.GetClaim().GetClaimIndex() != claim.GetClaimIndex() {
		t.Fatalf("claim again: %v, %v; want the claim at %s", again.GetClaim(), err, claim.GetHostPath())
	}
	if got := n.plugin.Stats().Calls["NodePublishVolume"]; got != publishes || publishes != 1 {
		t.Fatalf("NodePublishVolume calls: %d before claiming again, %d after; want 1 and 1", publishes, got)
	}

	if err := lc.Release(ctx, "v1", "w1"); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if held := leases.Held(); len(held) != 0 {
		t.Fatalf("held after the release: %v", held)
	}
	if c := claimOf(t, lc, "v1", "w1"); c != nil {
		t.Fatalf("the claim after the release: %v", c)
	}
	if len(n.plugin.NodeVolumes()) != 0 {
		t.Fatalf("the plugin still holds %v after the release", n.plugin.NodeVolumes())
	}
	for _, id := range []string{"v1", "nope"} {
		if err := lc.Release(ctx, id, "w1"); err != nil {
			t.Fatalf("Release of a claim that does not exist (volume %s): %v", id, err)
		}
	}

	// Sync: w2 is taken before the known index and not listed: released;
	// w3 after it: kept; w4 is another owner's: untouched.
	for _, w := range []struct{ id, owner string }{{"w2", "docker"}, {"w4", "systemd"}} {
		if _, err := lc.Claim(ctx, "v1", w.id, w.owner, time.Minute, nil); err != nil {
			t.Fatalf("Claim %s: %v", w.id, err)
		}
	}
	known, err := lc.ClaimsIndex(ctx)
	if err != nil || known == 0 {
		t.Fatalf("ClaimsIndex: %d, %v", known, err)
	}
	if _, err := lc.Claim(ctx, "v1", "w3", "docker", time.Minute, nil); err != nil {
		t.Fatalf("Claim w3: %v", err)
	}
	synced, err := lc.Sync(ctx, "docker", nil, known)
	if err != nil {
		t.Fatalf("Sync: %v", err)
	}
	if r, k := synced.GetReleased(), synced.GetKeptByIndex(); len(r) != 1 || r[0].GetWorkloadId() != "w2" || len(k) != 1 || k[0].GetWorkloadId() != "w3" {
		t.Fatalf("Sync released %v and kept %v; want w2 released and w3 kept", r, k)
	}
	want := []nodeclient.Hold{{VolumeID: "v1", WorkloadID: "w3", Lease: time.Minute}, {VolumeID: "v1", WorkloadID: "w4", Lease: time.Minute}}
	if got := leases.Held(); !slices.Equal(got, want) {
		t.Fatalf("Held() after the sync = %v, want %v", got, want)
	}
	testutil.WaitFor(t, 30*time.Second, "the claim of w2 freed", func() bool { return claimOf(t, lc, "v1", "w2") == nil })

	if err := lc.DeleteVolume(ctx, "v1"); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("DeleteVolume of a claimed volume: %v, want FailedPrecondition", err)
	}
	for _, w := range []string{"w3", "w4"} {
		if err := lc.Release(ctx, "v1", w); err != nil {
			t.Fatalf("Release %s: %v", w, err)
		}
	}
	if err := lc.DeleteVolume(ctx, "v1"); err != nil {
		t.Fatalf("DeleteVolume: %v", err)
	}
	if _, err := lc.GetVolume(ctx, "v1"); status.Code(err) != codes.NotFound {
		t.Fatalf("GetVolume after the delete: %v, want NotFound", err)
	}
}

// TestLocalClaimReleasedWhenItsHoldFails claims with a holder whose lease
// file cannot be written (a directory is in its place): the claim is
// released again, the error says why, and nothing is held or mounted.
func TestLocalClaimReleasedWhenItsHoldFails(t *testing.T) {
	n := newLocalNode(t)
	dir := t.TempDir()
	lc, leases := n.localClaims(t, dir)
	ctx := context.Background()
	if _, err := lc.CreateVolume(ctx, &csisupdv1.VolumeCreateRequest{Id: "v1", PluginId: "tp", CapacityMinBytes: 1 << 20,
		Capabilities: []*csisupdv1.VolumeCapability{{AccessType: "mount", AccessMode: "SINGLE_NODE_WRITER"}}}); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, nodeclient.LeaseFileName, "in-the-way"), 0o700); err != nil {
		t.Fatal(err)
	}
	_, err := lc.Claim(ctx, "v1", "w1", "docker", 30*time.Second, nil)
	if err == nil || !strings.Contains(err.Error(), "hold its lease") || !strings.Contains(err.Error(), "released again") {
		t.Fatalf("Claim with a broken lease file: %v, want an error saying the hold failed and the claim was released", err)
	}
	if c := claimOf(t, lc, "v1", "w1"); c != nil {
		t.Fatalf("the claim whose hold failed: %v, want none", c)
	}
	if held := leases.Held(); len(held) != 0 {
		t.Fatalf("held: %v", held)
	}
	if n.plugin.Stats().Calls["NodePublishVolume"] != 1 || len(n.plugin.NodeVolumes()) != 0 {
		t.Fatalf("the plugin published %d times and holds %v; want once, and nothing left", n.plugin.Stats().Calls["NodePublishVolume"], n.plugin.NodeVolumes())
	}
}

// TestLocalClaimsCheckTheirArguments refuses, before any call, what the
// servers could not admit, with InvalidArgument naming the field.
func TestLocalClaimsCheckTheirArguments(t *testing.T) {
	cl, err := nodeclient.New(validConfig(), nil) // never run: nothing may be called
	if err != nil {
		t.Fatal(err)
	}
	leases := newLeases(t, cl, t.TempDir(), nil)
	lc, err := nodeclient.NewLocalClaims(nodeclient.LocalClaimsConfig{Client: cl, Leases: leases}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tests := []struct {
		name string
		call func() error
		want string
	}{
		{"claim without an owner", func() error { _, err := lc.Claim(ctx, "v", "w", "", time.Minute, nil); return err }, "owner"},
		{"claim with a bad owner", func() error { _, err := lc.Claim(ctx, "v", "w", "a b", time.Minute, nil); return err }, "owner"},
		{"claim without a lease", func() error { _, err := lc.Claim(ctx, "v", "w", "docker", 0, nil); return err }, "lease"},
		{"claim with a long lease", func() error { _, err := lc.Claim(ctx, "v", "w", "docker", 25*time.Hour, nil); return err }, "lease"},
		{"claim of a bad volume id", func() error { _, err := lc.Claim(ctx, "a/b", "w", "docker", time.Minute, nil); return err }, "volume_id"},
		{"claim for a dot workload", func() error { _, err := lc.Claim(ctx, "v", "..", "docker", time.Minute, nil); return err }, "workload_id"},
		{"release without a workload", func() error { return lc.Release(ctx, "v", "") }, "workload_id"},
		{"release without a volume", func() error { return lc.Release(ctx, "", "w") }, "volume_id"},
		{"sync without an owner", func() error { _, err := lc.Sync(ctx, "", nil, 0); return err }, "owner"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want InvalidArgument naming %s", err, tt.want)
			}
		})
	}
	if _, err := nodeclient.NewLocalClaims(nodeclient.LocalClaimsConfig{}, nil); err == nil ||
		!strings.Contains(err.Error(), "Client") || !strings.Contains(err.Error(), "Leases") {
		t.Fatalf("NewLocalClaims without a config: %v, want an error naming Client and Leases", err)
	}
}

// TestWaitRegistered checks that a node client that has not registered
// yet makes a claim wait for it, and says so when the caller's deadline
// comes first: a client that never runs never registers; one that runs
// registers, and the wait ends.
func TestWaitRegistered(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 1})
	c.WaitForLeader(t, 20*time.Second)
	cfg := validConfig()
	cfg.Servers, cfg.RPCTimeout = c.RPCAddrs(), 10*time.Second
	client, err := nodeclient.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	leases := newLeases(t, client, t.TempDir(), nil)
	lc, err := nodeclient.NewLocalClaims(nodeclient.LocalClaimsConfig{Client: client, Leases: leases}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	_, err = lc.Claim(ctx, "v1", "w1", "docker", 30*time.Second, nil)
	cancel()
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "has not registered with the servers yet") {
		t.Fatalf("a claim before the node registered: %v; want Unavailable saying the node has not registered", err)
	}
	run(t, client)
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := client.WaitRegistered(ctx); err != nil {
		t.Fatalf("WaitRegistered of a running client: %v", err)
	}
	if !client.Registered() {
		t.Error("WaitRegistered returned, but the client is not registered")
	}
}
