package upgrade

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// The fixed ports of every agent of the fixture; each agent has a loopback
// address of its own. Raft's configuration in the fixture records the
// servers' raft addresses, so a server must come back at its own.
const (
	rpcPort  = 24780
	raftPort = 24781
	httpPort = 24782
)

// member is one agent of the fixture's cluster.
type member struct {
	name string // also its node id, written to its data_dir before its first start
	ip   string
}

func (m member) rpc() string { return fmt.Sprintf("%s:%d", m.ip, rpcPort) }

// lockAddresses holds the fixture's fixed addresses for the rest of the
// test against the tests of this package in other processes (another
// checkout's `go test ./...` on the same machine), with an flock that the
// kernel drops however the process ends. It waits for a holder at most
// 10 minutes.
func lockAddresses(t *testing.T) {
	t.Helper()
	name := filepath.Join(os.TempDir(), fmt.Sprintf("csisupd-upgrade-fixture-%d.lock", os.Getuid()))
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatalf("lock file of the fixture's addresses: %v", err)
	}
	t.Cleanup(func() { _ = f.Close() })
	testutil.WaitFor(t, 10*time.Minute, "the fixture's addresses, held by another test process", func() bool {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err != nil && !errors.Is(err, syscall.EWOULDBLOCK) {
			t.Fatalf("lock %s: %v", name, err)
		}
		return err == nil
	})
}

// fixtureServers are the three servers of the fixture.
func fixtureServers() []member {
	return []member{{"server-1", "127.0.0.21"}, {"server-2", "127.0.0.22"}, {"server-3", "127.0.0.23"}}
}

// fixtureClients are the client agents that registered the fixture's nodes.
func fixtureClients() []member {
	return []member{{"node-1", "127.0.0.31"}, {"node-2", "127.0.0.32"}}
}

// testdata paths.
const (
	dataDirs     = "testdata/data"         // one data_dir per server, server parts only
	snapshotFile = "testdata/snapshot.bin" // `operator snapshot save` of the final state
	goldenDir    = "testdata/golden"       // the API's answers before the stop
)

// pki is a directory of certificates made with `csisupd tls`. ACLs need
// TLS; certificates name a role, not an address, so the tests make their
// own rather than keep the fixture's.
type pki struct {
	bin, dir string
}

func newPKI(t *testing.T, bin string, servers, clients int) pki {
	t.Helper()
	p := pki{bin: bin, dir: testutil.TempDir(t)}
	p.tls(t, "ca", "create")
	// Agents are dialled at their own loopback addresses.
	var ips []string
	for _, m := range append(fixtureServers(), fixtureClients()...) {
		ips = append(ips, "--additional-ipaddress", m.ip)
	}
	for range servers {
		p.tls(t, append([]string{"cert", "create", "--server"}, ips...)...)
	}
	for range clients {
		p.tls(t, append([]string{"cert", "create", "--client"}, ips...)...)
	}
	p.tls(t, "cert", "create", "--cli")
	return p
}

