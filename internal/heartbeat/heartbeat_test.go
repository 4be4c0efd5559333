package heartbeat

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-test/v5/driver"
	"go.uber.org/goleak"
	"go.uber.org/mock/gomock"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// anyArg matches any context or request.
var anyArg = gomock.Any()

func TestClassify(t *testing.T) {
	cases := []struct {
		name      string
		resp      *csi.ProbeResponse
		err       error
		wantState State
		wantDesc  string
	}{
		{name: "nil response", wantState: Healthy, wantDesc: "healthy"},
		{name: "ready absent", resp: &csi.ProbeResponse{}, wantState: Healthy, wantDesc: "healthy"},
		{name: "ready true", resp: &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, wantState: Healthy, wantDesc: "healthy"},
		{name: "ready false", resp: &csi.ProbeResponse{Ready: wrapperspb.Bool(false)}, wantState: Unhealthy, wantDesc: "plugin reports not ready"},
		{
			name:      "deadline exceeded",
			err:       status.Error(codes.DeadlineExceeded, "context deadline exceeded"),
			wantState: Unhealthy, wantDesc: "probe timed out after 3s",
		},
		{
			name:      "bare context deadline",
			err:       context.DeadlineExceeded,
			wantState: Unhealthy, wantDesc: "probe timed out after 3s",
		},
		{
			name:      "unavailable",
			err:       status.Error(codes.Unavailable, "connection refused"),
			wantState: Unhealthy, wantDesc: "plugin unreachable: connection refused",
		},
		{
			name:      "internal",
			err:       status.Error(codes.Internal, "disk on fire"),
			wantState: Unhealthy, wantDesc: "probe failed: Internal: disk on fire",
		},
		{
			name:      "failed precondition",
			err:       status.Error(codes.FailedPrecondition, "not configured"),
			wantState: Unhealthy, wantDesc: "probe failed: FailedPrecondition: not configured",
		},
		{
			name:      "error wins over a response",
			resp:      &csi.ProbeResponse{Ready: wrapperspb.Bool(true)},
			err:       status.Error(codes.Internal, "x"),
			wantState: Unhealthy, wantDesc: "probe failed: Internal: x",
		},
		{
			name:      "plain error",
			err:       errors.New("oops"),
			wantState: Unhealthy, wantDesc: "probe failed: Unknown: oops",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			state, desc := Classify(tc.resp, tc.err, 3*time.Second)
			if state != tc.wantState || desc != tc.wantDesc {
				t.Fatalf("Classify = (%s, %q), want (%s, %q)", state, desc, tc.wantState, tc.wantDesc)
			}
		})
	}
}

// fakeIdentity returns a client that is never called; validation tests
// need a non-nil Identity.
func fakeIdentity(t *testing.T) csi.IdentityClient {
	t.Helper()
	c, err := csiclient.New(csiclient.Config{Socket: "unused.sock", Redial: config.DefaultRetry().PluginRedial})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.Identity
}

