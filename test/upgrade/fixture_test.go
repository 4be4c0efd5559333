//go:build fixture

package upgrade

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// fixtureCommit is the release the fixture in testdata was made with: the
// last commit whose servers stored the public API messages.
const fixtureCommit = "35545f8"

// TestMakeFixture remakes testdata with the release at fixtureCommit (or
// CSISUPD_FIXTURE_COMMIT): it builds that release from `git archive`, runs
// three servers and two client agents of it on fixed loopback addresses
// with TLS and ACLs on, writes state, makes every server take a raft
// snapshot and writes more after it, saves a snapshot file, records the
// API's answers, stops everything and keeps the servers' parts of their
// data_dirs. See testdata/README.md.
func TestMakeFixture(t *testing.T) {
	lockAddresses(t)
	commit := fixtureCommit
	if c := os.Getenv("CSISUPD_FIXTURE_COMMIT"); c != "" {
		commit = c
	}
	old := buildRelease(t, commit)
	p := newPKI(t, old, 3, 2)

	servers := fixtureServers()
	var join []string
	for _, m := range servers {
		join = append(join, m.rpc())
	}
	dirs := make([]string, len(servers))
	procs := make([]*testutil.Process, len(servers))
	for i, m := range servers {
		dirs[i] = testutil.TempDir(t)
		writeNodeID(t, dirs[i], m.name)
		procs[i] = startAgent(t, old, m, serverConfig(t, p, m, i, dirs[i], join))
	}
	addr := servers[0].rpc()

	// ACLs: the bootstrap (retried until there is a leader), a policy and
	// token for the client agents, and a reader's policy and client token.
	cred := credentials{ManagementSecret: bootstrapACL(t, p, addr)}
	mgmt := cred.ManagementSecret
	waitForCluster(t, p, addr, mgmt, 3, false)
	applyPolicy(t, p, addr, mgmt, "agent", `node { policy = "write" }`)
	applyPolicy(t, p, addr, mgmt, "reader", "volume { policy = \"read\" }\nplugin { policy = \"read\" }\nnode { policy = \"read\" }")
	agentToken := createToken(t, p, addr, mgmt, "agents", "agent")
	reader := createToken(t, p, addr, mgmt, "reader", "reader")
	cred.ClientAccessor, cred.ClientSecret = reader.AccessorID, reader.SecretID

	// Two client agents: node-1 runs the plugin's controller and node
	// services, node-2 its node service; both in zone z1.
	clients := fixtureClients()
	controller, dir1 := startPlugin(t, testplugin.Config{
		Type: testplugin.TypeMonolith, NodeID: "csi-node-1", KnownNodeIDs: []string{testplugin.AnyNode},
		Topology: map[string]string{"zone": "z1"}, VendorVersion: "1.2.3",
	})
	_, dir2 := startPlugin(t, testplugin.Config{
		Type: testplugin.TypeNode, NodeID: "csi-node-2", ForeignVolumes: true, MaxVolumes: 16,
		Topology: map[string]string{"zone": "z1"}, VendorVersion: "1.2.3",
	})
	pluginDirs := []string{dir1, dir2}
	clientProcs := make([]*testutil.Process, len(clients))
	for i, m := range clients {
		dir := testutil.TempDir(t)
		writeNodeID(t, dir, m.name)
		cfg := writeConfig(t, m, dir, fmt.Sprintf(`client {
  plugin_dir     = %q
  servers        = [%q, %q, %q]
  probe_interval = "1s"
  probe_timeout  = "1s"
}
acl {
  enabled = true
  tokens { agent = %q }
}
%s`, pluginDirs[i], join[0], join[1], join[2], agentToken.SecretID, p.tlsBlock("client", i)))
		clientProcs[i] = startAgent(t, old, m, cfg)
	}
	waitPlugin := func() {
		t.Helper()
		testutil.WaitFor(t, 60*time.Second, "plugin tp healthy on both nodes", func() bool {
			res := p.cli(t, addr, mgmt, "plugin", "status", "tp", "--json")
			var doc struct {
				ControllersHealthy int `json:"controllers_healthy"`
				NodesHealthy       int `json:"nodes_healthy"`
			}
			return res.code == 0 && json.Unmarshal([]byte(res.stdout), &doc) == nil &&
				doc.ControllersHealthy == 1 && doc.NodesHealthy == 2
		})
	}
	waitPlugin()

	// State that the raft snapshot will hold: a registered volume, created
	// volumes, and claims that are done (taken and mounted).
	cli := func(args ...string) string { return p.mustCLI(t, addr, mgmt, args...) }
	cli("volume", "register", "vol-registered", "--plugin", "tp", "--external-id", "ext-registered",
		"--capacity", "2GiB", "--context", "origin=fixture", "--parameter", "tier=gold", "--access-mode", "multi-node-multi-writer")
	cli("volume", "create", "vol-web", "--plugin", "tp", "--capacity", "1GiB", "--parameter", "kind=web")
	cli("volume", "create", "vol-db", "--plugin", "tp", "--capacity", "1GiB", "--fs-type", "ext4", "--mount-flag", "noatime")
	cli("volume", "create", "vol-shared", "--plugin", "tp", "--capacity", "1GiB", "--access-mode", "multi-node-reader-only")
	cli("volume", "claim", "vol-web", "--node", "node-1", "--workload", "web-1")
	cli("volume", "claim", "vol-db", "--node", "node-2", "--workload", "db-1")
	cli("volume", "claim", "vol-shared", "--node", "node-1", "--workload", "reader-1", "--read-only", "--access-mode", "multi-node-reader-only")
	cli("volume", "claim", "vol-shared", "--node", "node-2", "--workload", "reader-2", "--read-only", "--access-mode", "multi-node-reader-only")

	// Every server takes a raft snapshot: a restore writes one on the
	// leader and leaves a gap in its log, so that the followers are sent
	// it too. The release has no other way to ask for one.
	forced := filepath.Join(testutil.TempDir(t), "forced.snap")
	cli("operator", "snapshot", "save", forced)
	cli("operator", "snapshot", "restore", forced)
	for i, m := range servers {
		testutil.WaitFor(t, 60*time.Second, m.name+"'s raft snapshot", func() bool { return len(raftSnapshots(t, dirs[i])) > 0 })
	}
	waitForCluster(t, p, addr, mgmt, 3, false)
	// The restored state's nodes are initializing until they heartbeat.
	waitPlugin()

	// State in the log after the snapshot: a volume claimed and released
	// again, a new policy and token, a release stopped halfway (the
	// controller refuses to unpublish: the claim stays node-unpublished
	// with its error), and a volume deleted.
	cli("volume", "create", "vol-batch", "--plugin", "tp", "--capacity", "1GiB")
	cli("volume", "claim", "vol-batch", "--node", "node-2", "--workload", "batch-1")
	cli("volume", "release", "vol-batch", "--node", "node-2", "--workload", "batch-1")
	cli("volume", "create", "vol-gone", "--plugin", "tp", "--capacity", "1GiB")
	cli("volume", "delete", "vol-gone")
	applyPolicy(t, p, addr, mgmt, "operator", "operator { policy = \"read\" }\nvolume { policy = \"write\" }")
	createToken(t, p, addr, mgmt, "operator", "operator")
	controller.SetFaults(testplugin.Faults{Errors: map[string]codes.Code{"ControllerUnpublishVolume": codes.Internal}})
	if res := p.cli(t, addr, mgmt, "volume", "release", "vol-db", "--node", "node-2", "--workload", "db-1"); res.code == 0 {
		t.Fatalf("release of vol-db succeeded though the controller refuses to unpublish: %s", res.stdout)
	}
	testutil.WaitFor(t, 30*time.Second, "vol-db's claim node-unpublished", func() bool {
		var doc struct {
			Claims []struct {
				State     string `json:"state"`
				LastError string `json:"last_error"`
			} `json:"claims"`
		}
		res := p.cli(t, addr, mgmt, "volume", "status", "vol-db", "--json")
		return res.code == 0 && json.Unmarshal([]byte(res.stdout), &doc) == nil && len(doc.Claims) == 1 &&
			doc.Claims[0].State == "node-unpublished" && doc.Claims[0].LastError != ""
	})

	// The snapshot file and the answers, then a graceful stop.
	if err := os.RemoveAll("testdata"); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(goldenDir, 0o755); err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs(snapshotFile)
	if err != nil {
		t.Fatal(err)
	}
	cli("operator", "snapshot", "save", abs)
	for name, raw := range readAnswers(t, p, addr, cred) {
		writeIndented(t, filepath.Join(goldenDir, name+".json"), raw)
	}
	credJSON, err := json.Marshal(cred)
	if err != nil {
		t.Fatal(err)
	}
	writeIndented(t, filepath.Join(goldenDir, "credentials.json"), credJSON)

	for i, m := range clients {
		stopAgent(t, m.name, clientProcs[i])
	}
	for i, m := range servers {
		stopAgent(t, m.name, procs[i])
	}

	// Only the server parts of each data_dir: the node id (the server's
	// raft id) and the server directory (raft log, stable store,
	// snapshots).
	for i, m := range servers {
		dst := filepath.Join(dataDirs, m.name)
		copyTree(t, filepath.Join(dirs[i], "server"), filepath.Join(dst, "server"))
		b, err := os.ReadFile(filepath.Join(dirs[i], "node-id"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, "node-id"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile("testdata/README.md", []byte(fixtureReadme(commit)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// buildRelease builds the csisupd binary of commit from `git archive` of
// this repository, so that the fixture is made by exactly that release.
func buildRelease(t *testing.T, commit string) string {
	t.Helper()
	src := testutil.TempDir(t)
	archive := exec.Command("sh", "-c", `git archive "$1" | tar -x -C "$2"`, "sh", commit, src)
	archive.Dir = "../.." // the repository's root: git archive refuses an untracked directory
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s: %v\n%s", commit, err, out)
	}
	bin := filepath.Join(testutil.TempDir(t), "csisupd")
	build := exec.Command("go", "build", "-ldflags", "-X main.commit="+commit, "-o", bin, "./cmd/csisupd")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build csisupd at %s: %v\n%s", commit, err, out)
	}
	return bin
}

// startPlugin starts the test plugin "tp" in a plugin directory of its own
// and returns it and the directory.
func startPlugin(t *testing.T, cfg testplugin.Config) (*testplugin.Plugin, string) {
	t.Helper()
	dir := testutil.TempDir(t)
	cfg.Socket = filepath.Join(dir, "tp", "csi.sock")
	cfg.StateDir = testutil.TempDir(t)
	plugin, err := testplugin.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := plugin.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(plugin.Stop)
	return plugin, dir
}

// writeNodeID gives an agent a readable node id before its first start.
func writeNodeID(t *testing.T, dataDir, id string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dataDir, "node-id"), []byte(id+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// raftSnapshots returns the raft snapshots' meta files under a data_dir.
func raftSnapshots(t *testing.T, dataDir string) []string {
	t.Helper()
	var metas []string
	_ = filepath.WalkDir(dataDir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() == "meta.json" && !strings.HasSuffix(filepath.Dir(path), ".tmp") {
			metas = append(metas, path)
		}
		return nil
	})
	return metas
}

func applyPolicy(t *testing.T, p pki, addr, token, name, rules string) {
	t.Helper()
	file := filepath.Join(testutil.TempDir(t), name+".hcl")
	if err := os.WriteFile(file, []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	p.mustCLI(t, addr, token, "acl", "policy", "apply", name, file)
}

type tokenDoc struct {
	AccessorID string `json:"accessor_id"`
	SecretID   string `json:"secret_id"`
}

func createToken(t *testing.T, p pki, addr, token, name, policy string) tokenDoc {
	t.Helper()
	var tok tokenDoc
	p.cliJSON(t, addr, token, &tok, "acl", "token", "create", "--name", name, "--policy", policy)
	return tok
}

// writeIndented writes a JSON document indented, for readable diffs.
func writeIndented(t *testing.T, path string, raw []byte) {
	t.Helper()
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("%s: %v\n%s", path, err, raw)
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}

func fixtureReadme(commit string) string {
	return strings.ReplaceAll(`# Upgrade fixture

Made by TestMakeFixture (fixture_test.go, build tag fixture) with the
release at commit COMMIT, the last one whose servers stored the public API
messages (csisupd.v1) in their raft log and snapshots.

- data/server-N/: the server parts of the data_dir of each of three
  servers (node-id, the raft id; server/, the raft log and stable store in
  raft.db and the raft snapshots). Each server holds a snapshot and log
  entries written after it. The servers ran at 127.0.0.21, .22 and .23
  with rpc port 24780, raft port 24781 and http port 24782, with TLS and
  ACLs on; raft's configuration records those addresses.
- snapshot.bin: the file of `+"`csisupd operator snapshot save`"+` of the final
  state.
- golden/: what the API answered (CLI --json) before the stop: volumes
  with their claims (one release stopped halfway: vol-db's claim is
  node-unpublished), nodes, ACL tokens and policies, raft peers, the
  client token's own view; credentials.json holds the management and the
  client token's secrets of this throwaway cluster.

The certificates are not kept: they name a role, not an address, and the
tests make their own.

To remake it (it needs git, go, and the loopback addresses above free):

    go test -tags fixture -run TestMakeFixture -count=1 -v ./test/upgrade/

CSISUPD_FIXTURE_COMMIT=<commit> makes it with another release. The
fixture must stay made by a release of the previous storage format: the
upgrade tests prove that data_dirs of that release load.
`, "COMMIT", commit)
}
