package registry

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// eventsAfter returns the events of plugin id after index after.
func eventsAfter(reg *Registry, id string, after uint64) []plugin.Event {
	evs, _ := reg.Events(after)
	var out []plugin.Event
	for _, e := range evs {
		if e.PluginID == id {
			out = append(out, e)
		}
	}
	return out
}

func TestDeclaredSocketOutsidePluginDir(t *testing.T) {
	root := testutil.TempDir(t)
	sock := filepath.Join(root, "elsewhere", "ebs.sock")
	startPlugin(t, sock, testplugin.Config{Type: testplugin.TypeNode})
	m := startManager(t, ManagerConfig{
		PluginDir:    filepath.Join(root, "plugins"),
		Declarations: map[string]Declaration{"ebs": {Socket: sock, Type: plugin.TypeNode}},
	})
	testutil.WaitFor(t, 10*time.Second, "declared plugin healthy", func() bool { return healthOf(m.Registry(), "ebs") == "healthy" })
	p, _ := m.Registry().Get("ebs")
	if p.Instance.Path != sock || p.Fingerprint.Type != plugin.TypeNode {
		t.Errorf("record = %s, type %s; want the declared socket %s, type node", p.Instance.Path, p.Fingerprint.Type, sock)
	}
	if got := eventsOf(m.Registry(), "ebs"); !slices.Equal(got, []plugin.EventType{plugin.EventRegistered, plugin.EventHealthy}) {
		t.Errorf("events = %v, want registered then healthy", got)
	}
	if _, c, _ := m.Lookup("ebs"); c == nil {
		t.Error("Lookup gives no connection to the declared plugin")
	}
}

func TestDeclaredTypeMismatchIsUnhealthy(t *testing.T) {
	root := testutil.TempDir(t)
	sock := filepath.Join(root, "ctl", "csi.sock")
	startPlugin(t, sock, testplugin.Config{Type: testplugin.TypeNode})
	m := startManager(t, ManagerConfig{
		PluginDir:    filepath.Join(root, "plugins"),
		Declarations: map[string]Declaration{"ctl": {Socket: sock, Type: plugin.TypeController}},
	})
	testutil.WaitFor(t, 10*time.Second, "plugin probed", func() bool {
		p, ok := m.Registry().Get("ctl")
		return ok && p.Health.State == heartbeat.Unhealthy && p.Fingerprinted
	})
	p, _ := m.Registry().Get("ctl")
	d := p.Health.Description
	if !strings.Contains(d, `"controller"`) || !strings.Contains(d, `"node"`) {
		t.Errorf("description %q does not name both types", d)
	}
	if n := countEvents(m.Registry(), "ctl", plugin.EventHealthy); n != 0 {
		t.Errorf("%d plugin-healthy events for a plugin of the wrong type", n)
	}
}

func TestRequiredPluginMissing(t *testing.T) {
	root := testutil.TempDir(t)
	sock := filepath.Join(root, "ebs", "csi.sock")
	const timeout = 400 * time.Millisecond
	start := time.Now()
	m := startManager(t, ManagerConfig{
		PluginDir:    filepath.Join(root, "plugins"),
		Declarations: map[string]Declaration{"ebs": {Socket: sock, Type: plugin.TypeNode, Required: true, HealthTimeout: timeout}},
	})
	reg := m.Registry()

	// Listed at once, before its socket ever existed: expected, not
	// healthy, with why.
	src := reg.Source()
	p, ok := src.Get("ebs")
	if !ok {
		t.Fatal("a required plugin without a socket is not in the read model")
	}
	if p.GetHealthy() || p.GetHealthState() != HealthMissing || p.GetType() != "node" ||
		!strings.Contains(p.GetHealthDescription(), sock+": does not exist") {
		t.Errorf("placeholder = healthy %v, state %q, type %q, %q", p.GetHealthy(), p.GetHealthState(), p.GetType(), p.GetHealthDescription())
	}
	if got := src.List(); len(got) != 1 || got[0].GetId() != "ebs" {
		t.Errorf("List = %v, want the placeholder", got)
	}

	testutil.WaitFor(t, 10*time.Second, "plugin-missing", func() bool { return countEvents(reg, "ebs", plugin.EventMissing) > 0 })
	ev, _ := findEvent(reg, "ebs", plugin.EventMissing)
	if waited := ev.Time.Sub(start); waited < timeout {
		t.Errorf("plugin-missing after %s, before its health_timeout %s", waited, timeout)
	}
	if !strings.Contains(ev.Description, sock) {
		t.Errorf("plugin-missing %q does not say which socket is missing", ev.Description)
	}

	// Started: the episode ends with plugin-healthy.
	pl := startPlugin(t, sock, testplugin.Config{Type: testplugin.TypeNode})
	testutil.WaitFor(t, 10*time.Second, "plugin healthy", func() bool {
		p, ok := src.Get("ebs")
		return ok && p.GetHealthy()
	})
	if n := countEvents(reg, "ebs", plugin.EventHealthy); n != 1 {
		t.Errorf("%d plugin-healthy events, want 1", n)
	}

	// A new episode: the plugin dies and stays away.
	pl.Stop()
	testutil.WaitFor(t, 10*time.Second, "second plugin-missing", func() bool { return countEvents(reg, "ebs", plugin.EventMissing) == 2 })
	if n := countEvents(reg, "ebs", plugin.EventMissing); n != 2 {
		t.Errorf("%d plugin-missing events, want one per episode (2)", n)
	}
}