func TestNewValidation(t *testing.T) {
	id := fakeIdentity(t)
	onProbe := func(Result) {}
	valid := func() Config {
		return Config{Identity: id, Timing: fixed(time.Second, time.Second), OnProbe: onProbe}
	}
	cases := []struct {
		name    string
		change  func(c *Config)
		wantErr []string
	}{
		{name: "valid", change: func(*Config) {}},
		{name: "timeout below interval", change: func(c *Config) { c.Timing = fixed(time.Second, time.Millisecond) }},
		{name: "no identity", change: func(c *Config) { c.Identity = nil }, wantErr: []string{"Identity is required"}},
		{name: "no timing", change: func(c *Config) { c.Timing = nil }, wantErr: []string{"Timing is required"}},
		{name: "zero interval", change: func(c *Config) { c.Timing = fixed(0, 0) }, wantErr: []string{"probe interval must be positive, got 0s"}},
		{name: "negative interval", change: func(c *Config) { c.Timing = fixed(-time.Second, time.Second) }, wantErr: []string{"probe interval must be positive, got -1s"}},
		{name: "zero timeout", change: func(c *Config) { c.Timing = fixed(time.Second, 0) }, wantErr: []string{"probe timeout must be in (0, interval 1s], got 0s"}},
		{name: "timeout above interval", change: func(c *Config) { c.Timing = fixed(time.Second, 2*time.Second) }, wantErr: []string{"probe timeout must be in (0, interval 1s], got 2s"}},
		{name: "no OnProbe", change: func(c *Config) { c.OnProbe = nil }, wantErr: []string{"OnProbe is required"}},
		{
			name:    "all errors reported together",
			change:  func(c *Config) { *c = Config{} },
			wantErr: []string{"Identity is required", "Timing is required", "OnProbe is required"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := valid()
			tc.change(&cfg)
			m, err := New(cfg)
			if len(tc.wantErr) == 0 {
				if err != nil || m == nil {
					t.Fatalf("New = %v, %v", m, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("New succeeded, want errors %q", tc.wantErr)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("New error %q does not contain %q", err, want)
				}
			}
		})
	}
}

func TestHealthApply(t *testing.T) {
	t0 := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	steps := []struct {
		r          Result
		transition bool
		since      time.Time
	}{
		{Result{State: Healthy, Description: "healthy", At: at(1)}, true, at(1)},
		{Result{State: Healthy, Description: "healthy", At: at(2)}, false, at(1)},
		{Result{State: Healthy, Description: "healthy, but slow", At: at(3)}, false, at(1)}, // a new description is no transition
		{Result{State: Unhealthy, Description: "plugin unreachable", At: at(4)}, true, at(4)},
		{Result{State: Unhealthy, Description: "plugin unreachable", At: at(5)}, false, at(4)},
		{Result{State: Healthy, Description: "healthy", At: at(6)}, true, at(6)},
	}
	h := Health{State: Unknown, Since: t0}
	for i, st := range steps {
		var transition bool
		h, transition = h.Apply(st.r)
		want := Health{State: st.r.State, Description: st.r.Description, Since: st.since, LastProbe: st.r.At}
		if h != want || transition != st.transition {
			t.Errorf("step %d: Apply(%+v) = %+v, %v; want %+v, %v", i, st.r, h, transition, want, st.transition)
		}
	}
}

func TestValidateTiming(t *testing.T) {
	cases := []struct {
		interval, timeout time.Duration
		wantErr           bool
	}{
		{interval: 10 * time.Second, timeout: 2 * time.Second},
		{interval: time.Second, timeout: time.Second},
		{interval: 0, timeout: time.Second, wantErr: true},
		{interval: -time.Second, timeout: time.Second, wantErr: true},
		{interval: time.Second, timeout: 0, wantErr: true},
		{interval: time.Second, timeout: -time.Second, wantErr: true},
		{interval: time.Second, timeout: 2 * time.Second, wantErr: true},
	}
	for _, tc := range cases {
		err := ValidateTiming(tc.interval, tc.timeout)
		if (err != nil) != tc.wantErr {
			t.Errorf("ValidateTiming(%s, %s) = %v, want error %v", tc.interval, tc.timeout, err, tc.wantErr)
		}
	}
}

// fixed is a Config.Timing that always returns interval and timeout.
func fixed(interval, timeout time.Duration) func() (time.Duration, time.Duration) {
	return func() (time.Duration, time.Duration) { return interval, timeout }
}

// changeable is a Config.Timing whose values a test changes, as a reload
// does.
type changeable struct {
	mu                sync.Mutex
	interval, timeout time.Duration
}

func (c *changeable) timing() (time.Duration, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.interval, c.timeout
}

func (c *changeable) set(interval, timeout time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.interval, c.timeout = interval, timeout
}

func TestProbeNowNeverBlocks(t *testing.T) {
	m, err := New(Config{Identity: fakeIdentity(t), Timing: fixed(time.Second, time.Second), OnProbe: func(Result) {}})
	if err != nil {
		t.Fatal(err)
	}
	// Nobody runs the monitor: the kicks must coalesce, not block.
	for range 100 {
		m.ProbeNow()
	}
}

// plugin is a gomock CSI Identity service served on a unix socket that can
// be stopped and started again on the same path.
type plugin struct {
	t        *testing.T
	socket   string
	identity *driver.MockIdentityServer
	drv      *driver.CSIDriver
}

func newPlugin(t *testing.T) *plugin {
	t.Helper()
	dir, err := os.MkdirTemp("", "csi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := &plugin{
		t:        t,
		socket:   filepath.Join(dir, "csi.sock"),
		identity: driver.NewMockIdentityServer(gomock.NewController(t)),
	}
	t.Cleanup(p.stop)
	return p
}

// start serves the identity mock on the plugin's socket.
func (p *plugin) start() {
	p.t.Helper()
	l, err := net.Listen("unix", p.socket)
	if err != nil {
		p.t.Fatalf("listen on %s: %v", p.socket, err)
	}
	// The generated mock cannot implement the CSI interface's unexported
	// guard method; pair it with csi.UnsafeIdentityServer as csi-test does.
	p.drv = driver.NewCSIDriver(&driver.CSIDriverServers{Identity: struct {
		csi.UnsafeIdentityServer
		*driver.MockIdentityServer
	}{MockIdentityServer: p.identity}})
	if err := p.drv.Start(l); err != nil {
		p.t.Fatalf("start mock driver on %s: %v", p.socket, err)
	}
}

// stop stops serving; the socket file goes away with the listener.
func (p *plugin) stop() {
	if p.drv != nil {
		p.drv.Stop()
		p.drv = nil
	}
}

// client returns a real client for the plugin's socket.
func (p *plugin) client() *csiclient.Client {
	return p.watchedClient(nil)
}

// watchedClient is client with csiclient's OnDisconnect set.
func (p *plugin) watchedClient(onDisconnect func()) *csiclient.Client {
	p.t.Helper()
	c, err := csiclient.New(csiclient.Config{Socket: p.socket, MaxBackoff: 50 * time.Millisecond, OnDisconnect: onDisconnect, Redial: config.DefaultRetry().PluginRedial})
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { c.Close() })
	return c
}

