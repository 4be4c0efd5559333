package agent_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// Paths of the binaries built once by TestMain.
var (
	csisupdBin       string
	testPluginBin    string
	testRegistrarBin string
)

func TestMain(m *testing.M) {
	testutil.RunWithBinaries(m,
		testutil.Binary{Pkg: "github.com/csisupd/csisupd/cmd/csisupd", Path: &csisupdBin},
		testutil.Binary{Pkg: "github.com/csisupd/csisupd/internal/testplugin/cmd/csi-testplugin", Path: &testPluginBin},
		testutil.Binary{Pkg: "github.com/csisupd/csisupd/internal/testregistrar/cmd/csi-testregistrar", Path: &testRegistrarBin})
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t *testing.T) int {
	return testutil.FreePorts(t, 1)[0]
}

// portFree reports whether nothing listens on the loopback port.
func portFree(port int) bool {
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	_ = ln.Close()
	return true
}

// process is a started subprocess of a test.
type process = testutil.Process

// result is the outcome of a command run to completion.
type result struct {
	code           int
	Stdout, Stderr string
}

// runCLI runs csisupd with args to completion.
func runCLI(t *testing.T, args ...string) result {
	t.Helper()
	return runCLIEnv(t, nil, args...)
}

// runCLIEnv runs csisupd with args and env added to the environment.
func runCLIEnv(t *testing.T, env []string, args ...string) result {
	t.Helper()
	cmd := exec.Command(csisupdBin, args...)
	cmd.Env = append(append(os.Environ(), "CSISUPD_ADDR="), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("run csisupd %v: %v", args, err)
	}
	return result{code: code, Stdout: stdout.String(), Stderr: stderr.String()}
}

// agentProc is a running `csisupd agent`.
type agentProc struct {
	*process
	rpc, http, raft int
}

func (a *agentProc) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(a.rpc)) }

// startAgent runs `csisupd agent` with args plus free ports and waits until
// /v1/health answers 200. A start that lost a port to another process is
// retried once with new ports.
func startAgent(t *testing.T, env []string, args ...string) *agentProc {
	t.Helper()
	for attempt := 1; ; attempt++ {
		ports := testutil.FreePorts(t, 3)
		a := &agentProc{rpc: ports[0], http: ports[1], raft: ports[2]}
		full := append([]string{"agent",
			"--rpc-port", strconv.Itoa(a.rpc), "--http-port", strconv.Itoa(a.http), "--raft-port", strconv.Itoa(a.raft)},
			args...)
		a.process = testutil.StartProcess(t, env, csisupdBin, full...)
		deadline := time.Now().Add(20 * time.Second)
		for {
			if code, _ := a.health(); code == http.StatusOK {
				return a
			}
			if a.Exited() {
				if attempt == 1 && strings.Contains(a.Stderr.String(), "address already in use") {
					break // retry with new ports
				}
				t.Fatalf("agent exited with code %d before serving:\n%s", a.ExitCode(), a.Stderr)
			}
			if time.Now().After(deadline) {
				t.Fatalf("agent not serving after 20s:\n%s", a.Stderr)
			}
			time.Sleep(20 * time.Millisecond) // poll interval
		}
	}
}

// health returns the status code of GET /v1/health, or 0 when it cannot
// connect.
func (a *agentProc) health() (int, string) {
	return httpGet(fmt.Sprintf("http://127.0.0.1:%d/v1/health", a.http))
}

func httpGet(url string) (int, string) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// statusDoc is the part of `status --json` the tests read; raw keeps every
// field for contract checks.
type statusDoc struct {
	PluginDir string           `json:"plugin_dir"`
	Plugins   []map[string]any `json:"plugins"`
}

// status runs `csisupd status --json` against the agent.
func (a *agentProc) status(t *testing.T) statusDoc {
	t.Helper()
	r := runCLI(t, "--address", a.addr(), "status", "--json")
	if r.code != 0 {
		t.Fatalf("status --json: exit %d: %s", r.code, r.Stderr)
	}
	var doc statusDoc
	if err := json.Unmarshal([]byte(r.Stdout), &doc); err != nil {
		t.Fatalf("status --json is not one JSON object: %v\n%s", err, r.Stdout)
	}
	return doc
}

