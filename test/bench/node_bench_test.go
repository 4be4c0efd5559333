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
	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/fingerprint"
	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/registry"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// samples is how many discoveries and deaths are timed per run.
const samples = 200

// BenchmarkNodeAgent reports, in one run: the direct Probe round trip (the
// floor of any detection), the direct discovery (the floor of discovery:
// see measureDirectDiscovery), discovery latency (socket created ->
// registered and healthy) and death detection latency (plugin killed ->
// unhealthy event) with production probe settings (5 s / 3 s).
func BenchmarkNodeAgent(b *testing.B) {
	dir := testutil.TempDir(b)

	direct := measureDirectProbe(b, dir)
	reportPercentiles(b, "probe_direct", direct)
	directDiscovery := measureDirectDiscovery(b, filepath.Join(dir, "direct-plugins"), filepath.Join(dir, "direct-states"))
	reportPercentiles(b, "direct_discovery", directDiscovery)

	reg, stop := startManager(b, filepath.Join(dir, "plugins"))
	defer stop()

	discovery, death := measureDiscoveryAndDeath(b, reg, filepath.Join(dir, "plugins"), filepath.Join(dir, "state"))
	reportPercentiles(b, "discovery", discovery)
	reportPercentiles(b, "death", death)
	p50 := percentile(direct, 50)
	b.ReportMetric(float64(percentile(discovery, 99))/float64(p50), "discovery_p99/probe_p50")
	b.ReportMetric(float64(percentile(discovery, 99))/float64(percentile(directDiscovery, 99)), "discovery_p99/direct_discovery_p99")
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

// measureDirectDiscovery times, for samples plugins started one after the
// other as measureDiscoveryAndDeath starts them, what any supervisor must
// do before it can call a plugin healthy, done by the least code: from the
// plugin's start, an inotify watch on the plugin's directory reports its
// socket, then a bare grpc-go connection to it (its calls waiting for the
// connection to be ready, as the registry's do) takes the fingerprint and
// a Probe (a plugin is healthy once a Probe says so). No scan, no trust
// checks, no registry, no events.
func measureDirectDiscovery(b *testing.B, pluginDir, stateDir string) []time.Duration {
	b.Helper()
	w, err := fsnotify.NewWatcher()
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close()
	out := make([]time.Duration, 0, samples)
	for i := range samples {
		sub := filepath.Join(pluginDir, fmt.Sprintf("d%03d", i))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			b.Fatal(err)
		}
		if err := w.Add(sub); err != nil {
			b.Fatal(err)
		}
		sock := filepath.Join(sub, "csi.sock")
		p := newPlugin(b, sock, filepath.Join(stateDir, fmt.Sprintf("d%03d", i)))
		start := time.Now()
		if err := p.Start(); err != nil {
			b.Fatal(err)
		}
		awaitCreate(b, w, sock)
		conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.WaitForReady(true)))
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), config.DefaultProbeTimeout)
		identity := csi.NewIdentityClient(conn)
		_, err = fingerprint.Take(ctx, fingerprint.Clients{
			Identity: identity, Controller: csi.NewControllerClient(conn), Node: csi.NewNodeClient(conn),
		})
		if err == nil {
			_, err = identity.Probe(ctx, &csi.ProbeRequest{})
		}
		cancel()
		if err != nil {
			b.Fatalf("direct fingerprint and probe of %s: %v", sock, err)
		}
		out = append(out, time.Since(start))
		conn.Close()
		p.Stop()
		_ = w.Remove(sub)
		_ = os.RemoveAll(sub)
	}
	return out
}

// awaitCreate waits, within 30 s, for w to report path created.
func awaitCreate(b *testing.B, w *fsnotify.Watcher, path string) {
	b.Helper()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for {
		select {
		case ev := <-w.Events:
			if ev.Name == path && ev.Has(fsnotify.Create) {
				return
			}
		case err := <-w.Errors:
			b.Fatalf("watching for %s: %v", path, err)
		case <-deadline.C:
			b.Fatalf("%s was not created within 30s", path)
		}
	}
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
