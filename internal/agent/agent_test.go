package agent

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/registry"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testConfig is a client-only configuration in short temporary directories
// with ports chosen by the kernel.
func testConfig(t *testing.T) *config.Config {
	t.Helper()
	dir, err := os.MkdirTemp("", "csa")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	cfg := config.Default()
	cfg.Name = "test-node"
	cfg.DataDir = filepath.Join(dir, "data")
	cfg.Client.PluginDir = filepath.Join(dir, "plugins")
	cfg.BindAddr, cfg.AdvertiseAddr = "127.0.0.1", "127.0.0.1"
	cfg.Ports = config.Ports{RPC: 0, HTTP: 0, Raft: 0}
	cfg.Consul.Enabled = false
	cfg.Client.ProbeInterval = time.Hour
	cfg.Client.ProbeTimeout = time.Second
	return &cfg
}

// startPlugin serves a test plugin with id in cfg's plugin directory.
func startPlugin(t *testing.T, cfg *config.Config, id string) {
	t.Helper()
	startPluginWith(t, cfg, id, testplugin.Config{})
}

// startPluginWith serves a monolith test plugin of pc with id in cfg's
// plugin directory; it stops when the test ends.
func startPluginWith(t *testing.T, cfg *config.Config, id string, pc testplugin.Config) *testplugin.Plugin {
	t.Helper()
	sock := filepath.Join(cfg.Client.PluginDir, id, "csi.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		t.Fatal(err)
	}
	pc.Socket, pc.StateDir = sock, filepath.Join(cfg.DataDir, "plugin-"+id)
	pc.Type, pc.NodeID, pc.Logger = testplugin.TypeMonolith, "n1", hclog.NewNullLogger()
	p, err := testplugin.New(pc)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

// runAgent runs a in the background until the test ends; the returned stop
// cancels Run and returns its error.
func runAgent(t *testing.T, a *Agent) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			err = <-done
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	select {
	case <-a.Ready():
	case err := <-done:
		t.Fatalf("Run returned before ready: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("agent not ready after 10s")
	}
	return stop
}

func waitHealthy(t *testing.T, a *Agent, id string) registry.Plugin {
	t.Helper()
	var p registry.Plugin
	testutil.WaitFor(t, 10*time.Second, "plugin "+id+" healthy", func() bool {
		var ok bool
		p, ok = a.Registry().Get(id)
		return ok && p.Health.State == heartbeat.Healthy
	})
	return p
}

func portFree(t *testing.T, addr string) bool {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	_ = ln.Close()
	return true
}

// New fails cleanly when a port is taken: the error names the config key
// and the address, and every listener it opened is closed again.
func TestNewListenerInUse(t *testing.T) {
	tests := []struct {
		name   string
		server bool
		busy   func(p *config.Ports) *int // the port to occupy
		key    string
	}{
		{"rpc", false, func(p *config.Ports) *int { return &p.RPC }, "ports.rpc"},
		{"http", false, func(p *config.Ports) *int { return &p.HTTP }, "ports.http"},
		{"raft", true, func(p *config.Ports) *int { return &p.Raft }, "raft"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Server.Enabled = tt.server
			cfg.Server.BootstrapExpect = 1
			p := testutil.FreePorts(t, 3)
			cfg.Ports = config.Ports{RPC: p[0], HTTP: p[1], Raft: p[2]}
			busy, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer busy.Close()
			*tt.busy(&cfg.Ports) = busy.Addr().(*net.TCPAddr).Port

			a, err := New(Config{Config: cfg, Logger: hclog.NewNullLogger()})
			if err == nil {
				t.Fatal("New succeeded with a port in use")
			}
			if a != nil {
				t.Errorf("New returned an agent with error %v", err)
			}
			if !strings.Contains(err.Error(), tt.key) || !strings.Contains(err.Error(), busy.Addr().String()) {
				t.Errorf("error %q does not name %s and %s", err, tt.key, busy.Addr())
			}
			for key, port := range map[string]int{"rpc": cfg.Ports.RPC, "http": cfg.Ports.HTTP, "raft": cfg.Ports.Raft} {
				addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
				if addr != busy.Addr().String() && !portFree(t, addr) {
					t.Errorf("ports.%s %s still open after New failed", key, addr)
				}
			}
		})
	}
}

func TestNewRequiresConfig(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Fatal("New without Config succeeded")
	}
}