func TestConflictDeclaredOverDiscoveredStableAcrossRestart(t *testing.T) {
	root := testutil.TempDir(t)
	dir := filepath.Join(root, "plugins")
	discovered := filepath.Join(dir, "ebs", SocketName)
	declared := filepath.Join(root, "run", "ebs.sock")
	startPlugin(t, discovered, testplugin.Config{Type: testplugin.TypeNode, NodeID: "from-dir"})
	startPlugin(t, declared, testplugin.Config{Type: testplugin.TypeNode, NodeID: "declared"})
	cfg := ManagerConfig{
		PluginDir:    dir,
		DataDir:      filepath.Join(root, "data"),
		Declarations: map[string]Declaration{"ebs": {Socket: declared}},
	}
	for run := 1; run <= 2; run++ {
		m := newTestManager(t, cfg)
		stop := runManager(t, m)
		awaitReady(t, m)
		reg := m.Registry()
		testutil.WaitFor(t, 10*time.Second, "plugin healthy", func() bool {
			p, ok := reg.Get("ebs")
			return ok && p.Healthy() && p.Instance.Path == declared
		})
		testutil.WaitFor(t, 10*time.Second, "plugin-conflict", func() bool { return countEvents(reg, "ebs", plugin.EventConflict) > 0 })
		ev, _ := findEvent(reg, "ebs", plugin.EventConflict)
		if !strings.Contains(ev.Description, declared) || !strings.Contains(ev.Description, discovered) {
			t.Errorf("run %d: plugin-conflict %q does not name both paths", run, ev.Description)
		}
		if p, _ := reg.Get("ebs"); p.Fingerprint.NodeID != "declared" {
			t.Errorf("run %d: supervising the plugin of node id %q, want the declared one", run, p.Fingerprint.NodeID)
		}
		if len(reg.List()) != 1 {
			t.Errorf("run %d: %d plugins, want one", run, len(reg.List()))
		}
		if !slices.ContainsFunc(reg.Ignored(), func(i plugin.Ignored) bool { return i.Path == discovered }) {
			t.Errorf("run %d: the losing socket is not listed as ignored: %v", run, reg.Ignored())
		}
		// Later scans report the conflict no more: a file dropped in the
		// plugin directory makes one, seen when it is listed as ignored.
		marker := filepath.Join(dir, fmt.Sprintf("marker-%d", run))
		writeFile(t, marker)
		testutil.WaitFor(t, 10*time.Second, "a later scan", func() bool {
			return slices.ContainsFunc(reg.Ignored(), func(i plugin.Ignored) bool { return i.Path == marker })
		})
		stop()
		if n := countEvents(reg, "ebs", plugin.EventConflict); n != 1 {
			t.Errorf("run %d: %d plugin-conflict events, want 1", run, n)
		}
		// The second run restores the record of the same instance: no
		// registration, no switch between the sockets.
		if n, want := countEvents(reg, "ebs", plugin.EventRegistered), 2-run; n != want {
			t.Errorf("run %d: %d plugin-registered events, want %d", run, n, want)
		}
	}
}

