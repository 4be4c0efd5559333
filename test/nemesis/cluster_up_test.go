//go:build nemesis

package nemesis

import (
	"slices"
	"testing"
	"time"
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
	c := StartCluster(t, Options{Servers: 3, Agents: 3})
	agents := c.Agents()
	got, err := c.HealthyPlugins()
	must(t, err)
	if !slices.Equal(got, agents) {
		t.Fatalf("healthy plugin instances on %v, want %v", got, agents)
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
	must(t, c.WaitHealthyPlugins(len(agents), readyTimeout))

	// A server isolated and healed: the cluster keeps a leader and all
	// three servers answer again.
	leader, err := c.WaitLeader(electionTimeout)
	must(t, err)
	var follower string
	for _, s := range c.Servers() {
		if s != leader {
			follower = s
			break
		}
	}
	must(t, c.Isolate(follower))
	if _, err := c.WaitLeader(electionTimeout); err != nil {
		t.Fatal(err)
	}
	must(t, c.HealAll())
	must(t, c.waitFor(electionTimeout, "every server answering with the leader", func() (bool, error) {
		var peers peersDoc
		if err := c.cliJSON(c.RPCAddr(follower), &peers, "operator", "raft", "list-peers"); err != nil {
			return false, err
		}
		return len(peers.Peers) == len(c.Servers()), nil
	}))

	// An agent killed and restarted: ready again with its plugin.
	b := agents[1]
	must(t, c.Kill(b))
	must(t, c.Restart(b))
	must(t, c.WaitNodeStatus(b, "ready", readyTimeout))
	must(t, c.WaitHealthyPlugins(len(agents), readyTimeout))

	for _, e := range c.Events() {
		t.Logf("schedule: %s", e)
	}
}
