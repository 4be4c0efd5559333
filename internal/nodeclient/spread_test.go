package nodeclient_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/nodeclient"
	"github.com/csisupd/csisupd/internal/plugin/plugintest"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testutil"
)

// arrivals records when each node's first successful registration reached
// a server.
type arrivals struct {
	mu    sync.Mutex
	first map[string]time.Time
}

func (a *arrivals) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	reg, ok := req.(*csisupdv1.NodeRegisterRequest)
	if !ok {
		return handler(ctx, req)
	}
	at := time.Now()
	resp, err := handler(ctx, req)
	if err == nil {
		a.mu.Lock()
		if _, seen := a.first[reg.GetNodeId()]; !seen {
			a.first[reg.GetNodeId()] = at
		}
		a.mu.Unlock()
	}
	return resp, err
}

func (a *arrivals) times() []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]time.Time, 0, len(a.first))
	for _, at := range a.first {
		out = append(out, at)
	}
	slices.SortFunc(out, func(x, y time.Time) int { return x.Compare(y) })
	return out
}

// busiest returns the most arrivals within any window of length w.
func busiest(times []time.Time, w time.Duration) int {
	most, j := 0, 0
	for i := range times {
		for times[i].Sub(times[j]) >= w {
			j++
		}
		most = max(most, i-j+1)
	}
	return most
}

// TestRegistrationsSpreadAfterServerRestart starts 200 node clients while
// their server restarts, so that all of them fail their first call in the
// same instant (a rack powered on with its server, or agents restarted
// with it). With the default node client policy, their retries are
// jittered, so when the server is back their registrations reach it
// spread over the jitter window instead of in one burst. Without jitter
// every client waits the same 0.5 s, 1 s, 2 s..., and all 200 arrive
// within a few milliseconds of each other.
func TestRegistrationsSpreadAfterServerRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 200 node clients")
	}
	const agents = 200
	rec := &arrivals{first: map[string]time.Time{}}
	c := testcluster.New(t, testcluster.Config{Servers: 1, ServerOptions: func(int) []grpc.ServerOption {
		return []grpc.ServerOption{grpc.ChainUnaryInterceptor(rec.intercept)}
	}})
	c.WaitForLeader(t, 20*time.Second)
	c.Stop(0)

	var logs testutil.SyncBuffer
	logger := hclog.New(&hclog.LoggerOptions{Level: hclog.Warn, Output: &logs})
	policy := config.DefaultRetry().NodeClient
	clients := make([]*nodeclient.Client, agents)
	for i := range clients {
		id := fmt.Sprintf("node-%03d", i)
		cl, err := nodeclient.New(nodeclient.Config{
			Servers:    c.RPCAddrs(),
			Node:       nodeclient.Node{ID: id, Address: fmt.Sprintf("127.0.0.1:%d", 10000+i), Secret: "secret-of-" + id},
			Plugins:    plugintest.NewSource(&csisupdv1.Plugin{Id: "p", Type: "node", Healthy: true, HealthState: "healthy"}),
			RPCTimeout: 5 * time.Second,
			Retry:      policy,
			Connect:    config.DefaultRetry().ServerConnect,
		}, logger.With("node", id))
		if err != nil {
			t.Fatal(err)
		}
		clients[i] = cl
	}
	for _, cl := range clients {
		run(t, cl)
	}
	testutil.WaitFor(t, 30*time.Second, "every client to fail its first registration", func() bool {
		failed := 0
		for i := range agents {
			if strings.Contains(logs.String(), fmt.Sprintf("node=node-%03d", i)) {
				failed++
			}
		}
		return failed == agents
	})

	c.Restart(0)
	testutil.WaitFor(t, 60*time.Second, "every client registered again", func() bool {
		for _, cl := range clients {
			if !cl.Registered() {
				return false
			}
		}
		return true
	})
	times := rec.times()
	if len(times) != agents {
		t.Fatalf("%d registrations recorded, want %d", len(times), agents)
	}
	const window = 100 * time.Millisecond
	most := busiest(times, window)
	spread := times[len(times)-1].Sub(times[0])
	t.Logf("%d registrations over %s; at most %d within %s (policy %s)", agents, spread, most, window, policy)
	if most > agents/2 {
		t.Errorf("%d of %d registrations arrived within %s: the retries are not spread (policy %s)", most, agents, window, policy)
	}
}
