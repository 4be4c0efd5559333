package registry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csisupd/csisupd/internal/fingerprint"
	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// sample is one gathered series: a counter's or gauge's value, or a
// histogram's sample count.
type sample struct {
	value float64
	count uint64
}

// gathered returns the series of metric name whose labels include want,
// keyed by their labels ("k=v,k=v", sorted by name).
func gathered(t *testing.T, g prometheus.Gatherer, name string, want map[string]string) map[string]sample {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]sample{}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			var key []string
			matched := 0
			for _, l := range m.GetLabel() {
				key = append(key, l.GetName()+"="+l.GetValue())
				if v, ok := want[l.GetName()]; ok && v == l.GetValue() {
					matched++
				}
			}
			if matched != len(want) {
				continue
			}
			var s sample
			switch {
			case m.GetCounter() != nil:
				s.value = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				s.value = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				s.count = m.GetHistogram().GetSampleCount()
			}
			out[strings.Join(key, ",")] = s
		}
	}
	return out
}

// one returns the single series of name with labels, failing the test
// when there is not exactly one.
func one(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) sample {
	t.Helper()
	got := gathered(t, g, name, labels)
	if len(got) != 1 {
		t.Fatalf("%s%v: %d series (%v), want 1", name, labels, len(got), got)
	}
	for _, s := range got {
		return s
	}
	panic("unreachable")
}

