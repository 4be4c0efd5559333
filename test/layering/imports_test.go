package layering

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/csisupd/csisupd/"

// The tiers of the graph, top to bottom:
//
//	cmd -> agent -> {registry, nodevolumes, rpc, server, consulsync, nodeclient, dockerplugin} -> {plugin, stream, retry, heartbeat, fingerprint, csiclient, config, acl, tlsutil, keylock, watchdog, volreq, kubeletreg}
//	{cmd, dockerplugin} -> volspec (volume specification files, read by the CLI; the Docker plugin builds its creates with them)
//
// and inside the server role:
//
//	server -> {volumeops, leader, raftnode} -> fsm -> state, {volumeops, fsm} -> rules -> state
//
// with leader -> {rules, state}: the leader's duties never see the Server,
// and reach the volume operations only through their interface
// (leader.VolumeWork), which the Server wires; volumeops and leader never
// import each other.
// Each package may import the packages listed for it, and nothing else of
// the module. The API (api/csisupd/v1) is importable by all, and so are
// internal/ids, the syntax of ids, internal/hclnest, the nesting cap of
// HCL files, and internal/hcldiag, HCL's diagnostics as errors, which
// import nothing of the module. Test-only
// packages (testutil, testplugin and its journal reader, testregistrar,
// testcluster, consultest, configtest, metricsdoc, netlab) are imported by tests, benchmarks and --dev only.
var (
	api    = "api/csisupd/v1"
	bottom = []string{"internal/plugin", "internal/stream", "internal/retry", "internal/heartbeat",
		"internal/fingerprint", "internal/csiclient", "internal/config", "internal/acl", "internal/tlsutil", "internal/keylock", "internal/watchdog",
		"internal/kubeletreg", "internal/secrets", "internal/safefile"}
	// everyone lists the packages every package may import.
	everyone = []string{"internal/ids", "internal/hclnest", "internal/hcldiag"}
	middle   = []string{"internal/registry", "internal/nodevolumes", "internal/rpc", "internal/server", "internal/consulsync", "internal/nodeclient", "internal/dockerplugin"}
)

