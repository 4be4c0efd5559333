package registry

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testregistrar"
	"github.com/csisupd/csisupd/internal/testutil"
)

// stageThrough sends one NodeStageVolume to plugin id through the
// connection the registry supervises, as the node volume manager does.
// The volume is unknown to the plugin, so the call fails; what matters is
// which plugin received it.
func stageThrough(t *testing.T, m *Manager, id string) {
	t.Helper()
	_, c, ok := m.Lookup(id)
	if !ok || c == nil {
		t.Fatalf("no connection to plugin %s", id)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = c.Node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId:          "v1",
		StagingTargetPath: filepath.Join(t.TempDir(), "staging"),
		VolumeCapability: &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		},
	})
}

// A kubelet registration naming the id of a healthy plugin with volumes on
// the node, at another socket, is refused and told why; the plugin keeps
// its socket and the next NodeStageVolume reaches it. Once its socket has
// been gone for the grace period (and the plugin deregistered), the same
// registrar, restarted as the sidecar is after a refusal, is accepted.
func TestKubeletRegistrationCannotTakeOverPluginInUse(t *testing.T) {
	root := testutil.TempDir(t)
	dir := filepath.Join(root, "plugins")
	holder := filepath.Join(dir, "tp", SocketName)
	original := startPlugin(t, holder, testplugin.Config{Type: testplugin.TypeNode, NodeID: "original"})
	endpoint := filepath.Join(root, "k", "tp", SocketName)
	newcomer := startPlugin(t, endpoint, testplugin.Config{Type: testplugin.TypeNode, NodeID: "newcomer"})
	regDir := filepath.Join(root, "plugins_registry")
	const grace = time.Second
	m := startManager(t, ManagerConfig{
		PluginDir:              dir,
		KubeletRegistrationDir: regDir,
		DeregisterGrace:        grace,
		InUse:                  func(id string) bool { return id == "tp" }, // a claim of tp is mounted here
	})
	reg := m.Registry()
	testutil.WaitFor(t, 10*time.Second, "the original plugin healthy", func() bool { return healthOf(reg, "tp") == "healthy" })

	cfg := testregistrar.Config{Dir: regDir, Driver: "tp", Endpoint: endpoint}
	r := startRegistrar(t, cfg)
	st := waitStatus(t, r, 1)
	if st.Registered || !strings.Contains(st.Error, `"tp"`) || !strings.Contains(st.Error, holder) || !strings.Contains(st.Error, "in use") {
		t.Fatalf("the registrar was told %+v; want refused naming the id, the socket %s that holds it and why", st, holder)
	}
	ev, ok := findEvent(reg, "tp", plugin.EventConflict)
	if !ok || !strings.Contains(ev.Description, holder) || !strings.Contains(ev.Description, endpoint) {
		t.Errorf("plugin-conflict = %+v (found %v); want one naming %s and %s", ev, ok, holder, endpoint)
	}
	if p, _ := reg.Get("tp"); p.Instance.Path != holder || p.Fingerprint.NodeID != "original" {
		t.Fatalf("after the refused registration tp is at %s (node id %q); want the original at %s", p.Instance.Path, p.Fingerprint.NodeID, holder)
	}
	stageThrough(t, m, "tp")
	if got, stray := original.Stats().Calls["NodeStageVolume"], newcomer.Stats().Calls["NodeStageVolume"]; got != 1 || stray != 0 {
		t.Fatalf("NodeStageVolume reached the original plugin %d times and the newcomer %d times; want 1 and 0", got, stray)
	}

	// The original plugin goes away: in use, its id stays held for the
	// grace period, then it is deregistered.
	r.Stop()
	original.Stop()
	testutil.WaitFor(t, 10*time.Second, "the original plugin deregistered", func() bool {
		_, ok := findEvent(reg, "tp", plugin.EventDeregistered)
		return ok
	})
	r = startRegistrar(t, cfg)
	if st := waitStatus(t, r, 1); !st.Registered {
		t.Fatalf("the restarted registrar was told %+v once the holder was gone; want registered", st)
	}
	if p, _ := reg.Get("tp"); p.Instance.Path != endpoint || p.Fingerprint.NodeID != "newcomer" {
		t.Fatalf("tp is at %s (node id %q); want the newcomer at %s", p.Instance.Path, p.Fingerprint.NodeID, endpoint)
	}
	if n := countEvents(reg, "tp", plugin.EventConflict); n != 1 {
		t.Errorf("%d plugin-conflict events, want 1", n)
	}
}

