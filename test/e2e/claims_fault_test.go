//go:build fault

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// claimNode is a two-process cluster for killing an agent in the middle of
// a volume step: a server agent with the controller of plugin "tp", and a
// client agent c0 with its node service, both real `csisupd agent`
// processes; addClient adds more clients. The plugins run in the test, so
// they outlive a killed agent and keep their own record of what is staged
// and published. The node plugins make real bind mounts when the test
// can, so the mount table shows what stays mounted.
type claimNode struct {
	serverAddr    string
	serverHTTP    int
	server        *agentProcess
	serverData    string
	serverSecrets string // its secrets file of plugin "tp", when it has one
	controller    *testplugin.Plugin
	ctrlState     string
	opts          claimNodeOptions
	*clientAgent
}

// clientAgent is a client agent with the node service of plugin "tp"
// (CSI node id csi-<name>), whose data dir is kept across its restarts.
type clientAgent struct {
	name string
	addr string // its gRPC address
	node *testplugin.Plugin

	clientCfg   string
	secretsFile string // its secrets file of plugin "tp", when the node has one
	clientHTTP  int
	clientData  string
	client      *agentProcess
}

func startClaimNode(t *testing.T) *claimNode {
	t.Helper()
	return startClaimNodeWith(t, claimNodeOptions{})
}

// claimNodeOptions change the cluster startClaimNodeWith makes.
type claimNodeOptions struct {
	// grace is the server's claim_gc_grace; "2s" when empty.
	grace string
	// secrets, when set, are required by every plugin on every call and
	// are in each agent's secrets file of plugin "tp", and nowhere else.
	secrets map[string]string
	// health makes the plugins report volume health (the controller with
	// GET_VOLUME_HEALTH and LIST_VOLUME_HEALTH) and has the server list
	// it and every agent ask its mounts' every second.
	health bool
}

// healthInterval is the line of a server or client block that asks
// volume health every second when opts.health is set.
func (o claimNodeOptions) healthInterval() string {
	if !o.health {
		return ""
	}
	return "  volume_health_interval = \"1s\"\n"
}

// controllerCapabilities are the controller's: the defaults, and the
// health ones with opts.health.
func (o claimNodeOptions) controllerCapabilities() []csi.ControllerServiceCapability_RPC_Type {
	if !o.health {
		return nil
	}
	return append(slices.Clone(testplugin.DefaultControllerCapabilities),
		csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH, csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH)
}

// startClaimNodeWith is startClaimNode with opts.
func startClaimNodeWith(t *testing.T, opts claimNodeOptions) *claimNode {
	t.Helper()
	if opts.grace == "" {
		opts.grace = "2s"
	}
	ports := testutil.FreePorts(t, 3)
	n := &claimNode{serverAddr: fmt.Sprintf("127.0.0.1:%d", ports[0]), serverHTTP: ports[2], opts: opts}

	serverPlugins := testutil.TempDir(t)
	n.ctrlState = testutil.TempDir(t)
	n.controller = startTestPlugin(t, testplugin.Config{
		Socket: filepath.Join(serverPlugins, "tp", "csi.sock"), StateDir: n.ctrlState,
		Type: testplugin.TypeController, NodeID: "csi-server", KnownNodeIDs: []string{testplugin.AnyNode},
		RequiredSecrets: opts.secrets, ControllerCapabilities: opts.controllerCapabilities(), VolumeHealth: opts.health,
	})
	n.serverData = testutil.TempDir(t)
	if len(opts.secrets) > 0 {
		n.serverSecrets = filepath.Join(testutil.TempDir(t), "tp.hcl")
	}
	serverCfg := agentHCLIn(t, "s0", n.serverData, ports[0], ports[1], ports[2], fmt.Sprintf(`client { plugin_dir = %q }
server {
  enabled          = true
  bootstrap_expect = 1
  claim_gc_grace   = %q
%s}
%s`, serverPlugins, opts.grace, opts.healthInterval(), secretsBlock(t, opts.secrets, n.serverSecrets)))
	n.server = startAgentProcess(t, "server s0", ports[2], "--config", serverCfg)

	n.clientAgent = n.addClient(t, "c0")
	testutil.WaitFor(t, 60*time.Second, "plugin tp with a controller and a node", func() bool {
		p, ok := tryPlugin(t, n.serverAddr, "tp")
		return ok && p.ControllersHealthy == 1 && p.NodesHealthy == 1
	})
	return n
}

// secretsBlock writes secrets, when there are any, to the secrets file
// of plugin "tp" at path and returns the agent config block that names it.
func secretsBlock(t *testing.T, secrets map[string]string, path string) string {
	t.Helper()
	if len(secrets) == 0 {
		return ""
	}
	writeSecretsFile(t, path, secrets)
	return fmt.Sprintf("plugin \"tp\" {\n  secrets_file = %q\n}\n", path)
}

