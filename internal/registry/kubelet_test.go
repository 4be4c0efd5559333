package registry

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testregistrar"
	"github.com/csisupd/csisupd/internal/testutil"
)

// startRegistrar starts a node-driver-registrar double in dir, stopped
// when the test ends.
func startRegistrar(t *testing.T, cfg testregistrar.Config) *testregistrar.Registrar {
	t.Helper()
	if err := os.MkdirAll(cfg.Dir, 0o750); err != nil {
		t.Fatal(err)
	}
	r, err := testregistrar.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r
}

// waitStatus waits for the registrar's nth NotifyRegistrationStatus.
func waitStatus(t *testing.T, r *testregistrar.Registrar, n int) testregistrar.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	st, err := r.WaitStatus(ctx, n-1)
	if err != nil {
		t.Fatalf("registration status %d: %v (received %v)", n, err, r.Statuses())
	}
	return st
}

// The registrar flow: a registration socket names the driver and its
// endpoint; the endpoint is supervised under the driver name, the registrar
// is told it is registered once the plugin is fingerprinted, and the
// plugin is deregistered a grace period after the registration socket goes.
func TestKubeletRegistration(t *testing.T) {
	root := testutil.TempDir(t)
	regDir := filepath.Join(root, "plugins_registry")
	endpoint := filepath.Join(root, "plugins", "ebs.csi.aws.com", "csi.sock")
	startPlugin(t, endpoint, testplugin.Config{Type: testplugin.TypeNode})
	const grace = 500 * time.Millisecond
	m := startManager(t, ManagerConfig{
		PluginDir:              filepath.Join(root, "csisupd"),
		KubeletRegistrationDir: regDir,
		DeregisterGrace:        grace,
	})
	reg := m.Registry()
	r := startRegistrar(t, testregistrar.Config{Dir: regDir, Driver: "ebs.csi.aws.com", Endpoint: "unix://" + endpoint})

	if st := waitStatus(t, r, 1); !st.Registered || st.Error != "" {
		t.Fatalf("registration status = %+v, want registered", st)
	}
	p, ok := reg.Get("ebs.csi.aws.com")
	if !ok || !p.Fingerprinted || p.Instance.Path != endpoint {
		t.Fatalf("record when the registrar was told = %+v (found %v); want the endpoint fingerprinted", p, ok)
	}
	testutil.WaitFor(t, 10*time.Second, "plugin healthy", func() bool { return healthOf(reg, "ebs.csi.aws.com") == "healthy" })

	// SIGTERM to node-driver-registrar removes its socket.
	stopped := time.Now()
	r.Stop()
	testutil.WaitFor(t, 10*time.Second, "plugin deregistered", func() bool { return healthOf(reg, "ebs.csi.aws.com") == "absent" })
	ev, _ := findEvent(reg, "ebs.csi.aws.com", plugin.EventDeregistered)
	if waited := ev.Time.Sub(stopped); waited < grace {
		t.Errorf("deregistered %s after the registration socket went, before the grace period %s", waited, grace)
	}
	if n := len(r.Statuses()); n != 1 {
		t.Errorf("the registrar was notified %d times, want once", n)
	}
}

// A registration kubelet's CSI handler would refuse is told why, and
// nothing is supervised.
func TestKubeletRegistrationRefused(t *testing.T) {
	tests := []struct {
		name     string
		cfg      testregistrar.Config
		inReason string
	}{
		{"not a CSI plugin", testregistrar.Config{Type: "DRAPlugin"}, `unsupported plugin type "DRAPlugin"`},
		{"no supported version", testregistrar.Config{Versions: []string{"0.3.0", "2.0.0"}}, "no supported version"},
		{"relative endpoint", testregistrar.Config{Endpoint: "csi.sock"}, "not an absolute path"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := testutil.TempDir(t)
			endpoint := filepath.Join(root, "ep", "csi.sock")
			startPlugin(t, endpoint, testplugin.Config{Type: testplugin.TypeNode})
			regDir := filepath.Join(root, "reg")
			m := startManager(t, ManagerConfig{PluginDir: filepath.Join(root, "csisupd"), KubeletRegistrationDir: regDir})
			cfg := tt.cfg
			cfg.Dir, cfg.Driver = regDir, "drv"
			if cfg.Endpoint == "" {
				cfg.Endpoint = endpoint
			}
			r := startRegistrar(t, cfg)
			st := waitStatus(t, r, 1)
			if st.Registered || !strings.Contains(st.Error, tt.inReason) {
				t.Errorf("registration status = %+v, want refused with %q", st, tt.inReason)
			}
			testutil.WaitFor(t, 10*time.Second, "the refusal listed", func() bool {
				return slices.ContainsFunc(m.Registry().Ignored(), func(i plugin.Ignored) bool {
					return i.Path == r.Socket() && strings.Contains(i.Reason, tt.inReason)
				})
			})
			if got := m.Registry().List(); len(got) != 0 {
				t.Errorf("supervising %v after a refused registration", got)
			}
		})
	}
}

