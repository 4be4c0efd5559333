package consulsync

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/csisupd/csisupd/internal/consulsync/consultest"
	"github.com/csisupd/csisupd/internal/registry"
	"github.com/csisupd/csisupd/internal/retry"
	"github.com/csisupd/csisupd/internal/testutil"
)

// firstServers calls Servers, which starts the watch, and returns its
// first answer.
func firstServers(t *testing.T, s *Syncer) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	addrs, err := s.Servers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return addrs
}

// hammer calls Servers from several goroutines for period, as the server
// role's join loop and the node client do, and returns when they are
// done. The period is what is measured, not a synchronisation.
func hammer(s *Syncer, period time.Duration) {
	var wg sync.WaitGroup
	end := time.NewTimer(period)
	defer end.Stop()
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					_, _ = s.Servers(context.Background())
				}
			}
		})
	}
	<-end.C
	close(stop)
	wg.Wait()
}

// registerServer registers a server service in the catalog of a with
// token, as another node's syncer would.
func registerServer(t *testing.T, a *consultest.Agent, token, node, addr string, port int) {
	t.Helper()
	_, err := newClient(t, a, token).Catalog().Register(&api.CatalogRegistration{
		Node: node, Address: addr,
		Service: &api.AgentService{ID: ServerServiceID, Service: baseConfig().ServerServiceName, Port: port},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
}

// With no server in the catalog, the watch makes one blocking request per
// wait, however often Servers is called.
func TestServerWatchRequestsOncePerWait(t *testing.T) {
	a := newAgent(t, consultest.Config{ManualChecks: true})
	reg := registry.New(registry.Config{})
	cfg := testConfig(reg, a.Addr(), &logBuffer{})
	const wait, window = 2 * time.Second, 10 * time.Second
	cfg.DiscoveryWait = wait
	r := start(t, cfg)
	waitFor(t, "first sync", func() bool { return synced(a, reg) })
	if got := firstServers(t, r.s); len(got) != 0 {
		t.Fatalf("Servers = %v with no server registered", got)
	}
	a.ResetCounts()

	hammer(r.s, window)
	got := a.Count(consultest.RouteCatalogService)
	if limit := int(window/wait) + 1; got > limit {
		t.Errorf("the watch made %d catalog requests in 10s with a wait of %s, want at most %d", got, wait, limit)
	}
	if got < 2 {
		t.Errorf("the watch made %d catalog requests in 10s with a wait of %s: it does not renew its query", got, wait)
	}
}

// A server registered in the catalog wakes the watch's blocking query at
// once: Servers lists it long before the wait would have passed.
func TestServerWatchWakesOnRegistration(t *testing.T) {
	cat := consultest.NewCatalog()
	a := newAgent(t, consultest.Config{NodeName: "node-1", Catalog: cat, ManualChecks: true})
	other := newAgent(t, consultest.Config{NodeName: "node-2", NodeAddress: "127.0.0.2", Catalog: cat, ManualChecks: true})
	reg := registry.New(registry.Config{})
	cfg := testConfig(reg, a.Addr(), &logBuffer{})
	cfg.DiscoveryWait = 10 * time.Minute // far beyond the test's deadline
	r := start(t, cfg)
	waitFor(t, "first sync", func() bool { return synced(a, reg) })
	if got := firstServers(t, r.s); len(got) != 0 {
		t.Fatalf("Servers = %v with no server registered", got)
	}
	waitFor(t, "the blocking query", func() bool { return a.Count(consultest.RouteCatalogService) >= 2 })
	before := a.Count(consultest.RouteCatalogService)

	registerServer(t, other, "", "node-2", "127.0.0.2", 4780)
	want := []string{"127.0.0.2:4780"}
	waitFor(t, "Servers to list the new server", func() bool {
		got, err := r.s.Servers(context.Background())
		return err == nil && slices.Equal(got, want)
	})
	// The query woken, then one new blocking query: no polling.
	if got := a.Count(consultest.RouteCatalogService) - before; got > 1 {
		t.Errorf("%d catalog requests after the registration, want at most 1: the next blocking query", got)
	}
}

// Failed requests (Consul answers 500, or nothing listens) back off with
// a jittered exponential wait: the requests of a window are bounded by the
// policy, and the waits are not the bare intervals.
func TestServerWatchBacksOffOnErrors(t *testing.T) {
	policy := retry.Policy{Base: 100 * time.Millisecond, Cap: 400 * time.Millisecond, Multiplier: 2, Jitter: 0.5}
	const window = 2 * time.Second
	// The shortest waits are 50ms, 100ms, then 200ms: in 2s at most 11
	// requests, the first included.
	const limit = 11
	bareIntervals := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond}

	check := func(t *testing.T, requests int, logs *logBuffer) {
		t.Helper()
		if requests > limit || requests < 2 {
			t.Errorf("%d catalog requests in %s, want 2 to %d with policy %s", requests, window, limit, policy)
		}
		waits := retryWaitsOf(t, logs, "consul server watch")
		if len(waits) < 2 {
			t.Fatalf("logged retry waits %v, want several", waits)
		}
		jittered := false
		for i, d := range waits {
			bare := bareIntervals[min(i, len(bareIntervals)-1)]
			if d < bare/2 || d > bare*3/2 {
				t.Errorf("retry wait %d is %s, outside %s±50%%", i, d, bare)
			}
			jittered = jittered || d != bare
		}
		if !jittered {
			t.Errorf("retry waits %v are the bare intervals: no jitter", waits)
		}
	}

	t.Run("500", func(t *testing.T) {
		a := newAgent(t, consultest.Config{ManualChecks: true})
		a.FailNext(consultest.RouteCatalogService, 1000, http.StatusInternalServerError)
		logs := &logBuffer{}
		cfg := testConfig(registry.New(registry.Config{}), a.Addr(), logs)
		cfg.Retry, cfg.DiscoveryMinInterval = policy, time.Millisecond
		r := start(t, cfg)
		ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
		defer cancel()
		if _, err := r.s.Servers(ctx); err == nil || !strings.Contains(err.Error(), "500") {
			t.Fatalf("Servers = %v, want the 500 before any answer", err)
		}
		hammer(r.s, window)
		check(t, a.Count(consultest.RouteCatalogService), logs)

		// Once Consul answers, the watch recovers and lists the servers.
		a.FailNext(consultest.RouteCatalogService, 0, 0)
		registerServer(t, a, "", "node-9", "127.0.0.9", 4780)
		waitFor(t, "recovery", func() bool {
			got, err := r.s.Servers(context.Background())
			return err == nil && slices.Equal(got, []string{"127.0.0.9:4780"})
		})
		if !strings.Contains(logs.String(), "consul server watch recovered") {
			t.Error("the recovery was not logged")
		}
	})
	t.Run("connection refused", func(t *testing.T) {
		logs := &logBuffer{}
		cfg := testConfig(registry.New(registry.Config{}), testutil.FreeAddr(t), logs)
		cfg.Retry, cfg.DiscoveryMinInterval = policy, time.Millisecond
		r := start(t, cfg)
		firstFailure := func() bool { return strings.Contains(logs.String(), "consul server watch failed") }
		_, _ = r.s.Servers(context.Background())
		waitFor(t, "the first failure", firstFailure)
		hammer(r.s, window)
		// Every failed request logs one line.
		check(t, len(retryWaitsOf(t, logs, "consul server watch")), logs)
	})
}

// A sync pass costs exactly two GETs with the watch running; the watch
// adds at most one request per wait.
func TestSyncPassesWithTheWatchRunning(t *testing.T) {
	a := newAgent(t, consultest.Config{ManualChecks: true})
	reg := registry.New(registry.Config{})
	cfg := testConfig(reg, a.Addr(), &logBuffer{})
	metrics := prometheus.NewRegistry()
	cfg.Metrics = metrics
	cfg.SyncInterval = 50 * time.Millisecond
	const wait, window = time.Second, 3 * time.Second
	cfg.DiscoveryWait = wait
	r := start(t, cfg)
	waitFor(t, "first sync", func() bool { return synced(a, reg) })
	firstServers(t, r.s)
	a.ResetCounts()
	passes0 := value(t, metrics, "csisupd_consul_sync_passes_total")

	timer := time.NewTimer(window)
	<-timer.C // the measurement period, not a synchronisation
	var counts map[string]int
	var passes float64
	// Between two passes (not in the middle of one) every pass made
	// exactly its two GETs.
	waitFor(t, "a moment between passes", func() bool {
		counts = a.Counts()
		passes = value(t, metrics, "csisupd_consul_sync_passes_total") - passes0
		return float64(counts[consultest.RouteServices]) == passes && float64(counts[consultest.RouteChecks]) == passes
	})
	if passes < 10 {
		t.Fatalf("%v passes in %s with a sync interval of %s", passes, window, cfg.SyncInterval)
	}
	watch := counts[consultest.RouteCatalogService]
	if limit := int(window/wait) + 1; watch > limit {
		t.Errorf("the watch made %d requests in %s with a wait of %s, want at most %d", watch, window, wait, limit)
	}
	delete(counts, consultest.RouteServices)
	delete(counts, consultest.RouteChecks)
	delete(counts, consultest.RouteCatalogService)
	if len(counts) != 0 {
		t.Errorf("other requests %v: a steady-state pass makes two GETs and no writes", counts)
	}
}

// Reload restarts the watch with the new address and token at once,
// without waiting for the blocking query to the old Consul to end.
func TestServerWatchRestartsOnReload(t *testing.T) {
	a := newAgent(t, consultest.Config{ManualChecks: true})
	registerServer(t, a, "", "node-a", "127.0.0.10", 4780)
	b := newAgent(t, consultest.Config{ACL: &consultest.ACL{Tokens: map[string]consultest.Policy{"token-b": consultest.AllowAll()}}})
	registerServer(t, b, "token-b", "node-b", "127.0.0.11", 4780)

	reg := registry.New(registry.Config{})
	cfg := testConfig(reg, a.Addr(), &logBuffer{})
	cfg.DiscoveryWait = 10 * time.Minute
	r := start(t, cfg)
	if got := firstServers(t, r.s); !slices.Equal(got, []string{"127.0.0.10:4780"}) {
		t.Fatalf("Servers = %v, want the server of Consul a", got)
	}
	waitFor(t, "the blocking query to a", func() bool { return a.Count(consultest.RouteCatalogService) >= 2 })

	next := cfg
	next.Address, next.Token = b.Addr(), "token-b"
	if err := r.s.Reload(next); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "Servers from Consul b", func() bool {
		got, err := r.s.Servers(context.Background())
		return err == nil && slices.Equal(got, []string{"127.0.0.11:4780"})
	})
	if n := b.TokensSeen()["token-b"]; n == 0 {
		t.Error("Consul b saw no request with the new token")
	}
}

