package rpc

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"github.com/kubernetes-csi/csi-test/v5/driver"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"go.uber.org/mock/gomock"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/fingerprint"
	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/registry"
	"github.com/csisupd/csisupd/internal/retry"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
	"github.com/csisupd/csisupd/internal/testutil/sanitytest"
)

// TestMain checks that no test leaves goroutines behind. It is the package's
// only TestMain.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, sanitytest.IgnoreGinkgo())
}

// testLogger logs through t when -v is given, else discards.
func testLogger(t testing.TB) hclog.Logger {
	if !testing.Verbose() {
		return hclog.NewNullLogger()
	}
	return hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Debug, Output: logWriter{t}})
}

type logWriter struct{ t testing.TB }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

// serveClientCSI serves a ClientCSI over plugins on a unix socket in dir and
// returns a client connected to it. Both end with the test. A zero
// cfg.Retry is shortRetry; zero limits are the configuration's defaults.
func serveClientCSI(t testing.TB, dir string, cfg ClientCSIConfig) csisupdv1.ClientCSIClient {
	t.Helper()
	auth, err := NewAuthorizer(AuthConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return serveClientCSIOn(t, filepath.Join(dir, "agent.sock"), cfg, agentServerOptions(t, auth),
		[]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())})
}

// agentServerOptions returns the options of an agent's gRPC server with
// authorizer auth (ServerOptions), its metrics in a registry of their own.
func agentServerOptions(t testing.TB, auth *Authorizer) []grpc.ServerOption {
	t.Helper()
	m, err := NewGRPCMetrics(prometheus.NewRegistry(), config.LatencyBuckets())
	if err != nil {
		t.Fatal(err)
	}
	return ServerOptions(m, auth)
}