// Conflicts with a kubelet registration: one plugin, one plugin-conflict
// naming both paths, the same winner after a restart, and a losing
// registrar told why.
func TestKubeletConflicts(t *testing.T) {
	t.Run("kubelet over discovered", func(t *testing.T) {
		root := testutil.TempDir(t)
		dir := filepath.Join(root, "plugins")
		discovered := filepath.Join(dir, "drv", SocketName)
		endpoint := filepath.Join(root, "k", "csi.sock")
		startPlugin(t, discovered, testplugin.Config{Type: testplugin.TypeNode, NodeID: "discovered"})
		startPlugin(t, endpoint, testplugin.Config{Type: testplugin.TypeNode, NodeID: "kubelet"})
		regDir := filepath.Join(root, "reg")
		r := startRegistrar(t, testregistrar.Config{Dir: regDir, Driver: "drv", Endpoint: endpoint})
		cfg := ManagerConfig{PluginDir: dir, DataDir: filepath.Join(root, "data"), KubeletRegistrationDir: regDir}
		for run := 1; run <= 2; run++ {
			m := newTestManager(t, cfg)
			stop := runManager(t, m)
			reg := m.Registry()
			testutil.WaitFor(t, 10*time.Second, "the kubelet endpoint supervised", func() bool {
				p, ok := reg.Get("drv")
				return ok && p.Healthy() && p.Instance.Path == endpoint && p.Fingerprint.NodeID == "kubelet"
			})
			testutil.WaitFor(t, 10*time.Second, "plugin-conflict", func() bool { return countEvents(reg, "drv", plugin.EventConflict) == 1 })
			ev, _ := findEvent(reg, "drv", plugin.EventConflict)
			if !strings.Contains(ev.Description, endpoint) || !strings.Contains(ev.Description, discovered) {
				t.Errorf("run %d: plugin-conflict %q does not name both paths", run, ev.Description)
			}
			if st := waitStatus(t, r, run); !st.Registered {
				t.Errorf("run %d: the winning registrar was told %+v", run, st)
			}
			stop()
			if n := countEvents(reg, "drv", plugin.EventConflict); n != 1 {
				t.Errorf("run %d: %d plugin-conflict events, want 1", run, n)
			}
			// The restarted agent supervises the endpoint from the start:
			// its record, restored, is never taken over by the socket of
			// the plugin directory.
			if n, want := countEvents(reg, "drv", plugin.EventRegistered), 2-run; n != want {
				t.Errorf("run %d: %d plugin-registered events, want %d", run, n, want)
			}
		}
	})

	t.Run("declared over kubelet", func(t *testing.T) {
		root := testutil.TempDir(t)
		declared := filepath.Join(root, "d", "csi.sock")
		endpoint := filepath.Join(root, "k", "csi.sock")
		startPlugin(t, declared, testplugin.Config{Type: testplugin.TypeNode, NodeID: "declared"})
		startPlugin(t, endpoint, testplugin.Config{Type: testplugin.TypeNode, NodeID: "kubelet"})
		regDir := filepath.Join(root, "reg")
		r := startRegistrar(t, testregistrar.Config{Dir: regDir, Driver: "drv", Endpoint: endpoint})
		cfg := ManagerConfig{
			PluginDir:              filepath.Join(root, "plugins"),
			DataDir:                filepath.Join(root, "data"),
			KubeletRegistrationDir: regDir,
			Declarations:           map[string]Declaration{"drv": {Socket: declared}},
		}
		for run := 1; run <= 2; run++ {
			m := newTestManager(t, cfg)
			stop := runManager(t, m)
			reg := m.Registry()
			st := waitStatus(t, r, run)
			if st.Registered || !strings.Contains(st.Error, declared) {
				t.Errorf("run %d: losing registrar told %+v, want refused naming the declared socket %s", run, st, declared)
			}
			testutil.WaitFor(t, 10*time.Second, "the declared socket supervised", func() bool {
				p, ok := reg.Get("drv")
				return ok && p.Healthy() && p.Instance.Path == declared
			})
			stop()
			if n := countEvents(reg, "drv", plugin.EventConflict); n != 1 {
				t.Errorf("run %d: %d plugin-conflict events, want 1", run, n)
			}
			if n, want := countEvents(reg, "drv", plugin.EventRegistered), 2-run; n != want {
				t.Errorf("run %d: %d plugin-registered events, want %d", run, n, want)
			}
		}
	})
}
