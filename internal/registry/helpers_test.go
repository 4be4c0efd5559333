package registry

import (
	"context"
	"github.com/csisupd/csisupd/internal/plugin"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/retry"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// testPluginBin is csi-testplugin, built once by TestMain, for tests that
// need a plugin process to stop with SIGSTOP.
var testPluginBin string

func TestMain(m *testing.M) {
	testutil.RunWithBinaries(m, testutil.Binary{
		Pkg: "github.com/csisupd/csisupd/internal/testplugin/cmd/csi-testplugin", Path: &testPluginBin})
}

// testLogger logs through t when -v is given, else discards.
func testLogger(t *testing.T) hclog.Logger {
	if !testing.Verbose() {
		return hclog.NewNullLogger()
	}
	return hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Debug, Output: hclogWriter{t}})
}

type hclogWriter struct{ t *testing.T }

func (w hclogWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// listenUnix creates a unix socket at path that accepts nothing; it is
// closed (and the file removed) when the test ends.
func listenUnix(t *testing.T, path string) *net.UnixListener {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// socketFile leaves a unix socket file at path with nobody listening.
func socketFile(t *testing.T, path string) {
	t.Helper()
	l := listenUnix(t, path)
	l.SetUnlinkOnClose(false)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// writeFile creates a regular file (and its directory).
func writeFile(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("not a socket"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// newPlugin creates a test CSI plugin on socket with its state in a fresh
// directory; it is stopped when the test ends. It does not start it.
func newPlugin(t *testing.T, socket string, cfg testplugin.Config) *testplugin.Plugin {
	t.Helper()
	cfg.Socket = socket
	if cfg.StateDir == "" {
		cfg.StateDir = testutil.TempDir(t)
	}
	if cfg.NodeID == "" {
		cfg.NodeID = "node-1"
	}
	p, err := testplugin.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

// startPlugin creates and starts a test CSI plugin on socket.
func startPlugin(t *testing.T, socket string, cfg testplugin.Config) *testplugin.Plugin {
	t.Helper()
	p := newPlugin(t, socket, cfg)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	return p
}

// testTiming is the default probe schedule of tests. The first probe and
// fingerprint are immediate; the timeout is generous so that a busy machine
// does not turn into unexpected health events. Tests that count probes set
// their own.
var testTiming = timing{
	ProbeInterval:       2 * time.Second,
	ProbeTimeout:        2 * time.Second,
	FingerprintInterval: time.Minute,
}

// testRetry holds the agent's default backoff policies, which the tests'
// supervisors use.
var testRetry = config.DefaultRetry()

// kubeletDefaults gives a config with a kubelet registration directory
// the agent's defaults of the kubelet settings it lacks.
func kubeletDefaults(cfg *ManagerConfig) {
	if cfg.KubeletRegistrationDir == "" {
		return
	}
	if cfg.KubeletEndpointDirs == nil {
		cfg.KubeletEndpointDirs = config.ClientConfig{PluginDir: cfg.PluginDir, KubeletRegistrationDir: cfg.KubeletRegistrationDir}.EndpointDirs()
	}
	if cfg.KubeletRetry == (retry.Policy{}) {
		cfg.KubeletRetry = testRetry.KubeletRegistration
	}
}

// fastTiming fails fast, for tests of sockets that do not answer, where a
// slow machine changes no outcome.
var fastTiming = timing{
	ProbeInterval:       200 * time.Millisecond,
	ProbeTimeout:        200 * time.Millisecond,
	FingerprintInterval: time.Minute,
}

// runManager starts m.Run and returns a function that stops it and fails
// the test when Run returned an error. The test's end stops it too.
func runManager(t *testing.T, m *Manager) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- m.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-errc; err != nil {
				t.Errorf("Manager.Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// newTestManager creates a manager with fast timings: cfg's zero durations
// get test values.
func newTestManager(t *testing.T, cfg ManagerConfig) *Manager {
	t.Helper()
	if cfg.ProbeInterval == 0 {
		cfg.ProbeInterval = testTiming.ProbeInterval
	}
	if cfg.ProbeTimeout == 0 {
		cfg.ProbeTimeout = testTiming.ProbeTimeout
	}
	if cfg.FingerprintInterval == 0 {
		cfg.FingerprintInterval = testTiming.FingerprintInterval
	}
	if cfg.DeregisterGrace == 0 {
		cfg.DeregisterGrace = 400 * time.Millisecond
	}
	if cfg.RescanInterval == 0 {
		cfg.RescanInterval = time.Second
	}
	if cfg.PluginRedial == (retry.Policy{}) {
		cfg.PluginRedial = testRetry.PluginRedial
	}
	if cfg.FingerprintRetry == (retry.Policy{}) {
		cfg.FingerprintRetry = testRetry.Fingerprint
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	kubeletDefaults(&cfg)
	m, err := NewManager(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// startManager creates a manager (see newTestManager), runs it until the
// test ends and waits until it is ready.
func startManager(t *testing.T, cfg ManagerConfig) *Manager {
	t.Helper()
	m := newTestManager(t, cfg)
	runManager(t, m)
	awaitReady(t, m)
	return m
}

func awaitReady(t *testing.T, m *Manager) {
	t.Helper()
	select {
	case <-m.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("manager not ready after 10s")
	}
}

// healthOf returns the plugin's health state, or "absent".
func healthOf(reg *Registry, id string) string {
	p, ok := reg.Get(id)
	if !ok {
		return "absent"
	}
	return string(p.Health.State)
}

// eventsOf returns the types of the buffered events of plugin id.
func eventsOf(reg *Registry, id string) []plugin.EventType {
	var out []plugin.EventType
	evs, _ := reg.Events(0)
	for _, e := range evs {
		if e.PluginID == id {
			out = append(out, e.Type)
		}
	}
	return out
}

// findEvent returns the first buffered event of plugin id with type typ.
func findEvent(reg *Registry, id string, typ plugin.EventType) (plugin.Event, bool) {
	evs, _ := reg.Events(0)
	for _, e := range evs {
		if e.PluginID == id && e.Type == typ {
			return e, true
		}
	}
	return plugin.Event{}, false
}

// statSocket returns the identity of the socket at path.
func statSocket(t *testing.T, path string) plugin.Instance {
	t.Helper()
	si, reason, err := lstatSocket(path)
	if err != nil {
		t.Fatal(err)
	}
	if reason != "" {
		t.Fatalf("%s: %s", path, reason)
	}
	return si
}
