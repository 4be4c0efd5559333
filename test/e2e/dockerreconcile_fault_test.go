//go:build fault

package e2e

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// TestDockerReconcileWithTheEngine gives the client agent dockerd's API
// socket (docker.engine_socket), reconciling every two seconds: the claim
// of a running container's mount, whose workload is Docker's mount id and
// no container's, survives the reconciles; a container killed while the
// agent is down is released by the reconcile when the agent is back
// (dockerd, failing to get the volume from the plugin then, never calls
// Unmount), and nothing stays mounted. The lease and the claim GC grace
// are ten minutes, so that nothing else releases the claim meanwhile.
func TestDockerReconcileWithTheEngine(t *testing.T) {
	requireEngine(t, "docker", "dockerd", "docker", "containerd", "runc")
	const reconcile = 2 * time.Second
	agentSocket := filepath.Join(testutil.TempDir(t), "csisupd.sock")
	rec := recordPlugin(t, agentSocket)
	d := startDocker(t, rec.socket)
	n := startClaimNodeWith(t, claimNodeOptions{grace: "10m", docker: &dockerOptions{
		socket: agentSocket, engineSocket: d.socket, reconcileInterval: reconcile.String(), lease: "10m",
	}})
	waitPluginSocket(t, n.clientAgent)
	d.must(t, "volume", "create", "--driver", d.driver, "--opt", "plugin=tp", "v1")

	ctr := d.start(t, "v1", "exec sleep 600")
	claim := waitContainerClaim(t, n.serverAddr, n.clientAgent, "v1", d.mountID(t, ctr, "v1"))
	testutil.HoldsFor(t, 3*reconcile, "the running container's claim across reconciles", func() bool {
		v, _ := volumeState(t, n.serverAddr, "v1")
		return len(v.Claims) == 1 && v.Claims[0].WorkloadID == claim.WorkloadID && v.Claims[0].State == "taken"
	})

	n.killClient(t)
	d.must(t, "kill", ctr)
	testutil.WaitFor(t, claimWait, "the killed container exited", func() bool {
		return d.must(t, "inspect", "--format", "{{.State.Status}}", ctr) == "exited"
	})
	if v, _ := volumeState(t, n.serverAddr, "v1"); len(v.Claims) != 1 || v.Claims[0].State != "taken" {
		t.Fatalf("claims of v1 while the agent is down: %+v, want the killed container's kept", v.Claims)
	}
	n.startClient(t)
	waitNoClaims(t, n.serverAddr, "v1", "after the restarted agent's reconcile")
	wantMountPoints(t, n.node, false, claim.HostPath)
	if left := mountsLeft(t, n.node); len(left) != 0 {
		t.Fatalf("still mounted after the reconcile: %q", left)
	}
}
