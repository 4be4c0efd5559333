package e2e

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// TestDevAgent runs `csisupd agent --dev` and drives a volume through its
// whole life with the CLI, checking each step in the demo plugin's state.
func TestDevAgent(t *testing.T) {
	const nodeName = "e2e-dev"
	dataDir := testutil.TempDir(t)
	ports := testutil.FreePorts(t, 3)
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])

	var logs testutil.SyncBuffer
	agent := exec.Command(binary, "agent", "--dev", "--name", nodeName, "--data-dir", dataDir,
		"--rpc-port", strconv.Itoa(ports[0]), "--raft-port", strconv.Itoa(ports[1]), "--http-port", strconv.Itoa(ports[2]))
	agent.Env = cleanEnv()
	agent.Stdout, agent.Stderr = &logs, &logs
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- agent.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			agent.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("agent output:\n%s", logs.String())
		}
	})

	health := fmt.Sprintf("http://127.0.0.1:%d/v1/health", ports[2])
	client := &http.Client{Timeout: 2 * time.Second}
	testutil.WaitFor(t, 30*time.Second, "the dev agent's /v1/health", func() bool {
		resp, err := client.Get(health)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	// The demo plugin registers through the node registration and raft.
	var plugin pluginDoc
	testutil.WaitFor(t, 30*time.Second, "plugin demo healthy in the cluster", func() bool {
		var ok bool
		plugin, ok = tryPlugin(t, addr, "demo")
		return ok && plugin.ControllersHealthy == 1 && plugin.NodesHealthy == 1
	})
	if plugin.ControllersExpected != 1 || plugin.NodesExpected != 1 || len(plugin.Instances) != 1 {
		t.Fatalf("plugin status demo: %+v", plugin)
	}
	if in := plugin.Instances[0]; in.NodeName != nodeName || in.Plugin.Type != testplugin.TypeMonolith || !in.Healthy || in.Plugin.NodeID != nodeName {
		t.Fatalf("demo instance: %+v", in)
	}

	var nodes nodeListDoc
	cliJSON(t, addr, &nodes, "node", "status")
	if len(nodes.Nodes) != 1 || nodes.Nodes[0].Name != nodeName || nodes.Nodes[0].Status != "ready" || nodes.Nodes[0].Address != addr {
		t.Fatalf("node status: %+v", nodes)
	}
	nodeID := nodes.Nodes[0].ID

	// `status` summarises the agent's place in the cluster.
	var status struct {
		Cluster struct {
			NodeID         string   `json:"node_id"`
			Server         bool     `json:"server"`
			Servers        []string `json:"servers"`
			NodeRegistered bool     `json:"node_registered"`
			Leader         string   `json:"leader"`
			RaftPeers      int32    `json:"raft_peers"`
			Nodes          int32    `json:"nodes"`
			NodesReady     int32    `json:"nodes_ready"`
		} `json:"cluster"`
	}
	cliJSON(t, addr, &status, "status")
	if c := status.Cluster; c.NodeID != nodeID || !c.Server || !c.NodeRegistered || c.Leader != nodeID ||
		c.RaftPeers != 1 || c.Nodes != 1 || c.NodesReady != 1 || len(c.Servers) != 1 || c.Servers[0] != addr {
		t.Fatalf("status cluster summary: %+v", c)
	}
	stateDir := filepath.Join(dataDir, "demo-plugin-state")

	// create
	var vol volumeDoc
	cliJSON(t, addr, &vol, "volume", "create", "v1", "--plugin", "demo", "--capacity", "1MiB",
		"--parameter", "tier=gold", "--secret", "password=hunter2")
	if vol.ID != "v1" || vol.PluginID != "demo" || vol.ExternalID == "" || vol.CapacityBytes < 1<<20 ||
		vol.Parameters["tier"] != "gold" || vol.ControllerNodeID != nodeID {
		t.Fatalf("volume create: %+v", vol)
	}
	rec, ok := readPluginVolume(t, stateDir, vol.ExternalID)
	if !ok || rec.Name != "v1" || rec.CapacityBytes != vol.CapacityBytes {
		t.Fatalf("plugin record of %s: %+v (exists %v)", vol.ExternalID, rec, ok)
	}
	var got volumeDoc
	cliJSON(t, addr, &got, "volume", "status", "v1")
	if got.ExternalID != vol.ExternalID || len(got.Claims) != 0 {
		t.Fatalf("volume status after create: %+v", got)
	}

	// attach: ControllerPublishVolume with the node's CSI node id.
	var att attachDoc
	cliJSON(t, addr, &att, "volume", "attach", "v1", "--node", nodeID)
	if att.Claim.NodeID != nodeID || att.Claim.CSINodeID != nodeName ||
		att.Claim.PublishContext[testplugin.PublishContextNodeID] != nodeName {
		t.Fatalf("volume attach: %+v", att)
	}
	if rec, _ := readPluginVolume(t, stateDir, vol.ExternalID); len(rec.Published) != 1 || rec.Published[nodeName] == nil {
		t.Fatalf("plugin record after attach: published to %v, want %s", rec.Published, nodeName)
	}
	cliJSON(t, addr, &got, "volume", "status", "v1")
	if len(got.Claims) != 1 || got.Claims[0].CSINodeID != nodeName {
		t.Fatalf("volume status after attach: %+v", got)
	}
	if res := cli(t, addr, "volume", "delete", "v1"); res.code != 1 || !strings.Contains(res.stderr, "detach it first") {
		t.Fatalf("delete of an attached volume: exit %d, %q", res.code, res.stderr)
	}

	// detach (by node name) and delete undo it.
	if res := cli(t, addr, "volume", "detach", "v1", "--node", nodeName); res.code != 0 {
		t.Fatalf("volume detach: exit %d: %s", res.code, res.stderr)
	}
	if rec, _ := readPluginVolume(t, stateDir, vol.ExternalID); len(rec.Published) != 0 {
		t.Fatalf("plugin record after detach: still published to %v", rec.Published)
	}
	if res := cli(t, addr, "volume", "delete", "v1"); res.code != 0 || !strings.Contains(res.stdout, "Deleted volume v1") {
		t.Fatalf("volume delete: exit %d: %s %s", res.code, res.stdout, res.stderr)
	}
	if _, ok := readPluginVolume(t, stateDir, vol.ExternalID); ok {
		t.Fatalf("plugin still has volume %s after delete", vol.ExternalID)
	}
	if res := cli(t, addr, "volume", "status", "v1"); res.code != 1 || !strings.Contains(res.stderr, "not found") {
		t.Fatalf("status of a deleted volume: exit %d, %q", res.code, res.stderr)
	}
	var list volumeListDoc
	cliJSON(t, addr, &list, "volume", "list")
	if len(list.Volumes) != 0 {
		t.Fatalf("volume list after delete: %+v", list)
	}

	// Secrets are sent, never printed or logged.
	if strings.Contains(logs.String(), "hunter2") {
		t.Fatal("the agent logged a secret")
	}

	// A usage error exits 2.
	if res := cli(t, addr, "volume", "attach", "v1"); res.code != 2 || !strings.Contains(res.stderr, "--node") {
		t.Fatalf("attach without --node: exit %d, %q", res.code, res.stderr)
	}

	// SIGTERM stops the agent cleanly.
	if err := agent.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	timer := time.NewTimer(15 * time.Second)
	defer timer.Stop()
	select {
	case err := <-exited:
		stopped = true
		if err != nil {
			t.Fatalf("agent exited with %v after SIGTERM", err)
		}
	case <-timer.C:
		t.Fatal("agent did not exit within 15 s of SIGTERM")
	}
	if _, err := os.Stat(dataDir); err != nil {
		t.Fatalf("the configured data dir must survive a dev agent: %v", err)
	}
}
