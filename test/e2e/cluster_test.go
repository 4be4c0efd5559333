package e2e

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// clusterWithPlugins starts 3 servers and 2 agents, a monolith test plugin
// "tp" on each agent (CSI node id csi-node-<i>), with real mounts when the
// test can make them, and waits until the cluster sees both instances
// healthy.
func clusterWithPlugins(t *testing.T) (*testcluster.Cluster, []*testplugin.Plugin) {
	t.Helper()
	c := testcluster.New(t, testcluster.Config{Servers: 3, Agents: 2})
	mounts := pluginMounts(t)
	var plugins []*testplugin.Plugin
	for i, a := range c.Agents() {
		p := a.StartPlugin("tp", testplugin.Config{
			Type: testplugin.TypeMonolith, NodeID: fmt.Sprintf("csi-node-%d", i), Mounts: mounts,
		})
		// The agents' directories, which hold the mounts, were made
		// before: this runs before they are removed.
		unmountAtEnd(t, p)
		plugins = append(plugins, p)
	}
	addr := followerAddr(t, c)
	testutil.WaitFor(t, 30*time.Second, "plugin tp healthy on both agents", func() bool {
		p, ok := tryPlugin(t, addr, "tp")
		return ok && p.ControllersHealthy == 2 && p.NodesHealthy == 2
	})
	return c, plugins
}

// followerAddr is the RPC address of a server that does not lead, so the
// CLI's calls take the forwarding path.
func followerAddr(t *testing.T, c *testcluster.Cluster) string {
	t.Helper()
	leader := c.WaitForLeader(t, 30*time.Second)
	return c.Member((leader.Index + 1) % len(c.Members())).RPCAddr
}