// probeResult is one OnProbe call: the health after it, as an owner
// applying the result would hold it, and whether it was a transition.
type probeResult struct {
	health     Health
	transition bool
}

// runner runs m until ctx ends. The returned channel is closed when it
// stopped.
type runner func(ctx context.Context, m *Monitor) <-chan struct{}

// forEachRunner runs test with each way of running a monitor: Run on a
// goroutine of its own, and a Scheduler's Start.
func forEachRunner(t *testing.T, test func(t *testing.T, run runner)) {
	t.Run("Run", func(t *testing.T) {
		test(t, func(ctx context.Context, m *Monitor) <-chan struct{} {
			done := make(chan struct{})
			go func() {
				defer close(done)
				m.Run(ctx)
			}()
			return done
		})
	})
	t.Run("Scheduler", func(t *testing.T) {
		test(t, NewScheduler(SchedulerConfig{}).Start)
	})
}

// recorder collects OnProbe calls and applies them to one Health, as the
// monitor's owner does. run runs its monitor.
type recorder struct {
	run     runner
	mu      sync.Mutex
	current Health
	results []probeResult
}

func (r *recorder) onProbe(res Result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.current.State == "" {
		r.current.State = Unknown
	}
	var transition bool
	r.current, transition = r.current.Apply(res)
	r.results = append(r.results, probeResult{r.current, transition})
}

// health returns the health the recorded results add up to.
func (r *recorder) health() Health {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.current
}

func (r *recorder) all() []probeResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]probeResult(nil), r.results...)
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.results)
}

// start creates a monitor with cfg (OnProbe set to the recorder) and runs
// it until the end of the test, checking that Run returns on cancel.
func (r *recorder) start(t *testing.T, cfg Config) *Monitor {
	t.Helper()
	cfg.OnProbe = r.onProbe
	m, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := r.run(ctx, m)
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("the monitor did not stop within 10s of cancel")
		}
	})
	return m
}

// waitForState waits for an OnProbe call reporting state and returns the
// first such call at or after index from.
func (r *recorder) waitForState(t *testing.T, from int, state State) probeResult {
	t.Helper()
	var got probeResult
	testutil.WaitFor(t, 5*time.Second, "an OnProbe with state "+string(state), func() bool {
		all := r.all()
		for i := from; i < len(all); i++ {
			if all[i].health.State == state {
				got = all[i]
				return true
			}
		}
		return false
	})
	return got
}

func ready(v bool) *csi.ProbeResponse {
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(v)}
}

