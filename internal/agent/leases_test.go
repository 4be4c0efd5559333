package agent

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/nodeclient"
	"github.com/csisupd/csisupd/internal/testutil"
)

// agentClient returns an Agent API client of a.
func agentClient(t *testing.T, a *Agent) csisupdv1.AgentClient {
	t.Helper()
	return csisupdv1.NewAgentClient(testutil.DialGRPC(t, a.RPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials())))
}

// TestHeldLeasesOutliveAGracefulStop holds leases through the Agent API
// of an agent with servers to report to (none answers here): a graceful
// stop keeps them in data_dir, and the next agent on it holds them again,
// without the dropped one.
func TestHeldLeasesOutliveAGracefulStop(t *testing.T) {
	cfg := testConfig(t)
	cfg.Client.Servers = []string{testutil.FreeAddr(t)}
	a, err := New(Config{Config: cfg, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	stop := runAgent(t, a)
	cl := agentClient(t, a)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, w := range []string{"w1", "w2"} {
		if _, err := cl.HoldLease(ctx, &csisupdv1.HoldLeaseRequest{VolumeId: "vol", WorkloadId: w, Lease: durationpb.New(30 * time.Second)}); err != nil {
			t.Fatalf("HoldLease %s: %v", w, err)
		}
	}
	if _, err := cl.DropLease(ctx, &csisupdv1.DropLeaseRequest{WorkloadId: "w2"}); err != nil {
		t.Fatalf("DropLease: %v", err)
	}
	_, err = cl.HoldLease(ctx, &csisupdv1.HoldLeaseRequest{VolumeId: "vol", WorkloadId: "w3", Lease: durationpb.New(time.Second)})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("HoldLease of a 1 s lease: %v, want InvalidArgument", err)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}

	again, err := New(Config{Config: cfg, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	want := []nodeclient.Hold{{VolumeID: "vol", WorkloadID: "w1", Lease: 30 * time.Second}}
	if got := again.leases.Held(); !slices.Equal(got, want) {
		t.Errorf("the restarted agent holds %v, want %v", got, want)
	}
}

// TestLeasesNeedServers calls HoldLease on an agent that reports to no
// servers: FailedPrecondition.
func TestLeasesNeedServers(t *testing.T) {
	a, err := New(Config{Config: testConfig(t), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, a)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = agentClient(t, a).HoldLease(ctx, &csisupdv1.HoldLeaseRequest{VolumeId: "vol", WorkloadId: "w", Lease: durationpb.New(30 * time.Second)})
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("HoldLease without servers: %v, want FailedPrecondition", err)
	}
}
