//go:build fault

package e2e

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// fileAgentConfig writes the config of a client agent without servers
// whose plugin "tp" has the secrets file secrets, and returns its path
// and HTTP port.
func fileAgentConfig(t *testing.T, secrets string) (string, int) {
	t.Helper()
	ports := testutil.FreePorts(t, 3)
	cfg := agentHCLIn(t, "files-node", testutil.TempDir(t), ports[0], ports[1], ports[2], fmt.Sprintf(`client {
  plugin_dir = %q
}
plugin "tp" {
  secrets_file = %q
}
`, testutil.TempDir(t), secrets))
	return cfg, ports[2]
}

// mkfifo makes a FIFO at path, removing what is there.
func mkfifo(t *testing.T, path string) {
	t.Helper()
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestAgentRefusesAFIFOSecretsFile: with a FIFO as secrets_file, nobody
// writing to it, `csisupd agent` exits 1 within 5 s naming the file and
// "not a regular file", having served nothing. (It used to hang in the
// file's open without a log line.)
func TestAgentRefusesAFIFOSecretsFile(t *testing.T) {
	fifo := filepath.Join(testutil.TempDir(t), "tp.hcl")
	mkfifo(t, fifo)
	cfg, httpPort := fileAgentConfig(t, fifo)

	cmd := exec.Command(binary, "agent", "--config", cfg)
	cmd.Env = cleanEnv()
	logs := &testutil.SyncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	timer := time.NewTimer(5 * time.Second)
	defer timer.Stop()
	var err error
	select {
	case err = <-exited:
	case <-timer.C:
		_ = cmd.Process.Kill()
		<-exited
		t.Fatalf("agent still running 5s after start with a FIFO as secrets_file:\n%s", logs)
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("agent exit = %v, want exit status 1:\n%s", err, logs)
	}
	out := logs.String()
	if want := "secrets file " + fifo + ": not a regular file (a FIFO)"; !strings.Contains(out, want) {
		t.Errorf("output does not say %q:\n%s", want, out)
	}
	if strings.Contains(out, "agent serving") {
		t.Errorf("the agent served before it refused the file:\n%s", out)
	}
	if resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/v1/health", httpPort)); err == nil {
		resp.Body.Close()
		t.Error("something answers on the agent's HTTP port after it exited")
	}
}

// TestSecretsFileFIFOAcrossSIGHUP: a running agent whose secrets file is
// replaced by a FIFO fails the SIGHUP's reload at once, naming the file,
// keeps the secrets read before and stays healthy; the next SIGHUP, with
// a good file back, reads it.
func TestSecretsFileFIFOAcrossSIGHUP(t *testing.T) {
	secrets := filepath.Join(testutil.TempDir(t), "tp.hcl")
	const first, second = "tok-files-e2e-first-7f3", "tok-files-e2e-second-7f3"
	writeSecretsFile(t, secrets, map[string]string{"token": first})
	cfg, httpPort := fileAgentConfig(t, secrets)
	a := startAgentProcess(t, "agent", httpPort, "--config", cfg)
	reads := func() int { return strings.Count(a.logs.String(), "secrets file read") }
	if got := reads(); got != 1 {
		t.Fatalf("%d secrets file reads logged at start, want 1", got)
	}
	health := func() int {
		t.Helper()
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/v1/health", httpPort))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}

	mkfifo(t, secrets)
	a.reload(t)
	out := a.logs.String()
	if want := "secrets file " + secrets + ": not a regular file (a FIFO)"; !strings.Contains(out, want) {
		t.Errorf("the reload's log does not say %q:\n%s", want, out)
	}
	if !strings.Contains(out, "secrets file not read; the plugin keeps the secrets read before") {
		t.Errorf("the log does not say the secrets were kept:\n%s", out)
	}
	if code := health(); code != http.StatusOK {
		t.Errorf("/v1/health after the failed reload = %d, want 200", code)
	}

	if err := os.Remove(secrets); err != nil {
		t.Fatal(err)
	}
	writeSecretsFile(t, secrets, map[string]string{"token": second})
	a.reload(t)
	if got := reads(); got != 2 {
		t.Errorf("%d secrets file reads logged, want 2 (start and the reload with a good file):\n%s", got, a.logs)
	}
	if out := a.logs.String(); strings.Contains(out, first) || strings.Contains(out, second) {
		t.Error("the log shows a secret")
	}
	if code := health(); code != http.StatusOK {
		t.Errorf("/v1/health after the good reload = %d, want 200", code)
	}
	if err := a.stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
}