// writeSecretsFile writes secrets as a secrets file's default block.
func writeSecretsFile(t *testing.T, path string, secrets map[string]string) {
	t.Helper()
	var b strings.Builder
	b.WriteString("default {\n")
	for _, k := range slices.Sorted(maps.Keys(secrets)) {
		fmt.Fprintf(&b, "  %s = %q\n", k, secrets[k])
	}
	b.WriteString("}\n")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

// addClient starts a client agent named name, with the node service of
// plugin "tp", that registers with n's server.
func (n *claimNode) addClient(t *testing.T, name string) *clientAgent {
	t.Helper()
	ports := testutil.FreePorts(t, 3)
	clientPlugins := testutil.TempDir(t)
	// The data dir is made before the plugin, so that the plugin's mounts
	// there are undone before the directory is removed.
	c := &clientAgent{name: name, addr: fmt.Sprintf("127.0.0.1:%d", ports[0]), clientData: testutil.TempDir(t), clientHTTP: ports[2]}
	c.node = startTestPlugin(t, testplugin.Config{
		Socket: filepath.Join(clientPlugins, "tp", "csi.sock"), StateDir: testutil.TempDir(t),
		Type: testplugin.TypeNode, NodeID: "csi-" + name, Mounts: pluginMounts(t),
		RequiredSecrets: n.opts.secrets, VolumeHealth: n.opts.health,
	})
	if len(n.opts.secrets) > 0 {
		c.secretsFile = filepath.Join(testutil.TempDir(t), "tp.hcl")
	}
	c.clientCfg = filepath.Join(testutil.TempDir(t), "agent.hcl")
	if err := os.WriteFile(c.clientCfg, []byte(fmt.Sprintf(`name      = %q
data_dir  = %q
bind_addr = "127.0.0.1"
ports {
  rpc  = %d
  raft = %d
  http = %d
}
consul { enabled = false }
client {
  plugin_dir     = %q
  servers        = [%q]
  probe_interval = "1s"
  probe_timeout  = "1s"
%s}
%s`, name, c.clientData, ports[0], ports[1], ports[2], clientPlugins, n.serverAddr, n.opts.healthInterval(),
		secretsBlock(t, n.opts.secrets, c.secretsFile))), 0o600); err != nil {
		t.Fatal(err)
	}
	c.startClient(t)
	return c
}

// startClient starts the client agent from its config file.
func (c *clientAgent) startClient(t *testing.T) {
	t.Helper()
	c.client = startAgentProcess(t, "client "+c.name, c.clientHTTP, "--config", c.clientCfg)
}

// killClient kills the client agent with SIGKILL and waits for it to exit.
func (c *clientAgent) killClient(t *testing.T) {
	t.Helper()
	if err := c.client.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-c.client.exited
	c.client.stopped = true
}

// startCLI runs the CLI in the background and returns a channel that
// receives its combined output and error when it exits.
func startCLI(t *testing.T, addr string, args ...string) <-chan string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	cmd := exec.CommandContext(ctx, binary, append([]string{"--address", addr, "--timeout", "90s"}, args...)...)
	cmd.Env = cleanEnv()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan string, 1)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		defer cancel()
		err := cmd.Wait()
		done <- fmt.Sprintf("%s (exit: %v)", out.String(), err)
	}()
	t.Cleanup(func() {
		cancel()
		<-exited
	})
	return done
}

// createAndClaim creates volume v1 of plugin tp, claims it for workload
// w1 on c0 and checks that c0's plugin holds it where the claim says; it
// returns the volume, the claim and the staging path.
func (n *claimNode) createAndClaim(t *testing.T) (volumeDoc, claimDoc, string) {
	t.Helper()
	var vol volumeDoc
	cliJSON(t, n.serverAddr, &vol, "volume", "create", "v1", "--plugin", "tp")
	var claim claimDoc
	cliJSON(t, n.serverAddr, &claim, "volume", "claim", "v1", "--node", "c0", "--workload", "w1")
	return vol, claim, n.wantClaimMounted(t, claim, vol.ExternalID)
}

// waitCalling waits until the plugin is in a call of method.
func waitCalling(t *testing.T, p *testplugin.Plugin, method string) {
	t.Helper()
	testutil.WaitFor(t, 30*time.Second, "a "+method+" call in flight", func() bool {
		return p.Stats().InFlight[method] == 1
	})
}

// waitAllUndone waits until the volume has no claims, the node plugin has
// nothing staged or published (in its records and, with real mounts, in
// the mount table), the controller has it published nowhere, and the
// client agent keeps no mount record.
func (n *claimNode) waitAllUndone(t *testing.T, volumeID, externalID string) {
	t.Helper()
	testutil.WaitFor(t, 90*time.Second, "the claim released everywhere", func() bool {
		var v volumeDoc
		res := cli(t, n.serverAddr, "volume", "status", volumeID, "--json")
		if res.code != 0 || !jsonInto(res.stdout, &v) || len(v.Claims) != 0 {
			return false
		}
		rec, _ := readPluginVolume(t, n.ctrlState, externalID)
		// The agent removes its mount record right after the plugin's
		// unstage answered, so the record is waited for too.
		return len(n.node.NodeVolumes()) == 0 && len(mountsLeft(t, n.node)) == 0 && len(rec.Published) == 0 && n.mountRecords(t) == 0
	})
}

