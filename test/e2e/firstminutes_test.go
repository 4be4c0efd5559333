package e2e

import (
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// quietWindow is how long a fresh dev agent must log no warning or error:
// the first seconds in which a newcomer reads its output.
const quietWindow = 10 * time.Second

// A newcomer's first minutes, as `make run` starts them: a fresh
// `csisupd agent --dev` logs no WARN or ERROR in its first 10 s, and a
// `volume create` issued as soon as `csisupd status` answers succeeds the
// first time.
func TestFreshDevAgentFirstMinutes(t *testing.T) {
	ports := testutil.FreePorts(t, 3)
	addr := "127.0.0.1:" + strconv.Itoa(ports[0])
	logs := &testutil.SyncBuffer{}
	cmd := exec.Command(binary, "agent", "--dev", "--name", "newcomer",
		"--rpc-port", strconv.Itoa(ports[0]), "--raft-port", strconv.Itoa(ports[1]), "--http-port", strconv.Itoa(ports[2]))
	cmd.Env = cleanEnv()
	cmd.Stdout, cmd.Stderr = logs, logs
	started := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("dev agent output:\n%s", logs.String())
		}
	})

	var status cliResult
	testutil.WaitFor(t, 30*time.Second, "`csisupd status` to answer", func() bool {
		status = cli(t, addr, "status")
		return status.code == 0
	})
	create := cli(t, addr, "volume", "create", "first", "--plugin", "demo")
	if create.code != 0 {
		t.Fatalf("volume create right after status answered: exit %d: %s", create.code, create.stderr)
	}
	if !strings.Contains(create.stdout, "Created volume first") {
		t.Errorf("volume create printed %q", create.stdout)
	}

	// Watch the whole window, then read what it logged.
	deadline := time.NewTimer(time.Until(started.Add(quietWindow)))
	defer deadline.Stop()
	select {
	case err := <-exited:
		t.Fatalf("dev agent exited: %v", err)
	case <-deadline.C:
	}
	loud := regexp.MustCompile(`(?m)^.*\[(WARN|ERROR)\].*$`)
	if lines := loud.FindAllString(logs.String(), -1); len(lines) > 0 {
		t.Errorf("a fresh dev agent logged %d warnings or errors in its first %s:\n%s", len(lines), quietWindow, strings.Join(lines, "\n"))
	}
}

// `csisupd plugin status` against a server that has no leader (it waits
// for a second server that never comes) says so, rather than that the
// agent cannot be reached.
func TestPluginStatusNoLeader(t *testing.T) {
	ports := testutil.FreePorts(t, 4)
	addr := "127.0.0.1:" + strconv.Itoa(ports[0])
	startAgentProcess(t, "server without peer", ports[2], "--server", "--bootstrap-expect", "2",
		"--retry-join", "127.0.0.1:"+strconv.Itoa(ports[3]), "--name", "lonely", "--data-dir", testutil.TempDir(t),
		"--plugin-dir", testutil.TempDir(t),
		"--rpc-port", strconv.Itoa(ports[0]), "--raft-port", strconv.Itoa(ports[1]), "--http-port", strconv.Itoa(ports[2]))
	res := cli(t, addr, "plugin", "status")
	if res.code != 1 {
		t.Fatalf("plugin status without a leader: exit %d, want 1 (stdout %q, stderr %q)", res.code, res.stdout, res.stderr)
	}
	if !strings.Contains(res.stderr, "the cluster has no leader") || strings.Contains(res.stderr, "cannot reach") {
		t.Errorf("plugin status without a leader printed %q, want a message saying the cluster has no leader", res.stderr)
	}
}