// allowed lists the imports of the module each package's code may have.
var allowed = map[string][]string{
	"cmd/csisupd":    {api, "internal/agent", "internal/config", "internal/retry", "internal/safefile", "internal/testplugin", "internal/tlsutil", "internal/volspec"}, // testplugin: the --dev demo plugin; retry: the waits of a call refused for want of a leader
	"internal/agent": append(append([]string{api, "internal/server/raftnode"}, middle...), bottom...),                                                                  // raftnode: a stopped server's raft state, for the offline operator commands

	"internal/registry": {api, "internal/plugin", "internal/stream", "internal/retry", "internal/heartbeat", "internal/fingerprint", "internal/csiclient", "internal/config", "internal/watchdog", "internal/kubeletreg", "internal/safefile"},
	"internal/rpc":      {api, "internal/plugin", "internal/stream", "internal/retry", "internal/heartbeat", "internal/csiclient", "internal/acl", "internal/tlsutil"},
	"internal/server":   {api, "internal/plugin", "internal/stream", "internal/retry", "internal/config", "internal/acl", "internal/safefile", "internal/tlsutil", "internal/keylock", "internal/watchdog", "internal/volreq", "internal/server/volumeops", "internal/server/rules", "internal/server/leader", "internal/server/raftnode", "internal/server/fsm", "internal/server/state", "internal/server/statepb"},
	// statepb is the servers' storage format; it imports the API only to
	// convert to and from it (its .proto files import no csisupd file).
	"internal/server/statepb": {api},
	"internal/consulsync":     {api, "internal/plugin", "internal/retry", "internal/heartbeat", "internal/config", "internal/safefile", "internal/watchdog"},
	"internal/nodeclient":     {api, "internal/plugin", "internal/retry", "internal/config", "internal/safefile", "internal/watchdog"}, // safefile: the held leases in data_dir
	"internal/nodevolumes":    {api, "internal/plugin", "internal/retry", "internal/csiclient", "internal/keylock", "internal/watchdog", "internal/volreq"},
	// dockerplugin serves Docker's volume plugin protocol: it reaches the
	// servers through its Cluster interface (the agent passes the node
	// client's local claims), never nodeclient or server; it builds and
	// checks its creates as the CLI and the servers do (volspec, volreq),
	// and its reconcile loop beats the watchdog.
	"internal/dockerplugin": {api, "internal/volreq", "internal/volspec", "internal/watchdog"},

	// The parts of the server role, bottom up: the state store; the claim
	// rules, which read node statuses and plugin roles from it; the FSM
	// that writes it; the raft member that runs the FSM; the leader's
	// duties, which read the state and reach the volume operations through
	// one interface. The raft member takes the server's settings as config
	// holds them. The
	// state holds the storage messages (statepb) only: it never imports
	// the API, whose messages the services convert to.
	"internal/server/state":    {"internal/acl", "internal/plugin", "internal/server/statepb"},
	"internal/server/rules":    {api, "internal/plugin", "internal/server/state", "internal/server/statepb"},
	"internal/server/fsm":      {api, "internal/acl", "internal/stream", "internal/server/rules", "internal/server/state", "internal/server/statepb"},
	"internal/server/raftnode": {api, "internal/config", "internal/retry", "internal/safefile", "internal/stream", "internal/tlsutil", "internal/watchdog", "internal/server/fsm", "internal/server/state", "internal/server/statepb"},
	"internal/server/leader":   {api, "internal/keylock", "internal/plugin", "internal/watchdog", "internal/server/rules", "internal/server/state", "internal/server/statepb"},
	// The volume operations: the rules they admit by, the state they read
	// and the commands they write, the volume locks, the watchdog beats
	// of the watcher's loop (watchdog's context helpers) and the id syntax
	// of volumes (ids, importable by all). Never the server, which wires them.
	"internal/server/volumeops": {api, "internal/keylock", "internal/plugin", "internal/watchdog", "internal/server/rules", "internal/server/state", "internal/server/statepb"},

	"internal/plugin":      {api, "internal/stream"},
	"internal/stream":      {},
	"internal/retry":       {},
	"internal/heartbeat":   {"internal/csiclient"},
	"internal/fingerprint": {"internal/csiclient", "internal/plugin"}, // plugin: the type it detects
	// csiclient holds the one plugin call path of ClientCSI and the node
	// volume manager, so that neither imports the other: it reads the
	// plugin's read model and typed errors (api) and checks the plugin's
	// type and capabilities by the plugin model's names (plugin); the
	// fields CSI marks secret, which it redacts, are named by secrets.
	"internal/csiclient": {api, "internal/plugin", "internal/retry", "internal/secrets"},
	"internal/config":    {"internal/retry", "internal/safefile"},
	// secrets reads a plugin's secrets file (through safefile) and merges
	// it into CSI requests by their csi_secret fields: protobuf reflection
	// only.
	"internal/secrets": {"internal/safefile"},
	// safefile reads the files the agent and the CLI are given, so that
	// none can wedge them: the standard library only.
	"internal/safefile": {},
	// kubeletreg is kubelet's side of the plugin registration protocol:
	// it checks a registrar's answer by the plugin id rule (ids) and the
	// socket path limit (csiclient).
	"internal/kubeletreg": {"internal/csiclient"},
	// ids is the syntax of plugin, volume, snapshot and workload ids and
	// of node names and ids: the standard library only.
	"internal/ids": {},
	// hclnest caps the nesting of an HCL file before it is parsed: the
	// standard library only.
	"internal/hclnest": {},
	// hcldiag turns the HCL parser's diagnostics into file:line errors,
	// for the config loader and the volume specification parser alike.
	"internal/hcldiag": {},
	// volreq checks volume requests for the servers and the node agent:
	// the API's messages in, plain errors out.
	"internal/volreq": {api},
	// volspec reads volume specification files for the CLI: HCL in, the
	// API's requests out.
	"internal/volspec":  {api},
	"internal/acl":      {api},
	"internal/tlsutil":  {"internal/safefile"},
	"internal/keylock":  {},
	"internal/watchdog": {},
	api:                 {},

	"internal/testutil":                            {},
	"internal/testutil/sanitytest":                 {"internal/testutil"},
	"internal/testutil/metricsdoc":                 {},
	"internal/plugin/plugintest":                   {api, "internal/plugin"},
	"internal/testplugin":                          {},
	"internal/testplugin/journal":                  {"internal/testplugin"},
	"internal/testplugin/cmd/csi-testplugin":       {"internal/testplugin"},
	"internal/testregistrar":                       {},
	"internal/testregistrar/cmd/csi-testregistrar": {"internal/testregistrar"},
	"internal/testcluster":                         {api, "internal/agent", "internal/config", "internal/rpc", "internal/server", "internal/testplugin", "internal/testutil"}, // rpc: the agent's server options for the servers' benchmarks
	"internal/consulsync/consultest":               {},
	// configtest lays out the broken configurations of config's testdata
	// for config's tests and the CLI's: the standard library only.
	"internal/config/configtest": {},
	// netlab builds lab networks for fault tests: the standard library and
	// the ip and iptables commands only.
	"internal/netlab": {},

	"test/agent":                {},
	"test/bench":                {},
	"test/deploy":               {},
	"test/docs":                 {},
	"test/e2e":                  {},
	"test/layering":             {},
	"test/package":              {},
	"test/nemesis":              {},
	"test/soak":                 {},
	"test/upgrade":              {},
	"test/soak/cmd/csi-hostile": {"internal/testutil"},
	// make package's packager: it packages the release binary and the
	// files of deploy/, and imports nothing of the module.
	"scripts/package": {},
	// make bench-table's and make bench-compare's reader of bench output:
	// it imports nothing of the module.
	"scripts/benchtable": {},
}