// A real plugin goes healthy, not ready, failing, healthy again and is
// killed (unreachable), then its socket is removed: every step is counted
// exactly once, by reason, and once the plugin is deregistered none of its
// series is left.
func TestMetricsFollowAPluginFromRegistrationToDeregistration(t *testing.T) {
	t.Parallel()
	dir := testutil.TempDir(t)
	sock := filepath.Join(dir, "a", SocketName)
	tp := startPlugin(t, sock, testplugin.Config{Type: testplugin.TypeMonolith})
	pr := prometheus.NewRegistry()
	// One probe an hour: every probe after the first is one the test asks
	// for (SetTiming probes at once) or one a broken connection asks for,
	// so the counts are exact; the timeout is generous so that a slow
	// machine adds no failure.
	const interval, timeout = time.Hour, 5 * time.Second
	m := startManager(t, ManagerConfig{PluginDir: dir, Metrics: pr,
		ProbeInterval: interval, ProbeTimeout: timeout, FingerprintInterval: interval, DeregisterGrace: 300 * time.Millisecond})
	reg := m.Registry()
	probeNow := func() {
		t.Helper()
		if err := m.SetTiming(interval, timeout, interval); err != nil {
			t.Fatal(err)
		}
	}
	description := func() string {
		p, _ := reg.Get("a")
		return p.Health.Description
	}
	id := map[string]string{"plugin_id": "a"}

	testutil.WaitFor(t, waitLong, "a healthy", func() bool { return healthOf(reg, "a") == "healthy" })
	if s := one(t, pr, "csisupd_plugin_last_healthy_probe_timestamp_seconds", id); s.value <= 0 {
		t.Errorf("last healthy probe timestamp %v after a healthy probe", s.value)
	}

	tp.SetFaults(testplugin.Faults{ProbeNotReady: true})
	probeNow()
	testutil.WaitFor(t, waitLong, "a not ready", func() bool { return description() == "plugin reports not ready" })

	tp.SetFaults(testplugin.Faults{ProbeError: codes.Internal})
	probeNow()
	testutil.WaitFor(t, waitLong, "a failing", func() bool { return strings.HasPrefix(description(), "probe failed: Internal") })

	tp.SetFaults(testplugin.Faults{})
	probeNow()
	testutil.WaitFor(t, waitLong, "a healthy again", func() bool { return healthOf(reg, "a") == "healthy" })
	p, _ := reg.Get("a")
	lastHealthy := p.Health.LastProbe
	fp := p.Fingerprint

	// Killed, its socket left behind: the broken connection asks for a
	// probe, which finds nobody listening. (A restart would be a new
	// socket, a new instance and a new supervisor, whose probes the test
	// could not count.)
	tp.Kill()
	testutil.WaitFor(t, waitLong, "a unreachable", func() bool { return strings.HasPrefix(description(), "plugin unreachable") })

	wantCounts := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"csisupd_plugin_health_transitions_total", map[string]string{"plugin_id": "a", "to": "healthy"}, 2},
		{"csisupd_plugin_health_transitions_total", map[string]string{"plugin_id": "a", "to": "unhealthy"}, 2},
		{"csisupd_plugin_probe_failures_total", map[string]string{"plugin_id": "a", "reason": "not_ready"}, 1},
		{"csisupd_plugin_probe_failures_total", map[string]string{"plugin_id": "a", "reason": "error"}, 1},
		{"csisupd_plugin_probe_failures_total", map[string]string{"plugin_id": "a", "reason": "unreachable"}, 1},
	}
	for _, c := range wantCounts {
		if got := one(t, pr, c.name, c.labels); got.value != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got.value, c.want)
		}
	}
	// Five probes: the first, three asked for and the one after the kill.
	if got := one(t, pr, "csisupd_plugin_probe_duration_seconds", id).count; got != 5 {
		t.Errorf("probe duration samples = %d, want 5", got)
	}
	// The fingerprint never changed and the other reasons never failed:
	// their series never appeared.
	if got := gathered(t, pr, "csisupd_plugin_fingerprint_changes_total", id); len(got) != 0 {
		t.Errorf("fingerprint change series of plugin a = %v, want none", got)
	}
	if got := gathered(t, pr, "csisupd_plugin_probe_failures_total", id); len(got) != 3 {
		t.Errorf("failure series of plugin a = %v, want the three reasons seen", got)
	}
	if got := one(t, pr, "csisupd_plugin_fingerprint_duration_seconds", nil).count; got == 0 {
		t.Error("no fingerprint duration sample")
	}
	// The failed probe after the kill left it at the last healthy one.
	if got, want := one(t, pr, "csisupd_plugin_last_healthy_probe_timestamp_seconds", id).value, float64(lastHealthy.UnixNano())/1e9; got != want {
		t.Errorf("last healthy probe timestamp %v, want the last healthy probe's %v", got, want)
	}
	if got := one(t, pr, "csisupd_watcher_scans_total", nil).value; got < 1 {
		t.Errorf("watcher scans = %v, want at least the initial one", got)
	}
	if got := one(t, pr, "csisupd_watcher_scan_duration_seconds", nil).count; got < 1 {
		t.Errorf("scan duration samples = %d, want at least one", got)
	}
	_, latest := reg.EventLog().Range()
	want := fmt.Sprintf(`
# HELP csisupd_plugin_healthy 1 when the plugin's latest probe was healthy, else 0.
# TYPE csisupd_plugin_healthy gauge
csisupd_plugin_healthy{plugin_id="a",type=%q,vendor_name=%q,vendor_version=%q} 0
# HELP csisupd_plugin_events_total Plugin events emitted since the agent started.
# TYPE csisupd_plugin_events_total counter
csisupd_plugin_events_total %d
# HELP csisupd_registry_plugins Plugins in the node's registry.
# TYPE csisupd_registry_plugins gauge
csisupd_registry_plugins 1
# HELP csisupd_registry_abandoned_supervisors Plugin supervisors that did not stop in time and were left behind; each holds a goroutine and a plugin connection.
# TYPE csisupd_registry_abandoned_supervisors gauge
csisupd_registry_abandoned_supervisors 0
`, fp.Type, fp.VendorName, fp.VendorVersion, latest)
	if err := promtest.GatherAndCompare(pr, strings.NewReader(want), "csisupd_plugin_healthy", "csisupd_plugin_events_total",
		"csisupd_registry_plugins", "csisupd_registry_abandoned_supervisors"); err != nil {
		t.Error(err)
	}

	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, waitLong, "a deregistered", func() bool { return healthOf(reg, "a") == "absent" })
	for _, name := range []string{"csisupd_plugin_healthy", "csisupd_plugin_probe_duration_seconds", "csisupd_plugin_probe_failures_total",
		"csisupd_plugin_last_healthy_probe_timestamp_seconds", "csisupd_plugin_health_transitions_total",
		"csisupd_plugin_fingerprint_changes_total"} {
		if n, err := promtest.GatherAndCount(pr, name); err != nil || n != 0 {
			t.Errorf("%s: %d series after deregistration (%v), want none", name, n, err)
		}
	}
	if got := one(t, pr, "csisupd_registry_plugins", nil).value; got != 0 {
		t.Errorf("csisupd_registry_plugins = %v after deregistration, want 0", got)
	}
}

