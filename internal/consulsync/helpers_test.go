package consulsync

import (
	"context"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"

	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/consulsync/consultest"
	"github.com/csisupd/csisupd/internal/fingerprint"
	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/registry"
	"github.com/csisupd/csisupd/internal/retry"
	"github.com/csisupd/csisupd/internal/testutil"
)

func TestMain(m *testing.M) {
	// consul/api reads the process environment; the tests start from none
	// of the CONSUL_* variables of whoever runs them, and set what they
	// need with t.Setenv.
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "CONSUL_") {
			os.Unsetenv(name)
		}
	}
	goleak.VerifyTestMain(m)
}

// waitTimeout bounds every wait; conditions normally hold in milliseconds.
const waitTimeout = 10 * time.Second

// waitFor polls cond until it holds or waitTimeout passes.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, waitTimeout, what, cond)
}

// logBuffer collects log output safely across goroutines.
type logBuffer struct{ testutil.SyncBuffer }

func (l *logBuffer) Count(s string) int { return strings.Count(l.String(), s) }

// setEnv sets the environment variables of m for the test; the others
// stay as TestMain left them (unset).
func setEnv(t testing.TB, m map[string]string) {
	t.Helper()
	for k, v := range m {
		t.Setenv(k, v)
	}
}

func newAgent(t testing.TB, cfg consultest.Config) *consultest.Agent {
	t.Helper()
	a, err := consultest.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return a
}

// newClient returns a consul/api client of a, acting as an operator.
func newClient(t testing.TB, a *consultest.Agent, token string) *api.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c, err := api.NewClient(&api.Config{Address: a.Addr(), Token: token, Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// shortRetry is the syncer's default retry policy made short for tests:
// from 10 ms up to 50 ms, jittered as by default.
var shortRetry = func() retry.Policy {
	p := config.DefaultRetry().ConsulSync
	p.Base, p.Cap = 10*time.Millisecond, 50*time.Millisecond
	return p
}()

// baseConfig is a valid Config with the values the agent passes at the
// configuration's defaults, without a plugin source or an address of Consul.
func baseConfig() Config {
	def := config.Default().Consul
	return Config{
		ServiceName:          def.ServiceName,
		PluginServiceName:    def.PluginService,
		ServerServiceName:    def.ServerServiceName,
		DiscoveryWait:        def.DiscoveryWait,
		DiscoveryMinInterval: config.DefaultConsulDiscoveryMinInterval,
		ServicePort:          4780,
		GRPCCheck:            "127.0.0.1:4780",
		GRPCCheckInterval:    def.CheckInterval,
		GRPCCheckTimeout:     def.CheckTimeout(),
		SyncInterval:         def.SyncInterval,
		CheckTTL:             def.CheckTTL(),
		Probation:            config.DefaultConsulProbation,
		Retry:                config.DefaultRetry().ConsulSync,
		RequestTimeout:       config.DefaultConsulRequestTimeout,
		ShutdownTimeout:      5 * time.Second,
	}
}

// testConfig is a Config with short retries and no periodic passes unless
// a test sets SyncInterval. The service address is never dialled: Consul's
// gRPC check of the agent dials a loopback port nothing listens on.
func testConfig(reg *registry.Registry, addr string, logs *logBuffer) Config {
	c := baseConfig()
	c.Plugins = reg.Source()
	c.Address = addr
	c.ServiceAddress = "10.1.2.3"
	c.GRPCCheck = "127.0.0.1:9"
	c.NodeName = "node-1"
	c.Tags = []string{"team-a"}
	// The TTL the configuration derives for an hour between passes.
	hourly := config.Default().Consul
	hourly.SyncInterval = time.Hour
	c.SyncInterval, c.CheckTTL = hourly.SyncInterval, hourly.CheckTTL()
	c.Retry = shortRetry
	c.DiscoveryMinInterval = 10 * time.Millisecond
	c.Probation = time.Hour
	c.Logger = hclog.New(&hclog.LoggerOptions{
		Name:   "consul",
		Level:  hclog.Debug,
		Output: logs,
	})
	return c
}

// running is a Syncer whose Run goroutine ends with the test.
type running struct {
	s      *Syncer
	cancel context.CancelFunc
	done   chan error
}

func start(t testing.TB, cfg Config) *running {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{s: s, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- s.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop ends Run and returns its error; later calls return nil.
func (r *running) stop(t testing.TB) error {
	t.Helper()
	r.cancel()
	select {
	case err, ok := <-r.done:
		if ok {
			close(r.done)
		}
		return err
	case <-time.After(waitTimeout):
		t.Fatal("Run did not return after its context ended")
		return nil
	}
}

func socket(id string, inode uint64) plugin.Instance {
	return plugin.Instance{Path: "/run/csi/" + id + "/csi.sock", Inode: inode}
}

func fprint(version string, typ plugin.Type) *fingerprint.Fingerprint {
	return &fingerprint.Fingerprint{VendorName: "example.csi.io", VendorVersion: version, Type: typ}
}

// addPlugin registers a fingerprinted plugin with a health state.
func addPlugin(reg *registry.Registry, id, version string, typ plugin.Type, state heartbeat.State, desc string) plugin.Instance {
	inst := socket(id, 1)
	reg.Register(id, inst, fprint(version, typ))
	reg.SetHealth(id, inst, heartbeat.Result{State: state, Description: desc})
	return inst
}

// synced reports whether the agent holds the service and TTL check csisupd
// wants for every plugin in reg, plus the agent service.
func synced(a *consultest.Agent, reg *registry.Registry) bool {
	plugins := reg.List()
	own := 0
	for id := range a.Services() {
		if isOwn(id) {
			own++
		}
	}
	if own != len(plugins)+1 {
		return false
	}
	if _, ok := a.Service(AgentServiceID); !ok {
		return false
	}
	for _, p := range plugins {
		svc, ok := a.Service(PluginServiceID(p.ID))
		if !ok || svc.Meta[metaVendorVersion] != p.Fingerprint.VendorVersion {
			return false
		}
		chk, ok := a.Check(PluginCheckID(p.ID))
		status, output := checkState(p.Proto())
		if !ok || chk.Status != status || chk.Output != output {
			return false
		}
	}
	return true
}
