package server_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testutil"
)

// manualNodes is the set up of tests whose nodes heartbeat by hand: TTLs
// long enough that no timer expires while a test runs.
func manualNodes(_ int, cfg *server.Config) {
	cfg.MinHeartbeatTTL = 30 * time.Second
	cfg.FailoverHeartbeatTTL = 30 * time.Second
}

// registerNode registers a node at addr with a healthy monolith "p1" and
// returns the TTL the leader gave it.
func registerNode(t *testing.T, cl csisupdv1.ClusterClient, id, addr string) time.Duration {
	t.Helper()
	resp, err := cl.NodeRegister(asNode(context.Background(), id), &csisupdv1.NodeRegisterRequest{
		NodeId: id, Name: "name-" + id, Address: addr, Plugins: []*csisupdv1.Plugin{monolith("p1", id)},
	})
	if err != nil {
		t.Fatalf("register %s: %v", id, err)
	}
	return time.Duration(resp.GetHeartbeatTtlMs()) * time.Millisecond
}

func beatNode(t *testing.T, cl csisupdv1.ClusterClient, id string) {
	t.Helper()
	resp, err := cl.NodeHeartbeat(asNode(context.Background(), id), &csisupdv1.NodeHeartbeatRequest{NodeId: id})
	if err != nil || resp.GetHeartbeatTtlMs() <= 0 {
		t.Fatalf("heartbeat %s: %v, %v", id, resp, err)
	}
}

// nodeStatuses returns the status and description of every node as
// ListNodes answers.
func nodeStatuses(t *testing.T, ctl csisupdv1.ControlClient, stale bool) map[string]*csisupdv1.ClusterNode {
	t.Helper()
	resp, err := ctl.ListNodes(context.Background(), &csisupdv1.NodeListRequest{Stale: stale})
	if err != nil {
		t.Fatalf("list nodes: %v", err)
	}
	out := map[string]*csisupdv1.ClusterNode{}
	for _, n := range resp.GetNodes() {
		out[n.GetId()] = n
	}
	return out
}

func wantStatuses(t *testing.T, ctl csisupdv1.ControlClient, want map[string]string) map[string]*csisupdv1.ClusterNode {
	t.Helper()
	got := nodeStatuses(t, ctl, false)
	for id, st := range want {
		n := got[id]
		if n.GetStatus() != st {
			t.Fatalf("node %s: status %q (%s), want %q", id, n.GetStatus(), n.GetStatusDescription(), st)
		}
		if st == state.NodeStatusInitializing && !strings.Contains(n.GetStatusDescription(), "no heartbeat to the current leader since") {
			t.Fatalf("node %s: initializing with description %q", id, n.GetStatusDescription())
		}
	}
	return got
}

