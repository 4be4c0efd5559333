package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testutil"
)

// suffrageOf returns the suffrage of id in the leader's configuration, and
// false when id is not in it.
func suffrageOf(t testing.TB, s *server.Server, id string) (raft.ServerSuffrage, bool) {
	t.Helper()
	conf, err := s.Configuration()
	if err != nil {
		t.Fatalf("configuration: %v", err)
	}
	for _, srv := range conf.Servers {
		if string(srv.ID) == id {
			return srv.Suffrage, true
		}
	}
	return 0, false
}

// peerOf returns id's row of RaftPeers asked of member i, or nil.
func peerOf(t testing.TB, c *testcluster.Cluster, i int, id string) *csisupdv1.RaftPeer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.Control(i).RaftPeers(ctx, &csisupdv1.RaftPeersRequest{})
	if err != nil {
		t.Fatalf("raft peers: %v", err)
	}
	for _, p := range resp.GetPeers() {
		if p.GetId() == id {
			return p
		}
	}
	return nil
}

// A Join naming a raft address nothing answers at must not cost a
// one-server cluster its quorum: the server joins as a non-voter, is never
// promoted, writes keep committing, and autopilot removes it once it has
// been dead for DeadServerTimeout.
func TestJoinOfUnreachableServerKeepsTheLeader(t *testing.T) {
	const stabilize, dead = time.Second, 3 * time.Second
	c := testcluster.New(t, testcluster.Config{Servers: 1, Configure: func(_ int, cfg *server.Config) {
		cfg.ServerStabilizationTime = stabilize
		cfg.DeadServerTimeout = dead
	}})
	leader := checkFormed(t, c, 1)
	s := leader.Server()
	term := s.Term()

	ctx := context.Background()
	joined := time.Now()
	jctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err := csisupdv1.NewClusterClient(c.Conn(0)).Join(jctx, &csisupdv1.JoinRequest{
		ServerId: "bogus", RaftAddress: testutil.FreeAddr(t), RpcAddress: testutil.FreeAddr(t),
	})
	cancel()
	if err != nil {
		t.Fatalf("join: %v", err)
	}
	if got, ok := suffrageOf(t, s, "bogus"); !ok || got != raft.Nonvoter {
		t.Fatalf("after the join the bogus server is %v (present %v), want a non-voter", got, ok)
	}

	// Until autopilot removes it, every look finds the same leader on the
	// same term with the one voter, the bogus server without a vote and
	// judged unhealthy, and a write commits.
	writes := 0
	testutil.WaitFor(t, 30*time.Second, "autopilot to remove the unreachable server", func() bool {
		if !s.IsLeader() || s.Term() != term {
			t.Fatalf("leadership changed after the join: leader %v, term %d -> %d", s.IsLeader(), term, s.Term())
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.Control(0).RegisterVolume(wctx, &csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{
			Id: fmt.Sprintf("v%d", writes), PluginId: "p", ExternalId: fmt.Sprintf("x%d", writes),
		}})
		cancel()
		if err != nil {
			t.Fatalf("write %d after the join: %v", writes, err)
		}
		writes++
		if got, ok := suffrageOf(t, s, leader.ID); !ok || got != raft.Voter {
			t.Fatalf("the leader is %v (present %v) in its configuration", got, ok)
		}
		got, ok := suffrageOf(t, s, "bogus")
		if !ok {
			return true
		}
		if got != raft.Nonvoter {
			t.Fatalf("the unreachable server became %v", got)
		}
		p := peerOf(t, c, 0, "bogus")
		if p == nil {
			return true // removed since the look above
		}
		if p.GetHealthy() || p.GetSuffrage() != "nonvoter" || p.GetLastContactMs() != -1 {
			t.Fatalf("raft peers shows the unreachable server as %v", p)
		}
		return false
	})
	// Removal waits for DeadServerTimeout, longer than the stabilization
	// time: the looks above covered the time a promotion would have taken.
	if elapsed := time.Since(joined); elapsed < stabilize {
		t.Fatalf("the unreachable server was removed %v after the join, before the stabilization time %v", elapsed, stabilize)
	}
	if writes == 0 {
		t.Fatal("no write was tried while the unreachable server was in the configuration")
	}
	t.Logf("%d writes committed while the unreachable server was a non-voter; removed %v after the join", writes, time.Since(joined))
}

