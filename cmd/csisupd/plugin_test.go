package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"sort"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/encoding/protojson"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// execute runs the CLI in process with args and returns its stdout.
func execute(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(io.Discard)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

// mustJSON runs the CLI with --json, fails on an error and decodes stdout
// into a generic document.
func mustJSON(t *testing.T, args ...string) map[string]any {
	t.Helper()
	out, err := execute(t, append(args, "--json")...)
	if err != nil {
		t.Fatalf("%s: %v", strings.Join(args, " "), err)
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return doc
}

// keys returns the sorted keys of a JSON object.
func keys(v any) string {
	m, _ := v.(map[string]any)
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return strings.Join(ks, ",")
}

// oneNodeCluster starts one server and one agent with the test plugin
// "tp", and waits until the plugin is healthy in the cluster.
func oneNodeCluster(t *testing.T) (*testcluster.Cluster, string) {
	t.Helper()
	c, addr, _ := oneNodeClusterWith(t, map[string]testplugin.Config{"tp": {NodeID: "csi-a"}})
	return c, addr
}

// oneNodeClusterWith starts one server and one agent running a test
// plugin per entry of plugins, configured by it, and waits until each is
// healthy in the cluster. It returns the plugins by id, for their faults
// and records.
func oneNodeClusterWith(t *testing.T, plugins map[string]testplugin.Config) (*testcluster.Cluster, string, map[string]*testplugin.Plugin) {
	t.Helper()
	c := testcluster.New(t, testcluster.Config{Servers: 1, Agents: 1})
	started := make(map[string]*testplugin.Plugin, len(plugins))
	for id, cfg := range plugins {
		started[id] = c.Agent(0).StartPlugin(id, cfg)
	}
	addr := c.Member(0).RPCAddr
	for id := range plugins {
		testutil.WaitFor(t, 30*time.Second, "plugin "+id+" healthy", func() bool {
			out, err := execute(t, "--address", addr, "plugin", "status", id, "--json")
			var p csisupdv1.ClusterPlugin
			return err == nil && protojson.Unmarshal([]byte(out), &p) == nil && p.GetControllersHealthy() == 1 && p.GetNodesHealthy() == 1
		})
	}
	return c, addr, started
}

func TestPluginAndNodeStatus(t *testing.T) {
	c, addr := oneNodeCluster(t)
	a := c.Agent(0)

	list := mustJSON(t, "--address", addr, "plugin", "status")
	if keys(list) != "index,plugins" {
		t.Fatalf("plugin status --json keys: %s", keys(list))
	}
	plugins := list["plugins"].([]any)
	if len(plugins) != 1 {
		t.Fatalf("plugins: %v", plugins)
	}
	const pluginKeys = "controllers_expected,controllers_healthy,draining_nodes,id,instances,nodes_expected,nodes_healthy,provider,version"
	if keys(plugins[0]) != pluginKeys {
		t.Fatalf("plugin keys %s, want %s", keys(plugins[0]), pluginKeys)
	}

	one := mustJSON(t, "--address", addr, "plugin", "status", "tp", "--stale")
	inst := one["instances"].([]any)
	if len(inst) != 1 {
		t.Fatalf("instances: %v", inst)
	}
	in := inst[0].(map[string]any)
	const instanceKeys = "health_description,healthy,node_id,node_name,plugin"
	if keys(in) != instanceKeys {
		t.Fatalf("instance keys %s, want %s", keys(in), instanceKeys)
	}
	// The instance's plugin is the node's Plugin message: its node_id is
	// the CSI node id, the instance's the cluster's node id.
	ip, _ := in["plugin"].(map[string]any)
	if in["node_id"] != a.NodeID() || in["node_name"] != a.Name || in["healthy"] != true ||
		ip["id"] != "tp" || ip["type"] != "monolith" || ip["node_id"] != "csi-a" {
		t.Fatalf("instance: %v", in)
	}

	out, err := execute(t, "--address", addr, "plugin", "status")
	if err != nil || !strings.Contains(out, "CONTROLLERS HEALTHY/EXPECTED") || !strings.Contains(out, "1/1") {
		t.Fatalf("plugin status table: %v\n%s", err, out)
	}
	out, err = execute(t, "--address", addr, "plugin", "status", "tp")
	if err != nil || !strings.Contains(out, a.NodeID()) || !strings.Contains(out, "monolith") {
		t.Fatalf("plugin status tp: %v\n%s", err, out)
	}
	if _, err := execute(t, "--address", addr, "plugin", "status", "nope"); err == nil || !strings.Contains(err.Error(), `plugin "nope" not found`) {
		t.Fatalf("unknown plugin: %v", err)
	}

	nodes := mustJSON(t, "--address", addr, "node", "status")
	ns := nodes["nodes"].([]any)
	if len(ns) != 1 {
		t.Fatalf("nodes: %v", ns)
	}
	n := ns[0].(map[string]any)
	if n["id"] != a.NodeID() || n["name"] != a.Name || n["address"] != a.RPCAddr || n["status"] != "ready" {
		t.Fatalf("node: %v", n)
	}
	node := mustJSON(t, "--address", addr, "node", "status", a.NodeID())
	if ps := node["plugins"].([]any); len(ps) != 1 || ps[0].(map[string]any)["node_id"] != "csi-a" {
		t.Fatalf("node plugins: %v", node["plugins"])
	}
	out, err = execute(t, "--address", addr, "node", "status")
	if err != nil || !strings.Contains(out, a.Name) || !strings.Contains(out, "ready") {
		t.Fatalf("node status table: %v\n%s", err, out)
	}
}

func TestNotAServer(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 1, Agents: 1})
	addr := c.Agent(0).RPCAddr
	for _, args := range [][]string{
		{"plugin", "status"},
		{"node", "status", "x"},
		{"volume", "list"},
		{"operator", "raft", "list-peers"},
	} {
		_, err := execute(t, append([]string{"--address", addr}, args...)...)
		want := "the agent at " + addr + " is not a server; point --address at a server"
		if err == nil || err.Error() != want {
			t.Errorf("%s: error %v, want %q", strings.Join(args, " "), err, want)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"volume", "create", "v1"},
		{"volume", "create", "v1", "--plugin", "tp", "--capacity", "lots"},
		{"volume", "create", "v1", "--plugin", "tp", "--access-mode", "all"},
		{"volume", "create", "v1", "--plugin", "tp", "--secret", "nokey"},
		{"volume", "register", "v1", "--plugin", "tp"},
		{"volume", "claim", "v1"},
		{"volume", "claim", "v1", "--node", "n"},
		{"volume", "claim", "v1", "--node", "n", "--workload", "w", "--block", "--fs-type", "ext4"},
		{"volume", "release", "v1", "--node", "n"},
		{"volume", "detach", "v1"},
		{"volume", "status"},
		{"plugin", "status", "a", "b"},
		{"operator", "raft", "remove-peer"},
		{"operator", "snapshot", "save"},
		{"volume", "list", "--no-such-flag"},
	} {
		// No agent listens there: a usage error must come before any dial.
		_, err := execute(t, append([]string{"--address", "127.0.0.1:1"}, args...)...)
		if !errors.As(err, new(usageError)) {
			t.Errorf("%s: error %v is not a usage error", strings.Join(args, " "), err)
		}
	}
}