// forbiddenOutside lists packages outside the module that a package must
// not import: a path forbids the package and those under it, a path
// ending in "=" the package alone. The state store knows no raft and no
// gRPC, so it can be read and tested without either.
var forbiddenOutside = map[string][]string{
	"internal/server/state": {"github.com/hashicorp/raft", "google.golang.org/grpc"},
	"internal/server/fsm":   {"google.golang.org/grpc"},
	// rules is pure rules: it builds gRPC status errors, as the API's
	// error constructors do, but holds no connection and knows no raft.
	"internal/server/rules":  {"github.com/hashicorp/raft", "google.golang.org/grpc="},
	"internal/server/leader": {"github.com/hashicorp/raft", "google.golang.org/grpc"},
	// volumeops reaches the agents through its client interfaces: it
	// builds gRPC status errors, but holds no connection and knows no
	// raft.
	"internal/server/volumeops": {"github.com/hashicorp/raft", "google.golang.org/grpc="},
	// volreq is the API's messages and the standard library only.
	"internal/volreq": {"github.com", "golang.org", "google.golang.org/grpc"},
	// volspec parses files; it makes no calls.
	"internal/volspec": {"google.golang.org/grpc"},
}

// testHelpers may be imported by every package's tests.
var testHelpers = []string{"internal/testutil", "internal/testutil/sanitytest", "internal/testutil/metricsdoc", "internal/testplugin", "internal/testplugin/journal", "internal/testregistrar", "internal/plugin/plugintest", "internal/consulsync/consultest", "internal/config/configtest", "internal/netlab"}

// allowedInTests lists what a package's tests may import beyond its own
// allowed imports and testHelpers, each with why. Tests run the real parts
// they talk to rather than doubles of the project's own code.
var allowedInTests = map[string][]string{
	// Agent and ClientCSI tests read a real registry supervising a real
	// plugin, and take the agent's defaults (limits, retry policies, log
	// levels) from config, as the agent passes them.
	"internal/rpc": {"internal/registry", "internal/fingerprint", "internal/config"},
	// Consul sync tests read a real registry.
	"internal/consulsync": {"internal/registry", "internal/fingerprint"},
	// Servers are tested with real node clients and a real ClientCSI, and
	// read the node agents' mount records where the agents keep them.
	"internal/server": {"internal/nodeclient", "internal/rpc", "internal/registry", "internal/csiclient",
		"internal/fingerprint", "internal/heartbeat", "internal/testcluster", "internal/server", "internal/nodevolumes"},
	"internal/nodeclient": {"internal/server", "internal/testcluster"},
	// The volume plugin is tested in a real agent of a real cluster.
	"internal/dockerplugin": {"internal/testcluster"},
	// The CLI is tested against real Agent services and clusters.
	"cmd/csisupd":    {"internal/registry", "internal/rpc", "internal/plugin", "internal/testcluster", "internal/server"},
	"internal/agent": {"internal/heartbeat", "internal/registry"},
	// Tests of the bottom tier take the retry policies' defaults from config.
	"internal/heartbeat":   {"internal/csiclient", "internal/config"},
	"internal/nodevolumes": {"internal/config"},
	"internal/fingerprint": {"internal/config"},
	// The call path is tested with a real secrets file merged into calls.
	"internal/csiclient":   {"internal/config", "internal/secrets"},
	"internal/testcluster": {"internal/testcluster"},
	// The heartbeat TTL tests check the production defaults.
	"internal/server/leader": {"internal/config"},
	// The test registrar's command is checked with kubelet's side of the
	// protocol, the client csisupd uses.
	"internal/testregistrar/cmd/csi-testregistrar": {"internal/kubeletreg"},
	// FSM tests name plugin types by the plugin model's constants.
	"internal/server/fsm": {"internal/plugin"},
}

