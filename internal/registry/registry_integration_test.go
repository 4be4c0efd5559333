package registry

import (
	"context"
	"fmt"
	"github.com/csisupd/csisupd/internal/plugin"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// These tests run the whole node-side registry over real unix sockets, with
// real CSI plugins (internal/testplugin) in the same process.

const waitLong = 15 * time.Second

func TestIntegrationPluginsBeforeAndAfterStart(t *testing.T) {
	t.Parallel()
	dir := testutil.TempDir(t)
	startPlugin(t, filepath.Join(dir, "early", SocketName), testplugin.Config{Type: testplugin.TypeMonolith, NodeID: "node-a"})
	m := startManager(t, ManagerConfig{PluginDir: dir})
	reg := m.Registry()
	startPlugin(t, filepath.Join(dir, "late"+SocketSuffix), testplugin.Config{Type: testplugin.TypeMonolith, NodeID: "node-a"})

	for _, id := range []string{"early", "late"} {
		testutil.WaitFor(t, waitLong, id+" healthy", func() bool { return healthOf(reg, id) == "healthy" })
		p, _ := reg.Get(id)
		if p.Fingerprint.Type != plugin.TypeMonolith || p.Fingerprint.NodeID != "node-a" {
			t.Errorf("%s: type %s node id %q, want monolith on node-a", id, p.Fingerprint.Type, p.Fingerprint.NodeID)
		}
		// A new plugin: registered, then healthy at its first probe.
		want := []plugin.EventType{plugin.EventRegistered, plugin.EventHealthy}
		if got := eventsOf(reg, id); !slices.Equal(got, want) {
			t.Errorf("%s: events %v, want %v", id, got, want)
		}
	}

	// Lookup hands out the supervisor's live connection.
	p, client, ok := m.Lookup("late")
	if !ok || p.GetId() != "late" || client == nil {
		t.Fatalf("Lookup(late) = %+v, %v, %v", p, client, ok)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := client.Identity.Probe(ctx, &csi.ProbeRequest{}); err != nil {
		t.Errorf("Probe through the looked-up connection: %v", err)
	}
	if _, _, ok := m.Lookup("nope"); ok {
		t.Error("Lookup of an unknown plugin succeeded")
	}
}

func TestIntegrationKillIsNoticedWithoutWaitingForAProbe(t *testing.T) {
	t.Parallel()
	dir := testutil.TempDir(t)
	sock := filepath.Join(dir, "a", SocketName)
	tp := startPlugin(t, sock, testplugin.Config{})
	// One probe a minute: only the connection watch can notice in time.
	m := startManager(t, ManagerConfig{PluginDir: dir, ProbeInterval: time.Minute, ProbeTimeout: 5 * time.Second})
	reg := m.Registry()
	testutil.WaitFor(t, waitLong, "a healthy", func() bool { return healthOf(reg, "a") == "healthy" })

	tp.Kill()
	testutil.WaitFor(t, waitLong, "a unhealthy", func() bool { return healthOf(reg, "a") == "unhealthy" })
	p, _ := reg.Get("a")
	if !strings.HasPrefix(p.Health.Description, "plugin unreachable") {
		t.Errorf("description = %q, want plugin unreachable", p.Health.Description)
	}

	if err := tp.Start(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, waitLong, "a healthy again", func() bool { return healthOf(reg, "a") == "healthy" })
	if _, found := findEvent(reg, "a", plugin.EventDeregistered); found {
		t.Error("a restarted plugin was deregistered")
	}
}

func TestIntegrationRemovedSocketIsDeregisteredAfterGrace(t *testing.T) {
	t.Parallel()
	dir := testutil.TempDir(t)
	sock := filepath.Join(dir, "a"+SocketSuffix)
	tp := startPlugin(t, sock, testplugin.Config{})
	m := startManager(t, ManagerConfig{PluginDir: dir, DeregisterGrace: 300 * time.Millisecond})
	reg := m.Registry()
	testutil.WaitFor(t, waitLong, "a healthy", func() bool { return healthOf(reg, "a") == "healthy" })

	tp.Stop() // removes the socket
	testutil.WaitFor(t, waitLong, "a deregistered", func() bool { return healthOf(reg, "a") == "absent" })
	e, ok := findEvent(reg, "a", plugin.EventDeregistered)
	if want := fmt.Sprintf("socket %s removed 300ms ago", sock); !ok || e.Description != want {
		t.Errorf("deregistered event = %+v, want description %q", e, want)
	}
	if _, _, ok := m.Lookup("a"); ok {
		t.Error("Lookup finds a deregistered plugin")
	}
}

func TestIntegrationSocketBackWithinGraceIsNotDeregistered(t *testing.T) {
	t.Parallel()
	const grace = time.Second
	dir := testutil.TempDir(t)
	tp := startPlugin(t, filepath.Join(dir, "a", SocketName), testplugin.Config{})
	m := startManager(t, ManagerConfig{PluginDir: dir, DeregisterGrace: grace,
		ProbeInterval: 500 * time.Millisecond, ProbeTimeout: 500 * time.Millisecond})
	reg := m.Registry()
	testutil.WaitFor(t, waitLong, "a healthy", func() bool { return healthOf(reg, "a") == "healthy" })

	removed := time.Now()
	tp.Stop()
	if err := tp.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait until probes show the grace period is long over.
	testutil.WaitFor(t, waitLong, "probes well after the grace period", func() bool {
		p, ok := reg.Get("a")
		return ok && p.Healthy() && p.Health.LastProbe.After(removed.Add(2*grace))
	})
	if got := eventsOf(reg, "a"); slices.Contains(got, plugin.EventDeregistered) {
		t.Errorf("events %v: a socket back within the grace was deregistered", got)
	}
}

func TestIntegrationReplacedSocketRestartsInstance(t *testing.T) {
	t.Parallel()
	dir := testutil.TempDir(t)
	sock := filepath.Join(dir, "a"+SocketSuffix)
	startPlugin(t, sock, testplugin.Config{VendorVersion: "1.0.0"})
	m := startManager(t, ManagerConfig{PluginDir: dir, DeregisterGrace: time.Minute})
	reg := m.Registry()
	testutil.WaitFor(t, waitLong, "a healthy", func() bool { return healthOf(reg, "a") == "healthy" })
	old, _ := reg.Get("a")

	// An upgrade: the old plugin still runs, its socket file is replaced.
	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	startPlugin(t, sock, testplugin.Config{VendorVersion: "2.0.0"})
	newID := statSocket(t, sock)
	if newID.Inode == old.Instance.Inode && newID.Mtime == old.Instance.Mtime {
		t.Fatal("the new socket has the old identity")
	}

	testutil.WaitFor(t, waitLong, "new instance healthy", func() bool {
		p, ok := reg.Get("a")
		return ok && p.Instance == newID && p.Healthy() && p.Fingerprint.VendorVersion == "2.0.0"
	})
	var registered []plugin.Event
	evs, _ := reg.Events(0)
	for _, e := range evs {
		if e.PluginID == "a" && e.Type == plugin.EventRegistered {
			registered = append(registered, e)
		}
	}
	if len(registered) != 2 || !strings.Contains(registered[1].Description, fmt.Sprintf("inode %d", newID.Inode)) ||
		!strings.Contains(registered[1].Description, fmt.Sprintf("replaces inode %d", old.Instance.Inode)) {
		t.Errorf("registered events = %+v, want a second one for inode %d replacing %d", registered, newID.Inode, old.Instance.Inode)
	}
	if _, found := findEvent(reg, "a", plugin.EventDeregistered); found {
		t.Error("a replaced socket deregistered its plugin")
	}
}

func TestIntegrationChmodDoesNotRestartInstance(t *testing.T) {
	t.Parallel()
	dir := testutil.TempDir(t)
	sock := filepath.Join(dir, "a"+SocketSuffix)
	startPlugin(t, sock, testplugin.Config{})
	m := startManager(t, ManagerConfig{PluginDir: dir, DeregisterGrace: time.Minute, RescanInterval: 100 * time.Millisecond})
	reg := m.Registry()
	testutil.WaitFor(t, waitLong, "a healthy", func() bool { return healthOf(reg, "a") == "healthy" })
	before, _ := reg.Get("a")

	// Plugins and operators re-permission sockets; that changes the
	// socket's ctime but it is the same plugin instance.
	if err := os.Chmod(sock, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(sock, os.Getuid(), os.Getgid()); err != nil {
		t.Fatal(err)
	}
	// Let the chmod's file event and several rescans go by.
	testutil.WaitFor(t, waitLong, "probes after several rescans", func() bool {
		p, ok := reg.Get("a")
		return ok && p.Health.LastProbe.After(time.Now().Add(-50*time.Millisecond)) &&
			time.Since(before.Health.LastProbe) > 500*time.Millisecond
	})
	after, _ := reg.Get("a")
	if after.Instance != before.Instance {
		t.Errorf("instance changed from %+v to %+v after chmod", before.Instance, after.Instance)
	}
	if got := eventsOf(reg, "a"); !slices.Equal(got, []plugin.EventType{plugin.EventRegistered, plugin.EventHealthy}) {
		t.Errorf("events after chmod = %v, want only registration and health", got)
	}
}

func TestIntegrationIgnoredEntries(t *testing.T) {
	t.Parallel()
	dir := testutil.TempDir(t)
	writeFile(t, filepath.Join(dir, "file.sock"))
	writeFile(t, filepath.Join(dir, "sub", SocketName))
	socketFile(t, filepath.Join(dir, ".hidden.sock"))
	writeFile(t, filepath.Join(dir, ".dotfile"))
	socketFile(t, filepath.Join(dir, "bad!id.sock"))
	m := startManager(t, ManagerConfig{PluginDir: dir})
	reg := m.Registry()
	startPlugin(t, filepath.Join(dir, "good.sock"), testplugin.Config{})
	socketFile(t, filepath.Join(dir, "-late.sock")) // after the initial walk

	want := map[string]string{
		filepath.Join(dir, "file.sock"):       "not a unix socket (regular file)",
		filepath.Join(dir, "sub", SocketName): "not a unix socket (regular file)",
		filepath.Join(dir, "bad!id.sock"):     `invalid plugin id "bad!id"`,
		filepath.Join(dir, "-late.sock"):      `invalid plugin id "-late"`,
	}
	testutil.WaitFor(t, waitLong, "ignored entries", func() bool { return len(reg.Ignored()) == len(want) })
	for _, ig := range reg.Ignored() {
		if !strings.HasPrefix(ig.Reason, want[ig.Path]) || want[ig.Path] == "" {
			t.Errorf("ignored %s: reason %q, want %q", ig.Path, ig.Reason, want[ig.Path])
		}
	}
	testutil.WaitFor(t, waitLong, "good healthy", func() bool { return healthOf(reg, "good") == "healthy" })
	if got := reg.List(); len(got) != 1 {
		t.Errorf("registered %d plugins, want only good: %+v", len(got), got)
	}
}

func TestIntegrationNonCSISocketsAreUnhealthy(t *testing.T) {
	t.Parallel()
	dir := testutil.TempDir(t)

	// A gRPC server with only the health service.
	l := listenUnix(t, filepath.Join(dir, "grpc-only.sock"))
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(l) })
	t.Cleanup(func() {
		srv.Stop()
		wg.Wait()
	})

	// A listener that accepts connections and closes them at once.
	raw := listenUnix(t, filepath.Join(dir, "raw.sock"))
	wg.Go(func() {
		for {
			c, err := raw.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	})
	t.Cleanup(func() { _ = raw.Close() })

	m := startManager(t, ManagerConfig{PluginDir: dir})
	reg := m.Registry()
	tests := []struct {
		id   string
		want string
	}{
		{"grpc-only", "fingerprint failed: GetPluginInfo: socket does not serve the CSI Identity service"},
		{"raw", "fingerprint failed: GetPluginInfo: rpc error: "},
	}
	for _, tt := range tests {
		testutil.WaitFor(t, waitLong, tt.id+" unhealthy", func() bool { return healthOf(reg, tt.id) == "unhealthy" })
		p, _ := reg.Get(tt.id)
		if !strings.HasPrefix(p.Health.Description, tt.want) {
			t.Errorf("%s: description %q, want prefix %q", tt.id, p.Health.Description, tt.want)
		}
		if p.Fingerprint.Type != plugin.TypeUnknown || p.Fingerprinted {
			t.Errorf("%s: fingerprint %+v, want none", tt.id, p.Fingerprint)
		}
		want := []plugin.EventType{plugin.EventRegistered, plugin.EventUnhealthy}
		if got := eventsOf(reg, tt.id); !slices.Equal(got, want) {
			t.Errorf("%s: events %v, want %v", tt.id, got, want)
		}
	}
}

func TestIntegrationHangingProbe(t *testing.T) {
	t.Parallel()
	dir := testutil.TempDir(t)
	hang := newPlugin(t, filepath.Join(dir, "hang.sock"), testplugin.Config{})
	hang.SetFaults(testplugin.Faults{ProbeHang: true})
	if err := hang.Start(); err != nil {
		t.Fatal(err)
	}
	startPlugin(t, filepath.Join(dir, "ok.sock"), testplugin.Config{})
	m := startManager(t, ManagerConfig{PluginDir: dir, ProbeInterval: 600 * time.Millisecond, ProbeTimeout: 500 * time.Millisecond})
	reg := m.Registry()

	testutil.WaitFor(t, waitLong, "hang unhealthy", func() bool { return healthOf(reg, "hang") == "unhealthy" })
	p, _ := reg.Get("hang")
	if p.Health.Description != "probe timed out after 500ms" {
		t.Errorf("description = %q, want probe timed out after 500ms", p.Health.Description)
	}
	if !p.Fingerprinted {
		t.Error("a plugin whose only problem is Probe was not fingerprinted")
	}
	// Several more hanging probes while the other plugin is probed too.
	since := p.Health.LastProbe
	testutil.WaitFor(t, waitLong, "more probes of both", func() bool {
		h, _ := reg.Get("hang")
		o, _ := reg.Get("ok")
		return h.Health.LastProbe.After(since.Add(1200*time.Millisecond)) && o.Health.LastProbe.After(since.Add(1200*time.Millisecond))
	})
	if got, want := eventsOf(reg, "ok"), []plugin.EventType{plugin.EventRegistered, plugin.EventHealthy}; !slices.Equal(got, want) {
		t.Errorf("ok: events %v, want %v", got, want)
	}
	if got, want := eventsOf(reg, "hang"), []plugin.EventType{plugin.EventRegistered, plugin.EventUnhealthy}; !slices.Equal(got, want) {
		t.Errorf("hang: events %v, want %v", got, want)
	}
}

func TestIntegrationManyPluginsAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 200 plugins")
	}
	// Not parallel: it runs alone, before the parallel tests, so that its
	// load cannot make their probes time out.
	const n = 200
	dir := testutil.TempDir(t)
	state := testutil.TempDir(t)
	// Long probe timings: 200 plugins starting at once load the machine,
	// and all this test needs is their first probe.
	m := startManager(t, ManagerConfig{PluginDir: dir, ProbeInterval: 10 * time.Second, ProbeTimeout: 10 * time.Second})
	reg := m.Registry()

	plugins := make([]*testplugin.Plugin, n)
	for i := range n {
		sock := filepath.Join(dir, fmt.Sprintf("p%03d.sock", i))
		if i%2 == 1 {
			sock = filepath.Join(dir, fmt.Sprintf("p%03d", i), SocketName)
		}
		plugins[i] = newPlugin(t, sock, testplugin.Config{StateDir: filepath.Join(state, fmt.Sprint(i))})
	}
	for _, p := range plugins {
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 45*time.Second, fmt.Sprintf("%d plugins healthy", n), func() bool {
		ps := reg.List()
		if len(ps) != n {
			return false
		}
		for _, p := range ps {
			if !p.Healthy() {
				return false
			}
		}
		return true
	})
	for i := range n {
		id := fmt.Sprintf("p%03d", i)
		if _, ok := findEvent(reg, id, plugin.EventRegistered); !ok {
			t.Errorf("%s: no plugin-registered event", id)
		}
		if _, ok := findEvent(reg, id, plugin.EventHealthy); !ok {
			t.Errorf("%s: no plugin-healthy event", id)
		}
	}
}

