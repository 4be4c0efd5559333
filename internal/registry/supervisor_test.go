package registry

import (
	"context"
	"github.com/csisupd/csisupd/internal/plugin"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// superviseSocket starts a supervisor for the socket at path (it need not
// exist yet) and stops it when the test ends.
func superviseSocket(t *testing.T, reg *Registry, id string, si plugin.Instance, tm timing) *supervisor {
	t.Helper()
	s, err := startSupervisor(context.Background(), supervisorConfig{
		ID: id, Instance: si, Registry: reg, Timing: newProbeTiming(tm), Logger: testLogger(t),
		Probes: heartbeat.NewScheduler(heartbeat.SchedulerConfig{}),
		Redial: testRetry.PluginRedial, FingerprintRetry: testRetry.Fingerprint,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopSupervisor(t, s) })
	return s
}

// stopSupervisor stops s and fails the test when it does not stop within
// 10s.
func stopSupervisor(t *testing.T, s *supervisor) {
	t.Helper()
	s.beginStop()
	if !s.awaitStop(time.Now().Add(10 * time.Second)) {
		t.Errorf("supervisor of %s did not stop within 10s", s.id)
	}
}

func TestSupervisorRegistersAndProbes(t *testing.T) {
	sock := filepath.Join(testutil.TempDir(t), "a.sock")
	startPlugin(t, sock, testplugin.Config{Type: testplugin.TypeMonolith, NodeID: "node-7", MaxVolumes: 3})
	reg := New(Config{})
	s := superviseSocket(t, reg, "a", statSocket(t, sock), testTiming)

	testutil.WaitFor(t, 10*time.Second, "plugin a healthy", func() bool { return healthOf(reg, "a") == "healthy" })
	p, _ := reg.Get("a")
	if p.Fingerprint.Type != plugin.TypeMonolith || p.Fingerprint.NodeID != "node-7" ||
		p.Fingerprint.MaxVolumes != 3 || p.Fingerprint.VendorName != testplugin.DefaultName || !p.Fingerprinted {
		t.Errorf("fingerprint = %+v", p.Fingerprint)
	}
	if got := eventsOf(reg, "a"); !slices.Equal(got, []plugin.EventType{plugin.EventRegistered, plugin.EventHealthy}) {
		t.Errorf("events = %v, want [plugin-registered plugin-healthy]", got)
	}

	stopSupervisor(t, s)
	select {
	case <-s.done:
	default:
		t.Error("stop returned before the supervisor's goroutines")
	}
}

func TestSupervisorRetriesFingerprintOfNonCSISocket(t *testing.T) {
	sock := filepath.Join(testutil.TempDir(t), "a.sock")
	// A listener that accepts and closes: not a gRPC server at all.
	l := listenUnix(t, sock)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	})
	defer wg.Wait()

	reg := New(Config{})
	superviseSocket(t, reg, "a", statSocket(t, sock), fastTiming)
	testutil.WaitFor(t, 10*time.Second, "plugin a registered unhealthy", func() bool { return healthOf(reg, "a") == "unhealthy" })
	p, _ := reg.Get("a")
	if !strings.HasPrefix(p.Health.Description, "fingerprint failed: GetPluginInfo") {
		t.Errorf("health description = %q, want a fingerprint failure", p.Health.Description)
	}
	if p.Fingerprinted || p.Fingerprint.Type != plugin.TypeUnknown {
		t.Errorf("fingerprint of a non-CSI socket = %+v", p.Fingerprint)
	}

	// A real plugin takes over the path: retries find it.
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	startPlugin(t, sock, testplugin.Config{Type: testplugin.TypeNode})
	testutil.WaitFor(t, 10*time.Second, "plugin a healthy", func() bool { return healthOf(reg, "a") == "healthy" })
	if p, _ := reg.Get("a"); p.Fingerprint.Type != plugin.TypeNode {
		t.Errorf("type = %s, want node", p.Fingerprint.Type)
	}
	want := []plugin.EventType{plugin.EventRegistered, plugin.EventUnhealthy, plugin.EventHealthy}
	if got := eventsOf(reg, "a"); !slices.Equal(got, want) {
		t.Errorf("events = %v, want %v", got, want)
	}
}

