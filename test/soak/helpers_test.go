package soak

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testutil"
)

// Paths of the binaries built once by TestMain. agentBin is built with the
// race detector when the tests run with it.
var (
	agentBin      string
	testPluginBin string
	hostileBin    string
)

const (
	agentPkg      = "github.com/csisupd/csisupd/cmd/csisupd"
	testPluginPkg = "github.com/csisupd/csisupd/internal/testplugin/cmd/csi-testplugin"
	hostilePkg    = "github.com/csisupd/csisupd/test/soak/cmd/csi-hostile"
)

func TestMain(m *testing.M) {
	testutil.RunWithBinaries(m,
		// The agent is the code under test: with -race it runs with the
		// race detector too. The plugins are tools.
		testutil.Binary{Pkg: agentPkg, Race: raceEnabled, Path: &agentBin},
		testutil.Binary{Pkg: testPluginPkg, Path: &testPluginBin},
		testutil.Binary{Pkg: hostilePkg, Path: &hostileBin})
}

// process is a started subprocess of a test.
type process = testutil.Process

// timing is the agent's client timing.
type timing struct {
	probeInterval, probeTimeout, deregisterGrace time.Duration
}

// agent is a running `csisupd agent` with its own data and plugin
// directories, and an Agent API client.
type agent struct {
	*process
	dataDir   string
	pluginDir string
	rpcPort   int
	httpPort  int
	client    csisupdv1.AgentClient
}

// startAgent runs bin as a non-dev agent (consul disabled, log level warn)
// on free loopback ports, with its plugin directory under dir, and waits
// until /v1/health answers 200. A start that lost a port to another process
// is retried once with new ports. At cleanup the agent is killed (if still
// running) and its output is checked for panics and data races.
func startAgent(t testing.TB, bin, dir string, tm timing) *agent {
	t.Helper()
	a := &agent{dataDir: filepath.Join(dir, "data"), pluginDir: filepath.Join(dir, "plugins")}
	if err := os.MkdirAll(a.pluginDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for attempt := 1; ; attempt++ {
		ports := testutil.FreePorts(t, 3)
		a.rpcPort, a.httpPort = ports[0], ports[1]
		cfg := filepath.Join(dir, "agent.hcl")
		writeFile(t, cfg, fmt.Sprintf(`
name      = "soak"
data_dir  = %q
log_level = "warn"
ports {
  rpc  = %d
  http = %d
  raft = %d
}
client {
  plugin_dir       = %q
  probe_interval   = %q
  probe_timeout    = %q
  deregister_grace = %q
}
consul {
  enabled = false
}
`, a.dataDir, ports[0], ports[1], ports[2], a.pluginDir, tm.probeInterval, tm.probeTimeout, tm.deregisterGrace))
		a.process = testutil.StartProcess(t, nil, bin, "agent", "--config", cfg)
		if a.waitServing(t) {
			break
		}
		if attempt > 1 || !strings.Contains(a.Stderr.String(), "address already in use") {
			t.Fatalf("agent exited with code %d before serving:\n%s", a.ExitCode(), a.Stderr)
		}
	}
	// Registered after startProcess's cleanup, so it runs before it: the
	// agent is stopped here and its whole output checked.
	t.Cleanup(func() {
		_ = a.Cmd.Process.Kill()
		<-a.Done()
		checkAgentOutput(t, a.Stderr.String())
	})
	conn, err := grpc.NewClient(fmt.Sprintf("127.0.0.1:%d", a.rpcPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	a.client = csisupdv1.NewAgentClient(conn)
	return a
}

// checkAgentOutput fails the test when the agent panicked or the race
// detector reported a race.
func checkAgentOutput(t testing.TB, stderr string) {
	t.Helper()
	for _, bad := range []string{"panic", "DATA RACE"} {
		if strings.Contains(stderr, bad) {
			t.Errorf("agent output contains %q:\n%s", bad, stderr)
		}
	}
}

// waitServing waits until /v1/health answers 200; false when the agent
// exited first.
func (a *agent) waitServing(t testing.TB) bool {
	t.Helper()
	c := http.Client{Timeout: 2 * time.Second}
	url := fmt.Sprintf("http://127.0.0.1:%d/v1/health", a.httpPort)
	serving := false
	// A race-enabled build starts slower; 30 s is far above either.
	testutil.WaitFor(t, 30*time.Second, "agent serving /v1/health", func() bool {
		if a.Exited() {
			return true
		}
		resp, err := c.Get(url)
		if err != nil {
			return false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		serving = resp.StatusCode == http.StatusOK
		return serving
	})
	return serving
}

// plugins returns the agent's plugins by id. The call is bounded: an agent
// that cannot answer within 2 s fails it.
func (a *agent) plugins() (map[string]*csisupdv1.Plugin, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := a.client.ListPlugins(ctx, &csisupdv1.ListPluginsRequest{})
	if err != nil {
		return nil, err
	}
	out := make(map[string]*csisupdv1.Plugin, len(resp.GetPlugins()))
	for _, p := range resp.GetPlugins() {
		out[p.GetId()] = p
	}
	return out, nil
}

// mustPlugins is plugins failing the test on error.
func (a *agent) mustPlugins(t testing.TB) map[string]*csisupdv1.Plugin {
	t.Helper()
	ps, err := a.plugins()
	if err != nil {
		t.Fatalf("ListPlugins: %v", err)
	}
	return ps
}

// waitPlugins polls ListPlugins until cond holds for the plugins and
// returns when it first held, with the plugins seen then.
func (a *agent) waitPlugins(t testing.TB, timeout time.Duration, what string, cond func(map[string]*csisupdv1.Plugin) bool) (time.Time, map[string]*csisupdv1.Plugin) {
	t.Helper()
	var ps map[string]*csisupdv1.Plugin
	var lastErr error
	deadline := time.Now().Add(timeout)
	for {
		var err error
		ps, err = a.plugins()
		now := time.Now()
		if err == nil && cond(ps) {
			return now, ps
		}
		if err != nil {
			lastErr = err
		}
		if a.Exited() {
			t.Fatalf("agent exited with %d while waiting for %s:\n%s", a.ExitCode(), what, a.Stderr)
		}
		if now.After(deadline) {
			t.Fatalf("timed out after %s waiting for %s (last ListPlugins error: %v); plugins:\n%s", timeout, what, lastErr, describe(ps))
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
}

// describe lists plugins one a line, sorted by id, for failure messages.
func describe(ps map[string]*csisupdv1.Plugin) string {
	ids := make([]string, 0, len(ps))
	for id := range ps {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	var b strings.Builder
	for _, id := range ids {
		p := ps[id]
		fmt.Fprintf(&b, "  %s: %s %q\n", id, p.GetHealthState(), p.GetHealthDescription())
	}
	return b.String()
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// waitEach polls ListPlugins until cond held for every id (p is nil for a
// plugin the agent does not list) and returns, per id, when it first held
// and the plugin then.
func (a *agent) waitEach(t testing.TB, timeout time.Duration, what string, ids []string, cond func(p *csisupdv1.Plugin) bool) (map[string]time.Time, map[string]*csisupdv1.Plugin) {
	t.Helper()
	at := make(map[string]time.Time, len(ids))
	seen := make(map[string]*csisupdv1.Plugin, len(ids))
	a.waitPlugins(t, timeout, what, func(ps map[string]*csisupdv1.Plugin) bool {
		now := time.Now()
		for _, id := range ids {
			if _, done := at[id]; !done && cond(ps[id]) {
				at[id], seen[id] = now, ps[id]
			}
		}
		return len(at) == len(ids)
	})
	return at, seen
}
