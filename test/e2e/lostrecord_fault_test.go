//go:build fault

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// TestLostMountRecord claims a single-writer volume on node c1, stops
// c1's agent, deletes its mount records (as an operator moving a corrupt
// record aside does) and starts it again. The agent logs the lost
// record; the servers keep refusing a writer on c0 while c1's claim holds;
// releasing c1's claim unpublishes and unstages the claim's paths in c1's
// plugin; only then does the claim on c0 succeed.
func TestLostMountRecord(t *testing.T) {
	n := startClaimNode(t)
	c1 := n.addClient(t, "c1")
	testutil.WaitFor(t, 60*time.Second, "plugin tp with two nodes", func() bool {
		p, ok := tryPlugin(t, n.serverAddr, "tp")
		return ok && p.NodesHealthy == 2
	})
	var vol volumeDoc
	cliJSON(t, n.serverAddr, &vol, "volume", "create", "v1", "--plugin", "tp")
	var claim claimDoc
	cliJSON(t, n.serverAddr, &claim, "volume", "claim", "v1", "--node", "c1", "--workload", "w2")
	held := c1.node.NodeVolumes()[vol.ExternalID]
	if claim.HostPath == "" || claim.StagingPath == "" || held.StagingPath != claim.StagingPath ||
		len(held.Targets) != 1 || held.Targets[0] != claim.HostPath {
		t.Fatalf("claim on c1 = %+v, plugin holds %+v; want it staged and published at the claim's paths", claim, held)
	}
	wantMountPoints(t, c1.node, true, claim.HostPath, claim.StagingPath)

	if err := c1.client.stop(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if count := c1.mountRecords(t); count != 1 {
		t.Fatalf("c1 has %d mount records, want the claim's", count)
	}
	// The operator moves the record aside.
	records := filepath.Join(c1.clientData, "volume-mounts")
	entries, err := os.ReadDir(records)
	if err != nil {
		t.Fatal(err)
	}
	aside := testutil.TempDir(t)
	for _, e := range entries {
		if err := os.Rename(filepath.Join(records, e.Name()), filepath.Join(aside, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	c1.startClient(t)
	testutil.WaitFor(t, 60*time.Second, "c1 to log the lost record", func() bool {
		logs := c1.client.logs.String()
		return strings.Contains(logs, "volume mount record lost; the servers hold a claim for it") &&
			strings.Contains(logs, "host_path="+claim.HostPath)
	})
	var status struct {
		Mounts []struct {
			VolumeID string `json:"volume_id"`
			State    string `json:"state"`
			HostPath string `json:"host_path"`
		} `json:"mounts"`
	}
	cliJSON(t, c1.addr, &status, "status")
	if len(status.Mounts) != 1 || status.Mounts[0].State != "record-lost" || status.Mounts[0].HostPath != claim.HostPath {
		t.Errorf("c1's mounts = %+v, want the claim's mount record-lost at %s", status.Mounts, claim.HostPath)
	}

	res := cli(t, n.serverAddr, "volume", "claim", "v1", "--node", "c0", "--workload", "w1", "--json")
	if res.code == 0 || !strings.Contains(res.stderr, "claim refused (access-mode)") {
		t.Fatalf("claim on c0 while c1 holds the volume: exit %d, %q; want a refusal naming access-mode", res.code, res.stderr)
	}
	var afterRestart volumeDoc
	cliJSON(t, n.serverAddr, &afterRestart, "volume", "status", "v1")
	if len(afterRestart.Claims) != 1 || afterRestart.Claims[0].NodeID != claim.NodeID || afterRestart.Claims[0].State != "taken" {
		t.Fatalf("volume status after c1's restart: %+v, want c1's claim taken", afterRestart.Claims)
	}
	if vols := c1.node.NodeVolumes(); len(vols[vol.ExternalID].Targets) != 1 {
		t.Fatalf("c1's plugin after the restart: %+v, want the volume still published", vols)
	}
	wantMountPoints(t, c1.node, true, claim.HostPath, claim.StagingPath)

	from := len(c1.node.NodeLog())
	if res := cli(t, n.serverAddr, "volume", "release", "v1", "--node", "c1", "--workload", "w2"); res.code != 0 {
		t.Fatalf("release on c1: exit %d: %s", res.code, res.stderr)
	}
	want := []testplugin.NodeCall{
		{Method: "NodeUnpublishVolume", VolumeID: vol.ExternalID, Path: claim.HostPath},
		{Method: "NodeUnstageVolume", VolumeID: vol.ExternalID, Path: claim.StagingPath},
	}
	got := c1.node.NodeLog()[from:]
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("c1's plugin calls of the release: %+v, want %+v", got, want)
	}
	if vols := c1.node.NodeVolumes(); len(vols) != 0 {
		t.Fatalf("c1's plugin after the release: %+v, want nothing staged or published", vols)
	}
	if left := mountsLeft(t, c1.node); len(left) != 0 {
		t.Fatalf("still mounted on c1 after the release: %v", left)
	}
	testutil.WaitFor(t, 30*time.Second, "c1's mount records gone", func() bool { return c1.mountRecords(t) == 0 })

	var onC0 claimDoc
	cliJSON(t, n.serverAddr, &onC0, "volume", "claim", "v1", "--node", "c0", "--workload", "w1")
	if vols := n.node.NodeVolumes(); len(vols[vol.ExternalID].Targets) != 1 || vols[vol.ExternalID].Targets[0] != onC0.HostPath {
		t.Fatalf("c0's plugin after its claim: %+v, want the volume published at %s", vols, onC0.HostPath)
	}
}