// superviseVersion1 starts plugin "a" at version 1.0.0 in dir and
// supervises it until healthy, with an hour between fingerprints: any
// later fingerprint has another cause.
func superviseVersion1(t *testing.T, dir string) (sock, state string, v1 *testplugin.Plugin, reg *Registry) {
	t.Helper()
	sock = filepath.Join(dir, "a.sock")
	state = filepath.Join(dir, "state")
	v1 = startPlugin(t, sock, testplugin.Config{StateDir: state, VendorVersion: "1.0.0"})
	reg = New(Config{})
	tm := testTiming
	tm.FingerprintInterval = time.Hour
	superviseSocket(t, reg, "a", statSocket(t, sock), tm)
	testutil.WaitFor(t, 10*time.Second, "plugin a healthy", func() bool { return healthOf(reg, "a") == "healthy" })
	return sock, state, v1, reg
}

func TestSupervisorRefingerprintsAfterRecovery(t *testing.T) {
	sock, state, v1, reg := superviseVersion1(t, testutil.TempDir(t))

	v1.Kill()
	testutil.WaitFor(t, 10*time.Second, "plugin a unhealthy", func() bool { return healthOf(reg, "a") == "unhealthy" })
	v1.Stop()
	startPlugin(t, sock, testplugin.Config{StateDir: state, VendorVersion: "2.0.0"})

	testutil.WaitFor(t, 10*time.Second, "fingerprint 2.0.0", func() bool {
		p, _ := reg.Get("a")
		return p.Fingerprint.VendorVersion == "2.0.0"
	})
	e, ok := findEvent(reg, "a", plugin.EventFingerprintChanged)
	if !ok || !strings.Contains(e.Description, "vendor_version") {
		t.Errorf("fingerprint-changed event = %+v (found %v)", e, ok)
	}
	if healthOf(reg, "a") != "healthy" {
		t.Errorf("health = %s, want healthy", healthOf(reg, "a"))
	}
}

// TestSupervisorRefingerprintsANewConnection replaces a plugin between two
// probes, so that no probe ever fails: the broken connection alone must
// make the supervisor fingerprint whoever answers the next one.
func TestSupervisorRefingerprintsANewConnection(t *testing.T) {
	dir := testutil.TempDir(t)
	sock, state, v1, reg := superviseVersion1(t, dir)

	// v2 listens first, then takes the path over, and only then does v1
	// die: every probe finds a plugin that answers.
	next := filepath.Join(dir, "next.sock")
	startPlugin(t, next, testplugin.Config{StateDir: state, VendorVersion: "2.0.0"})
	if err := os.Rename(next, sock); err != nil {
		t.Fatal(err)
	}
	v1.Kill()

	testutil.WaitFor(t, 10*time.Second, "fingerprint 2.0.0", func() bool {
		p, _ := reg.Get("a")
		return p.Fingerprint.VendorVersion == "2.0.0"
	})
	want := []plugin.EventType{plugin.EventRegistered, plugin.EventHealthy, plugin.EventFingerprintChanged}
	if got := eventsOf(reg, "a"); !slices.Equal(got, want) {
		t.Errorf("events = %v, want %v", got, want)
	}
}