func TestIntegrationRestartRecoversRegistry(t *testing.T) {
	t.Parallel()
	dir := testutil.TempDir(t)
	data := filepath.Join(testutil.TempDir(t), "data")
	pa := startPlugin(t, filepath.Join(dir, "a", SocketName), testplugin.Config{NodeID: "node-r"})
	pb := startPlugin(t, filepath.Join(dir, "b"+SocketSuffix), testplugin.Config{NodeID: "node-r"})
	gone := startPlugin(t, filepath.Join(dir, "gone"+SocketSuffix), testplugin.Config{NodeID: "node-r"})

	first := newTestManager(t, ManagerConfig{PluginDir: dir, DataDir: data})
	stopFirst := runManager(t, first)
	for _, id := range []string{"a", "b", "gone"} {
		testutil.WaitFor(t, waitLong, id+" healthy", func() bool { return healthOf(first.Registry(), id) == "healthy" })
	}
	stopFirst() // saves the registry
	if _, err := os.Stat(filepath.Join(data, StateFileName)); err != nil {
		t.Fatalf("no registry file after shutdown: %v", err)
	}
	gone.Stop() // its socket disappears while no manager runs

	// The plugins answer the second manager's first fingerprint slowly, and
	// its probe timeout is long: what it shows meanwhile comes from disk.
	slow := testplugin.Faults{Delays: map[string]time.Duration{"GetPluginInfo": 3 * time.Second}}
	pa.SetFaults(slow)
	pb.SetFaults(slow)
	second := newTestManager(t, ManagerConfig{
		PluginDir: dir, DataDir: data, DeregisterGrace: 2 * time.Second,
		ProbeInterval: 30 * time.Second, ProbeTimeout: 30 * time.Second,
	})
	runManager(t, second)
	awaitReady(t, second)
	reg := second.Registry()
	got := reg.List()
	if len(got) != 3 {
		t.Fatalf("restored %d plugins, want 3: %+v", len(got), got)
	}
	for _, p := range got {
		if p.Health.State != heartbeat.Unknown || p.Fingerprint.NodeID != "node-r" || p.Fingerprint.Type != plugin.TypeMonolith {
			t.Errorf("restored %s: health %s, fingerprint %+v; want unknown health and the saved fingerprint",
				p.ID, p.Health.State, p.Fingerprint)
		}
	}

	if p, c, ok := second.Lookup("gone"); !ok || c != nil || p.GetId() != "gone" {
		t.Errorf("Lookup(gone) = %v, %v, %v; want the record without a connection", p.GetId(), c, ok)
	}
	if _, c, ok := second.Lookup("a"); !ok || c == nil {
		t.Errorf("Lookup(a) = %v, %v; want the supervisor's connection", c, ok)
	}

	pa.SetFaults(testplugin.Faults{})
	pb.SetFaults(testplugin.Faults{})
	testutil.WaitFor(t, waitLong, "gone deregistered", func() bool { return healthOf(reg, "gone") == "absent" })
	if e, _ := findEvent(reg, "gone", plugin.EventDeregistered); !strings.Contains(e.Description, "after restart") {
		t.Errorf("gone: deregistered event %+v", e)
	}
	for _, id := range []string{"a", "b"} {
		testutil.WaitFor(t, waitLong, id+" healthy after restart", func() bool { return healthOf(reg, id) == "healthy" })
		// Same socket, same instance: no new registration.
		if got := eventsOf(reg, id); !slices.Equal(got, []plugin.EventType{plugin.EventHealthy}) {
			t.Errorf("%s: events after restart %v, want [plugin-healthy]", id, got)
		}
	}
}

