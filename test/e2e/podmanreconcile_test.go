package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// TestPodmanReconcileKeepsRunningContainers gives the client agent the
// API socket of podman's service (docker.engine_socket), reconciling
// every two seconds: the claim of a running container, whose workload is
// podman's pseudo container id and no container's, survives the
// reconciles, and the container's stop releases it. A claim of owner
// docker on the node that no container accounts for is released by the
// reconcile meanwhile: the reconcile runs, and keeps only what it must.
func TestPodmanReconcileKeepsRunningContainers(t *testing.T) {
	requireEngine(t, "podman", "podman", "runc", "conmon")
	const reconcile = 2 * time.Second
	agentSocket := filepath.Join(testutil.TempDir(t), "csisupd.sock")
	rec := recordPlugin(t, agentSocket)
	host := newPodmanHost(t, podmanConf(t, rec.socket))
	api := host.serveAPI(t)
	n := startClaimNodeWith(t, claimNodeOptions{docker: &dockerOptions{
		socket: agentSocket, engineSocket: api, reconcileInterval: reconcile.String(),
	}})
	waitPluginSocket(t, n.clientAgent)
	host.importBusybox(t)
	host.must(t, "volume", "create", "--driver", podmanDriver, "-o", "plugin=tp", "v1")

	ctr := host.start(t, "v1", "exec sleep 600")
	claim := waitContainerClaim(t, n.serverAddr, n.clientAgent, "v1", rec.mountID(t, "v1"))
	host.must(t, "volume", "create", "--driver", podmanDriver, "-o", "plugin=tp", "v2")
	stale := "docker-" + strings.Repeat("0", 64)
	cliJSON(t, n.serverAddr, &claimDoc{}, "volume", "claim", "v2", "--node", n.name, "--workload", stale, "--owner", "docker")
	waitNoClaims(t, n.serverAddr, "v2", "of "+stale+", which no container accounts for")
	testutil.HoldsFor(t, 3*reconcile, "the running container's claim across reconciles", func() bool {
		v, _ := volumeState(t, n.serverAddr, "v1")
		return len(v.Claims) == 1 && v.Claims[0].WorkloadID == claim.WorkloadID && v.Claims[0].State == "taken"
	})
	host.must(t, "stop", "--time", "0", ctr)
	waitNoClaims(t, n.serverAddr, "v1", "after the container stopped")
	wantMountPoints(t, n.node, false, claim.HostPath)
}