func TestSupervisorSetTimingReschedulesFingerprints(t *testing.T) {
	sock := filepath.Join(testutil.TempDir(t), "a.sock")
	tp := startPlugin(t, sock, testplugin.Config{})
	reg := New(Config{})
	tm := testTiming
	tm.FingerprintInterval = time.Hour
	s := superviseSocket(t, reg, "a", statSocket(t, sock), tm)
	testutil.WaitFor(t, 10*time.Second, "plugin a healthy", func() bool { return healthOf(reg, "a") == "healthy" })
	before := tp.Stats().Calls["GetPluginInfo"]

	// With an hour between fingerprints nothing would happen; the new
	// interval applies to the running supervisor.
	tm.FingerprintInterval = 100 * time.Millisecond
	s.timing.set(tm)
	s.timingChanged()
	testutil.WaitFor(t, 10*time.Second, "two more fingerprints", func() bool {
		return tp.Stats().Calls["GetPluginInfo"] >= before+2
	})
	want := []plugin.EventType{plugin.EventRegistered, plugin.EventHealthy}
	if got := eventsOf(reg, "a"); !slices.Equal(got, want) {
		t.Errorf("events = %v, want %v: an unchanged fingerprint emits nothing", got, want)
	}
	if got, _ := reg.Get("a"); got.Health.State != heartbeat.Healthy {
		t.Errorf("health = %s after a timing change", got.Health.State)
	}
}

func TestSupervisorStopsWhileDialingNothing(t *testing.T) {
	reg := New(Config{})
	sock := filepath.Join(testutil.TempDir(t), "never.sock")
	s := superviseSocket(t, reg, "a", plugin.Instance{Path: sock, Inode: 1}, fastTiming)
	testutil.WaitFor(t, 10*time.Second, "plugin a unhealthy", func() bool { return healthOf(reg, "a") == "unhealthy" })
	p, _ := reg.Get("a")
	if !strings.Contains(p.Health.Description, "fingerprint failed") {
		t.Errorf("description = %q", p.Health.Description)
	}
	stopSupervisor(t, s) // goleak in TestMain checks that nothing stays behind
	if _, err := net.Dial("unix", sock); err == nil {
		t.Error("a socket appeared from nowhere")
	}
}

func TestFingerprintRetryIsCappedByTheProbeInterval(t *testing.T) {
	ms := time.Millisecond
	plain := testRetry.Fingerprint
	plain.Jitter = 0 // the intervals the waits are drawn around
	tests := []struct {
		name     string
		interval time.Duration
		want     []time.Duration
	}{
		{"doubles from the base up to the interval", time.Second,
			[]time.Duration{50 * ms, 100 * ms, 200 * ms, 400 * ms, 800 * ms, time.Second, time.Second}},
		{"a long interval lets it grow further", 10 * time.Second,
			[]time.Duration{50 * ms, 100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms, 3200 * ms, 6400 * ms, 10 * time.Second}},
		{"an interval below the base is base and cap", 20 * ms,
			[]time.Duration{20 * ms, 20 * ms, 20 * ms}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := fingerprintRetry(plain, tt.interval)
			if err := p.Validate(); err != nil {
				t.Fatalf("fingerprintRetry(%s) = %v: %v", tt.interval, p, err)
			}
			b := p.NewBackOff()
			for i, want := range tt.want {
				if got := b.NextBackOff(); got != want {
					t.Fatalf("wait %d = %s, want %s", i+1, got, want)
				}
			}
		})
	}
}

func TestFingerprintRetriesOfPluginsStartedTogetherDoNotCoincide(t *testing.T) {
	// Plugins that restart together (an upgrade of the node's plugins)
	// are fingerprinted again together: their retries must spread, each
	// within half its interval either way.
	const interval = 2 * time.Second
	p := fingerprintRetry(testRetry.Fingerprint, interval)
	a, b := p.NewBackOff(), p.NewBackOff()
	base := p.Base
	equal := 0
	for i := range 6 {
		wa, wb := a.NextBackOff(), b.NextBackOff()
		if wa == wb {
			equal++
		}
		around := min(base<<i, interval)
		for _, w := range []time.Duration{wa, wb} {
			if w < around/2 || w > around*3/2+1 {
				t.Errorf("wait %d = %s, want one within half of %s either way", i+1, w, around)
			}
		}
	}
	if equal == 6 {
		t.Error("two supervisors' fingerprint retries wait alike: in lockstep")
	}
}