// TestClusterVolumeLifecycle drives a volume through 3 servers and 2 agents
// with the CLI: created by one controller, claimed by a writer on one node
// (published with that node's CSI node id, staged and published there), a
// second writer refused, a reader allowed, and released step by step, as
// the plugins' own records and, with real mounts, the mount table show.
func TestClusterVolumeLifecycle(t *testing.T) {
	c, plugins := clusterWithPlugins(t)
	addr := followerAddr(t, c)
	agentOf := map[string]int{} // node id -> agent index
	for i, a := range c.Agents() {
		agentOf[a.NodeID()] = i
	}

	var p pluginDoc
	cliJSON(t, addr, &p, "plugin", "status", "tp")
	if p.ControllersExpected != 2 || p.NodesExpected != 2 || len(p.Instances) != 2 || p.Provider != testplugin.DefaultName {
		t.Fatalf("plugin status tp: %+v", p)
	}
	for _, in := range p.Instances {
		i, ok := agentOf[in.NodeID]
		if !ok || in.Plugin.NodeID != fmt.Sprintf("csi-node-%d", i) || in.NodeName != c.Agent(i).Name {
			t.Fatalf("instance %+v does not match its agent", in)
		}
	}

	var peers peersDoc
	cliJSON(t, addr, &peers, "operator", "raft", "list-peers")
	leaders := 0
	for _, peer := range peers.Peers {
		if peer.Leader {
			leaders++
		}
		if peer.Suffrage != "voter" {
			t.Errorf("peer %s is %s, want voter", peer.ID, peer.Suffrage)
		}
	}
	if len(peers.Peers) != 3 || leaders != 1 {
		t.Fatalf("raft peers: %+v", peers)
	}

	// create: one controller instance makes the volume.
	var vol volumeDoc
	cliJSON(t, addr, &vol, "volume", "create", "v1", "--plugin", "tp", "--capacity", "4MiB", "--access-mode", "multi-node-single-writer")
	ctrl, ok := agentOf[vol.ControllerNodeID]
	if !ok || vol.ExternalID == "" || vol.CapacityBytes < 4<<20 {
		t.Fatalf("volume create: %+v", vol)
	}
	ctrlState := filepath.Join(c.Agent(ctrl).Dir, "plugin-state", "tp")
	if rec, ok := readPluginVolume(t, ctrlState, vol.ExternalID); !ok || rec.Name != "v1" {
		t.Fatalf("controller plugin on %s has no record of v1: %+v", c.Agent(ctrl).Name, rec)
	}
	if n := calls(plugins, "CreateVolume"); n != 1 {
		t.Fatalf("plugins saw %d CreateVolume calls, want 1", n)
	}

	// claim on node A (agent-0), by name: the controller publish carries
	// its CSI node id; the node stages and publishes at the host path.
	nodeA, nodeB := c.Agent(0), c.Agent(1)
	var writer claimDoc
	cliJSON(t, addr, &writer, "volume", "claim", "v1", "--node", nodeA.Name, "--workload", "web-1")
	if writer.NodeID != nodeA.NodeID() || writer.CSINodeID != "csi-node-0" || writer.State != "taken" || !writer.Mounted ||
		writer.PublishContext[testplugin.PublishContextNodeID] != "csi-node-0" || writer.HostPath == "" {
		t.Fatalf("volume claim: %+v", writer)
	}
	if rec, _ := readPluginVolume(t, ctrlState, vol.ExternalID); rec.Published["csi-node-0"] == nil {
		t.Fatalf("controller plugin record after claim: published to %v, want csi-node-0", rec.Published)
	}
	// The host path is the plugin's publish target: what the workload
	// writes there lands in the volume.
	log := plugins[0].NodeLog()
	if len(log) != 2 || log[0].Method != "NodeStageVolume" || log[1].Method != "NodePublishVolume" || log[1].Path != writer.HostPath {
		t.Fatalf("node plugin on node A saw %+v, want stage then publish at %s", log, writer.HostPath)
	}
	staging := log[0].Path
	wantMountPoints(t, plugins[0], true, writer.HostPath, staging)
	if err := os.WriteFile(filepath.Join(writer.HostPath, "hello"), []byte("hi"), 0o600); err != nil {
		t.Fatalf("write through the host path: %v", err)
	}

	// A second writer, on node B, is refused with the rule it breaks.
	res := cli(t, addr, "volume", "claim", "v1", "--node", nodeB.Name, "--workload", "web-2")
	if res.code != 1 || !strings.Contains(res.stderr, "claim refused (access-mode)") {
		t.Fatalf("second writer: exit %d, %q; want a refusal naming access-mode", res.code, res.stderr)
	}
	if n := len(plugins[1].NodeLog()); n != 0 {
		t.Fatalf("the refused claim reached node B's plugin: %d node calls", n)
	}
	// A reader on node B is allowed by multi-node-single-writer.
	var reader claimDoc
	cliJSON(t, addr, &reader, "volume", "claim", "v1", "--node", nodeB.Name, "--workload", "report-1", "--read-only")
	if !reader.ReadOnly || reader.State != "taken" || reader.HostPath == "" {
		t.Fatalf("reader claim: %+v", reader)
	}
	wantMountPoints(t, plugins[1], true, reader.HostPath)
	if mounts(plugins[1]) {
		// The reader's mount is read-only, not only its claim.
		if err := os.WriteFile(filepath.Join(reader.HostPath, "nope"), nil, 0o600); !errors.Is(err, syscall.EROFS) {
			t.Fatalf("write through the reader's host path: %v, want EROFS", err)
		}
	}
	var got volumeDoc
	cliJSON(t, addr, &got, "volume", "status", "v1")
	if len(got.Claims) != 2 {
		t.Fatalf("volume status after two claims: %+v", got)
	}
	// The leader applied the write before answering: a stale read there
	// shows both claims.
	got = volumeDoc{}
	cliJSON(t, c.WaitForLeader(t, 30*time.Second).RPCAddr, &got, "volume", "status", "v1", "--stale")
	if len(got.Claims) != 2 {
		t.Fatalf("stale volume status on the leader: %+v", got)
	}
	if res := cli(t, addr, "volume", "delete", "v1"); res.code != 1 || !strings.Contains(res.stderr, "claims") {
		t.Fatalf("delete of a claimed volume: exit %d, %q; want a refusal", res.code, res.stderr)
	}

	// release the writer: node unpublish, then unstage, then the
	// controller unpublish from node A; the claim is freed.
	if res := cli(t, addr, "volume", "release", "v1", "--node", nodeA.NodeID(), "--workload", "web-1"); res.code != 0 {
		t.Fatalf("volume release: exit %d: %s", res.code, res.stderr)
	}
	log = plugins[0].NodeLog()
	if len(log) != 4 || log[2].Method != "NodeUnpublishVolume" || log[2].Path != writer.HostPath || log[3].Method != "NodeUnstageVolume" {
		t.Fatalf("node plugin on node A saw %+v, want unpublish then unstage after the release", log)
	}
	if left := plugins[0].NodeVolumes(); len(left) != 0 {
		t.Fatalf("node A's plugin still has %+v staged or published", left)
	}
	wantMountPoints(t, plugins[0], false, writer.HostPath, staging)
	wantMountPoints(t, plugins[1], true, reader.HostPath)
	if rec, _ := readPluginVolume(t, ctrlState, vol.ExternalID); rec.Published["csi-node-0"] != nil || rec.Published["csi-node-1"] == nil {
		t.Fatalf("controller plugin record after the release: published to %v, want only csi-node-1", rec.Published)
	}
	got = volumeDoc{}
	cliJSON(t, addr, &got, "volume", "status", "v1")
	if len(got.Claims) != 1 || got.Claims[0].WorkloadID != "report-1" {
		t.Fatalf("volume status after the release: %+v", got)
	}

	// detach releases what is left; then the volume can go.
	if res := cli(t, addr, "volume", "detach", "v1", "--node", nodeB.Name); res.code != 0 {
		t.Fatalf("volume detach: exit %d: %s", res.code, res.stderr)
	}
	if left := plugins[1].NodeVolumes(); len(left) != 0 {
		t.Fatalf("node B's plugin still has %+v staged or published", left)
	}
	for i, p := range plugins {
		if left := mountsLeft(t, p); len(left) != 0 {
			t.Fatalf("node %d's plugin left mounted: %q", i, left)
		}
	}
	if rec, _ := readPluginVolume(t, ctrlState, vol.ExternalID); len(rec.Published) != 0 {
		t.Fatalf("controller plugin record after detach: still published to %v", rec.Published)
	}
	if res := cli(t, addr, "volume", "delete", "v1"); res.code != 0 {
		t.Fatalf("volume delete: exit %d: %s", res.code, res.stderr)
	}
	if _, ok := readPluginVolume(t, ctrlState, vol.ExternalID); ok {
		t.Fatal("controller plugin still has the volume after delete")
	}
	for m, want := range map[string]int64{"ControllerPublishVolume": 2, "ControllerUnpublishVolume": 2, "DeleteVolume": 1} {
		if n := calls(plugins, m); n != want {
			t.Errorf("plugins saw %d %s calls, want %d", n, m, want)
		}
	}
	var list volumeListDoc
	cliJSON(t, addr, &list, "volume", "list", "--plugin", "tp")
	if len(list.Volumes) != 0 {
		t.Fatalf("volume list after delete: %+v", list)
	}

	// A client-only agent has no Control service.
	res = cli(t, c.Agent(0).RPCAddr, "plugin", "status")
	if want := "the agent at " + c.Agent(0).RPCAddr + " is not a server; point --address at a server"; res.code != 1 || !strings.Contains(res.stderr, want) {
		t.Fatalf("plugin status against a client: exit %d, %q, want %q", res.code, res.stderr, want)
	}
}