// TestRestoreNodesInitializingUntilHeartbeat restores a snapshot whose
// nodes are ready: the leader reports them initializing, counts none of
// their controllers, asks their controllers only after those of nodes it
// has heard from, and refuses claims on them, each until the node
// heartbeats or answers a call; neither writes to raft.
func TestRestoreNodesInitializingUntilHeartbeat(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 3, Configure: manualNodes})
	leader := checkFormed(t, c, 3)
	f := (leader.Index + 1) % 3
	ctl := c.Control(f) // consistent reads are answered by the leader
	cluster := csisupdv1.NewClusterClient(c.Conn(f))
	ctx := context.Background()
	a, b := startFakeAgent(t, "node-a"), startFakeAgent(t, "node-b")
	registerNode(t, cluster, "node-a", a.addr)
	registerNode(t, cluster, "node-b", b.addr)
	wantStatuses(t, ctl, map[string]string{"node-a": state.NodeStatusReady, "node-b": state.NodeStatusReady})
	if p := pluginOf(t, ctl, "p1"); p.GetControllersHealthy() != 2 || p.GetNodesHealthy() != 2 {
		t.Fatalf("before the restore: %v", p)
	}

	snap := saveSnapshot(t, ctl)
	restoreSnapshot(t, ctl, snap)
	restored := wantStatuses(t, ctl, map[string]string{"node-a": state.NodeStatusInitializing, "node-b": state.NodeStatusInitializing})
	if d := restored["node-a"].GetStatusDescription(); !strings.Contains(d, "snapshot restore") {
		t.Fatalf("description %q does not name the restore", d)
	}
	if resp, err := ctl.GetNode(ctx, &csisupdv1.NodeGetRequest{Id: "node-a"}); err != nil || resp.GetNode().GetStatus() != state.NodeStatusInitializing {
		t.Fatalf("get node-a after the restore: %v, %v", resp, err)
	}
	// A follower's stale read shows the stored status: it cannot know.
	if st := nodeStatuses(t, ctl, true)["node-a"].GetStatus(); st != state.NodeStatusReady {
		t.Fatalf("stale read on a follower: node-a %q, want the stored %q", st, state.NodeStatusReady)
	}
	p := pluginOf(t, ctl, "p1")
	if p.GetControllersHealthy() != 0 || p.GetNodesHealthy() != 0 || p.GetControllersExpected() != 2 ||
		p.GetInstances()[0].GetHealthy() || !strings.Contains(p.GetInstances()[0].GetHealthDescription(), "initializing") {
		t.Fatalf("plugin after the restore: %v", p)
	}
	modified := map[string]uint64{}
	for id, n := range restored {
		modified[id] = n.GetModifyIndex()
	}

	// Controllers on nodes not heard from are still used, in order; one
	// whose agent does not answer in time is passed over and stays
	// unconfirmed, and the one that answers is confirmed by its answer.
	a.setFail(status.Error(codes.DeadlineExceeded, "agent too slow"))
	created, err := ctl.CreateVolume(ctx, &csisupdv1.VolumeCreateRequest{Id: "v0", PluginId: "p1"})
	if err != nil {
		t.Fatalf("create with every controller node initializing: %v", err)
	}
	a.setFail(nil)
	if got := created.GetVolume().GetControllerNodeId(); got != "node-b" || a.callCount("create v0") != 1 || b.callCount("create v0") != 1 {
		t.Fatalf("create went to %s (node-a %d calls, node-b %d), want node-a tried first, then node-b",
			got, a.callCount("create v0"), b.callCount("create v0"))
	}
	wantStatuses(t, ctl, map[string]string{"node-a": state.NodeStatusInitializing, "node-b": state.NodeStatusReady})
	// The status filter sees the status the leader tells.
	for want, id := range map[string]string{state.NodeStatusInitializing: "node-a", state.NodeStatusReady: "node-b"} {
		resp, err := ctl.ListNodes(ctx, &csisupdv1.NodeListRequest{Status: want})
		if err != nil || len(resp.GetNodes()) != 1 || resp.GetNodes()[0].GetId() != id {
			t.Fatalf("list nodes with status %s: %v, %v; want %s only", want, resp.GetNodes(), err, id)
		}
	}
	if p := pluginOf(t, ctl, "p1"); p.GetControllersHealthy() != 1 || p.GetNodesHealthy() != 1 {
		t.Fatalf("plugin with node-b confirmed: %v", p)
	}

	// node-b is confirmed and node-a, which sorts first, is not: node-b
	// is asked first.
	beatNode(t, cluster, "node-b")
	created, err = ctl.CreateVolume(ctx, &csisupdv1.VolumeCreateRequest{Id: "v1", PluginId: "p1"})
	if err != nil {
		t.Fatal(err)
	}
	if got := created.GetVolume().GetControllerNodeId(); got != "node-b" || a.callCount("create v1") != 0 || b.callCount("create v1") != 1 {
		t.Fatalf("create went to %s (node-a %d calls, node-b %d), want node-b only", got, a.callCount("create v1"), b.callCount("create v1"))
	}
	// A claim on initializing node-a is not deferred: it goes to the
	// node, whose agent answers or not. This fake agent serves no
	// NodeVolumes, so the mount fails with its answer, and a failed call
	// does not confirm the node.
	_, err = ctl.ClaimVolume(ctx, &csisupdv1.VolumeClaimRequest{Id: "v0", NodeId: "node-a", WorkloadId: "w1"})
	if status.Code(err) != codes.Unimplemented || !strings.Contains(err.Error(), `on node "node-a"`) {
		t.Fatalf("claim on initializing node-a: %v, want the node's own answer (Unimplemented)", err)
	}
	wantStatuses(t, ctl, map[string]string{"node-a": state.NodeStatusInitializing, "node-b": state.NodeStatusReady})
	if _, err := ctl.DeleteVolume(ctx, &csisupdv1.VolumeDeleteRequest{Id: "v1"}); err != nil {
		t.Fatal(err)
	}
	if a.callCount("delete") != 0 || b.callCount("delete ext-v1") != 1 {
		t.Fatalf("delete calls: node-a %d, node-b %d; want node-b only", a.callCount("delete"), b.callCount("delete ext-v1"))
	}

	beatNode(t, cluster, "node-a")
	after := wantStatuses(t, ctl, map[string]string{"node-a": state.NodeStatusReady, "node-b": state.NodeStatusReady})
	if p := pluginOf(t, ctl, "p1"); p.GetControllersHealthy() != 2 || p.GetNodesHealthy() != 2 {
		t.Fatalf("plugin with both confirmed: %v", p)
	}
	// Confirmation is the leader's memory, not a write.
	for id, n := range after {
		if n.GetModifyIndex() != modified[id] {
			t.Fatalf("node %s was written by its heartbeat: modify index %d -> %d", id, modified[id], n.GetModifyIndex())
		}
	}
}

