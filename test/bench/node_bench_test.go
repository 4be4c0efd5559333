package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/registry"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// samples is how many discoveries and deaths are timed per run.
const samples = 200

// BenchmarkNodeAgent reports, in one run: the direct Probe round trip (the
// floor of any detection), discovery latency (socket created -> registered
// and healthy) and death detection latency (plugin killed -> unhealthy
// event) with production probe settings (5 s / 3 s).
func BenchmarkNodeAgent(b *testing.B) {
	dir := testutil.TempDir(b)

	direct := measureDirectProbe(b, dir)
	reportPercentiles(b, "probe_direct", direct)

	reg, stop := startManager(b, filepath.Join(dir, "plugins"))
	defer stop()

	discovery, death := measureDiscoveryAndDeath(b, reg, filepath.Join(dir, "plugins"), filepath.Join(dir, "state"))
	reportPercentiles(b, "discovery", discovery)
	reportPercentiles(b, "death", death)
	p50 := percentile(direct, 50)
	b.ReportMetric(float64(percentile(discovery, 99))/float64(p50), "discovery_p99/probe_p50")
	b.ReportMetric(float64(percentile(death, 99))/float64(p50), "death_p99/probe_p50")
}

func measureDirectProbe(b *testing.B, dir string) []time.Duration {
	b.Helper()
	sock := filepath.Join(dir, "direct.sock")
	p := startPlugin(b, sock, filepath.Join(dir, "direct-state"))
	defer p.Stop()
	c, err := csiclient.New(csiclient.Config{Socket: sock, Redial: config.DefaultRetry().PluginRedial})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	for range 100 { // warm up the connection
		if _, err := c.Identity.Probe(ctx, &csi.ProbeRequest{}); err != nil {
			b.Fatal(err)
		}
	}
	out := make([]time.Duration, 0, 2000)
	for range 2000 {
		start := time.Now()
		if _, err := c.Identity.Probe(ctx, &csi.ProbeRequest{}); err != nil {
			b.Fatal(err)
		}
		out = append(out, time.Since(start))
	}
	return out
}

// measureDiscoveryAndDeath starts one plugin per sample, times how long the
// registry takes to list it healthy, kills it and times the unhealthy event.
func measureDiscoveryAndDeath(b *testing.B, reg *registry.Registry, pluginDir, stateDir string) (discovery, death []time.Duration) {
	b.Helper()
	for i := range samples {
		id := fmt.Sprintf("b%03d", i)
		if err := os.MkdirAll(filepath.Join(pluginDir, id), 0o755); err != nil {
			b.Fatal(err)
		}
		p := newPlugin(b, filepath.Join(pluginDir, id, "csi.sock"), filepath.Join(stateDir, id))

		start := time.Now()
		if err := p.Start(); err != nil {
			b.Fatal(err)
		}
		waitHealth(b, reg, id, heartbeat.Healthy)
		discovery = append(discovery, time.Since(start))

		start = time.Now()
		p.Kill()
		waitHealth(b, reg, id, heartbeat.Unhealthy)
		death = append(death, time.Since(start))

		// Remove the socket so the plugin is deregistered in the background.
		_ = os.RemoveAll(filepath.Join(pluginDir, id))
	}
	return discovery, death
}

// waitHealth waits for a registry change that puts id into state.
func waitHealth(b *testing.B, reg *registry.Registry, id string, state heartbeat.State) {
	b.Helper()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for {
		changed := reg.Changed()
		if p, ok := reg.Get(id); ok && p.Health.State == state {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			b.Fatalf("plugin %s did not become %s within 30s", id, state)
		}
	}
}

func startManager(b *testing.B, pluginDir string) (*registry.Registry, func()) {
	b.Helper()
	m, err := registry.NewManager(registry.ManagerConfig{
		PluginDir:           pluginDir,
		ProbeInterval:       5 * time.Second,
		ProbeTimeout:        3 * time.Second,
		FingerprintInterval: time.Minute,
		DeregisterGrace:     time.Second,
		RescanInterval:      30 * time.Second,
		PluginRedial:        config.DefaultRetry().PluginRedial,
		FingerprintRetry:    config.DefaultRetry().Fingerprint,
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	select {
	case <-m.Ready():
	case err := <-done:
		b.Fatalf("manager stopped: %v", err)
	}
	return m.Registry(), func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("manager: %v", err)
		}
	}
}

func newPlugin(b *testing.B, sock, stateDir string) *testplugin.Plugin {
	b.Helper()
	p, err := testplugin.New(testplugin.Config{Socket: sock, StateDir: stateDir, Type: testplugin.TypeMonolith, NodeID: "bench-node"})
	if err != nil {
		b.Fatal(err)
	}
	return p
}

func startPlugin(b *testing.B, sock, stateDir string) *testplugin.Plugin {
	b.Helper()
	p := newPlugin(b, sock, stateDir)
	if err := p.Start(); err != nil {
		b.Fatal(err)
	}
	return p
}

// percentile returns the p-th percentile (nearest rank) of ds.
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := (p*len(s) + 99) / 100
	if rank < 1 {
		rank = 1
	}
	return s[rank-1]
}

func reportPercentiles(b *testing.B, name string, ds []time.Duration) {
	b.ReportMetric(float64(percentile(ds, 50).Microseconds())/1000, name+"_p50_ms")
	b.ReportMetric(float64(percentile(ds, 99).Microseconds())/1000, name+"_p99_ms")
}
