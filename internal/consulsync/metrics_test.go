package consulsync

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/csisupd/csisupd/internal/consulsync/consultest"
	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/registry"
	"github.com/csisupd/csisupd/internal/retry"
	"github.com/csisupd/csisupd/internal/testutil"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// value is testutil.MetricValue for a series that must exist.
func value(t testing.TB, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	v, ok := testutil.MetricValue(t, reg, name, labels...)
	if !ok {
		t.Fatalf("no series %s%v", name, labels)
	}
	return v
}

// writeRoutes maps the writes counter's operations to the test agent's
// routes of the same endpoints.
var writeRoutes = map[string]string{
	opServiceRegister:   consultest.RouteServiceRegister,
	opServiceDeregister: consultest.RouteServiceDeregister,
	opCheckRegister:     consultest.RouteCheckRegister,
	opCheckUpdate:       consultest.RouteCheckUpdate,
	opCheckDeregister:   consultest.RouteCheckDeregister,
}

// writes returns the writes counter by operation.
func writes(t testing.TB, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for op := range writeRoutes {
		out[op] = value(t, reg, "csisupd_consul_sync_writes_total", "operation", op)
	}
	return out
}

// newMetricsSyncer returns a Syncer of reg's plugins talking to addr with
// its metrics in a registry of its own, and a clock the test sets.
func newMetricsSyncer(t *testing.T, plugins *registry.Registry, addr string, configure func(*Config)) (*Syncer, *prometheus.Registry, *time.Time) {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg := testConfig(plugins, addr, &logBuffer{})
	cfg.Metrics = reg
	if configure != nil {
		configure(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, cc := s.current()
		cc.close()
	})
	now := time.Unix(1_700_000_000, 0)
	s.now = func() time.Time { return now }
	s.start = now
	return s, reg, &now
}

func TestMetricsCountPassesAndWrites(t *testing.T) {
	a := newAgent(t, consultest.Config{})
	plugins := registry.New(registry.Config{})
	addPlugin(plugins, "alpha", "1.0", plugin.TypeMonolith, heartbeat.Healthy, "probe ok")
	addPlugin(plugins, "beta", "1.0", plugin.TypeNode, heartbeat.Unhealthy, "not ready")
	// A leftover csisupd service from before: deregistered once the
	// probation is over.
	op := newClient(t, a, "")
	if err := op.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: PluginServiceID("gone"), Name: "csi-plugin-gone"}); err != nil {
		t.Fatal(err)
	}
	s, reg, now := newMetricsSyncer(t, plugins, a.Addr(), func(c *Config) { c.Probation = time.Minute })
	*now = now.Add(2 * time.Minute)
	ctx := context.Background()

	a.ResetCounts()
	if err := s.syncPass(ctx); err != nil {
		t.Fatal(err)
	}
	if !synced(a, plugins) {
		t.Fatal("the pass did not sync")
	}
	// Each operation counts exactly the requests its endpoint received.
	first := writes(t, reg)
	total := 0.0
	for op, route := range writeRoutes {
		if first[op] != float64(a.Count(route)) {
			t.Errorf("writes{operation=%q} = %v, but the agent received %d %s", op, first[op], a.Count(route), route)
		}
		total += first[op]
	}
	if first[opServiceRegister] != 3 || first[opServiceDeregister] != 1 || total != float64(a.Writes()) {
		t.Errorf("first pass writes %v, agent writes %d (%v); want 3 registrations and 1 deregistration",
			first, a.Writes(), a.Counts())
	}
	if got := value(t, reg, "csisupd_consul_sync_passes_total"); got != 1 {
		t.Errorf("passes = %v after one pass, want 1", got)
	}
	if got := value(t, reg, "csisupd_consul_sync_duration_seconds"); got != 1 {
		t.Errorf("duration observations = %v, want 1", got)
	}
	if got, want := value(t, reg, "csisupd_consul_sync_last_success_timestamp_seconds"), float64(now.Unix()); got != want {
		t.Errorf("last success = %v, want the pass's time %v", got, want)
	}

	// A steady pass writes nothing and counts no write.
	a.AntiEntropy()
	*now = now.Add(time.Minute)
	a.ResetCounts()
	if err := s.syncPass(ctx); err != nil {
		t.Fatal(err)
	}
	if a.Writes() != 0 {
		t.Fatalf("the steady pass wrote: %v", a.Counts())
	}
	if second := writes(t, reg); !equalMaps(second, first) {
		t.Errorf("a steady pass counted writes: %v, before %v", second, first)
	}
	if got := value(t, reg, "csisupd_consul_sync_passes_total"); got != 2 {
		t.Errorf("passes = %v after two passes, want 2", got)
	}
	if got, want := value(t, reg, "csisupd_consul_sync_last_success_timestamp_seconds"), float64(now.Unix()); got != want {
		t.Errorf("last success = %v, want the second pass's time %v", got, want)
	}
	for _, r := range []string{reasonUnreachable, reasonForbidden, reasonRejected, reasonTimeout, reasonOther} {
		if got := value(t, reg, "csisupd_consul_sync_failures_total", "reason", r); got != 0 {
			t.Errorf("failures{reason=%q} = %v without a failure", r, got)
		}
	}
}

