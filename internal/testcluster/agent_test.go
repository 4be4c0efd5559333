package testcluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testplugin"
)

// pluginCounts returns a plugin's healthy/expected counts as the leader
// sees them, or false when the plugin is unknown.
func pluginCounts(t *testing.T, cl csisupdv1.ControlClient, id string) (*csisupdv1.ClusterPlugin, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cl.GetPlugin(ctx, &csisupdv1.PluginGetRequest{Id: id})
	if err != nil {
		return nil, false
	}
	return resp.GetPlugin(), true
}

func TestAgentsRegisterNodesAndPlugins(t *testing.T) {
	c := New(t, Config{Servers: 1, Agents: 2})
	for _, a := range c.Agents() {
		if !a.Running() || a.NodeID() == "" {
			t.Fatalf("agent %s: running=%v node id %q", a.Name, a.Running(), a.NodeID())
		}
		if !strings.HasPrefix(a.Agent().PluginDir(), a.Dir) || a.Agent().RPCAddr().String() != a.RPCAddr {
			t.Fatalf("agent %s serves %s with plugin dir %s, want %s under %s",
				a.Name, a.Agent().RPCAddr(), a.Agent().PluginDir(), a.RPCAddr, a.Dir)
		}
		p := a.StartPlugin("tp", testplugin.Config{})
		if want := filepath.Join(a.PluginDir, "tp", "csi.sock"); p.Socket() != want {
			t.Fatalf("plugin socket %s, want %s", p.Socket(), want)
		}
	}
	cl := c.Control(0)

	var got *csisupdv1.ClusterPlugin
	if !poll(30*time.Second, func() bool {
		p, ok := pluginCounts(t, cl, "tp")
		got = p
		return ok && p.GetControllersHealthy() == 2 && p.GetNodesHealthy() == 2
	}) {
		t.Fatalf("plugin tp not healthy on both agents: %v", got)
	}
	for i, inst := range got.GetInstances() {
		if inst.GetPlugin().GetNodeId() == "" || inst.GetPlugin().GetType() != "monolith" {
			t.Errorf("instance %d: %v", i, inst)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	nodes, err := cl.ListNodes(ctx, &csisupdv1.NodeListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]*csisupdv1.ClusterNode{}
	for _, n := range nodes.GetNodes() {
		byID[n.GetId()] = n
	}
	for _, a := range c.Agents() {
		n := byID[a.NodeID()]
		if n == nil || n.GetName() != a.Name || n.GetAddress() != a.RPCAddr || n.GetStatus() != "ready" {
			t.Errorf("node of %s (%s): %v", a.Name, a.NodeID(), n)
		}
	}

	// A stopped agent stops heartbeating: its node goes down after the TTL
	// and its plugin instance stops counting as healthy.
	id := c.Agent(1).NodeID()
	c.StopAgent(1)
	if !poll(30*time.Second, func() bool {
		p, ok := pluginCounts(t, cl, "tp")
		got = p
		return ok && p.GetControllersHealthy() == 1 && p.GetControllersExpected() == 2 && p.GetNodesHealthy() == 1
	}) {
		t.Fatalf("plugin counts did not drop after stopping agent-1: %v", got)
	}
	resp, err := cl.GetNode(ctx, &csisupdv1.NodeGetRequest{Id: id})
	if err != nil || resp.GetNode().GetStatus() != "down" {
		t.Fatalf("node of stopped agent: %v, %v", resp.GetNode(), err)
	}

	// Restarted with the same data dir, it is the same node again.
	c.RestartAgent(1)
	if c.Agent(1).NodeID() != id {
		t.Fatalf("restarted agent has node id %s, want %s", c.Agent(1).NodeID(), id)
	}
	if !poll(30*time.Second, func() bool {
		p, ok := pluginCounts(t, cl, "tp")
		got = p
		return ok && p.GetNodesHealthy() == 2 && p.GetNodesExpected() == 2
	}) {
		t.Fatalf("plugin not healthy again after restarting agent-1: %v", got)
	}
	if err := c.Agent(0).Err(); err != nil {
		t.Fatalf("agent-0: %v", err)
	}
}

func TestAgentDirIsRemovedAtShutdown(t *testing.T) {
	c := New(t, Config{Servers: 1, Agents: 1})
	dir := c.Agent(0).Dir
	if _, err := os.Stat(c.Agent(0).ConfigFile); err != nil {
		t.Fatal(err)
	}
	c.Shutdown()
	if c.Agent(0).Running() {
		t.Fatal("agent still running after Shutdown")
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("agent dir %s still exists after Shutdown: %v", dir, err)
	}
}
