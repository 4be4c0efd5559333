package testcluster

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestPartitionAndHeal(t *testing.T) {
	c := New(t, Config{Servers: 3})
	old := c.WaitForLeader(t, 30*time.Second)
	term := old.Server().Term()

	c.Partition(old.Index)
	var next *Member
	if !poll(30*time.Second, func() bool {
		next = c.Leader()
		return next != nil && next.ID != old.ID
	}) {
		t.Fatalf("no new leader after partitioning %s: %s", old.ID, c.describe())
	}
	if next.Server().Term() <= term {
		t.Fatalf("new leader's term %d is not above %d", next.Server().Term(), term)
	}

	c.Heal(old.Index)
	if !poll(30*time.Second, func() bool {
		return c.Leader() != nil && old.Server().Leader() == c.Leader().ID && !old.Server().IsLeader()
	}) {
		t.Fatalf("healed server did not rejoin as a follower: %s", c.describe())
	}
}

func TestRestartKeepsIdentity(t *testing.T) {
	c := New(t, Config{Servers: 1})
	m := c.WaitForLeader(t, 30*time.Second)
	id, rpcAddr, raftAddr := m.ID, m.RPCAddr, m.Server().RaftAddr()
	c.Kill(0)
	if m.Running() {
		t.Fatal("killed member still running")
	}
	c.Restart(0)
	got := c.WaitForLeader(t, 30*time.Second)
	if got.ID != id || got.RPCAddr != rpcAddr || got.Server().RaftAddr() != raftAddr {
		t.Fatalf("restarted as %s %s %s, want %s %s %s", got.ID, got.RPCAddr, got.Server().RaftAddr(), id, rpcAddr, raftAddr)
	}
	if !got.Server().Bootstrapped() {
		t.Fatal("restarted server does not report Bootstrapped")
	}
}