// everything else a test/ package imports is allowed: end-to-end tests,
// benchmarks and soak tests may drive any part, but nothing imports cmd.
func isTestTree(pkg string) bool { return strings.HasPrefix(pkg, "test/") }

type listed struct {
	path                 string
	imports, testImports []string
	// outside holds the imports of packages outside the module.
	outside []string
}

// goList returns the module's packages with their imports of the module.
func goList(t *testing.T) []listed {
	t.Helper()
	out, err := exec.Command("go", "list", "-f",
		"{{.ImportPath}}|{{join .Imports \",\"}}|{{join .TestImports \",\"}},{{join .XTestImports \",\"}}",
		module+"...").Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	var pkgs []listed
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "|")
		if len(f) != 3 {
			t.Fatalf("go list printed %q", line)
		}
		pkgs = append(pkgs, listed{path: strings.TrimPrefix(f[0], module), imports: ours(f[1]), testImports: ours(f[2]),
			outside: theirs(f[1])})
	}
	return pkgs
}

// ours returns the module's packages in a comma-separated import list,
// without the module prefix.
func ours(list string) []string {
	var out []string
	for _, imp := range strings.Split(list, ",") {
		if p, ok := strings.CutPrefix(imp, module); ok && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// theirs returns the imports of a comma-separated import list that are
// outside the module.
func theirs(list string) []string {
	var out []string
	for _, imp := range strings.Split(list, ",") {
		if imp != "" && !strings.HasPrefix(imp, module) {
			out = append(out, imp)
		}
	}
	return out
}

// TestImports compares the imports `go list` reports with the table. A
// forbidden import fails it, naming the arrow. Tried by adding an import
// of internal/registry to internal/consulsync:
//
//	internal/consulsync imports internal/registry, which the package graph forbids
//	    (allowed: api/csisupd/v1 internal/plugin internal/retry internal/heartbeat internal/config)
//
// A new package fails it too until it has a row in the table.
func TestImports(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range goList(t) {
		seen[p.path] = true
		ok, listedPkg := allowed[p.path]
		if !listedPkg {
			t.Errorf("package %s has no row in the import table of this test: add it with the imports its tier allows", p.path)
			continue
		}
		for _, imp := range p.imports {
			switch {
			case imp == "cmd/csisupd" || strings.HasPrefix(imp, "cmd/"):
				t.Errorf("%s imports %s: nothing imports cmd", p.path, imp)
			case isTestTree(p.path), slices.Contains(everyone, imp):
			case !slices.Contains(ok, imp):
				t.Errorf("%s imports %s, which the package graph forbids\n    (allowed: %s)", p.path, imp, strings.Join(ok, " "))
			}
		}
		for _, imp := range p.outside {
			for _, bad := range forbiddenOutside[p.path] {
				exact, alone := strings.CutSuffix(bad, "=")
				if imp == exact || (!alone && strings.HasPrefix(imp, exact+"/")) {
					t.Errorf("%s imports %s, which it must not: it knows nothing of %s", p.path, imp, exact)
				}
			}
		}
		for _, imp := range p.testImports {
			switch {
			case strings.HasPrefix(imp, "cmd/"):
				t.Errorf("the tests of %s import %s: nothing imports cmd", p.path, imp)
			case isTestTree(p.path), imp == p.path, slices.Contains(ok, imp), slices.Contains(everyone, imp), slices.Contains(testHelpers, imp),
				slices.Contains(allowedInTests[p.path], imp):
			default:
				t.Errorf("the tests of %s import %s, which neither the package graph nor this test's list of test-only arrows allows", p.path, imp)
			}
		}
	}
	for pkg := range allowed {
		if !seen[pkg] {
			t.Errorf("the import table lists %s, which does not exist: remove its row", pkg)
		}
	}
}
