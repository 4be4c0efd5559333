package agent_test

import (
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// The dev agent lists the demo plugin healthy with every field of the
// `status --json` contract, and serves /v1/health and /metrics.
func TestDevAgentStatus(t *testing.T) {
	a := startAgent(t, nil, "--dev")
	p := a.waitHealthy(t, "demo")

	for _, key := range []string{"id", "type", "healthy", "health_description", "socket", "vendor_name",
		"vendor_version", "node_id", "max_volumes", "accessible_topology", "controller_capabilities",
		"node_capabilities", "last_probe"} {
		if _, ok := p[key]; !ok {
			t.Errorf("status --json plugin has no %q: %v", key, p)
		}
	}
	if p["type"] != "monolith" {
		t.Errorf("type = %v, want monolith", p["type"])
	}
	if s, _ := p["node_id"].(string); s == "" {
		t.Errorf("node_id = %v, want non-empty", p["node_id"])
	}
	if s, _ := p["vendor_name"].(string); s == "" {
		t.Errorf("vendor_name = %v, want non-empty", p["vendor_name"])
	}
	if s, _ := p["socket"].(string); !strings.HasSuffix(s, filepath.Join("demo", "csi.sock")) {
		t.Errorf("socket = %v, want .../demo/csi.sock", p["socket"])
	}
	if s, _ := p["last_probe"].(string); s == "" {
		t.Errorf("last_probe = %v, want a time", p["last_probe"])
	} else if _, err := time.Parse(time.RFC3339Nano, s); err != nil {
		t.Errorf("last_probe %q: %v", s, err)
	}
	if _, ok := p["controller_capabilities"].([]any); !ok {
		t.Errorf("controller_capabilities = %v, want a list", p["controller_capabilities"])
	}
	if _, ok := p["accessible_topology"].(map[string]any); !ok {
		t.Errorf("accessible_topology = %v, want an object", p["accessible_topology"])
	}

	// Text output names the plugin and its type.
	r := runCLI(t, "--address", a.addr(), "status")
	if r.code != 0 || !regexp.MustCompile(`(?m)^demo\s+monolith\s+healthy`).MatchString(r.Stdout) {
		t.Errorf("status: exit %d, output:\n%s%s", r.code, r.Stdout, r.Stderr)
	}
	// CSISUPD_ADDR is the default address.
	cmd := runCLIEnv(t, []string{"CSISUPD_ADDR=" + a.addr()}, "status", "--json")
	if cmd.code != 0 || !strings.Contains(cmd.Stdout, `"demo"`) {
		t.Errorf("status with CSISUPD_ADDR: exit %d: %s%s", cmd.code, cmd.Stdout, cmd.Stderr)
	}

	code, body := a.health()
	var h map[string]any
	if code != http.StatusOK || json.Unmarshal([]byte(body), &h) != nil || h["status"] != "ok" {
		t.Errorf("/v1/health = %d %s, want 200 with status ok", code, body)
	}
	testutil.WaitFor(t, 10*time.Second, "csisupd_plugin_healthy of demo = 1 in /metrics", func() bool {
		_, metrics := httpGet(fmt.Sprintf("http://127.0.0.1:%d/metrics", a.http))
		return regexp.MustCompile(`(?m)^csisupd_plugin_healthy\{[^}]*plugin_id="demo"[^}]*\} 1$`).MatchString(metrics)
	})
}

// events --json: a new plugin emits registered then healthy, and afterwards
// only changes: a kill, a restart on the same path (a new instance) and the
// removal of the socket.
func TestEventsLifecycle(t *testing.T) {
	dir := testutil.TempDir(t)
	cfg := writeFile(t, dir, "agent.hcl", `
client {
  probe_interval   = "200ms"
  probe_timeout    = "150ms"
  deregister_grace = "1s"
  rescan_interval  = "1s"
}
`)
	a := startAgent(t, nil, "--dev", "--config", cfg)
	a.waitHealthy(t, "demo")
	pluginDir := a.status(t).PluginDir
	if pluginDir == "" {
		t.Fatal("status --json has no plugin_dir")
	}
	ev := a.watchEvents(t)
	ev.waitTypes(t, "demo", "plugin-registered", "plugin-healthy")

	sock := filepath.Join(pluginDir, "extra", "csi.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		t.Fatal(err)
	}
	plugin := startTestPlugin(t, sock, "--node-id", "n1")
	ev.waitTypes(t, "extra", "plugin-registered", "plugin-healthy")

	plugin.Signal(t, syscall.SIGKILL)
	plugin.Wait(t, 10*time.Second)
	ev.waitTypes(t, "extra", "plugin-registered", "plugin-healthy", "plugin-unhealthy")

	startTestPlugin(t, sock, "--node-id", "n1")
	ev.waitTypes(t, "extra", "plugin-registered", "plugin-healthy", "plugin-unhealthy",
		"plugin-registered", "plugin-healthy")
	if p := a.status(t).plugin("extra"); p == nil || p["healthy"] != true {
		t.Errorf("after restart, status of extra = %v, want healthy", p)
	}

	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	ev.waitTypes(t, "extra", "plugin-registered", "plugin-healthy", "plugin-unhealthy",
		"plugin-registered", "plugin-healthy", "plugin-deregistered")
	if p := a.status(t).plugin("extra"); p != nil {
		t.Errorf("after deregistration, status still lists extra: %v", p)
	}
	// The demo plugin was probed every 200ms all along: steady state emits
	// nothing.
	if got := ev.types("demo"); strings.Join(got, ",") != "plugin-registered,plugin-healthy" {
		t.Errorf("events of demo = %v, want only registered and healthy", got)
	}
}

// SIGINT and SIGTERM stop the agent within 5 s with exit code 0, after it
// told systemd READY=1 and then STOPPING=1, and the registry is persisted.
func TestStopOnSignal(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			dir := testutil.TempDir(t)
			notifyPath := filepath.Join(dir, "notify")
			notify, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notifyPath, Net: "unixgram"})
			if err != nil {
				t.Fatal(err)
			}
			defer notify.Close()
			dataDir := filepath.Join(dir, "data")

			a := startAgent(t, []string{"NOTIFY_SOCKET=" + notifyPath}, "--dev", "--data-dir", dataDir)
			if msg := readNotify(t, notify); !strings.Contains(msg, "READY=1") {
				t.Fatalf("first sd_notify message = %q, want READY=1", msg)
			}
			a.waitHealthy(t, "demo")

			start := time.Now()
			a.Signal(t, sig)
			code := a.Wait(t, 10*time.Second)
			took := time.Since(start)
			if code != 0 {
				t.Errorf("exit code after %v = %d, want 0", sig, code)
			}
			if took >= 5*time.Second {
				t.Errorf("agent took %s to stop after %v, want < 5s", took, sig)
			}
			t.Logf("stopped %s after %v", took, sig)
			if msg := readNotify(t, notify); !strings.Contains(msg, "STOPPING=1") {
				t.Errorf("sd_notify message at shutdown = %q, want STOPPING=1", msg)
			}
			state, err := os.ReadFile(filepath.Join(dataDir, "registry.json"))
			if err != nil || !strings.Contains(string(state), `"demo"`) {
				t.Errorf("registry not persisted with the demo plugin: %v %s", err, state)
			}
			for _, port := range []int{a.rpc, a.http, a.raft} {
				if !portFree(port) {
					t.Errorf("port %d still in use after the agent exited", port)
				}
			}
		})
	}
}