// wantClaimMounted fails the test unless, with real mounts, the claim's
// host path and the volume's staging path are mount points. It returns
// the staging path.
func (n *claimNode) wantClaimMounted(t *testing.T, claim claimDoc, externalID string) string {
	t.Helper()
	staging := n.node.NodeVolumes()[externalID].StagingPath
	if staging == "" {
		t.Fatalf("the node plugin has not staged %s: %+v", externalID, n.node.NodeVolumes())
	}
	wantMountPoints(t, n.node, true, claim.HostPath, staging)
	return staging
}

// mountRecords counts the client agent's mount records.
func (c *clientAgent) mountRecords(t *testing.T) int {
	t.Helper()
	records, err := os.ReadDir(filepath.Join(c.clientData, "volume-mounts"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return len(records)
}

// TestAgentKilledBetweenStageAndPublish kills the node's agent while the
// plugin publishes a volume it has staged: the claim fails, and once the
// agent is back the staging is undone and the claim released.
func TestAgentKilledBetweenStageAndPublish(t *testing.T) {
	n := startClaimNode(t)
	var vol volumeDoc
	cliJSON(t, n.serverAddr, &vol, "volume", "create", "v1", "--plugin", "tp")

	n.node.SetFaults(testplugin.Faults{Delays: map[string]time.Duration{"NodePublishVolume": 10 * time.Minute}})
	claim := startCLI(t, n.serverAddr, "volume", "claim", "v1", "--node", "c0", "--workload", "w1")
	waitCalling(t, n.node, "NodePublishVolume")
	log := n.node.NodeLog()
	if len(log) != 1 || log[0].Method != "NodeStageVolume" {
		t.Fatalf("node plugin log before the kill: %+v, want one stage", log)
	}
	wantMountPoints(t, n.node, true, log[0].Path)
	n.killClient(t)
	n.node.SetFaults(testplugin.Faults{})
	if out := <-claim; !strings.Contains(out, "exit status 1") {
		t.Fatalf("the claim interrupted by the agent's death: %s; want it to fail", out)
	}

	n.startClient(t)
	n.waitAllUndone(t, "v1", vol.ExternalID)
	log = n.node.NodeLog()
	if last := log[len(log)-1]; last.Method != "NodeUnstageVolume" {
		t.Fatalf("node plugin log after the restart: %+v, want the staging undone", log)
	}
	if res := cli(t, n.serverAddr, "volume", "delete", "v1"); res.code != 0 {
		t.Fatalf("delete after the release: exit %d: %s", res.code, res.stderr)
	}
}

// TestAgentKilledBetweenUnpublishAndUnstage kills the node's agent while
// the plugin unstages a volume it has unpublished: once the agent is back
// it finishes the unstage and the servers finish the release.
func TestAgentKilledBetweenUnpublishAndUnstage(t *testing.T) {
	n := startClaimNode(t)
	vol, claim, staging := n.createAndClaim(t)

	n.node.SetFaults(testplugin.Faults{Delays: map[string]time.Duration{"NodeUnstageVolume": 10 * time.Minute}})
	release := startCLI(t, n.serverAddr, "volume", "release", "v1", "--node", "c0", "--workload", "w1")
	waitCalling(t, n.node, "NodeUnstageVolume")
	if vols := n.node.NodeVolumes(); len(vols[vol.ExternalID].Targets) != 0 || vols[vol.ExternalID].StagingPath == "" {
		t.Fatalf("node plugin before the kill: %+v, want unpublished and still staged", vols)
	}
	wantMountPoints(t, n.node, false, claim.HostPath)
	wantMountPoints(t, n.node, true, staging)
	n.killClient(t)
	n.node.SetFaults(testplugin.Faults{})
	<-release // fails or not: the servers' watcher finishes the release

	n.startClient(t)
	n.waitAllUndone(t, "v1", vol.ExternalID)
}

// TestNodeDownLongerThanClaimGCGrace kills the node's agent and leaves it
// down: after claim_gc_grace the servers release its claim through the
// controller alone, and the agent, when it returns, unmounts what it
// still had.
func TestNodeDownLongerThanClaimGCGrace(t *testing.T) {
	n := startClaimNode(t)
	vol, claim, staging := n.createAndClaim(t)
	n.killClient(t)

	testutil.WaitFor(t, 90*time.Second, "the claim of the down node released", func() bool {
		var v volumeDoc
		res := cli(t, n.serverAddr, "volume", "status", "v1", "--json")
		return res.code == 0 && jsonInto(res.stdout, &v) && len(v.Claims) == 0
	})
	if rec, _ := readPluginVolume(t, n.ctrlState, vol.ExternalID); len(rec.Published) != 0 {
		t.Fatalf("the controller still has the volume published to %v", rec.Published)
	}
	// The node could not be asked: its plugin still has the volume.
	if vols := n.node.NodeVolumes(); len(vols[vol.ExternalID].Targets) != 1 {
		t.Fatalf("node plugin while its agent is down: %+v, want the publication left", vols)
	}
	wantMountPoints(t, n.node, true, claim.HostPath, staging)

	n.startClient(t)
	n.waitAllUndone(t, "v1", vol.ExternalID)
}
