package rpc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/registry"
)

// localCall is one call recordedClaims received.
type localCall struct {
	method, volume, workload, owner string
	lease                           time.Duration
	usage                           *csisupdv1.VolumeUsage
}

// recordedClaims is a LocalClaims that records each call and answers
// err, or else a taken claim of the request. It checks how the Agent
// service checks requests and passes answers and errors on; the agent's
// real LocalClaims (package nodeclient) is tested against real servers
// there, and through the Agent API by the CLI's tests.
type recordedClaims struct {
	mu    sync.Mutex
	calls []localCall
	err   error
}

func (r *recordedClaims) record(c localCall) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, c)
	return r.err
}

func (r *recordedClaims) Claim(_ context.Context, volumeID, workloadID, owner string, lease time.Duration, usage *csisupdv1.VolumeUsage) (*csisupdv1.VolumeClaimResponse, error) {
	if err := r.record(localCall{"claim", volumeID, workloadID, owner, lease, usage}); err != nil {
		return nil, err
	}
	return &csisupdv1.VolumeClaimResponse{
		Volume: &csisupdv1.Volume{Id: volumeID},
		Claim: &csisupdv1.VolumeClaim{WorkloadId: workloadID, Owner: owner, State: "taken", HostPath: "/mnt/" + volumeID + "/" + workloadID,
			LeaseTtl: durationpb.New(lease), Usage: usage},
	}, nil
}

func (r *recordedClaims) Release(_ context.Context, volumeID, workloadID string) error {
	return r.record(localCall{method: "release", volume: volumeID, workload: workloadID})
}

func (r *recordedClaims) recorded() []localCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]localCall(nil), r.calls...)
}

// claimsAgent serves an Agent service with lc (none when nil) over real
// gRPC and returns a client of it.
func claimsAgent(t *testing.T, lc LocalClaims) csisupdv1.AgentClient {
	t.Helper()
	reg := registry.New(registry.Config{})
	svc := newAgentService(t, AgentServiceConfig{Plugins: reg.Source(), Events: reg.EventLog(), LocalClaims: lc})
	return dialAgent(t, serveAgent(t, svc, "tcp"))
}

// TestLocalClaimsNeedServers: an agent without LocalClaims refuses both
// methods with FailedPrecondition, saying it reports to no servers.
func TestLocalClaimsNeedServers(t *testing.T) {
	cl := claimsAgent(t, nil)
	ctx := context.Background()
	_, err := cl.ClaimVolume(ctx, &csisupdv1.LocalClaimRequest{VolumeId: "v", WorkloadId: "w", Owner: "systemd", Lease: durationpb.New(time.Minute)})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "reports to no servers") {
		t.Errorf("ClaimVolume without servers: %v, want FailedPrecondition", err)
	}
	_, err = cl.ReleaseVolume(ctx, &csisupdv1.LocalReleaseRequest{VolumeId: "v", WorkloadId: "w"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "reports to no servers") {
		t.Errorf("ReleaseVolume without servers: %v, want FailedPrecondition", err)
	}
}

// TestLocalClaimRequestsAreChecked refuses requests the servers could
// not admit, with InvalidArgument naming the field, before LocalClaims
// is called.
func TestLocalClaimRequestsAreChecked(t *testing.T) {
	lc := &recordedClaims{}
	cl := claimsAgent(t, lc)
	valid := func() *csisupdv1.LocalClaimRequest {
		return &csisupdv1.LocalClaimRequest{VolumeId: "v", WorkloadId: "w", Owner: "systemd", Lease: durationpb.New(time.Minute)}
	}
	tests := []struct {
		name   string
		change func(r *csisupdv1.LocalClaimRequest)
		want   string
	}{
		{"no volume", func(r *csisupdv1.LocalClaimRequest) { r.VolumeId = "" }, "volume_id"},
		{"volume with a slash", func(r *csisupdv1.LocalClaimRequest) { r.VolumeId = "a/b" }, "volume_id"},
		{"no workload", func(r *csisupdv1.LocalClaimRequest) { r.WorkloadId = "" }, "workload_id"},
		{"dot-dot workload", func(r *csisupdv1.LocalClaimRequest) { r.WorkloadId = ".." }, "workload_id"},
		{"no owner", func(r *csisupdv1.LocalClaimRequest) { r.Owner = "" }, "owner"},
		{"owner with a space", func(r *csisupdv1.LocalClaimRequest) { r.Owner = "my owner" }, "owner"},
		{"no lease", func(r *csisupdv1.LocalClaimRequest) { r.Lease = nil }, "lease is required"},
		{"short lease", func(r *csisupdv1.LocalClaimRequest) { r.Lease = durationpb.New(4 * time.Second) }, "lease 4s is out of range"},
		{"long lease", func(r *csisupdv1.LocalClaimRequest) { r.Lease = durationpb.New(25 * time.Hour) }, "lease 25h0m0s is out of range"},
		{"invalid lease", func(r *csisupdv1.LocalClaimRequest) { r.Lease = &durationpb.Duration{Seconds: 10, Nanos: -1} }, "lease"},
	}
	ctx := context.Background()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := valid()
			tt.change(req)
			_, err := cl.ClaimVolume(ctx, req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ClaimVolume: %v, want InvalidArgument naming %q", err, tt.want)
			}
		})
	}
	for _, req := range []*csisupdv1.LocalReleaseRequest{{VolumeId: "v"}, {WorkloadId: "w"}, {VolumeId: ".", WorkloadId: "w"}} {
		if _, err := cl.ReleaseVolume(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("ReleaseVolume(%v): %v, want InvalidArgument", req, err)
		}
	}
	if calls := lc.recorded(); len(calls) != 0 {
		t.Fatalf("refused requests reached LocalClaims: %+v", calls)
	}
}

