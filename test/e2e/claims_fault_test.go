//go:build fault

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/nodevolumes"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

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
	n, err := nodevolumes.CountRecords(c.clientData)
	if err != nil {
		t.Fatal(err)
	}
	return n
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
