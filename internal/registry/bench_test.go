package registry

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testregistrar"
	"github.com/csisupd/csisupd/internal/testutil"
)

// BenchmarkPluginSources times how soon a plugin is known through each
// source, beside the direct path, a socket in the plugin directory:
//
//   - discovered: a plugin starts in the plugin directory; until its
//     record is fingerprinted;
//
//   - kubelet: a registrar starts for a plugin that already serves; until
//     the registrar is told it is registered (the plugin fingerprinted),
//     then, after it stops, until the plugin is deregistered (grace 0);
//
//   - required-missing: a required plugin is declared; how late
//     plugin-missing comes after its health_timeout.
//
//     go test -run '^$' -bench PluginSources -benchtime 20x ./internal/registry/
func BenchmarkPluginSources(b *testing.B) {
	b.Run("discovered", func(b *testing.B) {
		root := testutil.TempDir(b)
		dir := filepath.Join(root, "plugins")
		m := startBenchManager(b, ManagerConfig{PluginDir: dir})
		var known time.Duration
		for i := range b.N {
			id := fmt.Sprintf("p%d", i)
			start := time.Now()
			startBenchPlugin(b, filepath.Join(dir, id, SocketName))
			waitBench(b, func() bool { p, ok := m.Registry().Get(id); return ok && p.Fingerprinted })
			known += time.Since(start)
		}
		b.ReportMetric(float64(known.Microseconds())/1000/float64(b.N), "known-ms/op")
	})
	b.Run("kubelet", func(b *testing.B) {
		root := testutil.TempDir(b)
		regDir := filepath.Join(root, "reg")
		if err := os.MkdirAll(regDir, 0o750); err != nil {
			b.Fatal(err)
		}
		m := startBenchManager(b, ManagerConfig{PluginDir: filepath.Join(root, "plugins"), KubeletRegistrationDir: regDir})
		var known, gone time.Duration
		for i := range b.N {
			id := fmt.Sprintf("d%d", i)
			endpoint := filepath.Join(root, "ep", id, "csi.sock")
			startBenchPlugin(b, endpoint)
			start := time.Now()
			r, err := testregistrar.Start(testregistrar.Config{Dir: regDir, Driver: id, Endpoint: endpoint})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			st, err := r.WaitStatus(ctx, 0)
			cancel()
			if err != nil || !st.Registered {
				b.Fatalf("registration status %+v, %v", st, err)
			}
			known += time.Since(start)
			start = time.Now()
			r.Stop()
			waitBench(b, func() bool { _, ok := m.Registry().Get(id); return !ok })
			gone += time.Since(start)
		}
		b.ReportMetric(float64(known.Microseconds())/1000/float64(b.N), "known-ms/op")
		b.ReportMetric(float64(gone.Microseconds())/1000/float64(b.N), "deregistered-ms/op")
	})
	b.Run("required-missing", func(b *testing.B) {
		root := testutil.TempDir(b)
		m := startBenchManager(b, ManagerConfig{PluginDir: filepath.Join(root, "plugins")})
		const timeout = 20 * time.Millisecond
		decls := map[string]Declaration{}
		var late time.Duration
		for i := range b.N {
			id := fmt.Sprintf("r%d", i)
			decls[id] = Declaration{Socket: filepath.Join(root, id+".sock"), Type: plugin.TypeNode, Required: true, HealthTimeout: timeout}
			start := time.Now()
			if err := m.SetDeclarations(maps.Clone(decls)); err != nil {
				b.Fatal(err)
			}
			var ev plugin.Event
			waitBench(b, func() bool {
				var ok bool
				ev, ok = findEvent(m.Registry(), id, plugin.EventMissing)
				return ok
			})
			late += ev.Time.Sub(start) - timeout
		}
		b.ReportMetric(float64(late.Microseconds())/1000/float64(b.N), "missing-late-ms/op")
	})
}

// startBenchManager runs a manager with the tests' timings and a grace
// period of zero until the benchmark ends.
func startBenchManager(b *testing.B, cfg ManagerConfig) *Manager {
	b.Helper()
	cfg.ProbeInterval, cfg.ProbeTimeout, cfg.FingerprintInterval = testTiming.ProbeInterval, testTiming.ProbeTimeout, testTiming.FingerprintInterval
	cfg.RescanInterval, cfg.PluginRedial, cfg.FingerprintRetry = time.Minute, testRetry.PluginRedial, testRetry.Fingerprint
	kubeletDefaults(&cfg)
	m, err := NewManager(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	b.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	})
	waitBench(b, func() bool {
		select {
		case <-m.Ready():
			return true
		default:
			return false
		}
	})
	return m
}

// startBenchPlugin starts a node test plugin on socket until the
// benchmark ends.
func startBenchPlugin(b *testing.B, socket string) {
	b.Helper()
	p, err := testplugin.New(testplugin.Config{Socket: socket, StateDir: testutil.TempDir(b), NodeID: "n", Type: testplugin.TypeNode})
	if err != nil {
		b.Fatal(err)
	}
	if err := p.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.Stop)
}

// waitBench polls cond every 100 µs for at most 10 s.
func waitBench(b *testing.B, cond func() bool) {
	b.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			b.Fatal("condition not met within 10s")
		}
		time.Sleep(100 * time.Microsecond) // poll interval
	}
}
