//go:build fault

package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// TestForcedReleaseOfAKilledNode kills a node's agent with SIGKILL and
// keeps it away far longer than the test (claim_gc_grace is an hour): an
// operator's `volume release --force` frees the claim through the
// controller alone, and the agent, when it does come back, unmounts what
// it had and keeps no mount record. While the agent answers, --force
// alone is refused.
func TestForcedReleaseOfAKilledNode(t *testing.T) {
	n := startClaimNodeWith(t, claimNodeOptions{grace: "1h"})
	vol, claim, staging := n.createAndClaim(t)

	res := cli(t, n.serverAddr, "volume", "release", "v1", "--node", "c0", "--force")
	if res.code == 0 || !strings.Contains(res.stderr, "--force twice") {
		t.Fatalf("--force on a node that answers: exit %d: %s%s; want a refusal naming --force twice", res.code, res.stdout, res.stderr)
	}
	if rec, _ := readPluginVolume(t, n.ctrlState, vol.ExternalID); len(rec.Published) != 1 {
		t.Fatalf("the refused force unpublished the volume: controller record %+v", rec)
	}

	n.killClient(t)
	testutil.WaitFor(t, 60*time.Second, "node c0 down", func() bool {
		var nd nodeDoc
		r := cli(t, n.serverAddr, "node", "status", claim.NodeID, "--json")
		return r.code == 0 && jsonInto(r.stdout, &nd) && nd.Status == "down"
	})
	var released volumeDoc
	cliJSON(t, n.serverAddr, &released, "volume", "release", "v1", "--node", "c0", "--force")
	if len(released.Claims) != 0 {
		t.Fatalf("claims after --force on the down node: %+v, want none", released.Claims)
	}
	if rec, _ := readPluginVolume(t, n.ctrlState, vol.ExternalID); len(rec.Published) != 0 {
		t.Fatalf("the controller still has the volume published to %v", rec.Published)
	}
	// Nobody could ask the node: its plugin still has the volume mounted,
	// and the agent's record of it stays on disk until the agent returns.
	if vols := n.node.NodeVolumes(); len(vols[vol.ExternalID].Targets) != 1 {
		t.Fatalf("node plugin while its agent is down: %+v, want the publication left", vols)
	}
	wantMountPoints(t, n.node, true, claim.HostPath, staging)
	if n.mountRecords(t) != 1 {
		t.Fatalf("agent c0's mount records while it is down = %d, want the claim's", n.mountRecords(t))
	}

	n.startClient(t)
	n.waitAllUndone(t, "v1", vol.ExternalID)
	if res := cli(t, n.serverAddr, "volume", "delete", "v1"); res.code != 0 {
		t.Fatalf("delete after the forced release: exit %d: %s", res.code, res.stderr)
	}
}