func TestSetDeclarationsTouchesOnlyChangedPlugins(t *testing.T) {
	root := testutil.TempDir(t)
	dir := filepath.Join(root, "plugins")
	sockA := filepath.Join(root, "a", "csi.sock")
	sockB1 := filepath.Join(root, "b1", "csi.sock")
	sockB2 := filepath.Join(root, "b2", "csi.sock")
	sockD := filepath.Join(root, "d", "csi.sock")
	for _, s := range []string{sockA, sockB1, sockB2, sockD, filepath.Join(dir, "c", SocketName)} {
		startPlugin(t, s, testplugin.Config{Type: testplugin.TypeNode})
	}
	decls := map[string]Declaration{
		"a": {Socket: sockA, Type: plugin.TypeNode},
		"b": {Socket: sockB1},
	}
	m := startManager(t, ManagerConfig{PluginDir: dir, Declarations: decls})
	reg := m.Registry()
	testutil.WaitFor(t, 10*time.Second, "a, b and c healthy", func() bool {
		return healthOf(reg, "a") == "healthy" && healthOf(reg, "b") == "healthy" && healthOf(reg, "c") == "healthy"
	})
	_, mark := reg.Events(0)
	supervisorOf := func(id string) *supervisor {
		m.rec.mu.Lock()
		defer m.rec.mu.Unlock()
		return m.rec.sups[id]
	}
	supA, supC := supervisorOf("a"), supervisorOf("c")

	// b moves to another socket, d is added, a and c stay.
	if err := m.SetDeclarations(map[string]Declaration{
		"a": {Socket: sockA, Type: plugin.TypeNode},
		"b": {Socket: sockB2},
		"d": {Socket: sockD},
	}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "b moved and d healthy", func() bool {
		p, ok := reg.Get("b")
		return ok && p.Instance.Path == sockB2 && p.Healthy() && healthOf(reg, "d") == "healthy"
	})
	for _, id := range []string{"b", "d"} {
		if evs := eventsAfter(reg, id, mark); len(evs) == 0 || evs[0].Type != plugin.EventRegistered {
			t.Errorf("plugin %s: events after the reload = %v, want plugin-registered first", id, evs)
		}
	}
	for _, id := range []string{"a", "c"} {
		if evs := eventsAfter(reg, id, mark); len(evs) != 0 {
			t.Errorf("plugin %s is unchanged but has events after the reload: %v", id, evs)
		}
	}
	if supervisorOf("a") != supA || supervisorOf("c") != supC {
		t.Error("the supervision of an unchanged plugin was restarted")
	}

	// A changed type restarts a's supervision alone: it is now unhealthy.
	_, mark = reg.Events(0)
	if err := m.SetDeclarations(map[string]Declaration{
		"a": {Socket: sockA, Type: plugin.TypeController},
		"b": {Socket: sockB2},
	}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "a unhealthy, d deregistered", func() bool {
		return healthOf(reg, "a") == "unhealthy" && healthOf(reg, "d") == "absent"
	})
	for _, id := range []string{"b", "c"} {
		if evs := eventsAfter(reg, id, mark); len(evs) != 0 {
			t.Errorf("plugin %s is unchanged but has events after the second reload: %v", id, evs)
		}
	}

	if err := m.SetDeclarations(map[string]Declaration{"x": {Socket: "relative.sock"}}); err == nil {
		t.Error("SetDeclarations accepted a relative socket path")
	}
}

// A declared socket gets the plugin directory's trust rules: a symlink,
// as the socket or on its path, is never followed.
func TestDeclaredSocketSymlinkRefused(t *testing.T) {
	root := testutil.TempDir(t)
	real := filepath.Join(root, "real", "csi.sock")
	startPlugin(t, real, testplugin.Config{Type: testplugin.TypeNode})
	link := filepath.Join(root, "link.sock")
	linkDir := filepath.Join(root, "linkdir")
	for from, to := range map[string]string{link: real, linkDir: filepath.Dir(real)} {
		if err := os.Symlink(to, from); err != nil {
			t.Fatal(err)
		}
	}
	viaDir := filepath.Join(linkDir, "csi.sock")
	m := startManager(t, ManagerConfig{
		PluginDir: filepath.Join(root, "plugins"),
		Declarations: map[string]Declaration{
			"l": {Socket: link, Type: plugin.TypeNode, Required: true, HealthTimeout: time.Hour},
			"d": {Socket: viaDir},
		},
	})
	reg := m.Registry()
	for id, path := range map[string]string{"l": link, "d": viaDir} {
		testutil.WaitFor(t, 10*time.Second, "plugin-socket-ignored for "+id, func() bool {
			ev, ok := findEvent(reg, id, plugin.EventSocketIgnored)
			return ok && strings.Contains(ev.Description, path) && strings.Contains(ev.Description, "symlink")
		})
	}
	if got := reg.List(); len(got) != 0 {
		t.Errorf("supervising %v through a symlink", got)
	}
	if p, _ := reg.Source().Get("l"); p.GetHealthy() || !strings.Contains(p.GetHealthDescription(), "not trusted") {
		t.Errorf("required plugin behind a symlink: %v", p)
	}
}

// TestDeclaredSocketNotASocketRefused: a FIFO, a regular file or a
// directory where a declaration names a socket is refused, and a
// plugin-socket-ignored event names the path and what is there; nothing
// is supervised.
func TestDeclaredSocketNotASocketRefused(t *testing.T) {
	root := testutil.TempDir(t)
	fifo := filepath.Join(root, "fifo.sock")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(root, "file.sock")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "dir.sock")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	m := startManager(t, ManagerConfig{
		PluginDir: filepath.Join(root, "plugins"),
		Declarations: map[string]Declaration{
			"fifo": {Socket: fifo, Type: plugin.TypeNode, Required: true, HealthTimeout: time.Hour},
			"file": {Socket: file},
			"dir":  {Socket: dir},
		},
	})
	reg := m.Registry()
	for id, want := range map[string][]string{
		"fifo": {fifo, "not a unix socket (named pipe)"},
		"file": {file, "not a unix socket (regular file)"},
		"dir":  {dir, "not a unix socket (directory)"},
	} {
		testutil.WaitFor(t, 10*time.Second, "plugin-socket-ignored for "+id, func() bool {
			ev, ok := findEvent(reg, id, plugin.EventSocketIgnored)
			return ok && strings.Contains(ev.Description, want[0]) && strings.Contains(ev.Description, want[1])
		})
	}
	if got := reg.List(); len(got) != 0 {
		t.Errorf("supervising %v", got)
	}
	if p, _ := reg.Source().Get("fifo"); p.GetHealthy() || !strings.Contains(p.GetHealthDescription(), "named pipe") {
		t.Errorf("required plugin at a FIFO: %v", p)
	}
}
