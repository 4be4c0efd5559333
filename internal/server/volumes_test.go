package server_test

import (
	"bytes"
	"context"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testutil"
)

func TestVolumeLifecycleThroughFollower(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 3})
	leader := checkFormed(t, c, 3)
	follower := (leader.Index + 1) % 3
	cl := c.Control(follower)
	ctx := context.Background()

	nv := newFakeNodeVolumes()
	a, b := startFakeAgentNV(t, "node-a", nv), startFakeAgentNV(t, "node-b", nv)
	startNode(t, "node-a", a.addr, c.RPCAddrs(), monolith("p1", "node-a"))
	startNode(t, "node-b", b.addr, c.RPCAddrs(), monolith("p1", "node-b"))
	testutil.WaitFor(t, 10*time.Second, "two healthy controllers", func() bool {
		p := pluginOf(t, cl, "p1")
		return p != nil && p.GetControllersHealthy() == 2 && p.GetNodesHealthy() == 2
	})
	p := pluginOf(t, cl, "p1")
	if p.GetProvider() != "csi.example" || p.GetVersion() != "1.2.3" || len(p.GetInstances()) != 2 ||
		p.GetInstances()[0].GetHealthDescription() != "probe ok" {
		t.Fatalf("plugin view: %v", p)
	}

	// node-a sorts first; a retryable failure there moves to node-b.
	a.setFail(retryable("controller restarting"))
	created, err := cl.CreateVolume(ctx, &csisupdv1.VolumeCreateRequest{
		Id: "vol-1", PluginId: "p1", CapacityMinBytes: 1 << 30,
		Parameters: map[string]string{"tier": "fast"},
		Secrets:    map[string]string{"password": "s3cr3t-value"},
	})
	if err != nil {
		t.Fatal(err)
	}
	v := created.GetVolume()
	if v.GetControllerNodeId() != "node-b" || v.GetExternalId() != "ext-vol-1" || v.GetCapacityBytes() != 1<<30 ||
		v.GetContext()["created-by"] != "node-b" || v.GetParameters()["tier"] != "fast" {
		t.Fatalf("created volume: %v", v)
	}
	if a.callCount("create") != 1 || b.callCount("create") != 1 {
		t.Fatalf("create calls: node-a %d, node-b %d; want 1 and 1", a.callCount("create"), b.callCount("create"))
	}
	a.setFail(nil)

	// A non-retryable error is returned, not retried elsewhere.
	a.setFail(status.Error(codes.InvalidArgument, "bad parameters"))
	_, err = cl.CreateVolume(ctx, &csisupdv1.VolumeCreateRequest{Id: "vol-2", PluginId: "p1"})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("create with non-retryable error: %v, want InvalidArgument", err)
	}
	if b.callCount("create vol-2") != 0 {
		t.Fatal("a non-retryable error moved to the next controller")
	}
	a.setFail(nil)

	// Create is idempotent by id.
	again, err := cl.CreateVolume(ctx, &csisupdv1.VolumeCreateRequest{Id: "vol-1", PluginId: "p1"})
	if err != nil || again.GetVolume().GetCreateIndex() != v.GetCreateIndex() {
		t.Fatalf("repeated create: %v, %v", again, err)
	}

	// A name apart from the id is the name the plugin's CreateVolume
	// gets; the volume keeps its id, and the plugin's id for it.
	named, err := cl.CreateVolume(ctx, &csisupdv1.VolumeCreateRequest{Id: "vol-3", Name: "database", PluginId: "p1"})
	if err != nil {
		t.Fatal(err)
	}
	if nv := named.GetVolume(); nv.GetId() != "vol-3" || nv.GetExternalId() != "ext-database" ||
		a.callCount("create database") != 1 || a.callCount("create vol-3") != 0 {
		t.Fatalf("create named database: %v, CreateVolume calls for database %d and vol-3 %d; want one, for database",
			nv, a.callCount("create database"), a.callCount("create vol-3"))
	}
	if _, err := cl.DeleteVolume(ctx, &csisupdv1.VolumeDeleteRequest{Id: "vol-3"}); err != nil || a.callCount("delete ext-database") != 1 {
		t.Fatalf("delete vol-3: %v, %d DeleteVolume calls for ext-database, want 1", err, a.callCount("delete ext-database"))
	}

	claimed, err := cl.ClaimVolume(ctx, &csisupdv1.VolumeClaimRequest{Id: "vol-1", NodeId: "node-b", WorkloadId: "w1",
		Secrets: map[string]string{"token": "s3cr3t-value"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := claimed.GetClaim(); got.GetCsiNodeId() != "csi-node-b" || got.GetPublishContext()["device"] != "/dev/fake-csi-node-b" ||
		got.GetState() != rules.StateTaken || got.GetHostPath() == "" {
		t.Fatalf("claim: %v", got)
	}
	if _, err := cl.DeleteVolume(ctx, &csisupdv1.VolumeDeleteRequest{Id: "vol-1"}); status.Code(err) != codes.FailedPrecondition ||
		!strings.Contains(err.Error(), "release them first") {
		t.Fatalf("delete of a claimed volume: %v, want FailedPrecondition naming the release", err)
	}

	// Secrets reach the plugin but are never stored.
	if !bytes.Contains([]byte(joinAll(a.seenSecrets(), b.seenSecrets(), nv.seenSecrets())), []byte("s3cr3t-value")) {
		t.Fatal("secrets did not reach the controller and the node")
	}
	snap := saveSnapshot(t, cl)
	if bytes.Contains(snap, []byte("s3cr3t-value")) {
		t.Fatal("a secret was stored in the replicated state")
	}

	rel, err := cl.ReleaseVolume(ctx, &csisupdv1.VolumeReleaseRequest{Id: "vol-1", NodeId: "node-b", WorkloadId: "w1"})
	if err != nil || len(rel.GetVolume().GetClaims()) != 0 {
		t.Fatalf("release: %v, %v", rel, err)
	}
	if _, err := cl.DeleteVolume(ctx, &csisupdv1.VolumeDeleteRequest{Id: "vol-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.GetVolume(ctx, &csisupdv1.VolumeGetRequest{Id: "vol-1"}); status.Code(err) != codes.NotFound {
		t.Fatalf("get after delete: %v, want NotFound", err)
	}
	// The delete goes to the controller that created the volume first,
	// node-b, though node-a sorts first: a node-local controller answers
	// success for a volume it does not hold.
	if a.callCount("delete ext-vol-1") != 0 || b.callCount("delete ext-vol-1") != 1 {
		t.Fatalf("delete went to node-a %d times and node-b %d times, want only node-b, its creator, once",
			a.callCount("delete ext-vol-1"), b.callCount("delete ext-vol-1"))
	}
}

func TestNodeMissingHeartbeatGoesDown(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 3, Configure: func(_ int, cfg *server.Config) {
		cfg.MinHeartbeatTTL = 300 * time.Millisecond
		cfg.HeartbeatGrace = 300 * time.Millisecond
	}})
	checkFormed(t, c, 3)
	cl := c.Control(0)
	a, b := startFakeAgent(t, "node-a"), startFakeAgent(t, "node-b")
	na := startNode(t, "node-a", a.addr, c.RPCAddrs(), monolith("p1", "node-a"))
	startNode(t, "node-b", b.addr, c.RPCAddrs(), monolith("p1", "node-b"))
	testutil.WaitFor(t, 10*time.Second, "two healthy controllers", func() bool {
		p := pluginOf(t, cl, "p1")
		return p != nil && p.GetControllersHealthy() == 2
	})

	na.stop()
	testutil.WaitFor(t, 20*time.Second, "node-a down", func() bool {
		resp, err := cl.GetNode(context.Background(), &csisupdv1.NodeGetRequest{Id: "node-a"})
		return err == nil && resp.GetNode().GetStatus() == state.NodeStatusDown
	})
	p := pluginOf(t, cl, "p1")
	if p.GetControllersHealthy() != 1 || p.GetControllersExpected() != 2 || p.GetNodesHealthy() != 1 {
		t.Fatalf("after node-a went down: %d/%d controllers, %d nodes healthy", p.GetControllersHealthy(), p.GetControllersExpected(), p.GetNodesHealthy())
	}
	for _, inst := range p.GetInstances() {
		if inst.GetNodeId() == "node-a" && (inst.GetHealthy() || inst.GetHealthDescription() != "node is down") {
			t.Fatalf("instance on a down node: %v", inst)
		}
	}

	// The node comes back: its heartbeats make it ready again.
	startNode(t, "node-a", a.addr, c.RPCAddrs(), monolith("p1", "node-a"))
	testutil.WaitFor(t, 10*time.Second, "node-a ready", func() bool {
		p := pluginOf(t, cl, "p1")
		return p != nil && p.GetControllersHealthy() == 2
	})
}

func TestPluginUpdatesAndGarbageCollection(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 1})
	checkFormed(t, c, 1)
	cl := c.Control(0)
	a := startFakeAgent(t, "node-a")
	n := startNode(t, "node-a", a.addr, c.RPCAddrs(), monolith("p1", "node-a"))
	testutil.WaitFor(t, 10*time.Second, "p1 registered", func() bool { return pluginOf(t, cl, "p1") != nil })

	sick := monolith("p1", "node-a")
	sick.Healthy, sick.HealthDescription = false, "probe failed: connection refused"
	n.setPlugins(sick, monolith("p2", "node-a"))
	testutil.WaitFor(t, 10*time.Second, "p1 unhealthy and p2 present", func() bool {
		p1, p2 := pluginOf(t, cl, "p1"), pluginOf(t, cl, "p2")
		return p1 != nil && p1.GetControllersHealthy() == 0 && p2 != nil &&
			p1.GetInstances()[0].GetHealthDescription() == "probe failed: connection refused"
	})

	n.setPlugins(monolith("p2", "node-a"))
	testutil.WaitFor(t, 10*time.Second, "p1 garbage-collected", func() bool { return pluginOf(t, cl, "p1") == nil })
	list, err := cl.ListPlugins(context.Background(), &csisupdv1.PluginListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetPlugins()) != 1 || list.GetPlugins()[0].GetId() != "p2" {
		t.Fatalf("plugins after gc: %v", list.GetPlugins())
	}
}

