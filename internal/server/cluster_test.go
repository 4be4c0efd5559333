package server_test

import (
	"fmt"
	"strings"

	"context"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/testutil"

	"github.com/hashicorp/raft"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/testcluster"
)

// checkFormed asserts one leader and one identical configuration holding
// every member.
func checkFormed(t testing.TB, c *testcluster.Cluster, n int) *testcluster.Member {
	t.Helper()
	leader := c.WaitForLeader(t, 30*time.Second)
	want, err := leader.Server().Configuration()
	if err != nil {
		t.Fatal(err)
	}
	if len(want.Servers) != n {
		t.Fatalf("leader configuration has %d servers, want %d: %+v", len(want.Servers), n, want.Servers)
	}
	testutil.WaitFor(t, 10*time.Second, "identical configurations", func() bool {
		for _, m := range c.Members() {
			got, err := m.Server().Configuration()
			if err != nil || !sameConfig(got, want) {
				return false
			}
		}
		return true
	})
	leaders := 0
	for _, m := range c.Members() {
		if m.Server().IsLeader() {
			leaders++
		}
		if !m.Server().Bootstrapped() {
			t.Errorf("%s: Bootstrapped() = false after formation", m.ID)
		}
	}
	if leaders != 1 {
		t.Fatalf("%d leaders, want 1", leaders)
	}
	return leader
}

func sameConfig(a, b raft.Configuration) bool {
	if len(a.Servers) != len(b.Servers) {
		return false
	}
	for i := range a.Servers {
		if a.Servers[i] != b.Servers[i] {
			return false
		}
	}
	return true
}

func TestFormationThreeServers(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 3})
	checkFormed(t, c, 3)
}

func TestFourthServerJoinsWithoutElection(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 3})
	leader := checkFormed(t, c, 3)
	term := leader.Server().Term()
	m := c.AddServer()
	testutil.WaitFor(t, 20*time.Second, "fourth server in the configuration", func() bool {
		conf, err := leader.Server().Configuration()
		return err == nil && len(conf.Servers) == 4
	})
	testutil.WaitFor(t, 10*time.Second, "fourth server to follow the leader", func() bool {
		return m.Server().Leader() == leader.ID
	})
	if got := leader.Server().Term(); got != term {
		t.Fatalf("raft term changed from %d to %d when a server joined", term, got)
	}
	if !leader.Server().IsLeader() {
		t.Fatal("leadership changed when a server joined")
	}
	resp, err := c.Control(3).RaftPeers(context.Background(), &csisupdv1.RaftPeersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetPeers()) != 4 {
		t.Fatalf("RaftPeers lists %d peers, want 4", len(resp.GetPeers()))
	}
}

func TestKillLeaderElectsNewLeader(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 3})
	old := checkFormed(t, c, 3)
	start := time.Now()
	c.Kill(old.Index)
	var next *testcluster.Member
	testutil.WaitFor(t, 30*time.Second, "a new leader", func() bool {
		next = c.Leader()
		return next != nil
	})
	t.Logf("new leader %s elected %v after killing %s", next.ID, time.Since(start), old.ID)
	if next.ID == old.ID {
		t.Fatalf("killed leader %s still leads", old.ID)
	}
	c.Restart(old.Index)
	testutil.WaitFor(t, 30*time.Second, "old leader to rejoin as follower", func() bool {
		s := c.Member(old.Index).Server()
		return s != nil && s.Leader() != "" && c.Leader() != nil
	})
}

func TestRestartKeepsDataAndDoesNotBootstrapAgain(t *testing.T) {
	logs := &logBuffer{}
	c := testcluster.New(t, testcluster.Config{Servers: 3, Logger: logs.logger()})
	checkFormed(t, c, 3)
	if n := logs.count("bootstrapping cluster"); n < 1 {
		t.Fatalf("no server logged a bootstrap during formation:\n%s", logs)
	}
	ctx := context.Background()
	_, err := c.Control(0).RegisterVolume(ctx, &csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{
		Id: "vol-1", PluginId: "p1", ExternalId: "ext-1", CapacityBytes: 42,
	}})
	if err != nil {
		t.Fatal(err)
	}
	before := logs.count("bootstrapping cluster")
	for i := range 3 {
		c.Kill(i)
	}
	for i := range 3 {
		c.Restart(i)
	}
	checkFormed(t, c, 3)
	if after := logs.count("bootstrapping cluster"); after != before {
		t.Fatalf("restarted servers bootstrapped again (%d bootstrap log lines, had %d)", after, before)
	}
	for _, m := range c.Members() {
		if !m.Server().Bootstrapped() {
			t.Errorf("%s: restarted server does not report Bootstrapped", m.ID)
		}
	}
	resp, err := c.Control(2).GetVolume(ctx, &csisupdv1.VolumeGetRequest{Id: "vol-1"})
	if err != nil {
		t.Fatalf("volume lost across restart: %v", err)
	}
	if resp.GetVolume().GetCapacityBytes() != 42 || resp.GetVolume().GetExternalId() != "ext-1" {
		t.Fatalf("volume changed across restart: %v", resp.GetVolume())
	}
}

