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
	agent := startDevAgent(t, nodeName)
	addr, dataDir := agent.addr, agent.dataDir

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

	// claim: ControllerPublishVolume with the node's CSI node id, then
	// stage and publish on the node for the workload.
	var claim claimDoc
	cliJSON(t, addr, &claim, "volume", "claim", "v1", "--node", nodeID, "--workload", "job-1")
	if claim.NodeID != nodeID || claim.CSINodeID != nodeName || claim.State != "taken" || claim.HostPath == "" ||
		claim.PublishContext[testplugin.PublishContextNodeID] != nodeName {
		t.Fatalf("volume claim: %+v", claim)
	}
	if rec, _ := readPluginVolume(t, stateDir, vol.ExternalID); len(rec.Published) != 1 || rec.Published[nodeName] == nil {
		t.Fatalf("plugin record after claim: published to %v, want %s", rec.Published, nodeName)
	}
	if fi, err := os.Lstat(claim.HostPath); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("host path %s after claim: %v, %v; want the plugin's publish target", claim.HostPath, fi, err)
	}
	cliJSON(t, addr, &got, "volume", "status", "v1")
	if len(got.Claims) != 1 || got.Claims[0].CSINodeID != nodeName || got.Claims[0].WorkloadID != "job-1" {
		t.Fatalf("volume status after claim: %+v", got)
	}
	var mounts struct {
		Mounts []struct {
			VolumeID   string `json:"volume_id"`
			WorkloadID string `json:"workload_id"`
			HostPath   string `json:"host_path"`
			State      string `json:"state"`
		} `json:"mounts"`
	}
	cliJSON(t, addr, &mounts, "status")
	if len(mounts.Mounts) != 1 || mounts.Mounts[0].VolumeID != "v1" || mounts.Mounts[0].HostPath != claim.HostPath || mounts.Mounts[0].State != "published" {
		t.Fatalf("status mounts after claim: %+v", mounts)
	}
	if res := cli(t, addr, "volume", "delete", "v1"); res.code != 1 || !strings.Contains(res.stderr, "release them first") {
		t.Fatalf("delete of a claimed volume: exit %d, %q", res.code, res.stderr)
	}

	// release (by node name) and delete undo it.
	if res := cli(t, addr, "volume", "release", "v1", "--node", nodeName, "--workload", "job-1"); res.code != 0 {
		t.Fatalf("volume release: exit %d: %s", res.code, res.stderr)
	}
	if rec, _ := readPluginVolume(t, stateDir, vol.ExternalID); len(rec.Published) != 0 {
		t.Fatalf("plugin record after release: still published to %v", rec.Published)
	}
	if _, err := os.Lstat(claim.HostPath); !os.IsNotExist(err) {
		t.Fatalf("host path after release: %v, want it gone", err)
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
	if strings.Contains(agent.logs.String(), "hunter2") {
		t.Fatal("the agent logged a secret")
	}

	// A usage error exits 2.
	if res := cli(t, addr, "volume", "claim", "v1", "--workload", "w"); res.code != 2 || !strings.Contains(res.stderr, "--node") {
		t.Fatalf("claim without --node: exit %d, %q", res.code, res.stderr)
	}

	// SIGTERM stops the agent cleanly.
	if err := agent.stop(15 * time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dataDir); err != nil {
		t.Fatalf("the configured data dir must survive a dev agent: %v", err)
	}
}

// agentProcess is one `csisupd agent` process.
type agentProcess struct {
	name    string               // for messages
	logs    *testutil.SyncBuffer // its output
	cmd     *exec.Cmd
	exited  chan error // receives the process's exit, once
	stopped bool       // stop saw it exit
}

// devAgent is one `csisupd agent --dev` process.
type devAgent struct {
	*agentProcess
	addr    string // its gRPC address
	dataDir string
}

// startAgentProcess starts `csisupd agent` with args, waits until its
// /v1/health on httpPort answers, and returns it. It is killed when the
// test ends unless stop saw it exit; its output is logged if the test
// failed.
func startAgentProcess(t *testing.T, name string, httpPort int, args ...string) *agentProcess {
	t.Helper()
	a := &agentProcess{name: name, logs: &testutil.SyncBuffer{}, exited: make(chan error, 1)}
	a.cmd = exec.Command(binary, append([]string{"agent"}, args...)...)
	a.cmd.Env = cleanEnv()
	a.cmd.Stdout, a.cmd.Stderr = a.logs, a.logs
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { a.exited <- a.cmd.Wait() }()
	t.Cleanup(func() {
		if !a.stopped {
			a.cmd.Process.Kill()
			<-a.exited
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", a.name, a.logs.String())
		}
	})
	health := fmt.Sprintf("http://127.0.0.1:%d/v1/health", httpPort)
	client := &http.Client{Timeout: 2 * time.Second}
	testutil.WaitFor(t, 30*time.Second, name+"'s /v1/health", func() bool {
		select {
		case err := <-a.exited:
			a.stopped = true
			t.Fatalf("%s exited before serving: %v\n%s", name, err, a.logs.String())
		default:
		}
		resp, err := client.Get(health)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return a
}

// startDevAgent starts `csisupd agent --dev` named nodeName on free ports
// with a data dir of its own and waits until it serves.
func startDevAgent(t *testing.T, nodeName string) *devAgent {
	t.Helper()
	ports := testutil.FreePorts(t, 3)
	dataDir := testutil.TempDir(t)
	a := startAgentProcess(t, "dev agent", ports[2], "--dev", "--name", nodeName, "--data-dir", dataDir,
		"--rpc-port", strconv.Itoa(ports[0]), "--raft-port", strconv.Itoa(ports[1]), "--http-port", strconv.Itoa(ports[2]))
	return &devAgent{agentProcess: a, addr: fmt.Sprintf("127.0.0.1:%d", ports[0]), dataDir: dataDir}
}

// stop sends SIGTERM and waits, at most timeout, for a clean exit.
func (a *agentProcess) stop(timeout time.Duration) error {
	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case err := <-a.exited:
		a.stopped = true
		if err != nil {
			return fmt.Errorf("agent exited with %v after SIGTERM", err)
		}
		return nil
	case <-timer.C:
		return fmt.Errorf("agent did not exit within %s of SIGTERM", timeout)
	}
}