func TestIntegrationSteadyStateEmitsNothing(t *testing.T) {
	t.Parallel()
	// Generous timeouts: a probe timing out on a busy machine is an event.
	const interval = time.Second
	dir := testutil.TempDir(t)
	ids := []string{"a", "b", "c"}
	for _, id := range ids {
		startPlugin(t, filepath.Join(dir, id+SocketSuffix), testplugin.Config{})
	}
	m := startManager(t, ManagerConfig{
		PluginDir: dir, DataDir: filepath.Join(dir, ".data"),
		ProbeInterval: interval, ProbeTimeout: interval,
		FingerprintInterval: 2 * interval, RescanInterval: 2 * interval,
	})
	reg := m.Registry()
	for _, id := range ids {
		testutil.WaitFor(t, waitLong, id+" healthy", func() bool { return healthOf(reg, id) == "healthy" })
	}
	_, index := reg.Events(0)
	version := reg.Version()
	start := time.Now()

	// Several probe, fingerprint and rescan periods, measured by probes.
	testutil.WaitFor(t, waitLong, "three probe intervals of probes", func() bool {
		for _, id := range ids {
			p, _ := reg.Get(id)
			if !p.Health.LastProbe.After(start.Add(3 * interval)) {
				return false
			}
		}
		return true
	})
	if evs, _ := reg.Events(index); len(evs) != 0 {
		t.Errorf("steady state emitted %d events: %+v", len(evs), evs)
	}
	if v := reg.Version(); v != version {
		t.Errorf("steady state changed the registry %d times", v-version)
	}
}