func readNotify(t *testing.T, c *net.UnixConn) string {
	t.Helper()
	if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if err != nil {
		t.Fatalf("read sd_notify socket: %v", err)
	}
	return string(buf[:n])
}

// SIGHUP reloads the log level and the probe interval from the config file.
func TestReloadOnSIGHUP(t *testing.T) {
	dir := testutil.TempDir(t)
	cfgFile := writeFile(t, dir, "agent.hcl", `
log_level = "info"
client {
  probe_interval = "1h"
}
`)
	a := startAgent(t, nil, "--dev", "--config", cfgFile)
	first := a.waitHealthy(t, "demo")["last_probe"]
	if strings.Contains(a.Stderr.String(), "[DEBUG]") {
		t.Fatalf("debug lines logged at log_level info:\n%s", a.Stderr)
	}

	writeFile(t, dir, "agent.hcl", `
log_level = "debug"
client {
  probe_interval = "100ms"
  probe_timeout  = "100ms"
}
`)
	a.Signal(t, syscall.SIGHUP)
	testutil.WaitFor(t, 10*time.Second, `"configuration reloaded" log line`, func() bool {
		return strings.Contains(a.Stderr.String(), "configuration reloaded")
	})
	// The new probe interval applies: the demo plugin is probed again long
	// before the old interval of one hour.
	testutil.WaitFor(t, 10*time.Second, "a new probe of demo", func() bool {
		p := a.status(t).plugin("demo")
		return p != nil && p["last_probe"] != first
	})
	// The new log level applies: a new plugin's health change is logged
	// at debug level.
	sock := filepath.Join(a.status(t).PluginDir, "late", "csi.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		t.Fatal(err)
	}
	startTestPlugin(t, sock)
	a.waitHealthy(t, "late")
	testutil.WaitFor(t, 10*time.Second, "a debug line after the reload", func() bool {
		return strings.Contains(a.Stderr.String(), "[DEBUG]")
	})
	if a.Exited() {
		t.Fatalf("agent exited on SIGHUP: %s", a.Stderr)
	}
}

