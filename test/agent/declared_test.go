package agent_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// clusterPlugin is the part of `plugin status ID --json` these tests read.
type clusterPlugin struct {
	ControllersHealthy  int `json:"controllers_healthy"`
	ControllersExpected int `json:"controllers_expected"`
	NodesHealthy        int `json:"nodes_healthy"`
	NodesExpected       int `json:"nodes_expected"`
}

// clusterPluginOf runs `plugin status ID --json`; ok is false while the
// servers do not know the plugin.
func (a *agentProc) clusterPluginOf(t *testing.T, id string) (clusterPlugin, bool) {
	t.Helper()
	r := runCLI(t, "--address", a.addr(), "plugin", "status", id, "--json")
	var p clusterPlugin
	if r.code != 0 || json.Unmarshal([]byte(r.Stdout), &p) != nil {
		return p, false
	}
	return p, true
}

// eventsOfType returns plugin id's events of type typ seen so far.
func (s *eventStream) eventsOfType(id, typ string) []event {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []event
	for _, e := range s.events {
		if e.PluginID == id && e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

// A declared required plugin that never starts: listed at once as not
// healthy with its reason, plugin-missing once its health_timeout has
// passed and not before, counted by the servers as expected but not
// healthy; starting it clears the condition with plugin-healthy.
func TestDeclaredRequiredPluginMissing(t *testing.T) {
	dir := testutil.TempDir(t)
	sock := filepath.Join(dir, "run", "ebs", "csi.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		t.Fatal(err)
	}
	const timeout = 3 * time.Second
	cfgFile := writeFile(t, dir, "agent.hcl", fmt.Sprintf(`
plugin "ebs" {
  socket         = %q
  type           = "node"
  required       = true
  health_timeout = %q
}
`, sock, timeout))
	start := time.Now()
	a := startAgent(t, nil, "--dev", "--config", cfgFile)
	events := a.watchEvents(t)

	p := a.status(t).plugin("ebs")
	if p == nil {
		t.Fatal("status does not list the declared required plugin before its socket exists")
	}
	if p["healthy"] != false || p["health_state"] != "missing" || p["type"] != "node" ||
		!strings.Contains(fmt.Sprint(p["health_description"]), sock) {
		t.Errorf("status entry of the missing plugin: %v", p)
	}
	if r := runCLI(t, "--address", a.addr(), "status"); !strings.Contains(r.Stdout, "required plugin is not running") {
		t.Errorf("status does not give the reason:\n%s", r.Stdout)
	}
	testutil.WaitFor(t, 20*time.Second, "the servers count ebs as expected, not healthy", func() bool {
		c, ok := a.clusterPluginOf(t, "ebs")
		return ok && c.NodesExpected == 1 && c.NodesHealthy == 0
	})

	testutil.WaitFor(t, 20*time.Second, "plugin-missing", func() bool { return len(events.eventsOfType("ebs", "plugin-missing")) > 0 })
	ev := events.eventsOfType("ebs", "plugin-missing")[0]
	at, err := time.Parse(time.RFC3339Nano, ev.Time)
	if err != nil {
		t.Fatal(err)
	}
	if waited := at.Sub(start); waited < timeout {
		t.Errorf("plugin-missing %s after the agent started, before its health_timeout %s", waited, timeout)
	}

	startTestPlugin(t, sock, "--type", "node")
	testutil.WaitFor(t, 20*time.Second, "plugin-healthy", func() bool { return len(events.eventsOfType("ebs", "plugin-healthy")) == 1 })
	testutil.WaitFor(t, 20*time.Second, "the servers count ebs healthy", func() bool {
		c, ok := a.clusterPluginOf(t, "ebs")
		return ok && c.NodesExpected == 1 && c.NodesHealthy == 1
	})
	if n := len(events.eventsOfType("ebs", "plugin-missing")); n != 1 {
		t.Errorf("%d plugin-missing events, want 1", n)
	}
}

// A declared plugin at a socket outside plugin_dir is supervised; a
// declared type the plugin does not have makes it unhealthy, naming both.
func TestDeclaredPluginOutsidePluginDirAndItsType(t *testing.T) {
	dir := testutil.TempDir(t)
	nodeSock := filepath.Join(dir, "run", "n", "csi.sock")
	ctlSock := filepath.Join(dir, "run", "c", "csi.sock")
	for _, s := range []string{nodeSock, ctlSock} {
		if err := os.MkdirAll(filepath.Dir(s), 0o755); err != nil {
			t.Fatal(err)
		}
		startTestPlugin(t, s, "--type", "node")
	}
	cfgFile := writeFile(t, dir, "agent.hcl", fmt.Sprintf(`
plugin "n" {
  socket = %q
  type   = "node"
}
plugin "c" {
  socket = %q
  type   = "controller"
}
`, nodeSock, ctlSock))
	a := startAgent(t, nil, "--dev", "--config", cfgFile)
	if p := a.waitHealthy(t, "n"); p["socket"] != nodeSock || p["type"] != "node" {
		t.Errorf("declared plugin n: %v", p)
	}
	var c map[string]any
	testutil.WaitFor(t, 20*time.Second, "plugin c probed", func() bool {
		c = a.status(t).plugin("c")
		return c != nil && c["health_state"] == "unhealthy" && c["type"] == "node"
	})
	if d := fmt.Sprint(c["health_description"]); !strings.Contains(d, `"controller"`) || !strings.Contains(d, `"node"`) {
		t.Errorf("description %q does not name both types", d)
	}
}

// SIGHUP with one changed declaration touches that plugin only: the other
// plugins' event streams show nothing.
func TestReloadChangesOneDeclaration(t *testing.T) {
	dir := testutil.TempDir(t)
	socks := map[string]string{}
	for _, name := range []string{"a", "b1", "b2"} {
		socks[name] = filepath.Join(dir, "run", name, "csi.sock")
		if err := os.MkdirAll(filepath.Dir(socks[name]), 0o755); err != nil {
			t.Fatal(err)
		}
		startTestPlugin(t, socks[name], "--type", "node")
	}
	config := func(b string) string {
		return fmt.Sprintf("plugin \"a\" {\n  socket = %q\n  type = \"node\"\n}\nplugin \"b\" {\n  socket = %q\n  type = \"node\"\n}\n",
			socks["a"], socks[b])
	}
	cfgFile := writeFile(t, dir, "agent.hcl", config("b1"))
	a := startAgent(t, nil, "--dev", "--config", cfgFile)
	for _, id := range []string{"demo", "a", "b"} {
		a.waitHealthy(t, id)
	}
	// The stream replays the buffered events first; once it has shown
	// every plugin healthy it is live, and what follows is new.
	events := a.watchEvents(t)
	seen := map[string]int{}
	for _, id := range []string{"demo", "a", "b"} {
		testutil.WaitFor(t, 20*time.Second, "the replay of "+id, func() bool { return len(events.eventsOfType(id, "plugin-healthy")) > 0 })
		seen[id] = len(events.types(id))
	}
	writeFile(t, dir, "agent.hcl", config("b2"))
	a.Signal(t, syscall.SIGHUP)
	testutil.WaitFor(t, 20*time.Second, "b at its new socket and healthy", func() bool {
		p := a.status(t).plugin("b")
		return p != nil && p["socket"] == socks["b2"] && p["healthy"] == true
	})
	if got := events.types("b")[seen["b"]:]; len(got) == 0 || got[0] != "plugin-registered" {
		t.Errorf("events of b after the reload = %v, want plugin-registered first", got)
	}
	for _, id := range []string{"demo", "a"} {
		if got := events.types(id)[seen[id]:]; len(got) != 0 {
			t.Errorf("plugin %s is unchanged, but its events after the reload are %v", id, got)
		}
	}
	logs := a.Stderr.String()
	if !strings.Contains(logs, "configuration reloaded") {
		t.Errorf("no \"configuration reloaded\" line: the declaration keys must apply live:\n%s", logs)
	}
	for id, want := range map[string]int{"a": 1, "b": 2} {
		if n := strings.Count(logs, "supervising plugin: plugin="+id+" "); n != want {
			t.Errorf("plugin %s: supervision started %d times, want %d:\n%s", id, n, want, logs)
		}
	}
	if a.Exited() {
		t.Fatalf("agent exited on SIGHUP: %s", a.Stderr)
	}
}

// A driver packaged for Kubernetes, unchanged: its registrar (the
// node-driver-registrar double, as a process) creates <driver>-reg.sock in
// client.kubelet_registration_dir, naming the driver's endpoint in another
// directory. The agent supervises the endpoint under the driver name and
// tells the registrar it is registered; SIGTERM to the registrar removes
// its socket and the plugin is deregistered after deregister_grace. A
// registrar that lists no supported version is refused and exits 1.
func TestKubeletRegistrarProcess(t *testing.T) {
	dir := testutil.TempDir(t)
	regDir := filepath.Join(dir, "plugins_registry")
	endpoint := filepath.Join(dir, "kubelet", "plugins", "drv", "csi.sock")
	for _, d := range []string{regDir, filepath.Dir(endpoint)} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	startTestPlugin(t, endpoint, "--type", "node")
	cfgFile := writeFile(t, dir, "agent.hcl", fmt.Sprintf(`
client {
  kubelet_registration_dir = %q
  deregister_grace         = "1s"
}
`, regDir))
	a := startAgent(t, nil, "--dev", "--config", cfgFile)
	events := a.watchEvents(t)

	reg := testutil.StartProcess(t, nil, testRegistrarBin, "--registration-dir", regDir,
		"--driver-name", "drv", "--endpoint", endpoint)
	testutil.WaitFor(t, 20*time.Second, "the registrar told it is registered", func() bool {
		if reg.Exited() {
			t.Fatalf("registrar exited %d: %s", reg.ExitCode(), reg.Stderr)
		}
		return strings.Contains(reg.Stdout.String(), "registered")
	})
	if p := a.waitHealthy(t, "drv"); p["socket"] != endpoint || p["type"] != "node" {
		t.Errorf("kubelet-registered plugin: %v", p)
	}

	reg.Signal(t, syscall.SIGTERM)
	testutil.WaitFor(t, 10*time.Second, "the registrar gone", reg.Exited)
	if code := reg.ExitCode(); code != 0 {
		t.Errorf("registrar exit code on SIGTERM = %d, want 0", code)
	}
	if _, err := os.Lstat(filepath.Join(regDir, "drv-reg.sock")); !os.IsNotExist(err) {
		t.Errorf("registration socket after SIGTERM: %v, want it removed", err)
	}
	testutil.WaitFor(t, 20*time.Second, "plugin-deregistered", func() bool {
		return len(events.eventsOfType("drv", "plugin-deregistered")) == 1
	})

	bad := testutil.StartProcess(t, nil, testRegistrarBin, "--registration-dir", regDir,
		"--driver-name", "old", "--endpoint", endpoint, "--supported-versions", "0.3.0")
	testutil.WaitFor(t, 20*time.Second, "the refused registrar exits", bad.Exited)
	if code := bad.ExitCode(); code != 1 {
		t.Errorf("refused registrar exit code = %d, want 1", code)
	}
	if !strings.Contains(bad.Stderr.String(), "no supported version") {
		t.Errorf("refused registrar was not told why:\n%s", bad.Stderr)
	}
	if p := a.status(t).plugin("old"); p != nil {
		t.Errorf("a refused registration is supervised: %v", p)
	}
}