// A probe whose answer violates the gRPC protocol fails for reason
// protocol, not as a plain error.
func TestMetricsCountProtocolViolations(t *testing.T) {
	t.Parallel()
	dir := testutil.TempDir(t)
	p := &violatingPlugin{}
	p.bigProbe.Store(true)
	serveViolating(t, filepath.Join(dir, "v"+SocketSuffix), p)
	pr := prometheus.NewRegistry()
	m := startManager(t, ManagerConfig{PluginDir: dir, Metrics: pr, MaxPluginMessageSize: 1 << 10})
	reason := func(r string) float64 {
		s := gathered(t, pr, "csisupd_plugin_probe_failures_total", map[string]string{"plugin_id": "v", "reason": r})
		for _, v := range s {
			return v.value
		}
		return 0
	}
	testutil.WaitFor(t, waitLong, "a protocol failure", func() bool { return reason("protocol") >= 1 })
	for _, r := range []string{"error", "not_ready", "timeout"} {
		if got := reason(r); got != 0 {
			t.Errorf("failures for reason %s = %v, want 0: violations are counted as protocol", r, got)
		}
	}
	if pl, _ := m.Registry().Get("v"); pl.Healthy() {
		t.Errorf("v is healthy: %+v", pl.Health)
	}
}

func TestProbeFailureReason(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"answered ready=false", nil, "not_ready"},
		{"deadline status", status.Error(codes.DeadlineExceeded, "context deadline exceeded"), "timeout"},
		{"bare deadline", context.DeadlineExceeded, "timeout"},
		{"wrapped deadline", fmt.Errorf("probe: %w", context.DeadlineExceeded), "timeout"},
		{"unavailable", status.Error(codes.Unavailable, "connection refused"), "unreachable"},
		{"refused dial", fmt.Errorf("dial: %w", syscall.ECONNREFUSED), "unreachable"},
		{"socket gone", fmt.Errorf("dial: %w", syscall.ENOENT), "unreachable"},
		{"plugin error", status.Error(codes.Internal, "disk on fire"), "error"},
		{"unimplemented", status.Error(codes.Unimplemented, "no Probe"), "error"},
		{"canceled", status.Error(codes.Canceled, "closing"), "error"},
		{"plain error", errors.New("oops"), "error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := probeFailureReason(tt.err); got != tt.want {
				t.Errorf("probeFailureReason(%v) = %q, want %q", tt.err, got, tt.want)
			}
		})
	}
}

// Plugins come and go: only the live ones have series, and a write of a
// deregistered instance (a probe that ended late) brings none back.
func TestMetricsSeriesBoundedByLivePlugins(t *testing.T) {
	r := New(Config{})
	pr := prometheus.NewRegistry()
	if err := r.metrics.register(pr); err != nil {
		t.Fatal(err)
	}
	fp := fingerprint.Fingerprint{Type: plugin.TypeNode, VendorName: "v", VendorVersion: "1"}
	const plugins, live = 100, 2
	for i := range plugins {
		id := fmt.Sprintf("p%d", i)
		in := inst(uint64(i + 1))
		r.Register(id, in, &fp)
		r.fingerprinted(id, in, time.Millisecond)
		r.probed(id, in, heartbeat.Result{State: heartbeat.Healthy, Description: "healthy", Duration: time.Millisecond})
		r.probed(id, in, heartbeat.Result{State: heartbeat.Unhealthy, Description: "failed", Duration: time.Millisecond,
			Err: status.Error(codes.Internal, "x")})
		changed := fp
		changed.VendorVersion = "2"
		r.SetFingerprint(id, in, changed)
		if i < plugins-live {
			if !r.Deregister(id, in, "gone") {
				t.Fatalf("Deregister(%s) refused", id)
			}
			r.probed(id, in, heartbeat.Result{State: heartbeat.Healthy, Duration: time.Millisecond})
			r.fingerprinted(id, in, time.Millisecond)
		}
	}
	tests := []struct {
		name      string
		perPlugin int
	}{
		{"csisupd_plugin_probe_duration_seconds", 1},
		{"csisupd_plugin_probe_failures_total", 1}, // the one reason that failed
		{"csisupd_plugin_last_healthy_probe_timestamp_seconds", 1},
		{"csisupd_plugin_health_transitions_total", 2},
		{"csisupd_plugin_fingerprint_changes_total", 1},
	}
	for _, tt := range tests {
		if n, err := promtest.GatherAndCount(pr, tt.name); err != nil || n != live*tt.perPlugin {
			t.Errorf("%s: %d series (%v), want %d for %d live plugins", tt.name, n, err, live*tt.perPlugin, live)
		}
	}
	// The live plugins' counts are exact.
	last := fmt.Sprintf("p%d", plugins-1)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"csisupd_plugin_health_transitions_total", map[string]string{"plugin_id": last, "to": "healthy"}, 1},
		{"csisupd_plugin_health_transitions_total", map[string]string{"plugin_id": last, "to": "unhealthy"}, 1},
		{"csisupd_plugin_probe_failures_total", map[string]string{"plugin_id": last, "reason": "error"}, 1},
		{"csisupd_plugin_fingerprint_changes_total", map[string]string{"plugin_id": last}, 1},
	} {
		if got := one(t, pr, c.name, c.labels).value; got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}

