package agent

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/testutil"
)

// runningLogLevel is the log_level of the running configuration.
func runningLogLevel(a *Agent) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cfg.LogLevel
}

// A reload that overruns its deadline (its load blocks until the test
// releases it) stalls the reload loop: /v1/health answers 503 naming it,
// the systemd watchdog pings stop, and the log says so. Requests made
// meanwhile return at once, and run once the stuck reload ends; then the
// agent is healthy and pinging again.
func TestStuckReloadIsReportedAndTheNextOneRuns(t *testing.T) {
	sock, interval := fakeSystemd(t)

	cfg := testConfig(t)
	logs := &testutil.SyncBuffer{}
	a, err := New(Config{Config: cfg, Logger: hclog.New(&hclog.LoggerOptions{Name: "test", Output: logs}),
		ReloadTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	runAgent(t, a)
	t.Cleanup(unblock) // before the agent stops, if the test fails early

	var other []string
	if !sock.Ping(10*interval, &other) {
		t.Fatal("no watchdog ping before the reload")
	}
	stuck, next := *cfg, *cfg
	stuck.LogLevel, next.LogLevel = "debug", "trace"
	a.RequestReload(func() (*config.Config, error) {
		<-release
		return &stuck, nil
	})
	testutil.WaitFor(t, 10*time.Second, "/v1/health to name the stuck reload", func() bool {
		code, body := httpGet(t, a, "/v1/health")
		return code == http.StatusServiceUnavailable && strings.Contains(body, `"stalled_loops":["config reload"]`)
	})
	// The watchdog sees the deadline pass on its own; the loop's log line
	// comes from the loop and may follow a moment later.
	testutil.WaitFor(t, 10*time.Second, "the log line of the stuck reload", func() bool {
		return strings.Contains(logs.String(), `reload did not finish within its deadline`) && strings.Contains(logs.String(), `loop="config reload"`)
	})
	// As for any wedged loop: a ping decided before may still arrive, then
	// none for an interval.
	sock.Drain(&other)
	_ = sock.Ping(interval/2, &other)
	if sock.Ping(2*interval, &other) {
		t.Fatal("watchdog pinged while a reload is stuck")
	}

	// SIGHUPs meanwhile: neither call blocks, the second is merged.
	for range 2 {
		a.RequestReload(func() (*config.Config, error) { return &next, nil })
	}
	if got := runningLogLevel(a); got != cfg.LogLevel {
		t.Fatalf("log_level %q while the reload is stuck, want %q", got, cfg.LogLevel)
	}
	unblock()
	testutil.WaitFor(t, 10*time.Second, "the reload requested meanwhile to be applied", func() bool { return runningLogLevel(a) == "trace" })
	testutil.WaitFor(t, 10*time.Second, "/v1/health 200", func() bool {
		code, _ := httpGet(t, a, "/v1/health")
		return code == http.StatusOK
	})
	if !sock.Ping(10*interval, &other) {
		t.Fatal("no watchdog ping after the stuck reload ended")
	}
	out := logs.String()
	if !strings.Contains(out, "the reload that overran its deadline ended") || strings.Count(out, "configuration reloaded") != 2 {
		t.Errorf("want the stuck reload's end and two reloads logged:\n%s", out)
	}
}

// A FIFO put in a secrets file's place fails the reload at once, naming
// the file, and keeps the secrets read before; the agent stays healthy,
// and the next reload with a good file applies it.
func TestReloadRefusesAFIFOSecretsFile(t *testing.T) {
	cfg := testConfig(t)
	secretsPath := filepath.Join(filepath.Dir(cfg.DataDir), "p1.hcl")
	writeSecrets(t, secretsPath, "default {\n  token = \""+secretToken+"\"\n}\n", 0o600)
	cfg.Plugins = map[string]config.PluginConfig{"p1": {SecretsFile: secretsPath, HealthTimeout: config.DefaultPluginHealthTimeout}}
	logs := &testutil.SyncBuffer{}
	a, err := New(Config{Config: cfg, Logger: hclog.New(&hclog.LoggerOptions{Name: "test", Output: logs}), ReloadTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, a)
	reloads := func() int {
		out := logs.String()
		return strings.Count(out, "configuration reloaded") + strings.Count(out, "configuration partly reloaded")
	}
	load := func() (*config.Config, error) { return cfg, nil }

	if err := os.Remove(secretsPath); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(secretsPath, 0o600); err != nil {
		t.Fatal(err)
	}
	a.RequestReload(load)
	testutil.WaitFor(t, 10*time.Second, "the reload with a FIFO to end", func() bool { return reloads() == 1 })
	if want := "secrets file " + secretsPath + ": not a regular file (a FIFO)"; !strings.Contains(logs.String(), want) {
		t.Errorf("the log does not say %q:\n%s", want, logs)
	}
	if !a.secrets.Has("p1") {
		t.Error("the secrets read before were dropped")
	}
	if code, body := httpGet(t, a, "/v1/health"); code != http.StatusOK {
		t.Errorf("/v1/health after the failed reload = %d %s, want 200", code, body)
	}

	if err := os.Remove(secretsPath); err != nil {
		t.Fatal(err)
	}
	writeSecrets(t, secretsPath, "default {\n  token = \"rotated\"\n}\n", 0o600)
	a.RequestReload(load)
	testutil.WaitFor(t, 10*time.Second, "the reload with a good file", func() bool { return reloads() == 2 })
	if got := strings.Count(logs.String(), "secrets file read"); got != 2 {
		t.Errorf("%d secrets file reads logged, want 2 (start and the good reload):\n%s", got, logs)
	}
	if strings.Contains(logs.String(), secretToken) {
		t.Error("the log shows the secret")
	}
}
