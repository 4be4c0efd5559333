package rpc

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/ids"
)

// The lease a local claim may carry: the bounds within which the servers
// admit a claim's lease_ttl.
const (
	minLocalLease = 5 * time.Second
	maxLocalLease = 24 * time.Hour
)

// LocalClaims claims volumes for workloads that run on this node through
// the servers, and holds their leases: the agent's nodeclient.LocalClaims.
type LocalClaims interface {
	// Claim claims volumeID for workloadID on this node with owner and
	// lease, then holds the lease; claiming an existing claim again
	// returns it. Its errors may be or wrap gRPC statuses, which are
	// passed on.
	Claim(ctx context.Context, volumeID, workloadID, owner string, lease time.Duration, usage *csisupdv1.VolumeUsage) (*csisupdv1.VolumeClaimResponse, error)
	// Release releases volumeID's claim of workloadID on this node and
	// stops holding its lease; a claim that does not exist is released.
	Release(ctx context.Context, volumeID, workloadID string) error
}

// errNoLocalClaims answers the local claim methods of an agent that
// reports to no servers.
var errNoLocalClaims = status.Error(codes.FailedPrecondition, "this agent reports to no servers: it claims no volumes (client.servers)")

// ClaimVolume claims a volume for a workload on this node through the
// servers, with an owner and a lease the agent holds
// (AgentServiceConfig.LocalClaims).
func (a *AgentService) ClaimVolume(ctx context.Context, req *csisupdv1.LocalClaimRequest) (*csisupdv1.LocalClaimResponse, error) {
	if a.cfg.LocalClaims == nil {
		return nil, errNoLocalClaims
	}
	lease, err := checkLocalClaim(req)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	resp, err := a.cfg.LocalClaims.Claim(ctx, req.GetVolumeId(), req.GetWorkloadId(), req.GetOwner(), lease, req.GetUsage())
	if err != nil {
		return nil, leaseError(err)
	}
	return &csisupdv1.LocalClaimResponse{Volume: resp.GetVolume(), Claim: resp.GetClaim()}, nil
}

// ReleaseVolume releases a claim ClaimVolume took and stops holding its
// lease.
func (a *AgentService) ReleaseVolume(ctx context.Context, req *csisupdv1.LocalReleaseRequest) (*csisupdv1.LocalReleaseResponse, error) {
	if a.cfg.LocalClaims == nil {
		return nil, errNoLocalClaims
	}
	if err := checkLocalIDs("release volume", req.GetVolumeId(), req.GetWorkloadId()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := a.cfg.LocalClaims.Release(ctx, req.GetVolumeId(), req.GetWorkloadId()); err != nil {
		return nil, leaseError(err)
	}
	return &csisupdv1.LocalReleaseResponse{}, nil
}

// checkLocalClaim checks a LocalClaimRequest's ids, owner and lease, and
// returns the lease. Its errors name the field.
func checkLocalClaim(req *csisupdv1.LocalClaimRequest) (time.Duration, error) {
	if err := checkLocalIDs("claim volume", req.GetVolumeId(), req.GetWorkloadId()); err != nil {
		return 0, err
	}
	if !ids.ValidPluginID(req.GetOwner()) {
		return 0, fmt.Errorf("claim volume: owner %q must match %s (docker, systemd, ...)", req.GetOwner(), ids.PluginIDPattern)
	}
	if req.GetLease() == nil {
		return 0, fmt.Errorf("claim volume: lease is required: %s to %s", minLocalLease, maxLocalLease)
	}
	if err := req.GetLease().CheckValid(); err != nil {
		return 0, fmt.Errorf("claim volume: lease: %w", err)
	}
	lease := req.GetLease().AsDuration()
	if lease < minLocalLease || lease > maxLocalLease {
		return 0, fmt.Errorf("claim volume: lease %s is out of range: give %s to %s", lease, minLocalLease, maxLocalLease)
	}
	return lease, nil
}

// checkLocalIDs checks the volume and workload ids of a local claim: the
// agent names directories after them, and a release without a workload
// would release every claim of the volume on the node.
func checkLocalIDs(op, volumeID, workloadID string) error {
	switch {
	case !ids.ValidPathID(volumeID):
		return fmt.Errorf("%s: volume_id %q must not be . or .. and must match %s", op, volumeID, ids.PluginIDPattern)
	case !ids.ValidPathID(workloadID):
		return fmt.Errorf("%s: workload_id %q must not be . or .. and must match %s", op, workloadID, ids.PluginIDPattern)
	}
	return nil
}
