package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// clusterWithPlugins starts 3 servers and 2 agents, a monolith test plugin
// "tp" on each agent (CSI node id csi-node-<i>), and waits until the
// cluster sees both instances healthy.
func clusterWithPlugins(t *testing.T) (*testcluster.Cluster, []*testplugin.Plugin) {
	t.Helper()
	c := testcluster.New(t, testcluster.Config{Servers: 3, Agents: 2})
	var plugins []*testplugin.Plugin
	for i, a := range c.Agents() {
		plugins = append(plugins, a.StartPlugin("tp", testplugin.Config{
			Type: testplugin.TypeMonolith, NodeID: fmt.Sprintf("csi-node-%d", i),
		}))
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
// with the CLI: the controller on one node publishes it to the other with
// that node's CSI node id.
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
	cliJSON(t, addr, &vol, "volume", "create", "v1", "--plugin", "tp", "--capacity", "4MiB")
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

	// attach to node 2 (agent-1), by name: the publish carries its CSI node id.
	target := c.Agent(1)
	var att attachDoc
	cliJSON(t, addr, &att, "volume", "attach", "v1", "--node", target.Name)
	if att.Claim.NodeID != target.NodeID() || att.Claim.CSINodeID != "csi-node-1" ||
		att.Claim.PublishContext[testplugin.PublishContextNodeID] != "csi-node-1" {
		t.Fatalf("volume attach: %+v", att.Claim)
	}
	if rec, _ := readPluginVolume(t, ctrlState, vol.ExternalID); len(rec.Published) != 1 || rec.Published["csi-node-1"] == nil {
		t.Fatalf("controller plugin record after attach: published to %v, want csi-node-1", rec.Published)
	}
	if n := plugins[ctrl].Stats().Calls["ControllerPublishVolume"]; n != 1 {
		t.Fatalf("controller plugin saw %d ControllerPublishVolume calls, want 1", n)
	}
	var got volumeDoc
	cliJSON(t, addr, &got, "volume", "status", "v1")
	if len(got.Claims) != 1 || got.Claims[0].NodeID != target.NodeID() {
		t.Fatalf("volume status after attach: %+v", got)
	}
	// The leader applied the write before answering, so its local state
	// already has it: a stale read there must show the claim.
	got = volumeDoc{}
	cliJSON(t, c.WaitForLeader(t, 30*time.Second).RPCAddr, &got, "volume", "status", "v1", "--stale")
	if len(got.Claims) != 1 || got.Claims[0].CSINodeID != "csi-node-1" {
		t.Fatalf("stale volume status on the leader after attach: %+v", got)
	}

	// detach and delete undo it.
	if res := cli(t, addr, "volume", "detach", "v1", "--node", target.NodeID()); res.code != 0 {
		t.Fatalf("volume detach: exit %d: %s", res.code, res.stderr)
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
	for _, m := range []string{"ControllerUnpublishVolume", "DeleteVolume"} {
		if n := calls(plugins, m); n != 1 {
			t.Errorf("plugins saw %d %s calls, want 1", n, m)
		}
	}
	var list volumeListDoc
	cliJSON(t, addr, &list, "volume", "list", "--plugin", "tp")
	if len(list.Volumes) != 0 {
		t.Fatalf("volume list after delete: %+v", list)
	}

	// A client-only agent has no Control service.
	res := cli(t, c.Agent(0).RPCAddr, "plugin", "status")
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

	// Attaching to the down node is refused.
	var vol volumeDoc
	cliJSON(t, addr, &vol, "volume", "create", "v2", "--plugin", "tp")
	res := cli(t, addr, "volume", "attach", "v2", "--node", down.NodeID())
	if res.code != 1 || !strings.Contains(res.stderr, "is down") {
		t.Fatalf("attach to a down node: exit %d, %q", res.code, res.stderr)
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
