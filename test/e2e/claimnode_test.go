package e2e

import (
	"fmt"
	"maps"
	"os"
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