func TestFirstProbeAtOnce(t *testing.T) {
	forEachRunner(t, func(t *testing.T, run runner) {
		p := newPlugin(t)
		p.identity.EXPECT().Probe(anyArg, anyArg).Return(ready(true), nil).AnyTimes()
		p.start()
		c := p.client()

		r := recorder{run: run}
		// With a one-hour interval, any probe seen here is the first one.
		r.start(t, Config{Identity: c.Identity, Timing: fixed(time.Hour, 5*time.Second)})
		first := r.waitForState(t, 0, Healthy)
		all := r.all()
		if !all[0].transition {
			t.Errorf("first probe was not reported as a transition: %+v", all[0])
		}
		if first.health.Description != "healthy" {
			t.Errorf("description = %q, want healthy", first.health.Description)
		}
		if first.health.LastProbe.IsZero() || first.health.Since.IsZero() {
			t.Errorf("first probe left times unset: %+v", first.health)
		}
		if got := r.health(); got.State != Healthy {
			t.Errorf("health = %+v after a healthy probe", got)
		}
	})
}

func TestTransitionsOnlyOnStateChange(t *testing.T) {
	forEachRunner(t, func(t *testing.T, run runner) {
		p := newPlugin(t)
		// Probe answers follow a script: healthy, then not ready, then healthy
		// for good.
		script := []*csi.ProbeResponse{
			ready(true), {}, ready(true),
			ready(false), ready(false), ready(false),
		}
		var calls atomic.Int32
		p.identity.EXPECT().Probe(anyArg, anyArg).DoAndReturn(
			func(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
				i := int(calls.Add(1)) - 1
				if i < len(script) {
					return script[i], nil
				}
				return ready(true), nil
			}).AnyTimes()
		p.start()
		c := p.client()

		r := recorder{run: run}
		// No Conn: probes come from the interval alone, and the monitor must
		// work without a connection to watch.
		r.start(t, Config{Identity: c.Identity, Timing: fixed(100*time.Millisecond, 100*time.Millisecond)})
		const probes = 9
		testutil.WaitFor(t, 15*time.Second, "9 probes", func() bool { return r.count() >= probes })

		all := r.all()[:probes]
		var transitions []State
		prev := Unknown
		var since time.Time
		for i, res := range all {
			changed := res.health.State != prev
			if res.transition != changed {
				t.Errorf("probe %d: transition=%v but state went %s -> %s", i, res.transition, prev, res.health.State)
			}
			if res.transition {
				transitions = append(transitions, res.health.State)
				since = res.health.Since
			} else if !res.health.Since.Equal(since) {
				t.Errorf("probe %d: Since moved to %s without a transition (was %s)", i, res.health.Since, since)
			}
			prev = res.health.State
		}
		want := []State{Healthy, Unhealthy, Healthy}
		if len(transitions) != len(want) || transitions[0] != want[0] || transitions[1] != want[1] || transitions[2] != want[2] {
			t.Fatalf("transitions = %v, want %v; probes: %+v", transitions, want, all)
		}
		if d := all[3].health.Description; d != "plugin reports not ready" {
			t.Errorf("not-ready probe description = %q", d)
		}
	})
}

func TestHangingProbeTimesOut(t *testing.T) {
	forEachRunner(t, func(t *testing.T, run runner) {
		p := newPlugin(t)
		p.identity.EXPECT().Probe(anyArg, anyArg).DoAndReturn(
			func(ctx context.Context, _ *csi.ProbeRequest) (*csi.ProbeResponse, error) {
				<-ctx.Done()
				return nil, ctx.Err()
			}).AnyTimes()
		p.start()
		c := p.client()

		r := recorder{run: run}
		r.start(t, Config{Identity: c.Identity, Timing: fixed(time.Hour, 100*time.Millisecond)})
		got := r.waitForState(t, 0, Unhealthy)
		if want := "probe timed out after 100ms"; got.health.Description != want {
			t.Fatalf("description = %q, want %q", got.health.Description, want)
		}
	})
}

