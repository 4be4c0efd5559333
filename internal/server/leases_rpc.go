package server

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/leader"
	"github.com/csisupd/csisupd/internal/server/rules"
)

// maxRenewWorkloads caps the workloads of one renewal: every input is
// capped, and a node runs far fewer.
const maxRenewWorkloads = 10000

// RenewClaims renews, on the leader, the leases of the listed workloads'
// claims on a node (package leader's Leases.Renew). It writes nothing to
// raft.
func (c *controlService) RenewClaims(ctx context.Context, req *csisupdv1.RenewClaimsRequest) (*csisupdv1.RenewClaimsResponse, error) {
	if err := checkRenewRequest(req); err != nil {
		return nil, err
	}
	return route(ctx, c.s.fwd, false, false,
		func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.RenewClaimsResponse, error) {
			return cl.RenewClaims(ctx, req)
		},
		func() (*csisupdv1.RenewClaimsResponse, error) {
			if c.s.State().Node(req.GetNodeId()) == nil {
				return nil, status.Errorf(codes.NotFound, "renew claims: node %q not found", req.GetNodeId())
			}
			return renewClaims(c.s.leases, req)
		})
}

// NodeRenewClaims is RenewClaims for a node's agent: the caller must act
// as the node it renews for (its secret and credentials, as for
// NodeHeartbeat).
func (c *clusterService) NodeRenewClaims(ctx context.Context, req *csisupdv1.RenewClaimsRequest) (*csisupdv1.RenewClaimsResponse, error) {
	if err := checkRenewRequest(req); err != nil {
		return nil, err
	}
	fctx, conn, err := c.fwd.leaderConn(ctx)
	if err != nil {
		return nil, err
	}
	if conn != nil {
		return csisupdv1.NewClusterClient(conn).NodeRenewClaims(fctx, req)
	}
	if _, err := c.actAs(ctx, req.GetNodeId()); err != nil {
		return nil, err
	}
	return renewClaims(c.leases, req)
}

// checkRenewRequest checks what a renewal needs before it is routed, so
// that a follower refuses it too.
func checkRenewRequest(req *csisupdv1.RenewClaimsRequest) error {
	switch n := len(req.GetWorkloadIds()); {
	case req.GetNodeId() == "":
		return status.Error(codes.InvalidArgument, "renew claims: node_id is required")
	case n == 0:
		return status.Error(codes.InvalidArgument, "renew claims: workload_ids is empty: name the workloads whose claims to renew")
	case n > maxRenewWorkloads:
		return status.Errorf(codes.InvalidArgument, "renew claims: %d workload_ids, over the %d one call may renew", n, maxRenewWorkloads)
	}
	for _, w := range req.GetWorkloadIds() {
		if w == "" {
			return status.Error(codes.InvalidArgument, "renew claims: an empty workload id in workload_ids")
		}
	}
	return nil
}

// renewClaims renews the leases of req in the leader's table and answers
// with the leases renewed and the workloads lost.
func renewClaims(leases *leader.Leases, req *csisupdv1.RenewClaimsRequest) (*csisupdv1.RenewClaimsResponse, error) {
	renewed, lost, err := leases.Renew(req.GetNodeId(), req.GetWorkloadIds())
	if errors.Is(err, leader.ErrNotLeading) {
		return nil, csisupdv1.NewNoLeaderError("", "leadership lost during the renewal")
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "renew claims: %v", err)
	}
	resp := &csisupdv1.RenewClaimsResponse{Renewed: make([]*csisupdv1.RenewedClaim, 0, len(renewed)), LostWorkloadIds: lost}
	for _, r := range renewed {
		resp.Renewed = append(resp.Renewed, &csisupdv1.RenewedClaim{
			VolumeId: r.Ref.VolumeID, WorkloadId: r.Ref.WorkloadID,
			LeaseTtl: durationpb.New(r.TTL), Deadline: timestamppb.New(r.Deadline),
		})
	}
	return resp, nil
}

// withLeaseTimes sets, on the leased claims of the volumes this server
// answers with, when their lease was last renewed and when it expires,
// from the leader's lease table. On a server that does not lead (a stale
// read on a follower) they stay unset: the table is the leader's alone.
func withLeaseTimes(leases *leader.Leases, volumes ...*csisupdv1.Volume) {
	for _, v := range volumes {
		for _, c := range v.GetClaims() {
			withClaimLeaseTimes(leases, v.GetId(), c)
		}
	}
}

// withClaimLeaseTimes is withLeaseTimes for one claim of volume volumeID.
func withClaimLeaseTimes(leases *leader.Leases, volumeID string, c *csisupdv1.VolumeClaim) {
	if c.GetLeaseTtl() == nil {
		return
	}
	ref := rules.Ref{VolumeID: volumeID, NodeID: c.GetNodeId(), WorkloadID: c.GetWorkloadId()}
	if renewed, deadline, ok := leases.Times(ref, c.GetClaimIndex()); ok {
		c.LeaseRenewedAt, c.LeaseDeadline = timestamppb.New(renewed), timestamppb.New(deadline)
	}
}