// TestClusterNodeDown stops one agent: after its heartbeat TTL its node is
// down and the plugin's healthy counts drop, while the expected counts
// keep the instance.
func TestClusterNodeDown(t *testing.T) {
	c, _ := clusterWithPlugins(t)
	addr := followerAddr(t, c)
	down := c.Agent(1)
	c.StopAgent(1)

	var p pluginDoc
	testutil.WaitFor(t, 60*time.Second, "plugin counts to drop", func() bool {
		var ok bool
		p, ok = tryPlugin(t, addr, "tp")
		return ok && p.ControllersHealthy == 1 && p.NodesHealthy == 1
	})
	if p.ControllersExpected != 2 || p.NodesExpected != 2 {
		t.Fatalf("plugin status after a node went down: %+v", p)
	}
	var n nodeDoc
	cliJSON(t, addr, &n, "node", "status", down.NodeID())
	if n.Status != "down" || n.Name != down.Name {
		t.Fatalf("node status of the stopped agent: %+v", n)
	}
	var nodes nodeListDoc
	cliJSON(t, addr, &nodes, "node", "status")
	ready := 0
	for _, nd := range nodes.Nodes {
		if nd.Status == "ready" {
			ready++
		}
	}
	if len(nodes.Nodes) != 2 || ready != 1 {
		t.Fatalf("node list: %+v", nodes)
	}

	// A claim on the down node is refused, naming the rule.
	var vol volumeDoc
	cliJSON(t, addr, &vol, "volume", "create", "v2", "--plugin", "tp")
	res := cli(t, addr, "volume", "claim", "v2", "--node", down.NodeID(), "--workload", "w")
	if res.code != 1 || !strings.Contains(res.stderr, "claim refused (node-not-ready)") {
		t.Fatalf("claim on a down node: exit %d, %q", res.code, res.stderr)
	}
}

// calls sums a method's calls over plugins.
func calls(plugins []*testplugin.Plugin, method string) int64 {
	var n int64
	for _, p := range plugins {
		n += p.Stats().Calls[method]
	}
	return n
}