// A reachable server joins as a non-voter and becomes a voter only after
// autopilot has seen it healthy for ServerStabilizationTime; a rejoin at
// the same address keeps its vote.
func TestJoiningServerVotesOnlyOnceStable(t *testing.T) {
	const stabilize = 2 * time.Second
	c := testcluster.New(t, testcluster.Config{Servers: 1, Configure: func(_ int, cfg *server.Config) {
		cfg.ServerStabilizationTime = stabilize
	}})
	leader := checkFormed(t, c, 1)
	term := leader.Server().Term()
	started := time.Now()
	m := c.AddServer()

	var (
		sawNonvoter  bool
		healthySince time.Time // autopilot's stable_since while healthy and not yet a voter
		promotedAt   time.Time
	)
	testutil.WaitFor(t, 30*time.Second, "the new server to become a voter", func() bool {
		p := peerOf(t, c, 0, m.ID)
		now := time.Now()
		switch {
		case p == nil:
			return false
		case p.GetSuffrage() == "voter":
			promotedAt = now
			return true
		case p.GetSuffrage() != "nonvoter":
			t.Fatalf("the new server is %q", p.GetSuffrage())
		}
		sawNonvoter = true
		if p.GetHealthy() && p.GetStableSince() != nil {
			healthySince = p.GetStableSince().AsTime()
		} else {
			healthySince = time.Time{}
		}
		return false
	})
	if !sawNonvoter {
		t.Fatal("the new server was a voter at its first look: it joined with a vote")
	}
	if healthySince.IsZero() {
		t.Fatal("the new server was promoted without ever being seen healthy as a non-voter")
	}
	// promotedAt is no earlier than the promotion itself: a promotion
	// before the stabilization time would show here as a shorter span.
	if d := promotedAt.Sub(healthySince); d < stabilize {
		t.Fatalf("promoted %v after it became healthy, want at least the stabilization time %v", d, stabilize)
	}
	if d := promotedAt.Sub(started); d < stabilize {
		t.Fatalf("promoted %v after it was started, want at least %v", d, stabilize)
	}
	t.Logf("healthy %v after start, voter %v after start", healthySince.Sub(started), promotedAt.Sub(started))
	if got := leader.Server().Term(); got != term || !leader.Server().IsLeader() {
		t.Fatalf("leadership changed while the server joined: term %d -> %d", term, got)
	}
	p := peerOf(t, c, 0, m.ID)
	if !p.GetHealthy() || p.GetLastTerm() != term || p.GetLastIndex() == 0 || p.GetLastContactMs() < 0 {
		t.Fatalf("raft peers shows the promoted server as %v", p)
	}

	// A rejoin at the same address (as a restarted server's address check
	// sends) leaves its vote alone.
	before, err := leader.Server().Configuration()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := csisupdv1.NewClusterClient(c.Conn(0)).Join(ctx, &csisupdv1.JoinRequest{
		ServerId: m.ID, RaftAddress: m.RaftAddr, RpcAddress: m.RPCAddr,
	}); err != nil {
		t.Fatalf("rejoin: %v", err)
	}
	after, err := leader.Server().Configuration()
	if err != nil {
		t.Fatal(err)
	}
	if !sameConfig(before, after) {
		t.Fatalf("a rejoin at the same address changed the configuration: %+v -> %+v", before.Servers, after.Servers)
	}
	if got, _ := suffrageOf(t, leader.Server(), m.ID); got != raft.Voter {
		t.Fatalf("after the rejoin the server is %v, want a voter", got)
	}
}

// A non-voter that stops answering is judged by how old its last answer
// is: it turns unhealthy within moments, long before DeadServerTimeout,
// and is not promoted on the strength of its last good stats.
func TestJoiningServerThatDiesIsNotPromoted(t *testing.T) {
	const stabilize = 3 * time.Second
	c := testcluster.New(t, testcluster.Config{Servers: 1, Configure: func(_ int, cfg *server.Config) {
		cfg.ServerStabilizationTime = stabilize
		cfg.DeadServerTimeout = time.Minute
	}})
	leader := checkFormed(t, c, 1)
	m := c.AddServer()
	var healthySince time.Time
	testutil.WaitFor(t, 20*time.Second, "the new server to be healthy", func() bool {
		p := peerOf(t, c, 0, m.ID)
		if p.GetHealthy() && p.GetStableSince() != nil {
			healthySince = p.GetStableSince().AsTime()
			return true
		}
		return false
	})
	c.Kill(m.Index)
	testutil.WaitFor(t, 10*time.Second, "the killed server to be judged unhealthy", func() bool {
		p := peerOf(t, c, 0, m.ID)
		if p.GetSuffrage() != "nonvoter" {
			t.Fatalf("the killed server is %q", p.GetSuffrage())
		}
		return !p.GetHealthy()
	})
	// Past the time a promotion on stale stats would have happened.
	deadline := healthySince.Add(2 * stabilize)
	testutil.WaitFor(t, 20*time.Second, "twice the stabilization time", func() bool {
		if got, ok := suffrageOf(t, leader.Server(), m.ID); !ok || got != raft.Nonvoter {
			t.Fatalf("the killed server is %v (present %v), want a non-voter", got, ok)
		}
		return time.Now().After(deadline)
	})
	if p := peerOf(t, c, 0, m.ID); p.GetHealthy() || p.GetSuffrage() != "nonvoter" {
		t.Fatalf("raft peers shows the killed server as %v", p)
	}
}
