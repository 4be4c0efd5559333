//go:build fault

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// Markers of the README's outage recovery steps.
const (
	recoveryBegin = "<!-- outage-recovery:begin -->"
	recoveryEnd   = "<!-- outage-recovery:end -->"
)

// recoveryPlaceholders are the variables the README's steps may use; the
// README documents each. CSISUPD_ADDR is the CLI's own variable.
var recoveryPlaceholders = []string{"DATA_DIR", "SURVIVORS", "CSISUPD_ADDR"}

// recoveryServer is one server process with a data dir the test knows.
type recoveryServer struct {
	*agentProcess
	name, dataDir, config string
	rpc                   string
	httpPort              int
}

// startRecoveryServer starts a server named name on its own ports with
// bootstrap_expect = 3 and join in retry_join.
func startRecoveryServer(t *testing.T, name string, ports []int, join []string) *recoveryServer {
	t.Helper()
	s := &recoveryServer{name: name, dataDir: testutil.TempDir(t), rpc: fmt.Sprintf("127.0.0.1:%d", ports[0]), httpPort: ports[2]}
	s.config = agentHCLIn(t, name, s.dataDir, ports[0], ports[1], ports[2], fmt.Sprintf(`client { enabled = false }
server {
  enabled          = true
  bootstrap_expect = 3
  retry_join       = %s
}
`, hclList(join)))
	s.start(t)
	return s
}

func (s *recoveryServer) start(t *testing.T) {
	t.Helper()
	s.agentProcess = startAgentProcess(t, "server "+s.name, s.httpPort, "--config", s.config)
}

// kill ends the process at once, as a lost machine does.
func (s *recoveryServer) kill(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-s.exited
	s.stopped = true
}

