//go:build fault

package e2e

import (
	"testing"
)

// TestPodmanAgentKilledWhileContainerRuns kills the client agent with
// SIGKILL while a podman container has its volume mounted, and starts it
// again: the claim is kept, and podman's Unmount when the container stops,
// which reaches the restarted agent, releases it; nothing is left mounted,
// and Mount works again for the next container.
func TestPodmanAgentKilledWhileContainerRuns(t *testing.T) {
	n, rec, conf := startPodman(t, claimNodeOptions{})
	host := newPodmanHost(t, conf)
	host.importBusybox(t)
	host.must(t, "volume", "create", "--driver", podmanDriver, "-o", "plugin=tp", "v1")

	writer := host.start(t, "v1", "echo hi > /data/f; exec sleep 600")
	claim := waitContainerClaim(t, n.serverAddr, n.clientAgent, "v1", rec.mountID(t, "v1"))
	wantMountPoints(t, n.node, true, claim.HostPath)

	n.killClient(t)
	n.startClient(t)
	waitPluginSocket(t, n.clientAgent)
	if v, _ := volumeState(t, n.serverAddr, "v1"); len(v.Claims) != 1 || v.Claims[0].WorkloadID != claim.WorkloadID || v.Claims[0].State != "taken" {
		t.Fatalf("claims of v1 after the agent's restart: %+v, want %s's kept", v.Claims, claim.WorkloadID)
	}
	wantMountPoints(t, n.node, true, claim.HostPath)

	unmounts := rec.count("/VolumeDriver.Unmount")
	host.must(t, "stop", "--time", "0", writer)
	if got := rec.count("/VolumeDriver.Unmount"); got != unmounts+1 {
		t.Fatalf("podman called Unmount %d times on stop, want once:\n%s", got-unmounts, rec)
	}
	if c := rec.last(t, "/VolumeDriver.Unmount", "v1"); c.Status != 200 {
		t.Fatalf("the restarted agent answered podman's Unmount with %d %s", c.Status, c.Answer)
	}
	waitNoClaims(t, n.serverAddr, "v1", "after the container stopped")
	if left := mountsLeft(t, n.node); len(left) != 0 {
		t.Fatalf("still mounted after the release: %q", left)
	}

	// Mount keeps working on the restarted agent.
	out := host.must(t, "run", "--rm", "--network=none", "--volume", "v1:/data", host.image, "cat", "/data/f")
	if out != "hi" {
		t.Fatalf("the next container read %q from the volume, want hi", out)
	}
	waitNoClaims(t, n.serverAddr, "v1", "after the next container")
	if left := mountsLeft(t, n.node); len(left) != 0 {
		t.Fatalf("still mounted after the next container: %q", left)
	}
}