// Run stops within ShutdownTimeout even with an event stream open, and
// persists the registry before it returns.
func TestRunStopsWithinShutdownTimeout(t *testing.T) {
	cfg := testConfig(t)
	startPlugin(t, cfg, "p1")
	a, err := New(Config{Config: cfg, Version: "test", Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	stop := runAgent(t, a)
	waitHealthy(t, a, "p1")
	rpcAddr, httpAddr := a.RPCAddr().String(), a.HTTPAddr().String()

	conn, err := grpc.NewClient(rpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := csisupdv1.NewAgentClient(conn).WatchEvents(ctx, &csisupdv1.WatchEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if e, err := stream.Recv(); err != nil || e.GetPluginId() != "p1" {
		t.Fatalf("first event = %v, %v; want one of p1", e, err)
	}

	start := time.Now()
	if err := stop(); err != nil {
		t.Errorf("Run returned %v, want nil", err)
	}
	if took := time.Since(start); took >= ShutdownTimeout {
		t.Errorf("Run took %s to stop, want < ShutdownTimeout (%s)", took, ShutdownTimeout)
	}
	// The open stream ended.
	for {
		if _, err := stream.Recv(); err != nil {
			break
		}
	}
	state, err := os.ReadFile(filepath.Join(cfg.DataDir, registry.StateFileName))
	if err != nil || !strings.Contains(string(state), `"p1"`) {
		t.Errorf("registry not persisted with p1: %v %s", err, state)
	}
	for _, addr := range []string{rpcAddr, httpAddr} {
		if !portFree(t, addr) {
			t.Errorf("%s still open after Run returned", addr)
		}
	}
}

// Reload applies the log level and probe timing to the running agent.
func TestReload(t *testing.T) {
	cfg := testConfig(t)
	cfg.LogLevel = "info"
	startPlugin(t, cfg, "p1")
	var logs testutil.SyncBuffer
	log := hclog.New(&hclog.LoggerOptions{Name: "test", Output: &logs})
	a, err := New(Config{Config: cfg, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, a)
	first := waitHealthy(t, a, "p1").Health.LastProbe
	if log.IsDebug() {
		t.Fatal("logger at debug level with log_level info")
	}

	tests := []struct {
		name    string
		edit    func(c *config.Config)
		wantErr string
	}{
		{"bad probe timing", func(c *config.Config) { c.Client.ProbeTimeout = 0 }, "probe"},
		{"log level and probe interval", func(c *config.Config) {
			c.LogLevel = "debug"
			c.Client.ProbeInterval = 20 * time.Millisecond
			c.Client.ProbeTimeout = 20 * time.Millisecond
		}, ""},
	}
	for _, tt := range tests {
		next := *cfg
		tt.edit(&next)
		err := a.Reload(&next)
		switch {
		case tt.wantErr == "" && err != nil:
			t.Fatalf("%s: Reload: %v", tt.name, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Fatalf("%s: Reload error = %v, want one naming %q", tt.name, err, tt.wantErr)
		}
	}
	if !log.IsDebug() || !log.Named("registry").IsDebug() {
		t.Error("log level not debug after Reload")
	}
	if !strings.Contains(logs.String(), "configuration reloaded") {
		t.Errorf("no \"configuration reloaded\" log line:\n%s", logs.String())
	}
	// With the old interval of an hour, p1 would not be probed again.
	testutil.WaitFor(t, 10*time.Second, "a new probe of p1", func() bool {
		p, ok := a.Registry().Get("p1")
		return ok && p.Health.LastProbe.After(first)
	})
	if a.PluginDir() != cfg.Client.PluginDir || a.DataDir() != cfg.DataDir {
		t.Errorf("directories changed on Reload: %s %s", a.PluginDir(), a.DataDir())
	}
}

// Run returns the error of a component that cannot start, and closes the
// listeners.
func TestRunFailsWhenPluginDirUnusable(t *testing.T) {
	cfg := testConfig(t)
	a, err := New(Config{Config: cfg, Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	// Replace the plugin directory by a file after New created it.
	if err := os.RemoveAll(cfg.Client.PluginDir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg.Client.PluginDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(context.Background()) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "plugin registry") {
			t.Errorf("Run error = %v, want one from the plugin registry", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the registry failed")
	}
	if !portFree(t, a.RPCAddr().String()) {
		t.Error("rpc listener still open")
	}
}

func TestCloseWithoutRunReleasesEverything(t *testing.T) {
	// Dev mode: New makes a temporary data directory that Close removes.
	cfg := testConfig(t)
	cfg.Dev, cfg.DataDir, cfg.Client.PluginDir = true, "", ""
	a, err := New(Config{Config: cfg, Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	rpcAddr, httpAddr, dataDir := a.RPCAddr().String(), a.HTTPAddr().String(), a.DataDir()
	a.Close()
	a.Close() // idempotent
	for _, addr := range []string{rpcAddr, httpAddr} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("%s still in use after Close: %v", addr, err)
			continue
		}
		ln.Close()
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Errorf("dev data dir %s still there after Close: %v", dataDir, err)
	}
	if err := a.Run(context.Background()); err == nil {
		t.Error("Run after Close succeeded")
	}
}