func TestHeartbeatsDoNotWriteToRaft(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 3})
	leader := checkFormed(t, c, 3)
	ctx := context.Background()
	cluster := csisupdv1.NewClusterClient(c.Conn((leader.Index + 1) % 3))
	const nodes = 20
	for i := range nodes {
		_, err := cluster.NodeRegister(asNode(ctx, nodeName(i)), &csisupdv1.NodeRegisterRequest{
			NodeId: nodeName(i), Address: "127.0.0.1:1", Name: nodeName(i),
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	beatAll := func(round int) {
		for i := range nodes {
			resp, err := cluster.NodeHeartbeat(asNode(ctx, nodeName(i)), &csisupdv1.NodeHeartbeatRequest{NodeId: nodeName(i)})
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			if resp.GetHeartbeatTtlMs() <= 0 {
				t.Fatalf("heartbeat returned TTL %d", resp.GetHeartbeatTtlMs())
			}
		}
	}
	// A leader election writes to raft (the new leader's first entry, and
	// node status changes once TTLs restart), and a loaded machine can
	// time out a leader's heartbeat: a window with an election in it says
	// nothing about node heartbeats, so it is measured again, up to three
	// times. Each window starts with a round that makes every node ready
	// with a fresh TTL; only the rounds after it are measured.
	for attempt := 1; ; attempt++ {
		leader := checkFormed(t, c, 3)
		// A follower records its address through a Join to the leader
		// once formed: a write that is no heartbeat's, so it is waited for.
		testutil.WaitFor(t, 10*time.Second, "every server's address record", func() bool {
			return len(leader.Server().State().Servers()) == 3
		})
		beatAll(0)
		testutil.WaitFor(t, 10*time.Second, "the leader to apply its whole log", func() bool {
			last, _ := strconv.ParseUint(leader.Server().RaftStats()["last_log_index"], 10, 64)
			return leader.Server().AppliedIndex() >= last
		})
		term, before := leader.Server().Term(), leader.Server().AppliedIndex()
		for round := 1; round <= 5; round++ {
			beatAll(round)
		}
		after := leader.Server().AppliedIndex()
		if leader.Server().Term() != term || !leader.Server().IsLeader() {
			if attempt == 3 {
				t.Fatalf("a leader election in each of %d measurement windows", attempt)
			}
			t.Logf("window %d had a leader election (term %d -> %d); measuring again", attempt, term, leader.Server().Term())
			continue
		}
		// A node whose record changed in the window missed its TTL: the
		// loaded machine did not send its heartbeat in time, and the
		// status writes (down, then ready again) are transitions, not
		// steady-state heartbeats. Measured again, like an election.
		var expired []string
		for _, n := range leader.Server().State().Nodes() {
			if n.GetModifyIndex() > before {
				expired = append(expired, n.GetId())
			}
		}
		if after != before && len(expired) > 0 && attempt < 3 {
			t.Logf("window %d: nodes %v changed status (a TTL expired on a loaded machine); measuring again", attempt, expired)
			continue
		}
		if after != before {
			t.Fatalf("applied index grew from %d to %d with steady-state heartbeats (node records changed: %v)", before, after, expired)
		}
		break
	}
	_, err := cluster.NodeHeartbeat(asNode(ctx, "unknown-node"), &csisupdv1.NodeHeartbeatRequest{NodeId: "unknown-node"})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("heartbeat of an unknown node: %v, want NotFound", err)
	}
}

func TestSnapshotSaveRestore(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 3})
	leader := checkFormed(t, c, 3)
	cl := c.Control((leader.Index + 1) % 3)
	ctx := context.Background()
	for _, id := range []string{"v1", "v2"} {
		if _, err := cl.RegisterVolume(ctx, &csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{Id: id, PluginId: "p", ExternalId: "x-" + id}}); err != nil {
			t.Fatal(err)
		}
	}
	snap := saveSnapshot(t, cl)
	if _, err := cl.DeleteVolume(ctx, &csisupdv1.VolumeDeleteRequest{Id: "v1", DeregisterOnly: true}); err != nil {
		t.Fatal(err)
	}
	restoreSnapshot(t, cl, snap)
	for _, m := range c.Members() {
		testutil.WaitFor(t, 10*time.Second, "restored volume on "+m.ID, func() bool {
			return m.Server().State().Volume("v1") != nil && m.Server().State().Volume("v2") != nil
		})
	}

	bad, err := cl.SnapshotRestore(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bad.Send(&csisupdv1.SnapshotChunk{Data: []byte("not a snapshot")})
	if _, err := bad.CloseAndRecv(); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("restore of garbage: %v, want InvalidArgument", err)
	}
}