// nodeID is the server's raft id, which the agent keeps in its data dir.
func (s *recoveryServer) nodeID(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.dataDir, "node-id"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// recoverySteps returns the command lines of the README's outage recovery
// block, without comments and blank lines.
func recoverySteps(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), recoveryBegin)
	block, _, ok2 := strings.Cut(rest, recoveryEnd)
	if !ok || !ok2 {
		t.Fatalf("docs/operations.md has no %s ... %s block", recoveryBegin, recoveryEnd)
	}
	block = strings.TrimSpace(block)
	body, ok := strings.CutPrefix(block, "```sh\n")
	body, ok2 = strings.CutSuffix(body, "```")
	if !ok || !ok2 {
		t.Fatalf("the README's recovery block is not one ```sh fence:\n%s", block)
	}
	var steps []string
	for _, line := range strings.Split(body, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		steps = append(steps, line)
	}
	for _, m := range regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)`).FindAllStringSubmatch(body, -1) {
		if !slices.Contains(recoveryPlaceholders, m[1]) {
			t.Fatalf("the README's recovery steps use $%s, which is not one of the documented placeholders %v", m[1], recoveryPlaceholders)
		}
	}
	return steps
}

// runStep runs one README command line with sh, the csisupd binary first
// in PATH and env added to the environment.
func runStep(t *testing.T, line string, env []string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-ec", line)
	cmd.Env = append(cleanEnv(), env...)
	cmd.Env = append(cmd.Env, "PATH="+filepath.Dir(binary)+string(os.PathListSeparator)+os.Getenv("PATH"))
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	res := cliResult{stdout: out.String(), stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		res.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s: %v", line, err)
	}
	return res
}

// TestOutageRecoveryByTheREADME loses two of three servers for good and
// brings the cluster back by running the README's outage recovery steps
// as written on the survivor: it then leads alone with the state intact,
// and two fresh servers join it to make three voters again. Before that,
// a bad peers.json keeps the survivor's agent from starting.
func TestOutageRecoveryByTheREADME(t *testing.T) {
	steps := recoverySteps(t)
	ports := testutil.FreePorts(t, 15)
	var join []string
	for i := range 3 {
		join = append(join, fmt.Sprintf("127.0.0.1:%d", ports[3*i]))
	}
	var servers []*recoveryServer
	for i := range 3 {
		servers = append(servers, startRecoveryServer(t, fmt.Sprintf("s%d", i), ports[3*i:3*i+3], join))
	}
	peers := func(addr string) (peersDoc, bool) {
		res := cli(t, addr, "operator", "raft", "list-peers", "--json")
		var d peersDoc
		return d, res.code == 0 && jsonInto(res.stdout, &d)
	}
	testutil.WaitFor(t, 60*time.Second, "a cluster of three servers with a leader", func() bool {
		d, ok := peers(join[0])
		if !ok || len(d.Peers) != 3 {
			return false
		}
		for _, p := range d.Peers {
			if p.Leader {
				return true
			}
		}
		return false
	})
	if res := cli(t, join[0], "volume", "register", "keep", "--plugin", "tp", "--external-id", "ext-keep"); res.code != 0 {
		t.Fatalf("volume register: exit %d: %s", res.code, res.stderr)
	}
	survivor := servers[2]
	testutil.WaitFor(t, 30*time.Second, "the volume in the survivor's own state", func() bool {
		var v volumeDoc
		res := cli(t, survivor.rpc, "volume", "status", "keep", "--stale", "--json")
		return res.code == 0 && jsonInto(res.stdout, &v) && v.ExternalID == "ext-keep"
	})

	// Two servers are lost with their disks.
	for _, s := range servers[:2] {
		s.kill(t)
		if err := os.RemoveAll(s.dataDir); err != nil {
			t.Fatal(err)
		}
	}
	// A bad peers.json keeps the survivor from starting at all, and stays.
	if err := survivor.stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(survivor.dataDir, "server", "raft", "peers.json")
	if err := os.WriteFile(bad, []byte(`[{"id": "", "address": "127.0.0.1:1"}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	p := testutil.StartProcess(t, cleanEnv(), binary, "agent", "--config", survivor.config)
	code := p.Wait(t, 30*time.Second)
	if out := p.Stdout.String() + p.Stderr.String(); code != 1 || !strings.Contains(out, bad) || !strings.Contains(out, "entry 1 has an empty id") {
		t.Fatalf("agent with a bad peers.json: exit %d:\n%s", code, out)
	}
	if err := os.Remove(bad); err != nil {
		t.Fatalf("the bad peers.json was not kept: %v", err)
	}
	survivor.start(t) // running again, without a quorum, as the README's steps find it

	survivorID := survivor.nodeID(t)
	env := []string{"DATA_DIR=" + survivor.dataDir, "SURVIVORS=" + survivorID, "CSISUPD_ADDR=" + survivor.rpc}
	var started, stoppedOnce bool
	for _, line := range steps {
		switch {
		case line == "systemctl stop csisupd":
			if err := survivor.stop(30 * time.Second); err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			stoppedOnce = true
		case line == "systemctl start csisupd":
			if !stoppedOnce {
				t.Fatalf("the README starts the agent before stopping it")
			}
			survivor.start(t)
			started = true
		case strings.HasPrefix(line, "systemctl"):
			t.Fatalf("the README's recovery steps run %q, which this test cannot map", line)
		case strings.HasPrefix(line, "csisupd operator raft list-peers"):
			// A check after the start: the survivor may still be electing.
			var res cliResult
			testutil.WaitFor(t, 60*time.Second, line, func() bool {
				res = runStep(t, line, env)
				return res.code == 0 && strings.Contains(res.stdout, survivorID) && strings.Contains(res.stdout, "true")
			})
			t.Logf("%s:\n%s", line, res.stdout)
		default:
			res := runStep(t, line, env)
			if res.code != 0 {
				t.Fatalf("%s: exit %d: %s", line, res.code, res.stderr)
			}
			t.Logf("%s:\n%s", line, res.stdout)
		}
	}
	if !started {
		t.Fatal("the README's recovery steps never start the agent again")
	}

	d, ok := peers(survivor.rpc)
	if !ok || len(d.Peers) != 1 || d.Peers[0].ID != survivorID || !d.Peers[0].Leader || d.Peers[0].Suffrage != "voter" {
		t.Fatalf("peers after recovery: %+v", d)
	}
	if _, err := os.Stat(filepath.Join(survivor.dataDir, "server", "raft", "peers.json")); !os.IsNotExist(err) {
		t.Fatalf("peers.json after the recovery: %v", err)
	}
	var v volumeDoc
	cliJSON(t, survivor.rpc, &v, "volume", "status", "keep")
	if v.ExternalID != "ext-keep" {
		t.Fatalf("volume after recovery: %+v", v)
	}

	// Two new servers, empty, join the survivor.
	for i := 3; i < 5; i++ {
		startRecoveryServer(t, fmt.Sprintf("s%d", i), ports[3*i:3*i+3], []string{survivor.rpc})
	}
	testutil.WaitFor(t, 120*time.Second, "three voters after the new servers joined", func() bool {
		d, ok := peers(survivor.rpc)
		if !ok || len(d.Peers) != 3 {
			return false
		}
		for _, p := range d.Peers {
			if p.Suffrage != "voter" {
				return false
			}
		}
		return true
	})
	cliJSON(t, survivor.rpc, &v, "volume", "status", "keep")
	if v.ExternalID != "ext-keep" {
		t.Fatalf("volume after the new servers joined: %+v", v)
	}
	if res := cli(t, survivor.rpc, "volume", "register", "after", "--plugin", "tp", "--external-id", "ext-after"); res.code != 0 {
		t.Fatalf("write after the recovery: exit %d: %s", res.code, res.stderr)
	}
}