// Changes made while a subscriber has a notification pending fold into
// it, and are counted.
func TestMetricsCountCoalescedUpdates(t *testing.T) {
	r := New(Config{})
	sub := r.Subscribe()
	defer sub.Close()
	<-sub.C() // the initial notification
	for i := range 3 {
		r.Register(fmt.Sprintf("p%d", i), inst(uint64(i+1)), nil)
	}
	// The first change is the pending notification; two folded into it.
	if got := promtest.ToFloat64(r.metrics.coalesced); got != 2 {
		t.Errorf("coalesced = %v, want 2", got)
	}
	<-sub.C()
	r.Register("p9", inst(9), nil)
	if got := promtest.ToFloat64(r.metrics.coalesced); got != 2 {
		t.Errorf("coalesced = %v after a change to a subscriber with nothing pending, want still 2", got)
	}
}

// A supervisor that does not stop in time shows in
// csisupd_registry_abandoned_supervisors.
func TestMetricsReportAbandonedSupervisors(t *testing.T) {
	t.Parallel()
	const stopTimeout = 300 * time.Millisecond
	dir := testutil.TempDir(t)
	startPlugin(t, filepath.Join(dir, "a"+SocketSuffix), testplugin.Config{})
	pr := prometheus.NewRegistry()
	m := newTestManager(t, ManagerConfig{PluginDir: dir, Metrics: pr, StopTimeout: stopTimeout})
	stop := runManager(t, m)
	awaitReady(t, m)
	testutil.WaitFor(t, waitLong, "a healthy", func() bool { return healthOf(m.Registry(), "a") == "healthy" })
	_, release := hangStop(t, m.rec, "a")
	stop()
	want := `
# HELP csisupd_registry_abandoned_supervisors Plugin supervisors that did not stop in time and were left behind; each holds a goroutine and a plugin connection.
# TYPE csisupd_registry_abandoned_supervisors gauge
csisupd_registry_abandoned_supervisors 1
`
	if err := promtest.GatherAndCompare(pr, strings.NewReader(want), "csisupd_registry_abandoned_supervisors"); err != nil {
		t.Error(err)
	}
	release()
}

func TestNewManagerReturnsMetricsRegistrationErrors(t *testing.T) {
	pr := prometheus.NewRegistry()
	newTestManager(t, ManagerConfig{PluginDir: testutil.TempDir(t), Metrics: pr})
	// A second manager's series collide with the first's.
	_, err := NewManager(ManagerConfig{PluginDir: testutil.TempDir(t), Metrics: pr,
		ProbeInterval: testTiming.ProbeInterval, ProbeTimeout: testTiming.ProbeTimeout, FingerprintInterval: testTiming.FingerprintInterval,
		RescanInterval: time.Second, PluginRedial: testRetry.PluginRedial, FingerprintRetry: testRetry.Fingerprint})
	if err == nil || !strings.Contains(err.Error(), "registry: metrics") {
		t.Errorf("NewManager with taken series: %v, want a metrics registration error", err)
	}
}