func equalMaps(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// hangingConsul is an HTTP server that answers no request until the
// request's context ends (the client gave up) or the test ends.
type hangingConsul struct {
	srv     *httptest.Server
	arrived chan struct{} // one value per request
	done    chan struct{}
}

func startHangingConsul(t *testing.T) *hangingConsul {
	t.Helper()
	h := &hangingConsul{arrived: make(chan struct{}, 100), done: make(chan struct{})}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case h.arrived <- struct{}{}:
		default:
		}
		select {
		case <-r.Context().Done():
		case <-h.done:
		}
	}))
	t.Cleanup(func() {
		close(h.done)
		h.srv.Close()
	})
	return h
}

func TestMetricsFailureReasons(t *testing.T) {
	const token = "good-secret-000"
	tests := []struct {
		name   string
		reason string
		// fail makes the next pass of s fail.
		fail func(t *testing.T, a *consultest.Agent, s *Syncer)
	}{
		{"consul stopped", reasonUnreachable, func(t *testing.T, a *consultest.Agent, s *Syncer) { a.Close() }},
		{"token deleted", reasonForbidden, func(t *testing.T, a *consultest.Agent, s *Syncer) { a.DeleteToken(token) }},
		{"consul answers 500", reasonRejected, func(t *testing.T, a *consultest.Agent, s *Syncer) {
			a.FailNext(consultest.RouteServices, 1, http.StatusInternalServerError)
		}},
		{"consul hangs", reasonTimeout, func(t *testing.T, a *consultest.Agent, s *Syncer) {
			cfg, _ := s.current()
			cfg.Address = startHangingConsul(t).srv.Listener.Addr().String()
			cfg.RequestTimeout = 50 * time.Millisecond
			if err := s.Reload(cfg); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAgent(t, consultest.Config{ACL: &consultest.ACL{Tokens: map[string]consultest.Policy{token: consultest.AllowAll()}}})
			plugins := registry.New(registry.Config{})
			addPlugin(plugins, "alpha", "1.0", plugin.TypeNode, heartbeat.Healthy, "ok")
			s, reg, now := newMetricsSyncer(t, plugins, a.Addr(), func(c *Config) { c.Token = token })
			ctx := context.Background()
			if err := s.syncPass(ctx); err != nil {
				t.Fatal(err)
			}
			success := value(t, reg, "csisupd_consul_sync_last_success_timestamp_seconds")
			before := writes(t, reg)

			tt.fail(t, a, s)
			*now = now.Add(time.Minute)
			if err := s.syncPass(ctx); err == nil {
				t.Fatal("the pass succeeded")
			}
			for _, r := range []string{reasonUnreachable, reasonForbidden, reasonRejected, reasonTimeout, reasonOther} {
				want := 0.0
				if r == tt.reason {
					want = 1
				}
				if got := value(t, reg, "csisupd_consul_sync_failures_total", "reason", r); got != want {
					t.Errorf("failures{reason=%q} = %v, want %v", r, got, want)
				}
			}
			if got := value(t, reg, "csisupd_consul_sync_passes_total"); got != 2 {
				t.Errorf("passes = %v, want 2 (failed passes count)", got)
			}
			if got := value(t, reg, "csisupd_consul_sync_last_success_timestamp_seconds"); got != success {
				t.Errorf("last success moved from %v to %v on a failed pass", success, got)
			}
			if after := writes(t, reg); !equalMaps(after, before) {
				t.Errorf("a failed pass counted writes: %v, before %v", after, before)
			}
		})
	}
}