// serveClientCSIOn serves ClientCSI on the unix socket sock of a gRPC
// server with srvOpts and returns a client dialled with dialOpts.
func serveClientCSIOn(t testing.TB, sock string, cfg ClientCSIConfig, srvOpts []grpc.ServerOption, dialOpts []grpc.DialOption) csisupdv1.ClientCSIClient {
	t.Helper()
	if cfg.Retry == (retry.Policy{}) {
		cfg.Retry = shortRetry
	}
	if cfg.RPCTimeout == 0 {
		cfg.RPCTimeout = config.DefaultRPCTimeout
	}
	if cfg.MaxDestructiveInFlight == 0 {
		cfg.MaxDestructiveInFlight = config.DefaultMaxDestructiveInFlight
	}
	svc, err := NewClientCSI(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(srvOpts...)
	svc.Register(srv)
	testutil.ServeGRPC(t, testutil.ListenUnix(t, sock), srv)
	return csisupdv1.NewClientCSIClient(testutil.DialGRPC(t, "unix://"+sock, dialOpts...))
}

// fixedPlugins is a PluginLookup over a real registry store whose records
// the test writes itself, with one csiclient connection per plugin. Tests
// use it to put plugins in states (unhealthy, without capabilities) that a
// running supervisor would correct.
type fixedPlugins struct {
	reg *registry.Registry

	mu      sync.Mutex
	clients map[string]*csiclient.Client
}

func newFixedPlugins() *fixedPlugins {
	return &fixedPlugins{reg: registry.New(registry.Config{}), clients: make(map[string]*csiclient.Client)}
}

func (f *fixedPlugins) Lookup(id string) (*csisupdv1.Plugin, *csiclient.Client, bool) {
	p, ok := f.reg.Get(id)
	if !ok {
		return nil, nil, false
	}
	f.mu.Lock()
	c := f.clients[id]
	f.mu.Unlock()
	return p.Proto(), c, c != nil
}

// add registers plugin id at socket with fingerprint fp and health state h,
// connected through a real csiclient.
func (f *fixedPlugins) add(t testing.TB, id, socket string, fp fingerprint.Fingerprint, h heartbeat.State) {
	t.Helper()
	c, err := csiclient.New(csiclient.Config{Socket: socket, Redial: testRetry.PluginRedial})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	inst := plugin.Instance{Path: socket}
	f.reg.Register(id, inst, &fp)
	f.reg.SetHealth(id, inst, heartbeat.Result{State: h, Description: "set by the test", At: time.Now()})
	f.mu.Lock()
	f.clients[id] = c
	f.mu.Unlock()
}

// controllerFingerprint is the fingerprint of a controller plugin with the
// given controller capabilities.
func controllerFingerprint(caps ...csi.ControllerServiceCapability_RPC_Type) fingerprint.Fingerprint {
	fp := fingerprint.Fingerprint{
		VendorName:         "mock.csi.test",
		Type:               plugin.TypeController,
		PluginCapabilities: []string{"CONTROLLER_SERVICE"},
	}
	for _, c := range caps {
		fp.ControllerCapabilities = append(fp.ControllerCapabilities, c.String())
	}
	return fp
}

// allControllerCaps are the capabilities every ClientCSI method needs.
var allControllerCaps = []csi.ControllerServiceCapability_RPC_Type{
	csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
	csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
	csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
	csi.ControllerServiceCapability_RPC_GET_VOLUME,
	csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
	csi.ControllerServiceCapability_RPC_GET_CAPACITY,
	csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
	csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
	csi.ControllerServiceCapability_RPC_GET_SNAPSHOT,
	csi.ControllerServiceCapability_RPC_MODIFY_VOLUME,
	csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH,
	csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH,
}

// mockReporter lets gomock fail the test from a gRPC handler goroutine,
// where t.Fatalf must not be called: Fatalf records the failure and ends
// only the calling goroutine.
type mockReporter struct{ t *testing.T }

func (r mockReporter) Errorf(format string, args ...any) { r.t.Errorf(format, args...) }
func (r mockReporter) Fatalf(format string, args ...any) {
	r.t.Errorf(format, args...)
	runtime.Goexit()
}
func (r mockReporter) Helper()          {}
func (r mockReporter) Cleanup(f func()) { r.t.Cleanup(f) }

// startMockController serves csi-test's gomock controller on a unix socket
// in dir, with only the Controller service, and returns the mock and the
// socket.
func startMockController(t *testing.T, dir string) (*driver.MockControllerServer, string) {
	t.Helper()
	ctrl := gomock.NewController(mockReporter{t})
	mc := driver.NewMockControllerServer(ctrl)
	d := driver.NewCSIDriver(&driver.CSIDriverServers{
		Controller: struct {
			csi.UnsafeControllerServer
			*driver.MockControllerServer
		}{MockControllerServer: mc},
	})
	sock := filepath.Join(dir, "mock.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(l); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	return mc, sock
}

// mockEnv is a ClientCSI over one gomock controller plugin registered as
// "mock" in a real registry.
// testRetry holds the agent's default backoff policies.
var testRetry = config.DefaultRetry()

// shortRetry is ClientCSI's default retry policy made short for tests:
// waits of 1 ms and 2 ms before jitter, which stays as it is.
var shortRetry = func() retry.Policy {
	p := testRetry.ClientCSI
	p.Base, p.Cap = time.Millisecond, 2*time.Millisecond
	return p
}()

type mockEnv struct {
	mock    *driver.MockControllerServer
	plugins *fixedPlugins
	client  csisupdv1.ClientCSIClient
	socket  string
	logs    *testutil.SyncBuffer
}

// newMockEnv starts the mock plugin with fingerprint fp and health h, and a
// ClientCSI over it configured by cfg (Plugins and Logger are filled in).
func newMockEnv(t *testing.T, fp fingerprint.Fingerprint, h heartbeat.State, cfg ClientCSIConfig) *mockEnv {
	t.Helper()
	dir := testutil.TempDir(t)
	mc, sock := startMockController(t, dir)
	plugins := newFixedPlugins()
	plugins.add(t, "mock", sock, fp, h)
	logs := &testutil.SyncBuffer{}
	cfg.Plugins = plugins
	if cfg.Logger == nil {
		cfg.Logger = hclog.New(&hclog.LoggerOptions{Level: hclog.Trace, Output: logs})
	}
	client := serveClientCSI(t, dir, cfg)
	return &mockEnv{mock: mc, plugins: plugins, client: client, socket: sock, logs: logs}
}

// managedEnv is a real agent's plugin side: a registry.Manager watching a
// plugin directory with one testplugin in it, and ClientCSI over the
// manager.
type managedEnv struct {
	dir     string
	plugin  *testplugin.Plugin
	manager *registry.Manager
	client  csisupdv1.ClientCSIClient
}

// newManagedEnv starts testplugin id (configured by pcfg; Socket and
// StateDir are filled in) in a plugin directory watched by a real
// registry.Manager, waits until the plugin is healthy and fingerprinted, and
// serves ClientCSI (configured by cfg; Plugins is filled in) over the
// manager.
func newManagedEnv(t testing.TB, id string, pcfg testplugin.Config, cfg ClientCSIConfig, logger hclog.Logger) *managedEnv {
	t.Helper()
	dir := testutil.TempDir(t)
	pluginDir := filepath.Join(dir, "plugins")
	if logger == nil {
		logger = testLogger(t)
	}
	pcfg.Socket = filepath.Join(pluginDir, id, "csi.sock")
	pcfg.StateDir = filepath.Join(dir, "state")
	p, err := testplugin.New(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)

	m, err := registry.NewManager(registry.ManagerConfig{
		PluginDir:           pluginDir,
		ProbeInterval:       200 * time.Millisecond,
		ProbeTimeout:        200 * time.Millisecond,
		FingerprintInterval: 10 * time.Second,
		RescanInterval:      time.Second,
		PluginRedial:        testRetry.PluginRedial,
		FingerprintRetry:    testRetry.Fingerprint,
		Logger:              logger.Named("registry"),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("registry manager: %v", err)
		}
	})
	testutil.WaitFor(t, 20*time.Second, "plugin "+id+" to be healthy and fingerprinted", func() bool {
		rec, c, ok := m.Lookup(id)
		return ok && c != nil && rec.GetHealthy()
	})

	cfg.Plugins = m
	if cfg.Logger == nil {
		cfg.Logger = logger
	}
	client := serveClientCSI(t, dir, cfg)
	return &managedEnv{dir: dir, plugin: p, manager: m, client: client}
}