func TestConnectionLossAndRecovery(t *testing.T) {
	forEachRunner(t, func(t *testing.T, run runner) {
		p := newPlugin(t)
		p.identity.EXPECT().Probe(anyArg, anyArg).Return(ready(true), nil).AnyTimes()
		p.start()

		// The monitor is wired to the connection as the supervisor wires it:
		// a broken connection asks for a probe at once.
		var m *Monitor
		var mu sync.Mutex
		c := p.watchedClient(func() {
			mu.Lock()
			defer mu.Unlock()
			if m != nil {
				m.ProbeNow()
			}
		})

		r := recorder{run: run}
		// The interval is far longer than the test: every probe after the first
		// comes from the disconnect notice or from ProbeNow.
		mu.Lock()
		m = r.start(t, Config{Identity: csi.NewIdentityClient(c.Supervision()), Timing: fixed(time.Hour, 5*time.Second)})
		mu.Unlock()
		r.waitForState(t, 0, Healthy)

		p.stop()
		lost := r.waitForState(t, 0, Unhealthy)
		if !lost.transition {
			t.Errorf("loss was not reported as a transition: %+v", lost)
		}
		if !strings.HasPrefix(lost.health.Description, "plugin unreachable: ") {
			t.Errorf("loss description = %q, want it to start with %q", lost.health.Description, "plugin unreachable: ")
		}

		// The plugin comes back on the same path, with the same client; the next
		// probe (asked for here, as the supervisor's restart would) finds it.
		from := r.count()
		p.start()
		testutil.WaitFor(t, 5*time.Second, "a healthy probe after the plugin came back", func() bool {
			for _, res := range r.all()[from:] {
				if res.health.State == Healthy {
					return true
				}
			}
			m.ProbeNow()
			return false
		})
		back := r.waitForState(t, from, Healthy)
		if !back.transition {
			t.Errorf("recovery was not reported as a transition: %+v", back)
		}
		if got := r.health(); got.State != Healthy || got.Since.Before(lost.health.Since) {
			t.Errorf("health after recovery = %+v", got)
		}
	})
}

func TestProbeNowAndTimingChangesTriggerProbes(t *testing.T) {
	forEachRunner(t, func(t *testing.T, run runner) {
		p := newPlugin(t)
		p.identity.EXPECT().Probe(anyArg, anyArg).Return(ready(true), nil).AnyTimes()
		p.start()
		c := p.client()

		r := recorder{run: run}
		tm := &changeable{interval: time.Hour, timeout: 5 * time.Second}
		m := r.start(t, Config{Identity: c.Identity, Timing: tm.timing})
		testutil.WaitFor(t, 5*time.Second, "the first probe", func() bool { return r.count() >= 1 })

		m.ProbeNow()
		testutil.WaitFor(t, 5*time.Second, "a probe after ProbeNow", func() bool { return r.count() >= 2 })

		// A shorter interval, with the owner's ProbeNow, takes effect at once,
		// not after the hour.
		tm.set(50*time.Millisecond, 50*time.Millisecond)
		m.ProbeNow()
		testutil.WaitFor(t, 10*time.Second, "probes at the new interval", func() bool { return r.count() >= 6 })
		for i, res := range r.all() {
			if i > 0 && res.transition {
				t.Errorf("probe %d of a steady plugin reported a transition: %+v", i, res)
			}
		}
	})
}

func TestCancelDuringProbeReportsNothing(t *testing.T) {
	forEachRunner(t, func(t *testing.T, run runner) {
		p := newPlugin(t)
		entered := make(chan struct{}, 1)
		p.identity.EXPECT().Probe(anyArg, anyArg).DoAndReturn(
			func(ctx context.Context, _ *csi.ProbeRequest) (*csi.ProbeResponse, error) {
				select {
				case entered <- struct{}{}:
				default:
				}
				<-ctx.Done()
				return nil, ctx.Err()
			}).AnyTimes()
		p.start()
		c := p.client()

		r := recorder{run: run}
		m, err := New(Config{Identity: c.Identity, Timing: fixed(time.Hour, time.Hour), OnProbe: r.onProbe})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := run(ctx, m)

		select {
		case <-entered:
		case <-time.After(5 * time.Second):
			t.Fatal("the first probe did not reach the plugin")
		}
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("the monitor did not stop after cancel while a probe was in flight")
		}
		if n := r.count(); n != 0 {
			t.Fatalf("OnProbe called %d times for a probe cut short by shutdown: %+v", n, r.all())
		}
	})
}

// probeTimes records when each probe reached the plugin.
type probeTimes struct {
	mu    sync.Mutex
	times []time.Time
}

func (p *probeTimes) add() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.times = append(p.times, time.Now())
}

func (p *probeTimes) all() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.times...)
}