// A later socket of higher precedence does not take over a healthy
// plugin; once the holder is no longer healthy (and has no volumes), the
// order of the sources decides again, without waiting for a rescan.
func TestDeclarationWaitsForHealthyHolder(t *testing.T) {
	root := testutil.TempDir(t)
	dir := filepath.Join(root, "plugins")
	holder := filepath.Join(dir, "tp", SocketName)
	original := startPlugin(t, holder, testplugin.Config{Type: testplugin.TypeNode, NodeID: "original"})
	declared := filepath.Join(root, "d", SocketName)
	startPlugin(t, declared, testplugin.Config{Type: testplugin.TypeNode, NodeID: "declared"})
	m := startManager(t, ManagerConfig{PluginDir: dir, RescanInterval: time.Hour, DeregisterGrace: time.Hour})
	reg := m.Registry()
	testutil.WaitFor(t, 10*time.Second, "the original plugin healthy", func() bool { return healthOf(reg, "tp") == "healthy" })

	if err := m.SetDeclarations(map[string]Declaration{"tp": {Socket: declared}}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "plugin-conflict", func() bool { return countEvents(reg, "tp", plugin.EventConflict) == 1 })
	ev, _ := findEvent(reg, "tp", plugin.EventConflict)
	if !strings.Contains(ev.Description, holder) || !strings.Contains(ev.Description, declared) || !strings.Contains(ev.Description, "in use") {
		t.Errorf("plugin-conflict %q; want it to name %s, %s and why the first holds the id", ev.Description, holder, declared)
	}
	if p, _ := reg.Get("tp"); p.Instance.Path != holder {
		t.Fatalf("tp moved to %s while healthy", p.Instance.Path)
	}

	original.Stop()
	testutil.WaitFor(t, 10*time.Second, "the declared socket supervised", func() bool {
		p, ok := reg.Get("tp")
		return ok && p.Healthy() && p.Instance.Path == declared && p.Fingerprint.NodeID == "declared"
	})
}

// A registration is refused, naming what is wrong, when its endpoint is a
// symlink, lies outside client.kubelet_endpoint_dirs, or is a socket that
// serves another plugin id already.
func TestKubeletEndpointRefused(t *testing.T) {
	tests := []struct {
		name string
		// endpoint returns the endpoint to register under driver "drv",
		// given the test's root and the serving plugin's socket, and the
		// texts the refusal must contain.
		endpoint func(t *testing.T, root, serving string) (string, []string)
		dirs     func(root string) []string
	}{
		{
			name: "a symlink",
			endpoint: func(t *testing.T, root, serving string) (string, []string) {
				real := filepath.Join(root, "k", "real", SocketName)
				startPlugin(t, real, testplugin.Config{Type: testplugin.TypeNode})
				link := filepath.Join(root, "k", "link.sock")
				if err := os.Symlink(real, link); err != nil {
					t.Fatal(err)
				}
				return link, []string{link, "symlink"}
			},
		},
		{
			name: "outside kubelet_endpoint_dirs",
			endpoint: func(t *testing.T, root, serving string) (string, []string) {
				ep := filepath.Join(root, "elsewhere", SocketName)
				startPlugin(t, ep, testplugin.Config{Type: testplugin.TypeNode})
				return ep, []string{ep, filepath.Join(root, "allowed"), "client.kubelet_endpoint_dirs"}
			},
			dirs: func(root string) []string { return []string{filepath.Join(root, "allowed")} },
		},
		{
			name: "a socket serving another id",
			endpoint: func(t *testing.T, root, serving string) (string, []string) {
				return serving, []string{serving, strconv.Quote("a"), strconv.Quote("drv")}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := testutil.TempDir(t)
			dir := filepath.Join(root, "plugins")
			serving := filepath.Join(dir, "a", SocketName)
			startPlugin(t, serving, testplugin.Config{Type: testplugin.TypeNode})
			regDir := filepath.Join(root, "reg")
			cfg := ManagerConfig{PluginDir: dir, KubeletRegistrationDir: regDir}
			if tt.dirs != nil {
				cfg.KubeletEndpointDirs = tt.dirs(root)
			}
			m := startManager(t, cfg)
			reg := m.Registry()
			testutil.WaitFor(t, 10*time.Second, "plugin a healthy", func() bool { return healthOf(reg, "a") == "healthy" })

			endpoint, want := tt.endpoint(t, root, serving)
			r := startRegistrar(t, testregistrar.Config{Dir: regDir, Driver: "drv", Endpoint: endpoint})
			st := waitStatus(t, r, 1)
			if st.Registered {
				t.Fatalf("registration of %s accepted", endpoint)
			}
			for _, w := range want {
				if !strings.Contains(st.Error, w) {
					t.Errorf("refusal %q does not contain %q", st.Error, w)
				}
			}
			if _, ok := reg.Get("drv"); ok {
				t.Error("drv is registered after its registration was refused")
			}
			if p, _ := reg.Get("a"); p.Instance.Path != serving || !p.Healthy() {
				t.Errorf("plugin a is at %s (healthy %v) after the refusal; want it at %s, healthy", p.Instance.Path, p.Healthy(), serving)
			}
		})
	}
}
