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

// settleTarget is how soon after a leader's fault the servers' claims
// and the nodes' mounts must agree. The servers keep the default
// claim_resume_timeout (2 min), far above it, so that only the new
// leader's resuming of the claims its predecessor left can meet it.
const settleTarget = 10 * time.Second

// parallelClaims is how many workloads claim the volume at once.
const parallelClaims = 30

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
  enabled          = true
  bootstrap_expect = 3
  retry_join       = %s
}
`, hclList(join)))
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

// claimView is one reading of the volume's claims on the servers and of
// what the nodes' plugins publish.
type claimView struct {
	claims []claimDoc
	// published holds the workloads' target paths each node's plugin
	// publishes the volume at, by node name.
	published map[string][]string
}

// view reads volume v1's claims from addr and the plugins' records; ok is
// false when the servers did not answer.
func (c *leaderKillCluster) view(t *testing.T, addr, externalID string) (claimView, bool) {
	t.Helper()
	var v volumeDoc
	r := cli(t, addr, "volume", "status", "v1", "--json")
	if r.code != 0 || !jsonInto(r.stdout, &v) {
		return claimView{}, false
	}
	cv := claimView{claims: v.Claims, published: map[string][]string{}}
	for name, p := range c.plugins {
		if nv, ok := p.NodeVolumes()[externalID]; ok {
			cv.published[name] = nv.Targets
		}
	}
	return cv, true
}

// writers returns the number of writers the servers record (every claim
// of the single-writer volume in state taken) and the number of targets
// the plugins publish the volume at.
func (cv claimView) writers() (claims, targets int) {
	for _, cl := range cv.claims {
		if cl.State == "taken" {
			claims++
		}
	}
	for _, ts := range cv.published {
		targets += len(ts)
	}
	return claims, targets
}

// settled reports whether the claims and the plugins agree: no claim and
// nothing published or mounted anywhere, or one claim taken and mounted
// whose node's plugin publishes the volume at the claim's host path (a
// mount point when the plugin mounts) and nothing else.
func (c *leaderKillCluster) settled(t *testing.T, cv claimView) bool {
	t.Helper()
	switch {
	case len(cv.claims) == 0:
		if len(cv.published) != 0 {
			return false
		}
		for _, p := range c.plugins {
			if len(mountsLeft(t, p)) != 0 {
				return false
			}
		}
		return true
	case len(cv.claims) == 1 && cv.claims[0].State == "taken" && cv.claims[0].Mounted:
		cl := cv.claims[0]
		node := c.nodeOf(cl)
		if node == "" || len(cv.published) != 1 || !slices.Equal(cv.published[node], []string{cl.HostPath}) {
			return false
		}
		if !mounts(c.plugins[node]) {
			return true
		}
		mounted, err := testplugin.IsMountPoint(cl.HostPath)
		return err == nil && mounted
	}
	return false
}

// nodeOf returns the name of the node a claim is on, from its CSI node
// id ("csi-" and the node's name in these tests), or "".
func (c *leaderKillCluster) nodeOf(cl claimDoc) string {
	name := strings.TrimPrefix(cl.CSINodeID, "csi-")
	if _, ok := c.plugins[name]; ok {
		return name
	}
	return ""
}

// leaderDiesMidClaim claims v1, a single-writer volume, for 30 workloads
// at once, through a follower, half of them on each node, while the
// nodes' plugins are slow to publish; it runs fault on the leader once a
// publish is in flight. Until the servers' claims and the plugins agree
// (within settleTarget of the fault) it checks at every reading that
// there is never more than one writer, on the servers or on the nodes.
// Then another workload's claim is refused while the holder (if any)
// holds the volume, the holder learns its claim by claiming again, and
// once it releases, another workload claims the volume.
func leaderDiesMidClaim(t *testing.T, fault func(t *testing.T, leader *recoveryServer)) {
	c := startLeaderKillCluster(t)
	leader, follower := c.leader(t)
	var vol volumeDoc
	cliJSON(t, follower.rpc, &vol, "volume", "create", "v1", "--plugin", "tp")

	slow := testplugin.Faults{Delays: map[string]time.Duration{"NodePublishVolume": 5 * time.Second}}
	for _, p := range c.plugins {
		p.SetFaults(slow)
	}
	claims := make([]<-chan string, parallelClaims)
	for i := range claims {
		node := []string{"node-1", "node-2"}[i%2]
		claims[i] = startCLI(t, follower.rpc, "volume", "claim", "v1", "--node", node, "--workload", fmt.Sprintf("w%d", i+1), "--json")
	}
	testutil.WaitFor(t, 30*time.Second, "a NodePublishVolume call in flight", func() bool {
		for _, p := range c.plugins {
			if p.Stats().InFlight["NodePublishVolume"] > 0 {
				return true
			}
		}
		return false
	})
	faultAt := time.Now()
	fault(t, leader)
	for _, p := range c.plugins {
		p.SetFaults(testplugin.Faults{})
	}

	// Read through the follower, which is not the faulted server: a
	// stopped server would hold the CLI until its timeout.
	var last claimView
	testutil.WaitFor(t, settleTarget+60*time.Second, "the servers' claims and the nodes' mounts to agree", func() bool {
		cv, ok := c.view(t, follower.rpc, vol.ExternalID)
		if !ok {
			return false
		}
		last = cv
		if claims, targets := cv.writers(); claims > 1 || targets > 1 {
			t.Fatalf("two writers: claims %+v, published %v", cv.claims, cv.published)
		}
		return c.settled(t, cv)
	})
	took := time.Since(faultAt)
	t.Logf("settled %s after the fault: claims %+v, published %v", took.Round(10*time.Millisecond), last.claims, last.published)
	if took > settleTarget {
		t.Errorf("the claims and the nodes agreed %s after the fault, want within %s", took.Round(10*time.Millisecond), settleTarget)
	}

	// Every caller has its answer; at most one was told it holds the
	// volume, and that one is the holder.
	var holder *claimDoc
	if len(last.claims) == 1 {
		holder = &last.claims[0]
	}
	succeeded := 0
	for _, ch := range claims {
		out := <-ch
		var got claimDoc
		if !strings.HasSuffix(out, "(exit: <nil>)") || !jsonInto(strings.TrimSuffix(out, " (exit: <nil>)"), &got) {
			continue
		}
		succeeded++
		if holder == nil || got.WorkloadID != holder.WorkloadID || got.NodeID != holder.NodeID {
			t.Errorf("a caller was told it holds the volume: %+v; the servers' claim: %+v", got, holder)
		}
	}
	t.Logf("%d of %d callers were told they hold the volume", succeeded, len(claims))
	if succeeded > 1 {
		t.Errorf("%d callers were told they hold the single-writer volume", succeeded)
	}

	_, follower = c.leader(t)
	other := "w-late"
	r := cliAnyLeader(t, follower.rpc, "volume", "claim", "v1", "--node", "node-2", "--workload", other)
	if holder != nil {
		if r.code == 0 || !strings.Contains(r.stderr, "access-mode") {
			t.Fatalf("a second writer while %s holds the volume: exit %d, %s", holder.WorkloadID, r.code, r.stderr)
		}
		// A caller that saw an error learns the outcome by claiming again.
		var again claimDoc
		r = cliAnyLeader(t, follower.rpc, "volume", "claim", "v1", "--node", holder.NodeID, "--workload", holder.WorkloadID, "--json")
		if r.code != 0 || !jsonInto(r.stdout, &again) || !again.Mounted || again.HostPath != holder.HostPath {
			t.Fatalf("claiming again: %+v, want the finished claim %+v", again, *holder)
		}
		if r := cliAnyLeader(t, follower.rpc, "volume", "release", "v1", "--node", holder.NodeID, "--workload", holder.WorkloadID); r.code != 0 {
			t.Fatalf("release of %s: exit %d: %s", holder.WorkloadID, r.code, r.stderr)
		}
		node := c.plugins[c.nodeOf(*holder)]
		if left := node.NodeVolumes(); len(left) != 0 {
			t.Fatalf("%s's plugin still holds %+v after the release", holder.NodeID, left)
		}
		if left := mountsLeft(t, node); len(left) != 0 {
			t.Fatalf("still mounted on %s after the release: %v", holder.NodeID, left)
		}
		r = cliAnyLeader(t, follower.rpc, "volume", "claim", "v1", "--node", "node-2", "--workload", other)
	}
	if r.code != 0 {
		t.Fatalf("claim of %s once the volume is free: exit %d: %s", other, r.code, r.stderr)
	}
}

// cliAnyLeader runs the CLI like cli, again while it fails because the
// cluster has no leader: a server that comes back from SIGSTOP, or a
// loaded machine, can make the new leader step down once more, and the
// CLI says that such a call is safe to retry.
func cliAnyLeader(t *testing.T, addr string, args ...string) cliResult {
	t.Helper()
	var r cliResult
	testutil.WaitFor(t, 60*time.Second, "an answer from a cluster leader to "+strings.Join(args, " "), func() bool {
		r = cli(t, addr, args...)
		return r.code == 0 || !strings.Contains(r.stderr, "the cluster has no leader")
	})
	return r
}

// TestLeaderKilledMidClaim: the leader is SIGKILLed while a node
// publishes a claim it took, in the middle of 30 parallel claims.
func TestLeaderKilledMidClaim(t *testing.T) {
	leaderDiesMidClaim(t, func(t *testing.T, leader *recoveryServer) {
		leader.kill(t)
	})
}

// TestLeaderStoppedMidClaim: the leader is SIGSTOPped for 3 s while a
// node publishes a claim it took, in the middle of 30 parallel claims; it
// comes back to find another leader.
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