func TestPaceDecidesTheNextProbe(t *testing.T) {
	forEachRunner(t, func(t *testing.T, run runner) {
		cases := []struct {
			name     string
			interval time.Duration
			pace     Pace
			// kick makes the plugin call ProbeNow during every probe, as a
			// connection broken by the failing probe does.
			kick     bool
			wantDesc string
			// The gap between the first two probes is at least minGap and below
			// maxGap.
			minGap, maxGap time.Duration
		}{
			// Intervals, and so probe timeouts, of a quarter second at least:
			// a busy machine may hold a probe of the in-process plugin for
			// tens of milliseconds, which must not turn the plugin's Internal
			// into DeadlineExceeded.
			{
				name:     "longer wait and description",
				interval: 250 * time.Millisecond,
				pace:     Pace{Wait: time.Second, Description: "backing off"},
				wantDesc: "backing off",
				minGap:   time.Second, maxGap: time.Hour,
			},
			{
				name:     "zero wait means the interval",
				interval: 250 * time.Millisecond,
				pace:     Pace{},
				wantDesc: "probe failed: Internal: broken",
				minGap:   250 * time.Millisecond, maxGap: time.Hour,
			},
			{
				name:     "a kick caused by the failure does not cut a backoff short",
				interval: 250 * time.Millisecond,
				pace:     Pace{Wait: time.Second, Backoff: true},
				kick:     true,
				wantDesc: "probe failed: Internal: broken",
				minGap:   time.Second, maxGap: time.Hour,
			},
			{
				name:     "a backoff at the interval also drops the kick",
				interval: 300 * time.Millisecond,
				pace:     Pace{Backoff: true},
				kick:     true,
				wantDesc: "probe failed: Internal: broken",
				minGap:   300 * time.Millisecond, maxGap: time.Hour,
			},
			{
				name:     "a longer wait alone does not drop the kick",
				interval: 250 * time.Millisecond,
				pace:     Pace{Wait: time.Hour},
				kick:     true,
				wantDesc: "probe failed: Internal: broken",
				minGap:   0, maxGap: 10 * time.Second,
			},
			{
				name:     "without a backoff a kick probes at once",
				interval: time.Hour,
				pace:     Pace{},
				kick:     true,
				wantDesc: "probe failed: Internal: broken",
				minGap:   0, maxGap: 10 * time.Second,
			},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				p := newPlugin(t)
				var times probeTimes
				var mu sync.Mutex
				var m *Monitor
				p.identity.EXPECT().Probe(anyArg, anyArg).DoAndReturn(
					func(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
						times.add()
						if tc.kick {
							mu.Lock()
							m.ProbeNow()
							mu.Unlock()
						}
						return nil, status.Error(codes.Internal, "broken")
					}).AnyTimes()
				p.start()
				c := p.client()

				var paceErrs []error
				var paceMu sync.Mutex
				r := recorder{run: run}
				mu.Lock()
				m = r.start(t, Config{
					Identity: c.Identity, Timing: fixed(tc.interval, tc.interval),
					Pace: func(err error, interval time.Duration) Pace {
						paceMu.Lock()
						defer paceMu.Unlock()
						paceErrs = append(paceErrs, err)
						if interval != tc.interval {
							t.Errorf("Pace got interval %s, want %s", interval, tc.interval)
						}
						return tc.pace
					},
				})
				mu.Unlock()
				testutil.WaitFor(t, 10*time.Second, "two probes", func() bool { return len(times.all()) >= 2 })
				got := times.all()
				if gap := got[1].Sub(got[0]); gap < tc.minGap || gap >= tc.maxGap {
					t.Errorf("gap between the first two probes = %s, want [%s, %s)", gap, tc.minGap, tc.maxGap)
				}
				first := r.waitForState(t, 0, Unhealthy)
				if first.health.Description != tc.wantDesc {
					t.Errorf("description = %q, want %q", first.health.Description, tc.wantDesc)
				}
				paceMu.Lock()
				defer paceMu.Unlock()
				if len(paceErrs) == 0 || status.Code(paceErrs[0]) != codes.Internal {
					t.Errorf("Pace got errors %v, want the probe's Internal error", paceErrs)
				}
			})
		}
	})
}