func TestStaleAndConsistentReads(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 3})
	leader := checkFormed(t, c, 3)
	f := (leader.Index + 1) % 3
	cl := c.Control(f)
	ctx := context.Background()
	if _, err := cl.RegisterVolume(ctx, &csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{Id: "v1", PluginId: "p", ExternalId: "x"}}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "follower applied the volume", func() bool { return c.Member(f).Server().State().Volume("v1") != nil })

	// A consistent read through a follower is forwarded to the leader.
	r, err := cl.GetVolume(ctx, &csisupdv1.VolumeGetRequest{Id: "v1"})
	if err != nil || r.GetVolume().GetId() != "v1" {
		t.Fatalf("consistent read through a follower: %v, %v", r, err)
	}

	// A follower that lost the rest of the cluster answers stale reads only.
	for _, m := range c.Members() {
		if m.Index != f {
			c.Kill(m.Index)
		}
	}
	testutil.WaitFor(t, 10*time.Second, "lone follower to lose its leader", func() bool {
		return c.Member(f).Server().Leader() == ""
	})
	resp, err := cl.GetVolume(ctx, &csisupdv1.VolumeGetRequest{Id: "v1", Stale: true})
	if err != nil || resp.GetVolume().GetId() != "v1" {
		t.Fatalf("stale read: %v, %v", resp, err)
	}
	if _, err := cl.GetVolume(ctx, &csisupdv1.VolumeGetRequest{Id: "v1"}); status.Code(err) != codes.Unavailable {
		t.Fatalf("consistent read without a leader: %v, want Unavailable", err)
	}
}

