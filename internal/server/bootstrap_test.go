package server_test

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testutil"
)

// Four servers with bootstrap_expect 3 that all see each other refuse to
// bootstrap, each saying so once; the operator's remedy from that message
// (stop the surplus server, restart the others, start the surplus one
// again once a leader exists) forms the cluster.
func TestBootstrapRefusesSurplusServers(t *testing.T) {
	logs := &logBuffer{}
	c := testcluster.New(t, testcluster.Config{Servers: 4, BootstrapExpect: 3,
		Logger: hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: logs})})
	const refusal = "more servers known than bootstrap_expect"
	const known = `known_servers="server-0,server-1,server-2,server-3"`
	// Repeated attempts log the refusal at debug level only.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs:\n%s", logs)
		}
	})
	testutil.WaitFor(t, 20*time.Second, "every server to refuse repeatedly", func() bool {
		for _, m := range c.Members() {
			if logs.lines("[DEBUG]", refusal, known, "server="+m.ID+" ") < 2 {
				return false
			}
		}
		return true
	})
	for _, m := range c.Members() {
		if n := logs.lines("[ERROR]", refusal, known, "server="+m.ID+" "); n != 1 {
			t.Errorf("%s logged the refusal as an error %d times, want once:\n%s", m.ID, n, logs)
		}
		conf, err := m.Server().Configuration()
		if err != nil {
			t.Fatal(err)
		}
		if len(conf.Servers) != 0 || m.Server().Bootstrapped() {
			t.Fatalf("%s formed a cluster with a surplus server: %+v", m.ID, conf.Servers)
		}
	}
	if n := logs.count("bootstrapping cluster"); n != 0 {
		t.Fatalf("%d bootstraps with a surplus server", n)
	}

	// A restart forgets the known set; the stopped server stays out of it.
	for i := range 4 {
		c.Kill(i)
	}
	for i := range 3 {
		c.Restart(i)
	}
	leader := c.WaitForLeader(t, 30*time.Second)
	conf, err := leader.Server().Configuration()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range conf.Servers {
		if s.Suffrage != raft.Voter {
			t.Errorf("%s is not a voter", s.ID)
		}
		ids = append(ids, string(s.ID))
	}
	if got := strings.Join(ids, ","); got != "server-0,server-1,server-2" {
		t.Fatalf("bootstrapped configuration %s, want server-0,server-1,server-2", got)
	}
	c.Restart(3)
	testutil.WaitFor(t, 20*time.Second, "the fourth server to join the leader", func() bool {
		conf, err := leader.Server().Configuration()
		return err == nil && len(conf.Servers) == 4 && c.Member(3).Server().Leader() == leader.ID
	})
}