// TestLocalClaimsPassOn passes a request's fields to LocalClaims and its
// answer back; a gRPC status LocalClaims returns, wrapped or not, keeps
// its code over the wire, and any other error is Internal.
func TestLocalClaimsPassOn(t *testing.T) {
	lc := &recordedClaims{}
	cl := claimsAgent(t, lc)
	ctx := context.Background()
	usage := &csisupdv1.VolumeUsage{AccessMode: "SINGLE_NODE_WRITER", AccessType: "mount", ReadOnly: true}
	resp, err := cl.ClaimVolume(ctx, &csisupdv1.LocalClaimRequest{VolumeId: "data", WorkloadId: "systemd-data", Owner: "systemd",
		Lease: durationpb.New(30 * time.Second), Usage: usage})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetVolume().GetId() != "data" || resp.GetClaim().GetHostPath() != "/mnt/data/systemd-data" || resp.GetClaim().GetState() != "taken" {
		t.Fatalf("ClaimVolume answered %v", resp)
	}
	if _, err := cl.ReleaseVolume(ctx, &csisupdv1.LocalReleaseRequest{VolumeId: "data", WorkloadId: "systemd-data"}); err != nil {
		t.Fatal(err)
	}
	calls := lc.recorded()
	if len(calls) != 2 {
		t.Fatalf("calls: %+v, want a claim and a release", calls)
	}
	if c := calls[0]; c.method != "claim" || c.volume != "data" || c.workload != "systemd-data" || c.owner != "systemd" ||
		c.lease != 30*time.Second || !proto.Equal(c.usage, usage) {
		t.Errorf("claim call %+v, want the request's fields", c)
	}
	if c := calls[1]; c.method != "release" || c.volume != "data" || c.workload != "systemd-data" {
		t.Errorf("release call %+v, want the request's fields", c)
	}

	tests := []struct {
		err  error
		want codes.Code
	}{
		{status.Error(codes.NotFound, `volume "data" not found`), codes.NotFound},
		{fmt.Errorf("claim volume data on 127.0.0.1:4780: %w", status.Error(codes.FailedPrecondition, "refused")), codes.FailedPrecondition},
		{errors.New("lease file: disk full"), codes.Internal},
	}
	for _, tt := range tests {
		lc.mu.Lock()
		lc.err = tt.err
		lc.mu.Unlock()
		_, err := cl.ClaimVolume(ctx, &csisupdv1.LocalClaimRequest{VolumeId: "data", WorkloadId: "w", Owner: "docker", Lease: durationpb.New(time.Minute)})
		if status.Code(err) != tt.want || !strings.Contains(err.Error(), tt.err.Error()) {
			t.Errorf("ClaimVolume failing with %q: %v, want %s with the message", tt.err, err, tt.want)
		}
		_, err = cl.ReleaseVolume(ctx, &csisupdv1.LocalReleaseRequest{VolumeId: "data", WorkloadId: "w"})
		if status.Code(err) != tt.want || !strings.Contains(err.Error(), tt.err.Error()) {
			t.Errorf("ReleaseVolume failing with %q: %v, want %s with the message", tt.err, err, tt.want)
		}
	}
}