// newTestWatchdog returns a monitor on a fake clock whose timeout never
// passes on its own; its loops' series go to pr when set.
func newTestWatchdog(t *testing.T, pr prometheus.Registerer) (*watchdog.Monitor, *testutil.Clock) {
	t.Helper()
	clock := testutil.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	wd, err := watchdog.New(watchdog.Config{Timeout: time.Hour, Now: clock.Now, Metrics: pr})
	if err != nil {
		t.Fatal(err)
	}
	return wd, clock
}

// The manager's three loops register with the watchdog while it runs,
// and unregister when it stops.
func TestManagerLoopsRegisterWithTheWatchdog(t *testing.T) {
	t.Parallel()
	pr := prometheus.NewRegistry()
	wd, _ := newTestWatchdog(t, pr)
	m := newTestManager(t, ManagerConfig{PluginDir: testutil.TempDir(t), DataDir: testutil.TempDir(t), Watchdog: wd})
	stop := runManager(t, m)
	awaitReady(t, m)
	loops := func() []string {
		var names []string
		for key := range gathered(t, pr, "csisupd_watchdog_loop_beat_age_seconds", nil) {
			names = append(names, strings.TrimPrefix(key, "loop="))
		}
		slices.Sort(names)
		return names
	}
	want := []string{"plugin reconciler", "plugin watcher", "registry persister"}
	testutil.WaitFor(t, waitLong, "the loops registered", func() bool { return slices.Equal(loops(), want) })
	if stale := wd.Stale(); len(stale) != 0 {
		t.Errorf("stale loops %v while the manager runs", stale)
	}
	stop()
	if got := loops(); len(got) != 0 {
		t.Errorf("loops %v still registered after Run returned", got)
	}
}

// blockingLogger blocks the first Info call with message msg until
// released: a log sink that stops taking lines, which the reconciler
// writes to synchronously in its loop. Loggers made from it with Named
// (the supervisors') do not block.
type blockingLogger struct {
	hclog.Logger
	msg      string
	once     sync.Once
	blocked  chan struct{} // closed when the call blocks
	released chan struct{}
}

func (l *blockingLogger) Info(msg string, args ...any) {
	if msg == l.msg {
		block := false
		l.once.Do(func() { block = true })
		if block {
			close(l.blocked)
			<-l.released
		}
	}
	l.Logger.Info(msg, args...)
}

// A reconciler stuck in a turn stops beating, and the watchdog names it,
// while the watcher, which still turns, stays fresh; once it turns again
// it is fresh too.
func TestWatchdogNamesAWedgedReconciler(t *testing.T) {
	t.Parallel()
	wd, clock := newTestWatchdog(t, nil)
	dir := testutil.TempDir(t)
	log := &blockingLogger{Logger: testLogger(t), msg: "supervising plugin",
		blocked: make(chan struct{}), released: make(chan struct{})}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(log.released) }) }
	startManager(t, ManagerConfig{PluginDir: dir, Watchdog: wd, Logger: log})
	t.Cleanup(release) // before the manager stops (cleanups run last first)

	// A new socket: the reconciler starts its supervisor and blocks in
	// the log line that says so.
	socketFile(t, filepath.Join(dir, "a"+SocketSuffix))
	select {
	case <-log.blocked:
	case <-time.After(waitLong):
		t.Fatal("the reconciler did not log a new supervisor")
	}

	clock.Advance(2 * wd.Timeout())
	if got := wd.Stale(); !slices.Contains(got, "plugin reconciler") {
		t.Fatalf("stale = %v right after the clock moved past the timeout, want the reconciler among them", got)
	}
	// A file system event turns the watcher, which beats; the reconciler
	// cannot.
	writeFile(t, filepath.Join(dir, "poke"))
	testutil.WaitFor(t, waitLong, "only the reconciler stale", func() bool {
		return slices.Equal(wd.Stale(), []string{"plugin reconciler"})
	})

	release()
	testutil.WaitFor(t, waitLong, "no loop stale once the reconciler turns again", func() bool {
		return len(wd.Stale()) == 0
	})
}

