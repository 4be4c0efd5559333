package server_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/nodeclient"
	"github.com/csisupd/csisupd/internal/plugin/plugintest"
	"github.com/csisupd/csisupd/internal/retry"
	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testutil"
)

// catalogStub is a server list that changes while a client uses it, as a
// Consul catalog does when servers come and go.
type catalogStub struct {
	mu    sync.Mutex
	addrs []string
	calls int
}

func (c *catalogStub) set(addrs ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.addrs = addrs
}

func (c *catalogStub) discover(context.Context) ([]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	return slices.Clone(c.addrs), nil
}

// A node client without a fixed server list finds the servers through
// DiscoverServers: it waits while none is listed, registers once one is,
// moves to a newly listed server and drops a server that is no longer
// listed.
func TestNodeClientFollowsDiscoveredServers(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 3})
	checkFormed(t, c, 3)
	a := startFakeAgent(t, "node-a")
	catalog := &catalogStub{}
	nc, err := nodeclient.New(nodeclient.Config{
		DiscoverServers:  catalog.discover,
		DiscoverInterval: 50 * time.Millisecond,
		Node:             nodeclient.Node{ID: "node-a", Address: a.addr, Secret: testNodeSecret("node-a")},
		Plugins:          plugintest.NewSource(monolith("p1", "node-a")),
		RPCTimeout:       2 * time.Second,
		Retry:            retry.Policy{Base: 20 * time.Millisecond, Cap: 100 * time.Millisecond, Multiplier: 2, Jitter: 0.5},
		Connect:          config.DefaultRetry().ServerConnect,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = nc.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-done })

	testutil.WaitFor(t, 5*time.Second, "discovery asked again while no server is listed", func() bool {
		catalog.mu.Lock()
		defer catalog.mu.Unlock()
		return catalog.calls >= 3
	})
	if nc.Registered() {
		t.Fatal("registered with no server listed")
	}

	first, second := c.Member(0).RPCAddr, c.Member(1).RPCAddr
	catalog.set(first)
	testutil.WaitFor(t, 10*time.Second, "node registered through the listed server", func() bool {
		return nc.Registered() && slices.Equal(nc.Servers(), []string{first})
	})
	catalog.set(second)
	testutil.WaitFor(t, 10*time.Second, "the removed server dropped, the new one used", func() bool {
		return slices.Equal(nc.Servers(), []string{second})
	})
	c.Kill(0)
	leader := c.WaitForLeader(t, 30*time.Second)
	testutil.WaitFor(t, 10*time.Second, "node still ready through the new server", func() bool {
		n := leader.Server().State().Node("node-a")
		return n != nil && n.GetStatus() == state.NodeStatusReady && nc.Registered()
	})
}

func TestNodeClientNeedsServersOrDiscovery(t *testing.T) {
	_, err := nodeclient.New(nodeclient.Config{
		Node:       nodeclient.Node{ID: "n", Address: "127.0.0.1:1", Secret: testNodeSecret("n")},
		Plugins:    plugintest.NewSource(),
		RPCTimeout: time.Second, Retry: retry.Policy{Base: time.Millisecond, Cap: time.Second, Multiplier: 2, Jitter: 0.5},
		Connect: config.DefaultRetry().ServerConnect,
	}, nil)
	if err == nil || !strings.Contains(err.Error(), "client.servers is empty") {
		t.Fatalf("nodeclient.New without servers or discovery: err = %v, want the missing servers named", err)
	}
}

// Servers with no retry_join form through DiscoverServers, which lists
// every server including the asking one; bootstrap_expect alone decides.
func TestFormationThroughDiscovery(t *testing.T) {
	var catalog catalogStub
	c := testcluster.New(t, testcluster.Config{Servers: 3, Configure: func(_ int, cfg *server.Config) {
		cfg.RetryJoin = nil
		cfg.DiscoverServers = catalog.discover
	}})
	catalog.set(c.RPCAddrs()...)
	checkFormed(t, c, 3)
}
