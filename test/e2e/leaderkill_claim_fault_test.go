//go:build fault

package e2e

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// claimResumeTimeout is the servers' claim_resume_timeout in these tests.
const claimResumeTimeout = 5 * time.Second

// leaderKillCluster is three server processes and two node agents: node-1
// runs a monolith test plugin (the controller of every volume), node-2 a
// node-only one.
type leaderKillCluster struct {
	servers []*recoveryServer
	plugins map[string]*testplugin.Plugin // node name -> its plugin
}

func startLeaderKillCluster(t *testing.T) *leaderKillCluster {
	t.Helper()
	ports := testutil.FreePorts(t, 15)
	var join []string
	for i := range 3 {
		join = append(join, fmt.Sprintf("127.0.0.1:%d", ports[3*i]))
	}
	c := &leaderKillCluster{plugins: map[string]*testplugin.Plugin{}}
	for i := range 3 {
		s := &recoveryServer{name: fmt.Sprintf("s%d", i), dataDir: testutil.TempDir(t), rpc: join[i], httpPort: ports[3*i+2]}
		s.config = agentHCLIn(t, s.name, s.dataDir, ports[3*i], ports[3*i+1], ports[3*i+2], fmt.Sprintf(`client { enabled = false }
server {
  enabled              = true
  bootstrap_expect     = 3
  retry_join           = %s
  claim_resume_timeout = %q
}
`, hclList(join), claimResumeTimeout))
		s.start(t)
		c.servers = append(c.servers, s)
	}
	mode := pluginMounts(t)
	for i, name := range []string{"node-1", "node-2"} {
		// The agent's data dir, where the plugin mounts, is made before
		// the plugin, so that the plugin's mounts are undone before it is
		// removed.
		dir, dataDir := testutil.TempDir(t), testutil.TempDir(t)
		cfg := testplugin.Config{Socket: filepath.Join(dir, "tp", "csi.sock"), StateDir: testutil.TempDir(t),
			Type: testplugin.TypeNode, NodeID: "csi-" + name, Mounts: mode}
		if i == 0 {
			cfg.Type, cfg.KnownNodeIDs = testplugin.TypeMonolith, []string{testplugin.AnyNode}
		}
		c.plugins[name] = startTestPlugin(t, cfg)
		p := ports[9+3*i:]
		startAgentProcess(t, name, p[2], "--config", agentHCLIn(t, name, dataDir, p[0], p[1], p[2], fmt.Sprintf(`client {
  plugin_dir     = %q
  servers        = %s
  probe_interval = "1s"
  probe_timeout  = "1s"
}
`, dir, hclList(join))))
	}
	testutil.WaitFor(t, 60*time.Second, "plugin tp with a controller and two nodes", func() bool {
		p, ok := tryPlugin(t, join[0], "tp")
		return ok && p.ControllersHealthy == 1 && p.NodesHealthy == 2
	})
	return c
}

// leader returns the server that leads, and a follower.
func (c *leaderKillCluster) leader(t *testing.T) (leader, follower *recoveryServer) {
	t.Helper()
	testutil.WaitFor(t, 60*time.Second, "a leader", func() bool {
		for _, s := range c.servers {
			if s.stopped {
				continue
			}
			var peers peersDoc
			r := cli(t, s.rpc, "operator", "raft", "list-peers", "--json")
			if r.code != 0 || !jsonInto(r.stdout, &peers) {
				continue
			}
			for _, p := range peers.Peers {
				if !p.Leader {
					continue
				}
				for _, cand := range c.servers {
					if !cand.stopped && cand.nodeID(t) == p.ID {
						leader = cand
					}
				}
			}
			if leader != nil {
				break
			}
		}
		return leader != nil
	})
	for _, s := range c.servers {
		if s != leader && !s.stopped {
			follower = s
			break
		}
	}
	return leader, follower
}

