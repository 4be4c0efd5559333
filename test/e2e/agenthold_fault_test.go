//go:build fault

package e2e

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testutil"
)

// agentLease is the lease of the claim TestLeaseHeldByAnAgent holds: the
// agent renews it every third of it, so that a graceful restart of the
// agent, which takes a few seconds, leaves it more than half its time.
const agentLease = 10 * time.Second

// dialInsecure returns a plain-text gRPC connection to addr, closed when
// the test ends.
func dialInsecure(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	return testutil.DialGRPC(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// TestLeaseHeldByAnAgent claims a volume for workload w1 on client c0
// with a 10 s lease that only c0's agent renews, through its Agent API's
// HoldLease (as the Docker integration does). The claim stays taken for
// three and a half leases, across a graceful restart of the agent, which
// renews it again from its data_dir. Once the agent is killed and not restarted,
// nothing renews the lease: it expires, the claim releases with
// release_reason lease_expired, and is freed.
func TestLeaseHeldByAnAgent(t *testing.T) {
	n := startClaimNode(t)
	control := csisupdv1.NewControlClient(dialInsecure(t, n.serverAddr))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	nodeID := nodeIDOf(t, ctx, control, "c0")
	var vol volumeDoc
	cliJSON(t, n.serverAddr, &vol, "volume", "create", "v1", "--plugin", "tp")
	if _, err := control.ClaimVolume(ctx, &csisupdv1.VolumeClaimRequest{
		Id: "v1", NodeId: nodeID, WorkloadId: "w1", LeaseTtl: durationpb.New(agentLease),
		Usage: &csisupdv1.VolumeUsage{AccessType: "mount"},
	}); err != nil {
		t.Fatalf("claim v1 with a %v lease: %v", agentLease, err)
	}
	hold := func() {
		t.Helper()
		agent := csisupdv1.NewAgentClient(dialInsecure(t, n.clientAgent.addr))
		if _, err := agent.HoldLease(ctx, &csisupdv1.HoldLeaseRequest{VolumeId: "v1", WorkloadId: "w1", Lease: durationpb.New(agentLease)}); err != nil {
			t.Fatalf("HoldLease on c0: %v", err)
		}
	}
	hold()
	claim := func() *csisupdv1.VolumeClaim {
		resp, err := control.GetVolume(ctx, &csisupdv1.VolumeGetRequest{Id: "v1"})
		if err != nil {
			t.Fatalf("get volume v1: %v", err)
		}
		for _, c := range resp.GetVolume().GetClaims() {
			if c.GetWorkloadId() == "w1" {
				return c
			}
		}
		return nil
	}
	taken := func() bool { c := claim(); return c != nil && c.GetState() == "taken" && c.GetReleaseReason() == "" }
	testutil.HoldsFor(t, 3*agentLease/2, "the claim held by c0's renewals", taken)

	// A graceful stop keeps the hold in data_dir; the agent renews it
	// again as soon as it starts.
	if err := n.clientAgent.client.stop(10 * time.Second); err != nil {
		t.Fatalf("graceful stop of c0: %v", err)
	}
	n.clientAgent.startClient(t)
	testutil.HoldsFor(t, 2*agentLease, "the claim held by the restarted c0's renewals", taken)

	// Killed and not restarted: nobody renews, and the lease expires.
	n.clientAgent.killClient(t)
	killed := time.Now()
	testutil.WaitFor(t, 3*agentLease, "the claim releasing with release_reason lease_expired", func() bool {
		c := claim()
		return c != nil && c.GetReleaseReason() == "lease_expired"
	})
	t.Logf("the lease expired %v after the agent was killed", time.Since(killed).Round(time.Millisecond))
	testutil.WaitFor(t, 2*time.Minute, "the expired claim freed", func() bool { return claim() == nil })
}

// nodeIDOf returns the id of the node named name.
func nodeIDOf(t *testing.T, ctx context.Context, control csisupdv1.ControlClient, name string) string {
	t.Helper()
	resp, err := control.ListNodes(ctx, &csisupdv1.NodeListRequest{})
	if err != nil {
		t.Fatalf("list nodes: %v", err)
	}
	for _, node := range resp.GetNodes() {
		if node.GetName() == name {
			return node.GetId()
		}
	}
	t.Fatalf("no node named %s among %d", name, len(resp.GetNodes()))
	return ""
}
