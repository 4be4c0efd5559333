package e2e

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// A dev agent logs at info with raft's own lines at warn, says once that
// it is ready and what to try, and lets `operator debug` take its
// profiles although it has no ACLs and no token is passed.
func TestDevAgentOutputAndDebug(t *testing.T) {
	agent := startDevAgent(t, "e2e-devlog")
	ready := `[INFO]  csisupd: csisupd is ready: try "csisupd --address ` + agent.addr + ` status"`
	testutil.WaitFor(t, 30*time.Second, "the ready line", func() bool {
		return strings.Contains(agent.logs.String(), ready)
	})
	logs := agent.logs.String()
	if n := strings.Count(logs, "csisupd is ready"); n != 1 {
		t.Errorf("the ready line appears %d times, want once", n)
	}
	if strings.Index(logs, "agent serving") > strings.Index(logs, ready) {
		t.Errorf("the ready line comes before the agent serves")
	}
	if strings.Contains(logs, "[DEBUG]") {
		t.Errorf("a dev agent logged debug lines:\n%s", logs)
	}
	// raft's info lines (its states and elections) are held back.
	raftInfo := regexp.MustCompile(`(?m)^.*\[(TRACE|DEBUG|INFO)\] +csisupd\.server\.(raft|raft-net|snapshot):.*$`)
	if lines := raftInfo.FindAllString(logs, -1); len(lines) > 0 {
		t.Errorf("a dev agent logged raft's chatter below warn:\n%s", strings.Join(lines, "\n"))
	}
	if !strings.Contains(logs, "cluster leadership acquired") {
		t.Errorf("the agent's own info lines are missing:\n%s", logs)
	}

	outDir := testutil.TempDir(t)
	res := cli(t, agent.addr, "operator", "debug", "--duration", "2s", "--interval", "1s", "--output", outDir)
	if res.code != 0 {
		t.Fatalf("operator debug of a dev agent: exit %d: %s%s", res.code, res.stdout, res.stderr)
	}
	bundle := extract(t, strings.TrimSpace(res.stdout), testutil.TempDir(t))
	var manifest struct {
		Files  []string `json:"files"`
		Errors []struct {
			Part  string `json:"part"`
			Error string `json:"error"`
		} `json:"errors"`
	}
	data, err := os.ReadFile(filepath.Join(bundle, "manifest.json"))
	if err != nil || json.Unmarshal(data, &manifest) != nil {
		t.Fatalf("manifest.json: %v\n%s", err, data)
	}
	if len(manifest.Errors) != 0 {
		t.Errorf("operator debug of a dev agent recorded errors: %+v", manifest.Errors)
	}
	for _, name := range []string{"agent/pprof/cpu.prof", "agent/pprof/heap.prof", "agent/pprof/goroutine.txt"} {
		if fi, err := os.Stat(filepath.Join(bundle, name)); err != nil || fi.Size() == 0 {
			t.Errorf("profile %s: %v, %v; want a non-empty file", name, fi, err)
		}
	}
}

// `make run | tee log` whose tee died, then Ctrl-C: the agent's next log
// line meets a broken pipe. It must still stop cleanly, exit 0 and remove
// its temporary data directory, not die of SIGPIPE.
func TestDevAgentSurvivesBrokenStderr(t *testing.T) {
	ports := testutil.FreePorts(t, 3)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary, "agent", "--dev", "--name", "e2e-pipe",
		"--rpc-port", strconv.Itoa(ports[0]), "--raft-port", strconv.Itoa(ports[1]), "--http-port", strconv.Itoa(ports[2]))
	cmd.Env = cleanEnv()
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		select {
		case err := <-exited:
			exited <- err
		case <-time.After(10 * time.Second):
			t.Error("the agent did not exit within 10s of SIGKILL")
		}
	})

	// Read until the ready line, then close the reading end: the reader
	// is gone.
	var seen testutil.SyncBuffer
	readDone := make(chan string, 1)
	go func() {
		defer r.Close()
		dataDir := ""
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			line := sc.Text()
			seen.Write([]byte(line + "\n"))
			if m := regexp.MustCompile(`agent serving: .* data_dir=(\S+)`).FindStringSubmatch(line); m != nil {
				dataDir = m[1]
			}
			if strings.Contains(line, "csisupd is ready") {
				break
			}
		}
		readDone <- dataDir
	}()
	var dataDir string
	select {
	case dataDir = <-readDone:
	case <-time.After(30 * time.Second):
		t.Fatalf("no ready line within 30s:\n%s", seen.String())
	}
	if dataDir == "" || !strings.HasPrefix(filepath.Base(dataDir), "csisupd-dev-") {
		t.Fatalf("no temporary data dir in the agent's output:\n%s", seen.String())
	}
	if _, err := os.Stat(dataDir); err != nil {
		t.Fatalf("the dev data dir while the agent runs: %v", err)
	}

	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err // for the cleanup
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				t.Fatalf("the agent died of %v after its stderr broke", ws.Signal())
			}
		}
		if err != nil {
			t.Fatalf("the agent exited with %v after SIGINT", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the agent did not exit within 15s of SIGINT")
	}
	if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
		t.Errorf("the dev data dir %s after the agent stopped: %v; want it removed", dataDir, err)
	}
}