func TestFailureReason(t *testing.T) {
	refused := &url.Error{Op: "Get", URL: "http://127.0.0.1:1/v1/agent/services",
		Err: &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}}
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"403", api.StatusError{Code: http.StatusForbidden, Body: "ACL not found"}, reasonForbidden},
		{"500", api.StatusError{Code: http.StatusInternalServerError, Body: "boom"}, reasonRejected},
		{"400", api.StatusError{Code: http.StatusBadRequest, Body: "bad"}, reasonRejected},
		{"deadline", &url.Error{Op: "Get", URL: "http://x", Err: context.DeadlineExceeded}, reasonTimeout},
		{"refused", refused, reasonUnreachable},
		{"eof", &url.Error{Op: "Get", URL: "http://x", Err: io.EOF}, reasonUnreachable},
		{"other", errors.New("something else"), reasonOther},
		{"op error", &OpError{Op: "list services", Err: api.StatusError{Code: http.StatusForbidden}}, reasonForbidden},
		{"a pass's first error decides", &passError{errs: []error{
			&OpError{Op: "register service", Err: refused},
			&OpError{Op: "update check", Err: api.StatusError{Code: http.StatusForbidden}},
		}}, reasonUnreachable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := failureReason(tt.err); got != tt.want {
				t.Errorf("failureReason(%v) = %q, want %q", tt.err, got, tt.want)
			}
		})
	}
}

func TestMetricsRegistrationConflict(t *testing.T) {
	reg := prometheus.NewRegistry()
	cfg := testConfig(registry.New(registry.Config{}), "127.0.0.1:1", &logBuffer{})
	cfg.Metrics = reg
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.client.close()
	if _, err := New(cfg); err == nil {
		t.Fatal("a second syncer registered the same metrics in one registry")
	}
}

// newMonitor returns a watchdog on a fake clock whose loops' tickers
// fire every 25 ms of real time.
func newMonitor(t *testing.T) (*watchdog.Monitor, *testutil.Clock) {
	t.Helper()
	clock := testutil.NewClock(time.Unix(1_700_000_000, 0))
	m, err := watchdog.New(watchdog.Config{Timeout: 100 * time.Millisecond, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return m, clock
}

func TestSyncLoopBeatsWhileWaitingOutABackoff(t *testing.T) {
	mon, clock := newMonitor(t)
	plugins := registry.New(registry.Config{})
	addPlugin(plugins, "alpha", "1.0", plugin.TypeNode, heartbeat.Healthy, "ok")
	reg := prometheus.NewRegistry()
	cfg := testConfig(plugins, testutil.FreeAddr(t), &logBuffer{}) // Consul is down
	cfg.Metrics, cfg.Watchdog = reg, mon
	// After the first failure the loop waits an hour: only its idle beats
	// can keep it alive.
	cfg.Retry = retry.Policy{Base: time.Hour, Cap: time.Hour, Multiplier: 1}
	r := start(t, cfg)

	waitFor(t, "the first pass failed", func() bool {
		v, _ := testutil.MetricValue(t, reg, "csisupd_consul_sync_failures_total", "reason", reasonUnreachable)
		return v == 1
	})
	for i := range 3 {
		clock.Advance(time.Minute) // far past the timeout: stale until the loop beats again
		waitFor(t, fmt.Sprintf("a beat after advance %d", i), func() bool { return len(mon.Stale()) == 0 })
	}
	if got := value(t, reg, "csisupd_consul_sync_passes_total"); got != 1 {
		t.Errorf("passes = %v; the beats must come from the wait, not from passes", got)
	}

	// A stopped loop is not counted as wedged.
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Hour)
	if stale := mon.Stale(); len(stale) != 0 {
		t.Errorf("stale after Run returned: %v", stale)
	}
}

func TestWedgedSyncLoopIsStale(t *testing.T) {
	mon, clock := newMonitor(t)
	consul := startHangingConsul(t)
	cfg := testConfig(registry.New(registry.Config{}), consul.srv.Listener.Addr().String(), &logBuffer{})
	cfg.Watchdog = mon
	cfg.RequestTimeout = time.Hour // the request does not end during the test
	r := start(t, cfg)

	select {
	case <-consul.arrived:
	case <-time.After(waitTimeout):
		t.Fatal("the syncer sent no request")
	}
	// The loop is blocked in the request: it cannot beat, whatever its
	// ticker does. Until the request's deadline it is busy, not wedged;
	// the idle server watch beats at its next tick.
	clock.Advance(time.Minute)
	waitFor(t, "no loop stale while the sync waits for a request within its deadline", func() bool { return len(mon.Stale()) == 0 })
	// Past the deadline (on the monitor's clock) the request is stuck.
	clock.Advance(time.Hour)
	waitFor(t, "only the sync loop stale past its request's deadline", func() bool { return slices.Equal(mon.Stale(), []string{"consul sync"}) })
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if stale := mon.Stale(); len(stale) != 0 {
		t.Errorf("stale after Run returned: %v", stale)
	}
}