// plugin returns the status entry of plugin id, or nil.
func (d statusDoc) plugin(id string) map[string]any {
	for _, p := range d.Plugins {
		if p["id"] == id {
			return p
		}
	}
	return nil
}

// waitHealthy polls status until plugin id is healthy and returns its entry.
func (a *agentProc) waitHealthy(t *testing.T, id string) map[string]any {
	t.Helper()
	var p map[string]any
	testutil.WaitFor(t, 15*time.Second, "plugin "+id+" healthy in status", func() bool {
		p = a.status(t).plugin(id)
		return p != nil && p["healthy"] == true
	})
	return p
}

// event is one line of `events --json`.
type event struct {
	Time        string `json:"time"`
	Type        string `json:"type"`
	PluginID    string `json:"plugin_id"`
	Description string `json:"description"`
}

// eventStream is a running `csisupd events --json`.
type eventStream struct {
	mu     sync.Mutex
	events []event
	errs   []string
}

// watchEvents starts `csisupd events --json` against the agent.
func (a *agentProc) watchEvents(t *testing.T) *eventStream {
	t.Helper()
	s := &eventStream{}
	cmd := exec.Command(csisupdBin, "--address", a.addr(), "events", "--json")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr testutil.SyncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			var e event
			var raw map[string]any
			s.mu.Lock()
			if err := json.Unmarshal([]byte(line), &raw); err != nil {
				s.errs = append(s.errs, fmt.Sprintf("not JSON: %q", line))
			} else if err := json.Unmarshal([]byte(line), &e); err != nil || e.Time == "" || e.Type == "" || e.PluginID == "" {
				s.errs = append(s.errs, fmt.Sprintf("event without time, type or plugin_id: %q", line))
			} else if _, ok := raw["description"]; !ok {
				s.errs = append(s.errs, fmt.Sprintf("event without description: %q", line))
			} else if _, err := time.Parse(time.RFC3339Nano, e.Time); err != nil {
				s.errs = append(s.errs, fmt.Sprintf("event time %q is not RFC 3339", e.Time))
			} else {
				s.events = append(s.events, e)
			}
			s.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-scanned
		_ = cmd.Wait()
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, e := range s.errs {
			t.Errorf("events --json: %s", e)
		}
		if t.Failed() {
			t.Logf("events stderr: %s", stderr.String())
		}
	})
	return s
}

// types returns the event types seen so far for plugin id, in order.
func (s *eventStream) types(id string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, e := range s.events {
		if e.PluginID == id {
			out = append(out, e.Type)
		}
	}
	return out
}

// waitTypes waits until plugin id's events are exactly want.
func (s *eventStream) waitTypes(t *testing.T, id string, want ...string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		got := s.types(id)
		if strings.Join(got, ",") == strings.Join(want, ",") {
			return
		}
		if len(got) > len(want) || strings.Join(got, ",") != strings.Join(want[:len(got)], ",") {
			t.Fatalf("events of %s = %v, want %v", id, got, want)
		}
		if time.Now().After(deadline) {
			t.Fatalf("events of %s = %v after 15s, want %v", id, got, want)
		}
		time.Sleep(20 * time.Millisecond) // poll interval
	}
}

// startTestPlugin runs csi-testplugin on socket and waits until it serves.
func startTestPlugin(t *testing.T, socket string, args ...string) *process {
	t.Helper()
	p := testutil.StartProcess(t, nil, testPluginBin, append([]string{"--socket", socket}, args...)...)
	testutil.WaitFor(t, 10*time.Second, "csi-testplugin serving", func() bool {
		if p.Exited() {
			t.Fatalf("csi-testplugin exited: %s", p.Stderr)
		}
		return strings.Contains(p.Stdout.String(), "serving")
	})
	return p
}

// writeFile writes content to dir/name and returns the path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