// The dev agent's demo plugin has the whole volume lifecycle the tour
// shows: snapshots, clones, modify and expansion, each checked in the
// plugin's own records.
func TestDevAgentDemoLifecycle(t *testing.T) {
	agent := startDevAgent(t, "e2e-demo")
	addr := agent.addr
	stateDir := filepath.Join(agent.dataDir, "demo-plugin-state")
	// record is the demo plugin's record of a volume, as far as this test
	// reads it.
	type record struct {
		CapacityBytes     int64             `json:"capacity_bytes"`
		SourceVolumeID    string            `json:"source_volume_id"`
		MutableParameters map[string]string `json:"mutable_parameters"`
	}
	read := func(externalID string) record {
		t.Helper()
		var r record
		b, err := os.ReadFile(filepath.Join(stateDir, "volumes", externalID+".json"))
		if err != nil || json.Unmarshal(b, &r) != nil {
			t.Fatalf("demo plugin record of %s: %v\n%s", externalID, err, b)
		}
		return r
	}

	var vol volumeDoc
	cliJSON(t, addr, &vol, "volume", "create", "data", "--plugin", "demo", "--capacity", "1MiB")
	if vol.ExternalID == "" {
		t.Fatalf("volume create: %+v", vol)
	}

	var snap snapshotDoc
	cliJSON(t, addr, &snap, "volume", "snapshot", "create", "data", "nightly")
	if snap.ID != "nightly" || snap.SourceVolumeID != "data" || snap.ExternalID == "" {
		t.Fatalf("volume snapshot create: %+v", snap)
	}

	var clone volumeDoc
	cliJSON(t, addr, &clone, "volume", "create", "data-copy", "--plugin", "demo", "--clone", "data")
	if clone.ExternalID == "" || clone.ExternalID == vol.ExternalID {
		t.Fatalf("volume create --clone: %+v", clone)
	}
	if r := read(clone.ExternalID); r.SourceVolumeID != vol.ExternalID {
		t.Errorf("the clone's source in the plugin is %q, want %s", r.SourceVolumeID, vol.ExternalID)
	}

	var modified struct {
		MutableParameters map[string]string `json:"mutable_parameters"`
	}
	cliJSON(t, addr, &modified, "volume", "modify", "data", "--parameter", "iops=3000")
	if modified.MutableParameters["iops"] != "3000" {
		t.Errorf("volume modify: mutable parameters %v, want iops=3000", modified.MutableParameters)
	}
	if r := read(vol.ExternalID); r.MutableParameters["iops"] != "3000" {
		t.Errorf("the plugin's mutable parameters after modify: %v, want iops=3000", r.MutableParameters)
	}

	res := cli(t, addr, "volume", "expand", "data", "--capacity", "2MiB")
	if res.code != 0 {
		t.Fatalf("volume expand: exit %d: %s", res.code, res.stderr)
	}
	testutil.WaitFor(t, 30*time.Second, "the expanded capacity in volume status and the plugin", func() bool {
		var got volumeDoc
		cliJSON(t, addr, &got, "volume", "status", "data")
		return got.CapacityBytes >= 2<<20 && read(vol.ExternalID).CapacityBytes >= 2<<20
	})
}