// A plugin id or vendor name that is not UTF-8 (a directory name is
// bytes, a vendor name a plugin's answer) is a label with its invalid bytes
// written \xNN, as on the wire, not a panic of the scrape; its series go
// at deregistration like any other's.
func TestMetricsLabelsOfInvalidUTF8Names(t *testing.T) {
	r := New(Config{})
	pr := prometheus.NewRegistry()
	if err := registerMetrics(pr, r.metrics, newManagerCollector(r, func() uint64 { return 0 })); err != nil {
		t.Fatal(err)
	}
	const id = "caf\xe9"
	in := inst(1)
	fp := fingerprint.Fingerprint{Type: plugin.TypeNode, VendorName: "v\xff", VendorVersion: "1"}
	r.Register(id, in, &fp)
	r.probed(id, in, heartbeat.Result{State: heartbeat.Healthy, Description: "healthy", Duration: time.Millisecond})
	r.fingerprinted(id, in, time.Millisecond)

	want := map[string]string{"plugin_id": `caf\xe9`}
	if got := one(t, pr, "csisupd_plugin_healthy", map[string]string{"plugin_id": `caf\xe9`, "vendor_name": `v\xff`}).value; got != 1 {
		t.Errorf("csisupd_plugin_healthy = %v, want 1", got)
	}
	if got := one(t, pr, "csisupd_plugin_probe_duration_seconds", want).count; got != 1 {
		t.Errorf("csisupd_plugin_probe_duration_seconds: %d samples, want 1", got)
	}
	r.Deregister(id, in, "gone")
	for _, name := range []string{"csisupd_plugin_healthy", "csisupd_plugin_probe_duration_seconds", "csisupd_plugin_probe_failures_total",
		"csisupd_plugin_health_transitions_total", "csisupd_plugin_last_healthy_probe_timestamp_seconds"} {
		if n, err := promtest.GatherAndCount(pr, name); err != nil || n != 0 {
			t.Errorf("%s: %d series after deregistration (%v), want none", name, n, err)
		}
	}
}

// Unregistered, the metrics keep no series labelled by plugin_id: nothing
// could read them. The node-wide series count on, and the plugin series
// start with the first probe after registration.
func TestMetricsKeepNoPluginSeriesUntilRegistered(t *testing.T) {
	r := New(Config{})
	fp := fingerprint.Fingerprint{Type: plugin.TypeNode, VendorName: "v", VendorVersion: "1"}
	in := inst(1)
	r.Register("p", in, &fp)
	r.fingerprinted("p", in, time.Millisecond)
	probe := func(state heartbeat.State) {
		r.probed("p", in, heartbeat.Result{State: state, Description: string(state), Duration: time.Millisecond, At: time.Now()})
	}
	probe(heartbeat.Healthy)
	probe(heartbeat.Unhealthy)
	r.SetFingerprint("p", in, fingerprint.Fingerprint{Type: plugin.TypeNode, VendorName: "v", VendorVersion: "2"})
	perPlugin := func() int {
		return promtest.CollectAndCount(r.metrics.probeDuration) + promtest.CollectAndCount(r.metrics.probeFailures) +
			promtest.CollectAndCount(r.metrics.lastHealthy) + promtest.CollectAndCount(r.metrics.transitions) +
			promtest.CollectAndCount(r.metrics.fingerprintChanges)
	}
	if n := perPlugin(); n != 0 {
		t.Errorf("%d plugin series kept before the metrics were registered, want 0", n)
	}
	if n := promtest.CollectAndCount(r.metrics.fingerprintTime); n != 1 {
		t.Errorf("fingerprint histogram: %d series, want 1", n)
	}

	if err := r.metrics.register(prometheus.NewRegistry()); err != nil {
		t.Fatal(err)
	}
	probe(heartbeat.Healthy)
	if got := promtest.CollectAndCount(r.metrics.probeDuration); got != 1 {
		t.Errorf("probe histogram after registration: %d series, want 1", got)
	}
	if got := promtest.CollectAndCount(r.metrics.lastHealthy); got != 1 {
		t.Errorf("last healthy gauge after registration: %d series, want 1", got)
	}
}