func (p pki) tls(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command(p.bin, append(append([]string{"tls"}, args...), "--dir", p.dir)...).CombinedOutput()
	if err != nil {
		t.Fatalf("csisupd tls %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func (p pki) ca() string { return filepath.Join(p.dir, "csisupd-agent-ca.pem") }

func (p pki) cert(role string, n int) (cert, key string) {
	base := filepath.Join(p.dir, fmt.Sprintf("global-%s-csisupd-%d", role, n))
	return base + ".pem", base + "-key.pem"
}

// tlsBlock is the tls block of an agent with the n-th certificate of role.
func (p pki) tlsBlock(role string, n int) string {
	cert, key := p.cert(role, n)
	return fmt.Sprintf("tls {\n  ca_file   = %q\n  cert_file = %q\n  key_file  = %q\n}\n", p.ca(), cert, key)
}

// cliResult is one run of the CLI.
type cliResult struct {
	stdout, stderr string
	code           int
}

// cli runs the CLI of p.bin against addr with the --cli certificate and,
// when token is not empty, the token.
func (p pki) cli(t *testing.T, addr, token string, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cert, key := p.cert("cli", 0)
	flags := []string{"--address", addr, "--timeout", "30s", "--ca-file", p.ca(), "--client-cert", cert, "--client-key", key}
	if token != "" {
		flags = append(flags, "--token", token)
	}
	cmd := exec.CommandContext(ctx, p.bin, append(flags, args...)...)
	cmd.Env = cleanEnv()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	res := cliResult{stdout: out.String(), stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		res.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("csisupd %s: %v", strings.Join(args, " "), err)
	}
	return res
}

// mustCLI is cli that requires exit 0 and returns the standard output.
func (p pki) mustCLI(t *testing.T, addr, token string, args ...string) string {
	t.Helper()
	res := p.cli(t, addr, token, args...)
	if res.code != 0 {
		t.Fatalf("csisupd %s: exit %d: %s%s", strings.Join(args, " "), res.code, res.stderr, res.stdout)
	}
	return res.stdout
}

// cliJSON runs the CLI with --json, requires exit 0 and decodes the output
// into v.
func (p pki) cliJSON(t *testing.T, addr, token string, v any, args ...string) {
	t.Helper()
	out := p.mustCLI(t, addr, token, append(args, "--json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("csisupd %s --json: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// cleanEnv is the environment without CSISUPD_* variables.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CSISUPD_") {
			env = append(env, kv)
		}
	}
	return env
}

// serverConfig writes the configuration of server m (the n-th server
// certificate) with its data_dir and returns its path. The servers at
// join form a cluster through bootstrap_expect = len(join); with no join
// addresses the server forms a cluster of its own. claim_gc_grace is long
// so that no claim of a node the test does not run is released without
// it.
func serverConfig(t *testing.T, p pki, m member, n int, dataDir string, join []string) string {
	t.Helper()
	quoted := make([]string, len(join))
	for i, a := range join {
		quoted[i] = fmt.Sprintf("%q", a)
	}
	return writeConfig(t, m, dataDir, fmt.Sprintf(`client { enabled = false }
server {
  enabled          = true
  bootstrap_expect = %d
  retry_join       = [%s]
  claim_gc_grace   = "24h"
}
acl { enabled = true }
%s`, max(1, len(join)), strings.Join(quoted, ", "), p.tlsBlock("server", n)))
}

// writeConfig writes the configuration file of agent m: its name,
// data_dir, loopback address and fixed ports, no Consul, and body.
func writeConfig(t *testing.T, m member, dataDir, body string) string {
	t.Helper()
	content := fmt.Sprintf(`name      = %q
data_dir  = %q
bind_addr = %q
ports {
  rpc  = %d
  raft = %d
  http = %d
}
consul { enabled = false }
%s`, m.name, dataDir, m.ip, rpcPort, raftPort, httpPort, body)
	path := filepath.Join(testutil.TempDir(t), m.name+".hcl")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// startAgent starts `csisupd agent --config cfg` of bin for m and waits
// until its /v1/health answers 200.
func startAgent(t *testing.T, bin string, m member, cfg string) *testutil.Process {
	t.Helper()
	proc := testutil.StartProcess(t, nil, bin, "agent", "--config", cfg)
	waitHTTP(t, m, proc, "/v1/health")
	return proc
}

// waitHTTP waits until path on m's HTTP port answers 200: /v1/health once
// the agent serves, /v1/ready once a server also knows a leader.
func waitHTTP(t *testing.T, m member, proc *testutil.Process, path string) {
	t.Helper()
	url := fmt.Sprintf("http://%s:%d%s", m.ip, httpPort, path)
	client := &http.Client{Timeout: 2 * time.Second}
	testutil.WaitFor(t, 60*time.Second, m.name+"'s "+path, func() bool {
		if proc.Exited() {
			t.Fatalf("%s exited with %d:\n%s", m.name, proc.ExitCode(), proc.Stderr)
		}
		resp, err := client.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// stopAgent stops an agent with SIGTERM and requires a clean exit.
func stopAgent(t *testing.T, name string, proc *testutil.Process) {
	t.Helper()
	if err := proc.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("stop %s: %v", name, err)
	}
	if code := proc.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("%s exited with %d after SIGTERM:\n%s", name, code, proc.Stderr)
	}
}

// peersDoc is `operator raft list-peers --json`, as far as the tests read
// it.
type peersDoc struct {
	Peers []struct {
		ID          string `json:"id"`
		RaftAddress string `json:"raft_address"`
		Suffrage    string `json:"suffrage"`
		Leader      bool   `json:"leader"`
		Healthy     bool   `json:"healthy"`
	} `json:"peers"`
}

// waitForCluster waits until the server at addr answers list-peers with a
// leader and want voters, all of them healthy in autopilot's view when
// healthy is set.
func waitForCluster(t *testing.T, p pki, addr, token string, want int, healthy bool) {
	t.Helper()
	testutil.WaitFor(t, 90*time.Second, fmt.Sprintf("a leader and %d voters seen from %s", want, addr), func() bool {
		res := p.cli(t, addr, token, "operator", "raft", "list-peers", "--json")
		var doc peersDoc
		if res.code != 0 || json.Unmarshal([]byte(res.stdout), &doc) != nil || len(doc.Peers) != want {
			return false
		}
		leaders := 0
		for _, peer := range doc.Peers {
			if peer.Suffrage != "voter" || (healthy && !peer.Healthy) {
				return false
			}
			if peer.Leader {
				leaders++
			}
		}
		return leaders == 1
	})
}

// bootstrapACL bootstraps the ACLs of the cluster of the server at addr,
// retrying until the cluster has a leader, and returns the management
// token's secret.
func bootstrapACL(t *testing.T, p pki, addr string) string {
	t.Helper()
	var last cliResult
	var tok struct {
		SecretID string `json:"secret_id"`
	}
	defer func() { // also when WaitFor ends the test: the last answer says why
		if tok.SecretID == "" {
			t.Logf("last acl bootstrap: exit %d: %s%s", last.code, last.stderr, last.stdout)
		}
	}()
	testutil.WaitFor(t, 90*time.Second, "acl bootstrap", func() bool {
		last = p.cli(t, addr, "", "acl", "bootstrap", "--json")
		return last.code == 0 && json.Unmarshal([]byte(last.stdout), &tok) == nil && tok.SecretID != ""
	})
	return tok.SecretID
}

// credentials are the fixture's ACL secrets, kept beside its golden
// answers: the tests need them to read the cluster, and a token's secret
// is nowhere in the replicated state (only its hash).
type credentials struct {
	ManagementSecret string `json:"management_secret"`
	ClientAccessor   string `json:"client_accessor"`
	ClientSecret     string `json:"client_secret"`
}

// answers are the public API's answers the tests compare, each the --json
// output of one CLI command.
type answers map[string]json.RawMessage

// answerCommands are the CLI commands whose answers are compared, by
// golden file name. token-self is read with the client token.
func answerCommands() map[string][]string {
	return map[string][]string{
		"volumes":    {"volume", "list"},
		"nodes":      {"node", "status"},
		"tokens":     {"acl", "token", "list"},
		"policies":   {"acl", "policy", "list"},
		"peers":      {"operator", "raft", "list-peers"},
		"token-self": {"acl", "token", "self"},
	}
}

// readAnswers asks the server at addr every command of answerCommands.
func readAnswers(t *testing.T, p pki, addr string, cred credentials) answers {
	t.Helper()
	out := answers{}
	for name, args := range answerCommands() {
		token := cred.ManagementSecret
		if name == "token-self" {
			token = cred.ClientSecret
		}
		out[name] = json.RawMessage(p.mustCLI(t, addr, token, append(args, "--json")...))
	}
	return out
}

func readGolden(t *testing.T) (answers, credentials) {
	t.Helper()
	var cred credentials
	readJSON(t, filepath.Join(goldenDir, "credentials.json"), &cred)
	out := answers{}
	for name := range answerCommands() {
		b, err := os.ReadFile(filepath.Join(goldenDir, name+".json"))
		if err != nil {
			t.Fatal(err)
		}
		out[name] = b
	}
	return out, cred
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// compareAnswers compares got with the golden answers named in which,
// each after normalise.
func compareAnswers(t *testing.T, stage string, want, got answers, which ...string) {
	t.Helper()
	for _, d := range differences(t, want, got, which) {
		t.Errorf("%s: %s", stage, d)
	}
}

// differences describes each answer named in which that differs from the
// golden one after normalise.
func differences(t *testing.T, want, got answers, which []string) []string {
	t.Helper()
	var out []string
	for _, name := range which {
		w, g := normalise(t, name, want[name]), normalise(t, name, got[name])
		if !reflect.DeepEqual(w, g) {
			wj, _ := json.MarshalIndent(w, "", "  ")
			gj, _ := json.MarshalIndent(g, "", "  ")
			out = append(out, fmt.Sprintf("%s differs from the answer of the release that made the fixture:\n got  %s\n want %s", name, gj, wj))
		}
	}
	return out
}

// compareEachServer compares the volumes and nodes every server answers
// from its own state (--stale) with the golden answers, so that each
// server, not only the leader, is shown to have loaded the old data. A
// follower may trail the leader by a few entries, so each is read again
// until it matches or 30 s pass.
func compareEachServer(t *testing.T, stage string, p pki, members []member, want answers, cred credentials) {
	t.Helper()
	which := []string{"volumes", "nodes"}
	for _, m := range members {
		read := func() answers {
			return answers{
				"volumes": json.RawMessage(p.mustCLI(t, m.rpc(), cred.ManagementSecret, "volume", "list", "--stale", "--json")),
				"nodes":   json.RawMessage(p.mustCLI(t, m.rpc(), cred.ManagementSecret, "node", "status", "--stale", "--json")),
			}
		}
		var last []string
		// Also when WaitFor ends the test: the differences are the reason.
		defer func() {
			for _, d := range last {
				t.Logf("%s, read from %s's own state: %s", stage, m.name, d)
			}
		}()
		testutil.WaitFor(t, 30*time.Second, stage+": "+m.name+"'s own state to match the golden answers", func() bool {
			last = differences(t, want, read(), which)
			return len(last) == 0
		})
	}
}

// releasing reports whether a claim state is one of a release in
// progress, whose next step the leader's volume watcher keeps retrying.
func releasing(state any) bool {
	switch state {
	case "unpublishing", "node-unpublished", "controller-unpublished":
		return true
	}
	return false
}

// normalise decodes one answer and removes what legitimately changes
// across a stop and a start of the cluster, so that the rest must be
// equal:
//   - every answer's "index" (the raft index it was read at): a restarted
//     cluster writes (its leader's no-op, node status changes);
//   - a node's status, status_description, status_updated_at and
//     modify_index: the fixture's client agents do not run, so a leader
//     reports their nodes initializing and later stores them down;
//   - for a volume with a claim whose release is in progress: the
//     volume's modify_index and that claim's last_error and
//     state_updated_at, which the leader's volume watcher rewrites as it
//     retries the step (it cannot reach the fixture's nodes);
//   - a raft peer's leader flag and autopilot's view (healthy,
//     stable_since, last_contact_ms, last_index, last_term), and the
//     answer's term: they describe the running cluster, not the state.
//
// Lists are sorted by id so that order does not matter where the API does
// not promise one.
// dropEmpty deletes each key of doc whose value is the empty value empty
// gives for it: fields a later release added, which the fixture's release
// did not answer.
func dropEmpty(doc map[string]any, empty map[string]any) {
	for k, zero := range empty {
		if v, ok := doc[k]; ok && reflect.DeepEqual(v, zero) {
			delete(doc, k)
		}
	}
}

func normalise(t *testing.T, name string, raw json.RawMessage) any {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("%s: %v\n%s", name, err, raw)
	}
	delete(doc, "index")
	switch name {
	case "nodes":
		for _, n := range list(doc["nodes"]) {
			for _, k := range []string{"status", "status_description", "status_updated_at", "modify_index"} {
				delete(n, k)
			}
			// Added after the fixture's release; an upgraded node
			// drains nothing and was never rekeyed.
			dropEmpty(n, map[string]any{"draining_plugins": []any{}, "rekeyed": false, "replaced_by": ""})
		}
	case "volumes":
		for _, v := range list(doc["volumes"]) {
			// Added after the fixture's release, which answered without
			// them; an upgraded volume has them empty, and only then are
			// they dropped.
			dropEmpty(v, map[string]any{"capacity_limit_bytes": "0", "content_source": nil, "mutable_parameters": map[string]any{}, "expansion": nil,
				"availability": "", "conditions": []any{}, "ephemeral": false})
			for _, c := range list(v["claims"]) {
				// Added after the fixture's release, which answered
				// without it; an upgraded claim has none.
				delete(c, "staging_path")
				dropEmpty(c, map[string]any{"forced": false, "skipped_steps": []any{}, "owner": "", "release_reason": "",
					"lease_ttl": nil, "lease_renewed_at": nil, "lease_deadline": nil})
				if u, ok := c["usage"].(map[string]any); ok {
					dropEmpty(u, map[string]any{"volume_mount_group": ""})
				}
				if releasing(c["state"]) {
					delete(v, "modify_index")
					delete(c, "last_error")
					delete(c, "state_updated_at")
				}
			}
		}
	case "tokens":
		// Added after the fixture's release; an upgraded token has none.
		for _, tok := range list(doc["tokens"]) {
			dropEmpty(tok, map[string]any{"node_identity": ""})
		}
	case "token-self":
		dropEmpty(doc, map[string]any{"node_identity": ""})
	case "peers":
		delete(doc, "term")
		peers := list(doc["peers"])
		for _, p := range peers {
			for _, k := range []string{"leader", "healthy", "stable_since", "last_contact_ms", "last_index", "last_term"} {
				delete(p, k)
			}
		}
		sort.Slice(peers, func(i, j int) bool { return fmt.Sprint(peers[i]["id"]) < fmt.Sprint(peers[j]["id"]) })
		doc["peers"] = peers
	}
	return doc
}

// list returns the objects of a JSON list (nil when v is not one).
func list(v any) []map[string]any {
	items, _ := v.([]any)
	out := make([]map[string]any, 0, len(items))
	for _, it := range items {
		if m, ok := it.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

// copyTree copies the directory tree src to dst, files with mode 0600.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o700)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o600)
	})
	if err != nil {
		t.Fatalf("copy %s to %s: %v", src, dst, err)
	}
}