func TestPaceSeesSuccessAsNil(t *testing.T) {
	forEachRunner(t, func(t *testing.T, run runner) {
		p := newPlugin(t)
		p.identity.EXPECT().Probe(anyArg, anyArg).Return(ready(false), nil).AnyTimes()
		p.start()
		c := p.client()
		got := make(chan error, 1)
		r := recorder{run: run}
		r.start(t, Config{
			Identity: c.Identity, Timing: fixed(time.Hour, 5*time.Second),
			Pace: func(err error, _ time.Duration) Pace {
				select {
				case got <- err:
				default:
				}
				return Pace{}
			},
		})
		select {
		case err := <-got:
			if err != nil {
				t.Errorf("Pace got %v for a probe the plugin answered (not ready), want nil", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Pace not called within 10s")
		}
		if res := r.waitForState(t, 0, Unhealthy); res.health.Description != "plugin reports not ready" {
			t.Errorf("description = %q, want Classify's", res.health.Description)
		}
	})
}

func TestAlignedWait(t *testing.T) {
	base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		now  time.Time
		wait time.Duration
		want time.Duration
	}{
		{"short wait kept", base.Add(7 * time.Millisecond), minAlignedWait - time.Millisecond, minAlignedWait - time.Millisecond},
		{"on the grid already", base, 5 * time.Second, 5 * time.Second},
		{"rounded down", base.Add(100 * time.Millisecond), 5 * time.Second, 4900 * time.Millisecond},
		{"rounded up", base.Add(130 * time.Millisecond), 5 * time.Second, 5120 * time.Millisecond},
		{"half way rounds up", base.Add(125 * time.Millisecond), 5 * time.Second, 5125 * time.Millisecond},
		{"shortest aligned wait", base.Add(1 * time.Millisecond), minAlignedWait, minAlignedWait - time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := alignedWait(tt.now, tt.wait)
			if got != tt.want {
				t.Fatalf("alignedWait(+%s, %s) = %s, want %s", tt.now.Sub(base), tt.wait, got, tt.want)
			}
		})
	}
}

// TestAlignedWaitKeepsTheInterval checks, over every phase of the grid,
// that an aligned wait ends on the grid, moves by at most half of it, and
// keeps the interval on average.
func TestAlignedWaitKeepsTheInterval(t *testing.T) {
	const wait = 5 * time.Second
	base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	var sum time.Duration
	n := 0
	for phase := time.Duration(0); phase < alignGrid; phase += time.Millisecond {
		now := base.Add(phase)
		got := alignedWait(now, wait)
		if due := now.Add(got); due.Truncate(alignGrid) != due {
			t.Fatalf("phase %s: the wait ends at %s, off the %s grid", phase, due.Format(time.RFC3339Nano), alignGrid)
		}
		if d := got - wait; d > alignGrid/2 || d < -alignGrid/2 {
			t.Fatalf("phase %s: wait moved by %s, more than half the grid", phase, d)
		}
		sum += got
		n++
	}
	if mean := sum / time.Duration(n); mean-wait > time.Millisecond || wait-mean > time.Millisecond {
		t.Fatalf("mean aligned wait %s, want %s within 1ms", mean, wait)
	}
}

// Every Result of a probe carries the Probe call's error and how long it
// took, so the owner can tell why a probe failed: nil for a plugin that
// answered not ready, the gRPC status for one that failed.
func TestResultCarriesProbeErrorAndDuration(t *testing.T) {
	forEachRunner(t, func(t *testing.T, run runner) {
		p := newPlugin(t)
		p.identity.EXPECT().Probe(anyArg, anyArg).Return(ready(false), nil).Times(1)
		p.identity.EXPECT().Probe(anyArg, anyArg).Return(nil, status.Error(codes.Internal, "disk on fire")).AnyTimes()
		p.start()
		c := p.client()

		var (
			mu      sync.Mutex
			results []Result
		)
		m, err := New(Config{Identity: c.Identity, Timing: fixed(time.Hour, 5*time.Second), OnProbe: func(r Result) {
			mu.Lock()
			defer mu.Unlock()
			results = append(results, r)
		}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := run(ctx, m)
		defer func() {
			cancel()
			<-done
		}()
		count := func() int {
			mu.Lock()
			defer mu.Unlock()
			return len(results)
		}
		testutil.WaitFor(t, 5*time.Second, "the first probe", func() bool { return count() == 1 })
		m.ProbeNow()
		testutil.WaitFor(t, 5*time.Second, "the second probe", func() bool { return count() >= 2 })

		mu.Lock()
		defer mu.Unlock()
		notReady, failed := results[0], results[1]
		if notReady.State != Unhealthy || notReady.Err != nil || notReady.Duration <= 0 {
			t.Errorf("not-ready probe: %+v, want unhealthy with no error and a duration", notReady)
		}
		if failed.State != Unhealthy || status.Code(failed.Err) != codes.Internal || failed.Duration <= 0 {
			t.Errorf("failed probe: %+v, want unhealthy with the Internal status and a duration", failed)
		}
	})
}
