//go:build fault

package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// TestClusterLeaderLoss kills the leader between volume operations: the CLI
// keeps working through a surviving server once a new leader is elected and
// the nodes have heartbeated to it,
// the volume and its claim survive, and a restarted agent's node comes
// back ready with its plugin healthy.
func TestClusterLeaderLoss(t *testing.T) {
	c, plugins := clusterWithPlugins(t)
	addr := followerAddr(t, c)
	var vol volumeDoc
	cliJSON(t, addr, &vol, "volume", "create", "v1", "--plugin", "tp")
	var claim claimDoc
	cliJSON(t, addr, &claim, "volume", "claim", "v1", "--node", c.Agent(1).Name, "--workload", "w1")

	old := c.WaitForLeader(t, 30*time.Second)
	c.Kill(old.Index)
	next := c.WaitForLeader(t, 60*time.Second)
	if next.ID == old.ID {
		t.Fatalf("leader %s still leads after being killed", old.ID)
	}
	var got volumeDoc
	cliJSON(t, next.RPCAddr, &got, "volume", "status", "v1")
	if got.ExternalID != vol.ExternalID || len(got.Claims) != 1 || got.Claims[0].CSINodeID != "csi-node-1" {
		t.Fatalf("volume after leader loss: %+v", got)
	}
	// The killed server's address fails clearly.
	res := cli(t, old.RPCAddr, "plugin", "status")
	if res.code != 1 || !strings.Contains(res.stderr, "cannot reach the agent at "+old.RPCAddr) {
		t.Fatalf("CLI against a killed server: exit %d, %q", res.code, res.stderr)
	}

	// Until the nodes heartbeat to the new leader (or answer one of its
	// calls) they are initializing and their plugins' instances do not
	// count as healthy.
	testutil.WaitFor(t, 60*time.Second, "both nodes heard by the new leader", func() bool {
		p, ok := tryPlugin(t, next.RPCAddr, "tp")
		return ok && p.NodesHealthy == 2 && p.ControllersHealthy == 2
	})
	if r := cli(t, next.RPCAddr, "volume", "release", "v1", "--node", c.Agent(1).NodeID(), "--workload", "w1"); r.code != 0 {
		t.Fatalf("release after leader loss: exit %d: %s", r.code, r.stderr)
	}
	if left := plugins[1].NodeVolumes(); len(left) != 0 {
		t.Fatalf("agent-1's plugin still has %+v after the release", left)
	}
	if r := cli(t, next.RPCAddr, "volume", "delete", "v1"); r.code != 0 {
		t.Fatalf("delete after leader loss: exit %d: %s", r.code, r.stderr)
	}
	if n := calls(plugins, "DeleteVolume"); n != 1 {
		t.Fatalf("plugins saw %d DeleteVolume calls, want 1", n)
	}

	// An agent stopped and restarted registers the same node again.
	c.Restart(old.Index)
	id := c.Agent(0).NodeID()
	c.StopAgent(0)
	testutil.WaitFor(t, 60*time.Second, "agent-0's node down", func() bool {
		var n nodeDoc
		r := cli(t, next.RPCAddr, "node", "status", id, "--json")
		return r.code == 0 && jsonInto(r.stdout, &n) && n.Status == "down"
	})
	c.RestartAgent(0)
	testutil.WaitFor(t, 60*time.Second, "agent-0's node ready with a healthy plugin", func() bool {
		p, ok := tryPlugin(t, next.RPCAddr, "tp")
		return ok && p.NodesHealthy == 2 && p.ControllersHealthy == 2 && p.NodesExpected == 2
	})
}