func TestBootstrapExpectMismatchFormsNoCluster(t *testing.T) {
	logs := &logBuffer{}
	c := testcluster.New(t, testcluster.Config{Servers: 3, Logger: logs.logger(),
		Configure: func(i int, cfg *server.Config) {
			if i == 2 {
				cfg.BootstrapExpect = 2
			}
		}})
	testutil.WaitFor(t, 20*time.Second, "every server to log the mismatch", func() bool {
		for _, m := range c.Members() {
			if logs.lines("bootstrap_expect mismatch", "server="+m.ID+" ") == 0 {
				return false
			}
		}
		return true
	})
	for _, m := range c.Members() {
		s := m.Server()
		conf, err := s.Configuration()
		if err != nil {
			t.Fatal(err)
		}
		if len(conf.Servers) != 0 || s.Bootstrapped() || s.Leader() != "" {
			t.Fatalf("%s formed a cluster despite the mismatch: %+v", m.ID, conf.Servers)
		}
	}
	if n := logs.count("bootstrapping cluster"); n != 0 {
		t.Fatalf("%d bootstrap attempts despite the mismatch", n)
	}
	if !strings.Contains(logs.String(), "peer_bootstrap_expect=2") {
		t.Fatalf("mismatch log does not say which value differs:\n%s", logs)
	}
}

func TestAutopilotRemovesDeadServer(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 3, Configure: func(_ int, cfg *server.Config) {
		cfg.DeadServerTimeout = time.Second
		cfg.ServerStabilizationTime = 200 * time.Millisecond
	}})
	leader := checkFormed(t, c, 3)
	m := c.AddServer()
	testutil.WaitFor(t, 20*time.Second, "four voters", func() bool {
		conf, err := leader.Server().Configuration()
		return err == nil && len(conf.Servers) == 4
	})
	c.Kill(m.Index)
	testutil.WaitFor(t, 30*time.Second, "dead server removed", func() bool {
		conf, err := leader.Server().Configuration()
		if err != nil || len(conf.Servers) != 3 {
			return false
		}
		for _, s := range conf.Servers {
			if string(s.ID) == m.ID {
				return false
			}
		}
		return true
	})
}

func TestGracefulStopTransfersLeadership(t *testing.T) {
	logs := &logBuffer{}
	c := testcluster.New(t, testcluster.Config{Servers: 3, Logger: logs.logger()})
	old := checkFormed(t, c, 3)
	c.Stop(old.Index)
	if !strings.Contains(logs.String(), "transferring leadership before shutdown") {
		t.Fatal("the leader did not try to transfer leadership on graceful shutdown")
	}
	if strings.Contains(logs.String(), "leadership transfer failed") {
		t.Fatalf("leadership transfer failed:\n%s", logs)
	}
	next := c.WaitForLeader(t, 30*time.Second)
	if next.ID == old.ID {
		t.Fatalf("stopped server %s still leads", old.ID)
	}
}

func TestNewLeaderKeepsNodesReady(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 3, Configure: func(_ int, cfg *server.Config) {
		cfg.MinHeartbeatTTL = 300 * time.Millisecond
		cfg.HeartbeatGrace = 300 * time.Millisecond
		cfg.FailoverHeartbeatTTL = 3 * time.Second
	}})
	old := checkFormed(t, c, 3)
	a := startFakeAgent(t, "node-a")
	n := startNode(t, "node-a", a.addr, c.RPCAddrs(), monolith("p1", "node-a"))
	testutil.WaitFor(t, 10*time.Second, "node registered", func() bool { return n.client.Registered() })
	c.Kill(old.Index)
	next := c.WaitForLeader(t, 30*time.Second)
	// The new leader started the node's timer with the failover TTL; the
	// node's next heartbeats reach it and keep the node ready.
	testutil.WaitFor(t, 10*time.Second, "node ready on the new leader", func() bool {
		node := next.Server().State().Node("node-a")
		return node != nil && node.GetStatus() == state.NodeStatusReady && n.client.TTL() > 0
	})
	modified := next.Server().State().Node("node-a").GetModifyIndex()
	// Past the failover TTL the node must still be ready and unwritten: its
	// heartbeats replaced the failover timer, and heartbeats do not write.
	deadline := time.Now().Add(4 * time.Second)
	testutil.WaitFor(t, 10*time.Second, "failover TTL to pass", func() bool { return time.Now().After(deadline) })
	srv := c.WaitForLeader(t, 30*time.Second).Server()
	node := srv.State().Node("node-a")
	if node.GetStatus() != state.NodeStatusReady || node.GetModifyIndex() != modified {
		t.Fatalf("node changed after the leader changed: status %s, modify index %d -> %d",
			node.GetStatus(), modified, node.GetModifyIndex())
	}
}

func TestRaftSnapshotsRestoreOnRestartAndNewServer(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 3, Configure: func(_ int, cfg *server.Config) {
		cfg.SnapshotThreshold = 16
		cfg.SnapshotInterval = 50 * time.Millisecond
		cfg.TrailingLogs = 4
	}})
	leader := checkFormed(t, c, 3)
	cl := c.Control(leader.Index)
	ctx := context.Background()
	for i := range 60 {
		if _, err := cl.RegisterVolume(ctx, &csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{
			Id: fmt.Sprintf("v%02d", i), PluginId: "p", ExternalId: fmt.Sprintf("x%02d", i),
		}}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 10*time.Second, "a raft snapshot on the leader", func() bool {
		return leader.Server().RaftStats()["last_snapshot_index"] != "0"
	})
	// A new server can only catch up from the snapshot: the log before it
	// is gone.
	m := c.AddServer()
	// raft restores the snapshot into the state a moment before it records
	// the snapshot's index, so the two are waited for together.
	testutil.WaitFor(t, 20*time.Second, "new server to hold every volume from an installed snapshot", func() bool {
		return len(m.Server().State().Volumes("")) == 60 && m.Server().RaftStats()["last_snapshot_index"] != "0"
	})
	follower := (leader.Index + 1) % 3
	c.Kill(follower)
	c.Restart(follower)
	testutil.WaitFor(t, 20*time.Second, "restarted server to hold every volume", func() bool {
		return len(c.Member(follower).Server().State().Volumes("")) == 60
	})
}