// A Consul whose index went backwards (here: another catalog behind the
// same address) makes the watch start again from index 0, as Consul's
// documentation of blocking queries asks, rather than wait for the new
// catalog's index to pass the old one.
func TestServerWatchResetsAnIndexThatWentBackwards(t *testing.T) {
	addr := testutil.FreeAddr(t)
	a := newAgent(t, consultest.Config{Addr: addr, ManualChecks: true})
	op := newClient(t, a, "")
	for i := range 50 { // move the old catalog's index far ahead
		if err := op.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: fmt.Sprint("x-", i), Name: "x"}); err != nil {
			t.Fatal(err)
		}
	}
	registerServer(t, a, "", "node-a", "127.0.0.10", 4780)

	logs := &logBuffer{}
	cfg := testConfig(registry.New(registry.Config{}), addr, logs)
	cfg.DiscoveryWait = time.Second // the first query to the new catalog blocks this long
	r := start(t, cfg)
	if got := firstServers(t, r.s); !slices.Equal(got, []string{"127.0.0.10:4780"}) {
		t.Fatalf("Servers = %v, want the server of the first catalog", got)
	}
	a.Close()
	b := newAgent(t, consultest.Config{Addr: addr, ManualChecks: true})
	registerServer(t, b, "", "node-b", "127.0.0.11", 4780)
	waitFor(t, "Servers from the new catalog", func() bool {
		got, err := r.s.Servers(context.Background())
		return err == nil && slices.Equal(got, []string{"127.0.0.11:4780"})
	})
	waitFor(t, "the index reset", func() bool { return strings.Contains(logs.String(), "consul server watch: index reset") })
}

// The watch's loop beats while its blocking query is out, which may be
// far longer than the watchdog's timeout, and stops counting when Run
// returns.
func TestServerWatchBeatsWhileItsQueryBlocks(t *testing.T) {
	mon, clock := newMonitor(t)
	a := newAgent(t, consultest.Config{ManualChecks: true})
	reg := registry.New(registry.Config{})
	cfg := testConfig(reg, a.Addr(), &logBuffer{})
	cfg.Watchdog, cfg.DiscoveryWait = mon, 10*time.Minute
	r := start(t, cfg)
	firstServers(t, r.s)
	waitFor(t, "the blocking query", func() bool { return a.Count(consultest.RouteCatalogService) >= 2 })
	for i := range 3 {
		clock.Advance(time.Minute) // far past the timeout: stale until the loops beat again
		waitFor(t, fmt.Sprintf("beats after advance %d", i), func() bool { return len(mon.Stale()) == 0 })
	}
	if got := a.Count(consultest.RouteCatalogService); got > 3 {
		t.Errorf("%d catalog requests: the beats must not come from new requests", got)
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Hour)
	if stale := mon.Stale(); len(stale) != 0 {
		t.Errorf("stale after Run returned: %v", stale)
	}
}