// TestLeaderChangeNodesInitializingUntilHeartbeat kills the leader: the
// new one reports the nodes initializing until each heartbeats, and marks
// none down although each heartbeats only when the TTL the old leader gave
// it is nearly over, long after the configured failover TTL.
func TestLeaderChangeNodesInitializingUntilHeartbeat(t *testing.T) {
	const grace = 500 * time.Millisecond
	c := testcluster.New(t, testcluster.Config{Servers: 3, Configure: func(_ int, cfg *server.Config) {
		cfg.MinHeartbeatTTL = 4 * time.Second
		cfg.HeartbeatGrace = grace
		// Shorter than every TTL handed out: the new leader must not use it
		// as it is.
		cfg.FailoverHeartbeatTTL = 200 * time.Millisecond
	}})
	old := checkFormed(t, c, 3)
	f := (old.Index + 1) % 3
	ctl := c.Control(f)
	cluster := csisupdv1.NewClusterClient(c.Conn(f))
	due := map[string]time.Time{}
	for _, id := range []string{"node-a", "node-b"} {
		ttl := registerNode(t, cluster, id, "127.0.0.1:1")
		// The node sends its next heartbeat a TTL after it got the answer;
		// a little earlier here, on time.
		due[id] = time.Now().Add(ttl - 300*time.Millisecond)
	}
	before := wantStatuses(t, ctl, map[string]string{"node-a": state.NodeStatusReady, "node-b": state.NodeStatusReady})

	c.Kill(old.Index)
	next := c.WaitForLeader(t, 30*time.Second)
	if next.ID == old.ID {
		t.Fatalf("killed leader %s still leads", old.ID)
	}
	var initializing map[string]*csisupdv1.ClusterNode
	testutil.WaitFor(t, 20*time.Second, "the new leader to answer", func() bool {
		resp, err := ctl.ListNodes(context.Background(), &csisupdv1.NodeListRequest{})
		if err != nil {
			return false
		}
		initializing = map[string]*csisupdv1.ClusterNode{}
		for _, n := range resp.GetNodes() {
			initializing[n.GetId()] = n
		}
		return true
	})
	for _, id := range []string{"node-a", "node-b"} {
		if n := initializing[id]; n.GetStatus() != state.NodeStatusInitializing || !strings.Contains(n.GetStatusDescription(), "became leader") {
			t.Fatalf("node %s on the new leader: %q (%s), want initializing since it became leader", id, n.GetStatus(), n.GetStatusDescription())
		}
	}

	// Each node heartbeats when its old TTL is nearly over.
	order := []string{"node-a", "node-b"}
	if due["node-b"].Before(due["node-a"]) {
		order = []string{"node-b", "node-a"}
	}
	for i, id := range order {
		testutil.WaitFor(t, 20*time.Second, id+"'s heartbeat to be due", func() bool { return time.Now().After(due[id]) })
		if st := next.Server().State().Node(id).GetStatus(); st != state.NodeStatusReady {
			t.Fatalf("node %s is %q on the new leader before its heartbeat was due", id, st)
		}
		// A leader that is not ready yet answers Unavailable; an agent
		// retries.
		testutil.WaitFor(t, 20*time.Second, id+"'s heartbeat", func() bool {
			_, err := cluster.NodeHeartbeat(asNode(context.Background(), id), &csisupdv1.NodeHeartbeatRequest{NodeId: id})
			return err == nil
		})
		want := map[string]string{id: state.NodeStatusReady}
		if i == 0 {
			want[order[1]] = state.NodeStatusInitializing
		}
		wantStatuses(t, ctl, want)
	}
	for _, id := range order {
		n := next.Server().State().Node(id)
		if n.GetStatus() != state.NodeStatusReady || n.GetModifyIndex() != before[id].GetModifyIndex() {
			t.Fatalf("node %s after the leader change: %s, modify index %d -> %d: a status was written",
				id, n.GetStatus(), before[id].GetModifyIndex(), n.GetModifyIndex())
		}
	}
}

