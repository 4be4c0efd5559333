package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// The markers around the README's tour: one ```sh fence of commands.
const (
	tourBegin = "<!-- tour -->"
	tourEnd   = "<!-- /tour -->"
	// followMarker ends the comment of a command that follows a stream
	// until Ctrl-C: the tour test stops it once it has printed.
	followMarker = "Ctrl-C stops it"
	// tourPathLine is the tour's first line, which puts the built csisupd
	// on the PATH; the test puts its own binary there instead.
	tourPathLine = `export PATH="$PWD/bin:$PATH"`
)

// tourCommands returns the command lines of the README's tour.
func tourCommands(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), tourBegin)
	block, _, ok2 := strings.Cut(rest, tourEnd)
	if !ok || !ok2 {
		t.Fatalf("README has no %s ... %s block", tourBegin, tourEnd)
	}
	body, ok := strings.CutPrefix(strings.TrimSpace(block), "```sh\n")
	body, ok2 = strings.CutSuffix(body, "```")
	if !ok || !ok2 {
		t.Fatalf("the README's tour is not one ```sh fence:\n%s", block)
	}
	var lines []string
	for _, l := range strings.Split(body, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	if len(lines) < 2 || lines[0] != tourPathLine {
		t.Fatalf("the README's tour must start with %q, then its commands: %q", tourPathLine, lines)
	}
	return lines[1:]
}

// The README's tour works pasted as it is into `make run`'s dev mode:
// each of its commands, run by a shell against a dev agent named after
// the host as dev mode names it, exits 0.
func TestREADMETour(t *testing.T) {
	commands := tourCommands(t)
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	agent := startDevAgent(t, host)
	testutil.WaitFor(t, 30*time.Second, "plugin demo healthy in the cluster", func() bool {
		p, ok := tryPlugin(t, agent.addr, "demo")
		return ok && p.ControllersHealthy == 1 && p.NodesHealthy == 1
	})
	// The shell finds this test's csisupd as the tour's PATH line finds
	// bin/csisupd.
	binDir := testutil.TempDir(t)
	if err := os.Symlink(binary, filepath.Join(binDir, "csisupd")); err != nil {
		t.Fatal(err)
	}
	env := append(cleanEnv(), "CSISUPD_ADDR="+agent.addr, "PATH="+binDir+string(os.PathListSeparator)+os.Getenv("PATH"))

	for _, line := range commands {
		if strings.HasSuffix(line, followMarker) {
			runFollowing(t, env, line)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		cmd := exec.CommandContext(ctx, "sh", "-c", line)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("the README's tour: %s: %v\n%s", line, err, out)
		}
		t.Logf("$ %s\n%s", line, out)
	}
}

// runFollowing runs a tour command that follows a stream: it must print
// at least a line and still be following, as it would be when the reader
// presses Ctrl-C.
func runFollowing(t *testing.T, env []string, line string) {
	t.Helper()
	cmd := exec.Command("sh", "-c", "exec "+line)
	cmd.Env = env
	var out testutil.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-exited:
			t.Fatalf("the README's tour: %s: ended (%v) instead of following:\n%s", line, err, out.String())
		case <-deadline.C:
			_ = cmd.Process.Kill()
			<-exited
			t.Fatalf("the README's tour: %s: printed nothing within 30s", line)
		case <-tick.C:
			if !strings.Contains(out.String(), "\n") {
				continue
			}
			_ = cmd.Process.Kill()
			var exit *exec.ExitError
			if err := <-exited; err != nil && !errors.As(err, &exit) {
				t.Fatalf("the README's tour: %s: %v", line, err)
			}
			t.Logf("$ %s\n%s", line, out.String())
			return
		}
	}
}
