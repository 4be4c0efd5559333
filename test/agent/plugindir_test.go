package agent_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// A world-writable plugin directory stops `csisupd agent` with exit code 1
// and an error naming client.plugin_dir, the path, the mode found and the
// fix; with client.allow_insecure_plugin_dir = true the agent starts and
// warns. Either way a symlink in the plugin directory is never dialled and
// shows as one plugin-socket-ignored event.
func TestInsecurePluginDir(t *testing.T) {
	dir := testutil.TempDir(t)
	pluginDir := filepath.Join(dir, "plugins")
	if err := os.Mkdir(pluginDir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(pluginDir, 0o777); err != nil {
		t.Fatal(err)
	}

	ports := testutil.FreePorts(t, 3)
	r := runCLI(t, "agent", "--data-dir", filepath.Join(dir, "data"), "--plugin-dir", pluginDir,
		"--rpc-port", fmt.Sprint(ports[0]), "--http-port", fmt.Sprint(ports[1]), "--raft-port", fmt.Sprint(ports[2]))
	if r.code != 1 {
		t.Errorf("exit code = %d, want 1; stderr:\n%s", r.code, r.Stderr)
	}
	for _, w := range []string{"client.plugin_dir", pluginDir, "mode drwxrwxrwx", "writable by others",
		"fix: chmod go-w " + pluginDir, "client.allow_insecure_plugin_dir = true"} {
		if !strings.Contains(r.Stderr, w) {
			t.Errorf("stderr does not contain %q:\n%s", w, r.Stderr)
		}
	}
	for _, port := range ports {
		if !portFree(port) {
			t.Errorf("port %d in use after the agent refused to start", port)
		}
	}

	// Allowed: the agent starts, warns, and still follows no symlink.
	outside := testutil.TempDir(t)
	l, err := net.Listen("unix", filepath.Join(outside, "out.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	link := filepath.Join(pluginDir, "evil.sock")
	if err := os.Symlink(filepath.Join(outside, "out.sock"), link); err != nil {
		t.Fatal(err)
	}
	cfg := writeFile(t, dir, "agent.hcl", "client {\n  allow_insecure_plugin_dir = true\n}\n")
	a := startAgent(t, nil, "--dev", "--config", cfg, "--plugin-dir", pluginDir)
	if s := a.Stderr.String(); !strings.Contains(s, "[WARN]") || !strings.Contains(s, "client.allow_insecure_plugin_dir = true") {
		t.Errorf("agent stderr has no warning about the insecure plugin directory:\n%s", s)
	}
	a.waitHealthy(t, "demo")
	ev := a.watchEvents(t)
	ev.waitTypes(t, "evil", "plugin-socket-ignored")
	ev.mu.Lock()
	var desc string
	for _, e := range ev.events {
		if e.PluginID == "evil" {
			desc = e.Description
		}
	}
	ev.mu.Unlock()
	for _, w := range []string{link + " ignored: ", "outside the plugin directory", "never followed"} {
		if !strings.Contains(desc, w) {
			t.Errorf("plugin-socket-ignored description %q does not contain %q", desc, w)
		}
	}
	if p := a.status(t).plugin("evil"); p != nil {
		t.Errorf("status lists a plugin reached through a symlink: %v", p)
	}
	a.Signal(t, syscall.SIGTERM)
	if code := a.Wait(t, 10*time.Second); code != 0 {
		t.Errorf("agent exit code = %d, want 0", code)
	}
	// The agent has stopped: a dial it made would wait in the accept queue.
	if err := l.(*net.UnixListener).SetDeadline(time.Now()); err != nil {
		t.Fatal(err)
	}
	if c, err := l.Accept(); err == nil {
		_ = c.Close()
		t.Error("the socket behind the symlink was dialled")
	} else if ne := (net.Error)(nil); !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("accept: %v, want a timeout", err)
	}
}