func TestWatchEvents(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 1})
	checkFormed(t, c, 1)
	cl := c.Control(0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := cl.WatchEvents(ctx, &csisupdv1.ClusterEventWatchRequest{NoReplay: true})
	if err != nil {
		t.Fatal(err)
	}
	// The subscription is live once its header arrived; writes follow.
	// (An open stream alone is not: the server may not have subscribed
	// yet, and the write's event would come before it.)
	if _, err := stream.Header(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "volume registered", func() bool {
		_, err := cl.RegisterVolume(ctx, &csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{Id: "v1", PluginId: "p", ExternalId: "x"}})
		return err == nil
	})
	for {
		e, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if e.GetType() == "volume-created" && e.GetVolumeId() == "v1" && e.GetIndex() > 0 {
			break
		}
	}
}

func saveSnapshot(t testing.TB, cl csisupdv1.ControlClient) []byte {
	t.Helper()
	stream, err := cl.SnapshotSave(context.Background(), &csisupdv1.SnapshotSaveRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	for {
		chunk, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		buf.Write(chunk.GetData())
	}
	if buf.Len() == 0 {
		t.Fatal("empty snapshot")
	}
	return buf.Bytes()
}

// restoreSnapshot restores snap, a snapshot from saveSnapshot, in one chunk.
func restoreSnapshot(t testing.TB, cl csisupdv1.ControlClient, snap []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	up, err := cl.SnapshotRestore(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := up.Send(&csisupdv1.SnapshotChunk{Data: snap}); err != nil {
		t.Fatal(err)
	}
	if _, err := up.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
}

func joinAll(lists ...[]string) string {
	var b bytes.Buffer
	for _, l := range lists {
		for _, s := range l {
			b.WriteString(s)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

func nodeName(i int) string { return "node-" + string(rune('a'+i%26)) + string(rune('a'+i/26)) }

func TestNodeClientRegistersAgainWhenForgotten(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 1, Configure: func(_ int, cfg *server.Config) {
		cfg.MinHeartbeatTTL = 200 * time.Millisecond
	}})
	checkFormed(t, c, 1)
	cl := c.Control(0)
	empty := saveSnapshot(t, cl) // taken before the node exists

	a := startFakeAgent(t, "node-a")
	n := startNode(t, "node-a", a.addr, c.RPCAddrs(), monolith("p1", "node-a"))
	testutil.WaitFor(t, 10*time.Second, "node registered", func() bool { return c.Member(0).Server().State().Node("node-a") != nil })
	first := c.Member(0).Server().State().Node("node-a").GetModifyIndex()

	// Restoring the older snapshot makes the servers forget the node: its
	// next heartbeat gets NotFound and the client registers again.
	up, err := cl.SnapshotRestore(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := up.Send(&csisupdv1.SnapshotChunk{Data: empty}); err != nil {
		t.Fatal(err)
	}
	if _, err := up.CloseAndRecv(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "node registered again", func() bool {
		node := c.Member(0).Server().State().Node("node-a")
		return node != nil && node.GetModifyIndex() > first && n.client.Registered()
	})
	if p := pluginOf(t, cl, "p1"); p == nil || p.GetControllersHealthy() != 1 {
		t.Fatalf("plugin after re-registration: %v", p)
	}
}
