//go:build nemesis

package nemesis

import (
	"errors"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testplugin/journal"
)

// Bounds of the test's waits.
const (
	electionTimeout = 60 * time.Second // a new leader after the old one died
	nodeDownTimeout = 60 * time.Second // heartbeat TTL, grace and a leader's write
	readyTimeout    = 60 * time.Second // an agent back, registered and probed
)

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestClusterComesUp starts three servers and three agents with their
// plugins, and checks that the controls do what they say: a killed leader
// is replaced, a stopped agent goes down and comes back when continued, an
// isolated server rejoins, a killed agent restarted is ready again.
func TestClusterComesUp(t *testing.T) {
	// Not parallel: it runs first, alone, before the defects' soaks
	// (parallel tests), as its elections and heartbeats are timed.
	c := StartCluster(t, Options{Servers: 3, Agents: 3})
	agents := c.Agents()
	for _, id := range plugins {
		got, err := c.HealthyPlugins(id)
		must(t, err)
		if !slices.Equal(got, agents) {
			t.Fatalf("healthy instances of %s on %v, want %v", id, got, agents)
		}
	}
	for _, a := range agents {
		st, err := c.NodeStatus(a)
		must(t, err)
		if st != "ready" {
			t.Fatalf("node %s is %q, want ready", a, st)
		}
	}

	// The leader killed: the other two elect one of themselves.
	old := c.Leader()
	if old == "" {
		t.Fatal("no leader after the cluster formed")
	}
	must(t, c.Kill(old))
	next, err := c.WaitLeader(electionTimeout)
	must(t, err)
	if next == old {
		t.Fatalf("leader %s still named after it was killed", old)
	}
	must(t, c.Restart(old))

	// An agent stopped: its node goes down; continued, it is ready again
	// with its plugin healthy.
	a := agents[0]
	must(t, c.Stop(a))
	must(t, c.WaitNodeStatus(a, "down", nodeDownTimeout))
	must(t, c.Cont(a))
	must(t, c.WaitNodeStatus(a, "ready", readyTimeout))
	must(t, c.WaitHealthyPlugins(localPlugin, len(agents), readyTimeout))

	// The leader isolated: the other two elect one of themselves, and
	// the test's clients cannot reach it; healed, it answers again and
	// follows.
	leader, err := c.WaitLeader(electionTimeout)
	must(t, err)
	must(t, c.Isolate(leader))
	if res, err := c.CLI(c.RPCAddr(leader), "operator", "raft", "list-peers"); err == nil && res.code == 0 {
		t.Fatalf("isolated %s answered: %s", leader, res.stdout)
	}
	must(t, c.waitFor(electionTimeout, "a leader other than the isolated "+leader, func() (bool, error) {
		l := c.Leader()
		return l != "" && l != leader, nil
	}))
	must(t, c.HealAll())
	must(t, c.waitFor(electionTimeout, leader+" answering with the leader and every server", func() (bool, error) {
		var peers peersDoc
		if err := c.cliJSON(c.RPCAddr(leader), &peers, "operator", "raft", "list-peers"); err != nil {
			return false, err
		}
		leaders := 0
		for _, p := range peers.Peers {
			if p.Leader {
				leaders++
			}
		}
		return len(peers.Peers) == len(c.Servers()) && leaders == 1, nil
	}))

	// An agent killed: its node goes down; restarted with its data, it
	// is ready again with its plugin.
	b := agents[1]
	must(t, c.Kill(b))
	must(t, c.WaitNodeStatus(b, "down", nodeDownTimeout))
	must(t, c.Restart(b))
	must(t, c.WaitNodeStatus(b, "ready", readyTimeout))
	must(t, c.WaitHealthyPlugins(localPlugin, len(agents), readyTimeout))

	// A plugin killed: its instance turns unhealthy; restarted (on the
	// socket its killed run left behind), healthy again.
	p := PluginName(agents[2], localPlugin)
	must(t, c.Kill(p))
	must(t, c.waitFor(readyTimeout, p+" unhealthy", func() (bool, error) {
		got, err := c.HealthyPlugins(localPlugin)
		return err == nil && !slices.Contains(got, agents[2]), err
	}))
	must(t, c.Restart(p))
	must(t, c.WaitHealthyPlugins(localPlugin, len(agents), readyTimeout))

	// The journals outlive the processes and read back.
	for _, id := range plugins {
		for _, j := range c.Journals(id) {
			if _, err := os.Stat(j); err != nil {
				t.Fatalf("journal: %v", err)
			}
		}
		if _, err := journal.Merge(c.Journals(id)...); err != nil && !errors.Is(err, journal.ErrTornLine) {
			t.Fatalf("journals of %s: %v", id, err)
		}
	}

	for _, e := range c.Events() {
		t.Logf("schedule: %s", e)
	}
}