// settledClaim waits until the claim of w1 on node-1 is either taken and
// mounted, with the node's plugin publishing the volume at the claim's
// host path (a mount point when the plugin mounts), or gone, with the
// plugin holding nothing (and nothing left mounted); volume status is read
// from addr. It returns whether the claim holds.
func (c *leaderKillCluster) settledClaim(t *testing.T, addr, externalID string) bool {
	t.Helper()
	var holds bool
	var last string
	testutil.WaitFor(t, claimResumeTimeout+90*time.Second, "the claim finished or released, as the plugin holds it", func() bool {
		var v volumeDoc
		r := cli(t, addr, "volume", "status", "v1", "--json")
		if r.code != 0 || !jsonInto(r.stdout, &v) {
			return false
		}
		nv := c.plugins["node-1"].NodeVolumes()
		last = fmt.Sprintf("claims %+v, plugin %+v", v.Claims, nv)
		node := c.plugins["node-1"]
		switch {
		case len(v.Claims) == 0:
			holds = false
			return len(nv) == 0 && len(mountsLeft(t, node)) == 0
		case len(v.Claims) == 1 && v.Claims[0].WorkloadID == "w1" && v.Claims[0].State == "taken" && v.Claims[0].Mounted:
			holds = true
			if len(nv) != 1 || !slices.Contains(nv[externalID].Targets, v.Claims[0].HostPath) {
				return false
			}
			if !mounts(node) {
				return true
			}
			mounted, err := testplugin.IsMountPoint(v.Claims[0].HostPath)
			return err == nil && mounted
		}
		return false
	})
	t.Logf("settled: holds=%v (%s)", holds, last)
	return holds
}

// leaderDiesMidClaim claims v1 for w1 on node-1 through a follower while
// node-1's plugin is slow to publish, runs fault on the leader once the
// publish is in flight, and checks that the claim ends either finished or
// released, with volume status agreeing with the plugin, and that another
// workload's claim is refused only while the first one holds the volume.
func leaderDiesMidClaim(t *testing.T, fault func(t *testing.T, leader *recoveryServer)) {
	c := startLeaderKillCluster(t)
	leader, follower := c.leader(t)
	var vol volumeDoc
	cliJSON(t, follower.rpc, &vol, "volume", "create", "v1", "--plugin", "tp")

	node := c.plugins["node-1"]
	node.SetFaults(testplugin.Faults{Delays: map[string]time.Duration{"NodePublishVolume": 5 * time.Second}})
	claim := startCLI(t, follower.rpc, "volume", "claim", "v1", "--node", "node-1", "--workload", "w1")
	waitCalling(t, node, "NodePublishVolume")
	fault(t, leader)
	node.SetFaults(testplugin.Faults{})
	out := <-claim
	t.Logf("the claim's caller saw: %s", out)

	_, follower = c.leader(t)
	holds := c.settledClaim(t, follower.rpc, vol.ExternalID)
	r := cli(t, follower.rpc, "volume", "claim", "v1", "--node", "node-2", "--workload", "w2")
	if holds {
		if r.code == 0 || !strings.Contains(r.stderr, "access-mode") {
			t.Fatalf("a second writer while w1 holds the volume: exit %d, %s", r.code, r.stderr)
		}
		// The caller that saw an error learns the outcome by claiming again.
		var again claimDoc
		cliJSON(t, follower.rpc, &again, "volume", "claim", "v1", "--node", "node-1", "--workload", "w1")
		if !again.Mounted || again.HostPath == "" {
			t.Fatalf("claiming again: %+v, want the finished claim", again)
		}
		if r := cli(t, follower.rpc, "volume", "release", "v1", "--node", "node-1", "--workload", "w1"); r.code != 0 {
			t.Fatalf("release of w1: exit %d: %s", r.code, r.stderr)
		}
		if left := node.NodeVolumes(); len(left) != 0 {
			t.Fatalf("node-1's plugin still holds %+v after the release", left)
		}
		if left := mountsLeft(t, node); len(left) != 0 {
			t.Fatalf("still mounted on node-1 after the release: %v", left)
		}
		r = cli(t, follower.rpc, "volume", "claim", "v1", "--node", "node-2", "--workload", "w2")
	}
	if r.code != 0 {
		t.Fatalf("claim of w2 once w1 is released: exit %d: %s", r.code, r.stderr)
	}
}

// TestLeaderKilledMidClaim: the leader is SIGKILLed while the node
// publishes a claim it took.
func TestLeaderKilledMidClaim(t *testing.T) {
	leaderDiesMidClaim(t, func(t *testing.T, leader *recoveryServer) {
		leader.kill(t)
	})
}

// TestLeaderStoppedMidClaim: the leader is SIGSTOPped for 3 s while the
// node publishes a claim it took; it comes back to find another leader.
func TestLeaderStoppedMidClaim(t *testing.T) {
	leaderDiesMidClaim(t, func(t *testing.T, leader *recoveryServer) {
		if err := leader.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		// The fault lasts 3 s: a paused process, the case leases get wrong.
		cont := time.AfterFunc(3*time.Second, func() { leader.cmd.Process.Signal(syscall.SIGCONT) })
		t.Cleanup(func() {
			cont.Stop()
			leader.cmd.Process.Signal(syscall.SIGCONT)
		})
	})
}
