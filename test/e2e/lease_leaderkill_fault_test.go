//go:build fault

package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// TestLeasedClaimSurvivesLeaderKill claims a volume with a 5 s lease and
// renews it every 2 s for 20 s through a follower, SIGKILLing the leader
// during the renewals: the claim stays taken throughout, since a new
// leader gives every lease a full TTL from when it took over.
func TestLeasedClaimSurvivesLeaderKill(t *testing.T) {
	c := startLeaderKillCluster(t)
	leader, follower := c.leader(t)
	var vol volumeDoc
	cliJSON(t, follower.rpc, &vol, "volume", "create", "v1", "--plugin", "tp")
	var claim claimDoc
	cliJSON(t, follower.rpc, &claim, "volume", "claim", "v1", "--node", "node-1", "--workload", "w1", "--lease", "5s")

	// The renewals are paced as a holder paces them; the ticker is the
	// subject of the test, not a synchronisation.
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for i := range 10 {
		if i == 3 {
			leader.kill(t)
			t.Logf("leader %s killed", leader.name)
		}
		// During the election a renewal may find no leader: the holder
		// tries again, within its lease.
		testutil.WaitFor(t, 4*time.Second, "a renewal of w1", func() bool {
			r := cli(t, follower.rpc, "volume", "renew", "--node", "node-1", "--workload", "w1")
			if strings.Contains(r.stderr, "lost their claims") {
				t.Fatalf("renewal %d: w1 lost its claim: %s%s", i, r.stdout, r.stderr)
			}
			return r.code == 0
		})
		var v volumeDoc
		r := cli(t, follower.rpc, "volume", "status", "v1", "--json")
		if r.code != 0 || !jsonInto(r.stdout, &v) {
			t.Fatalf("volume status after renewal %d: exit %d: %s", i, r.code, r.stderr)
		}
		if len(v.Claims) != 1 || v.Claims[0].WorkloadID != "w1" || v.Claims[0].State != "taken" {
			t.Fatalf("after renewal %d: claims %+v, want w1's claim taken", i, v.Claims)
		}
		<-tick.C
	}
}