// TestHeartbeatsAfterRestoreDoNotWriteToRaft restores a snapshot on a
// one-server cluster, where nothing else writes: neither the heartbeats
// that confirm the restored nodes nor many rounds after them apply
// anything to raft.
func TestHeartbeatsAfterRestoreDoNotWriteToRaft(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 1, Configure: manualNodes})
	leader := checkFormed(t, c, 1)
	ctl := c.Control(0)
	cluster := csisupdv1.NewClusterClient(c.Conn(0))
	const nodes = 10
	for i := range nodes {
		registerNode(t, cluster, nodeName(i), "127.0.0.1:1")
	}
	restoreSnapshot(t, ctl, saveSnapshot(t, ctl))
	all := map[string]string{}
	for i := range nodes {
		all[nodeName(i)] = state.NodeStatusInitializing
	}
	wantStatuses(t, ctl, all)
	srv := leader.Server()
	testutil.WaitFor(t, 10*time.Second, "the leader to apply its whole log", func() bool {
		last, _ := strconv.ParseUint(srv.RaftStats()["last_log_index"], 10, 64)
		return srv.AppliedIndex() >= last
	})
	applied := srv.AppliedIndex()
	for round := range 20 {
		for i := range nodes {
			beatNode(t, cluster, nodeName(i))
		}
		if round == 0 {
			for id := range all {
				all[id] = state.NodeStatusReady
			}
			wantStatuses(t, ctl, all)
		}
	}
	if got := srv.AppliedIndex(); got != applied {
		t.Fatalf("applied index %d -> %d across %d heartbeats", applied, got, 20*nodes)
	}
	wantStatuses(t, ctl, all)
}

// TestMissedHeartbeatShowsDownNeverInitializing stops the heartbeats of
// nodes this leader has heard from: each stays ready until its write to
// down applies, and is never shown initializing on the way, which would
// claim that this leader has just taken over.
func TestMissedHeartbeatShowsDownNeverInitializing(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 1, Configure: func(_ int, cfg *server.Config) {
		cfg.MinHeartbeatTTL = 300 * time.Millisecond
		cfg.HeartbeatGrace = 100 * time.Millisecond
	}})
	checkFormed(t, c, 1)
	ctl := c.Control(0)
	cluster := csisupdv1.NewClusterClient(c.Conn(0))
	const nodes = 20
	for i := range nodes {
		registerNode(t, cluster, "node-"+strconv.Itoa(i), "127.0.0.1:1")
	}
	seen := map[string]int{}
	testutil.WaitFor(t, 30*time.Second, "every node to be marked down", func() bool {
		down := 0
		for id, n := range nodeStatuses(t, ctl, false) {
			seen[n.GetStatus()]++
			switch n.GetStatus() {
			case state.NodeStatusDown:
				down++
			case state.NodeStatusInitializing:
				t.Fatalf("node %s shown initializing after a missed heartbeat: %s", id, n.GetStatusDescription())
			}
		}
		return down == nodes
	})
	if seen[state.NodeStatusReady] == 0 {
		t.Fatalf("statuses seen %v: the nodes were never seen ready, so the test watched nothing", seen)
	}
}