// SIGHUP with changes the agent cannot apply live: the keys that need a
// restart are named in one warning, an added tls block is refused at error
// level saying TLS stays off, nothing claims the configuration was
// reloaded, and the API still serves plain text.
func TestReloadOnSIGHUPNamesWhatItDoesNotApply(t *testing.T) {
	dir := testutil.TempDir(t)
	ca := testutil.NewCA(t, dir, "ca")
	cert, key := ca.Issue(t, "agent", x509.ExtKeyUsageServerAuth)
	cfgFile := writeFile(t, dir, "agent.hcl", `log_level = "info"`+"\n")
	a := startAgent(t, nil, "--dev", "--config", cfgFile)
	a.waitHealthy(t, "demo")

	writeFile(t, dir, "agent.hcl", fmt.Sprintf(`
log_level = "info"
name      = "renamed"
client {
  rpc_timeout = "30s"
}
tls {
  ca_file   = %q
  cert_file = %q
  key_file  = %q
}
`, ca.File, cert, key))
	a.Signal(t, syscall.SIGHUP)
	testutil.WaitFor(t, 10*time.Second, `"configuration partly reloaded" log line`, func() bool {
		return strings.Contains(a.Stderr.String(), "configuration partly reloaded")
	})
	logs := a.Stderr.String()
	for _, want := range []string{
		"[WARN]  csisupd: reload: name, client.rpc_timeout changed but take effect only after a restart",
		"[ERROR] csisupd: reload: tls: changing tls.ca_file, tls.cert_file, tls.key_file by reload is not supported; " +
			"TLS stays as it was (off: the gRPC API serves plain text); restart the agent to change it",
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("no log line %q in:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, "configuration reloaded") {
		t.Errorf("the agent logged \"configuration reloaded\" although it applied neither tls nor name:\n%s", logs)
	}
	if r := runCLI(t, "--address", a.addr(), "status"); r.code != 0 {
		t.Errorf("plain-text status after the refused tls reload: exit %d: %s", r.code, r.Stderr)
	}
	if a.Exited() {
		t.Fatalf("agent exited on SIGHUP: %s", a.Stderr)
	}
}

// A restarted agent lists the plugins of its data_dir at once.
func TestRestartRecoversRegistry(t *testing.T) {
	dir := testutil.TempDir(t)
	dataDir, pluginDir := filepath.Join(dir, "data"), filepath.Join(dir, "plugins")
	sock := filepath.Join(pluginDir, "keep", "csi.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		t.Fatal(err)
	}
	startTestPlugin(t, sock)
	args := []string{"--dev", "--data-dir", dataDir, "--plugin-dir", pluginDir}

	a := startAgent(t, nil, args...)
	before := a.waitHealthy(t, "keep")
	a.Signal(t, syscall.SIGTERM)
	if code := a.Wait(t, 10*time.Second); code != 0 {
		t.Fatalf("first agent exit code = %d", code)
	}

	b := startAgent(t, nil, args...)
	p := b.status(t).plugin("keep")
	if p == nil {
		t.Fatalf("restarted agent does not list plugin keep at once: %+v", b.status(t))
	}
	if st := p["health_state"]; st != "unknown" && st != "healthy" {
		t.Errorf("restored plugin health_state = %v, want unknown or healthy", st)
	}
	if p["registered_at"] != before["registered_at"] {
		t.Errorf("registered_at = %v, want %v from the first run (restored, not re-registered)",
			p["registered_at"], before["registered_at"])
	}
	b.waitHealthy(t, "keep")
}

// Config errors exit 1 naming file:line and key, and start nothing.
func TestConfigErrors(t *testing.T) {
	dir := testutil.TempDir(t)
	aFile := writeFile(t, dir, "not-a-dir", "")
	tests := []struct {
		name    string
		content string
		want    []string
	}{
		{"unknown key", "log_level = \"info\"\nbogus_key = 1\n", []string{"agent.hcl:2", "bogus_key"}},
		{"bad duration", "client {\n  probe_interval = \"5x\"\n}\n", []string{"agent.hcl:2", "client.probe_interval", "5x"}},
		{"plugin_dir is a file", "client {\n  plugin_dir = \"" + aFile + "\"\n}\n", []string{"agent.hcl:2", "client.plugin_dir", "not a directory"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := writeFile(t, dir, "agent.hcl", tt.content)
			dataDir := filepath.Join(dir, "data-"+strings.ReplaceAll(tt.name, " ", "-"))
			ports := testutil.FreePorts(t, 3)
			r := runCLI(t, "agent", "--config", cfg, "--data-dir", dataDir,
				"--rpc-port", fmt.Sprint(ports[0]), "--http-port", fmt.Sprint(ports[1]), "--raft-port", fmt.Sprint(ports[2]))
			if r.code != 1 {
				t.Errorf("exit code = %d, want 1; stderr:\n%s", r.code, r.Stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(r.Stderr, w) {
					t.Errorf("stderr does not name %q:\n%s", w, r.Stderr)
				}
			}
			if n := strings.Count(r.Stderr, tt.want[0]); n != 1 {
				t.Errorf("%q reported %d times, want once:\n%s", tt.want[0], n, r.Stderr)
			}
			if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
				t.Errorf("data dir was created for a bad config (err %v)", err)
			}
			for _, port := range ports {
				if !portFree(port) {
					t.Errorf("port %d in use after a config error", port)
				}
			}
		})
	}
}

// Usage errors exit 2; a client command without an agent exits 1 naming
// the address.
func TestExitCodes(t *testing.T) {
	free := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"agent", "--no-such-flag"}, 2, "--no-such-flag"},
		{[]string{"status", "--no-such-flag"}, 2, "--no-such-flag"},
		{[]string{"agent", "extra"}, 2, "arg"},
		{[]string{"status", "extra"}, 2, "arg"},
		{[]string{"version", "extra"}, 2, "arg"},
		{[]string{"no-such-command"}, 2, "no-such-command"},
		{[]string{"--address", free, "status"}, 1, free},
		{[]string{"--address", free, "status", "--json"}, 1, free},
		{[]string{"--address", free, "events"}, 1, free},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			r := runCLI(t, tt.args...)
			if r.code != tt.code {
				t.Errorf("exit code = %d, want %d; stderr:\n%s", r.code, tt.code, r.Stderr)
			}
			if !strings.Contains(r.Stderr, tt.want) {
				t.Errorf("stderr does not mention %q:\n%s", tt.want, r.Stderr)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	r := runCLI(t, "version")
	if r.code != 0 || !regexp.MustCompile(`^csisupd \S+ \(commit \S+, go[\d.]+`).MatchString(r.Stdout) {
		t.Errorf("version: exit %d, output %q", r.code, r.Stdout)
	}
	r = runCLI(t, "version", "--json")
	var v map[string]any
	if r.code != 0 || json.Unmarshal([]byte(r.Stdout), &v) != nil {
		t.Fatalf("version --json: exit %d, output %q", r.code, r.Stdout)
	}
	for _, key := range []string{"version", "commit", "go"} {
		if s, _ := v[key].(string); s == "" {
			t.Errorf("version --json has no %q: %v", key, v)
		}
	}
	if _, ok := v["dirty"].(bool); !ok {
		t.Errorf("version --json: dirty = %v, want a boolean", v["dirty"])
	}
	if _, ok := v["build_time"]; !ok {
		t.Errorf("version --json has no build_time: %v", v)
	}
	if flag := runCLI(t, "--version", "--json"); flag.code != 0 || flag.Stdout != r.Stdout {
		t.Errorf("--version --json: exit %d, output %q, want what version --json prints: %q", flag.code, flag.Stdout, r.Stdout)
	}
}
