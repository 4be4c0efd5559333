package nodeclient

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/ids"
)

// writeTimeout bounds one Control call that makes the servers call a
// plugin (a claim, a release, a create, a delete): the servers bound
// their plugin calls by client.rpc_timeout, whose default this is.
const writeTimeout = config.DefaultRPCTimeout

// maxListedVolumes caps what ListVolumes gathers over its pages, so that
// a cluster of any size cannot make the agent hold more in one answer.
const maxListedVolumes = 100_000

// listPageSize is the page ListVolumes asks for: the most the servers
// return.
const listPageSize = 1000

// LocalClaimsConfig configures LocalClaims.
type LocalClaimsConfig struct {
	// Client is the node client whose servers, connection, token,
	// node id and failover the calls use. Required.
	Client *Client
	// Leases holds the leases of the claims. Required.
	Leases *Leases
}

// LocalClaims makes claims for workloads that run on this node (a Docker
// or Podman container, a systemd service) through the servers' Control
// API, with the agent's own connection, token and failover, and holds
// their leases.
//
// A claim is taken with an owner and a lease, then held: Leases renews it
// while the agent runs. Release releases it and stops holding it. A
// claim whose holder goes away (the agent stops for longer than the
// lease) runs out on the servers, which release it.
type LocalClaims struct {
	cfg    LocalClaimsConfig
	logger hclog.Logger
}

// NewLocalClaims validates cfg and returns LocalClaims.
func NewLocalClaims(cfg LocalClaimsConfig, logger hclog.Logger) (*LocalClaims, error) {
	var errs []error
	if cfg.Client == nil {
		errs = append(errs, errors.New("local claims: Client is required"))
	}
	if cfg.Leases == nil {
		errs = append(errs, errors.New("local claims: Leases is required"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &LocalClaims{cfg: cfg, logger: logger.Named("local-claims")}, nil
}

// NodeID is this node's id.
func (l *LocalClaims) NodeID() string { return l.cfg.Client.cfg.Node.ID }

// Claim claims volumeID for workloadID on this node with owner and lease
// (5s..24h, required), then holds the lease. usage nil: the volume's
// default (its first capability, read-write). Claiming again an existing
// claim of the same workload returns it (the servers' idempotent claim):
// nothing is published twice. If holding the lease fails, the claim is
// released again and the error returned.
//
// The lease held is the claim's lease_ttl as the servers answer it (that
// of an existing claim claimed again), else lease. Errors keep the gRPC
// status of the servers' answer (status.Code sees through them); those of
// the arguments are InvalidArgument naming the field.
func (l *LocalClaims) Claim(ctx context.Context, volumeID, workloadID, owner string, lease time.Duration, usage *csisupdv1.VolumeUsage) (*csisupdv1.VolumeClaimResponse, error) {
	if err := checkLocalClaim(volumeID, workloadID, owner, lease); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	// A claim asked for while the agent starts (a unit ordered after
	// csisupd.service, an engine restarting its containers) waits for the
	// node to be known to the servers, within the caller's deadline.
	if err := l.cfg.Client.WaitRegistered(ctx); err != nil {
		return nil, fmt.Errorf("claim volume %s: %w", volumeID, err)
	}
	req := &csisupdv1.VolumeClaimRequest{
		Id: volumeID, NodeId: l.NodeID(), WorkloadId: workloadID, Usage: usage,
		LeaseTtl: durationpb.New(lease), Owner: owner,
	}
	resp, err := callControl(ctx, l, "claim volume "+volumeID, writeTimeout, func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.VolumeClaimResponse, error) {
		return cl.ClaimVolume(ctx, req)
	})
	if err != nil {
		return nil, err
	}
	held := lease
	if ttl := resp.GetClaim().GetLeaseTtl(); ttl != nil && ttl.CheckValid() == nil && ttl.AsDuration() >= MinHoldLease && ttl.AsDuration() <= MaxHoldLease {
		held = ttl.AsDuration()
	}
	if err := l.cfg.Leases.Hold(volumeID, workloadID, held); err != nil {
		holdErr := fmt.Errorf("claim volume %s for workload %s: hold its lease: %w", volumeID, workloadID, err)
		// The claim must not outlive the hold that failed by a lease:
		// release it, even when the caller has gone.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
		defer cancel()
		if _, rerr := l.release(rctx, volumeID, workloadID); rerr != nil {
			return nil, errors.Join(holdErr, fmt.Errorf("and the claim could not be released again (its lease runs out on the servers): %w", rerr))
		}
		return nil, fmt.Errorf("%w; the claim is released again", holdErr)
	}
	l.logger.Debug("claimed", "volume_id", volumeID, "workload_id", workloadID, "owner", owner, "lease", held,
		"host_path", resp.GetClaim().GetHostPath())
	return resp, nil
}

// Release releases volumeID's claim of workloadID on this node, then drops
// that volume's hold (DropVolume). A claim that does not exist (NotFound,
// or nothing to release) is success. When the release fails, the hold is
// dropped anyway, so that the lease runs out and the servers release it;
// the error says so.
//
// A hold that cannot be dropped once the claim is released (the lease
// file cannot be written) is logged, not returned: the claim is gone, and
// the renewals drop the workload once the servers answer that it holds no
// claim on the node.
func (l *LocalClaims) Release(ctx context.Context, volumeID, workloadID string) error {
	if err := checkLocalRelease(volumeID, workloadID); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	released, err := l.release(ctx, volumeID, workloadID)
	if derr := l.cfg.Leases.DropVolume(volumeID, workloadID); derr != nil {
		l.logger.Warn("cannot stop holding the lease of a released claim; the renewals drop it once the servers hold no claim of the workload",
			"volume_id", volumeID, "workload_id", workloadID, "error", derr)
	}
	if err != nil {
		return fmt.Errorf("%w; its lease is no longer held, so the servers release the claim when the lease runs out", err)
	}
	l.logger.Debug("released", "volume_id", volumeID, "workload_id", workloadID, "claims", released)
	return nil
}

// release releases volumeID's claim of workloadID on this node and
// returns how many claims the servers found to release: 0, with no
// error, when there is none (the volume included).
func (l *LocalClaims) release(ctx context.Context, volumeID, workloadID string) (uint32, error) {
	resp, err := callControl(ctx, l, "release volume "+volumeID, writeTimeout, func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.VolumeReleaseResponse, error) {
		return cl.ReleaseVolume(ctx, &csisupdv1.VolumeReleaseRequest{Id: volumeID, NodeId: l.NodeID(), WorkloadId: workloadID})
	})
	switch {
	case status.Code(err) == codes.NotFound:
		return 0, nil
	case err != nil:
		return 0, err
	}
	return resp.GetReleased(), nil
}

// ClaimsIndex is the cluster index of the servers' claims of this node
// (Cluster.NodeClaims' index), read before listing the live workloads,
// for Sync's knownIndex.
func (l *LocalClaims) ClaimsIndex(ctx context.Context) (uint64, error) {
	_, index, err := l.cfg.Client.NodeClaims(ctx)
	return index, err
}

// Sync releases owner's claims on this node of every workload not in
// workloads, keeping claims taken after knownIndex
// (Control.SyncNodeClaims), and drops the holds of the released
// workloads. A hold that cannot be dropped is logged, as Release does.
func (l *LocalClaims) Sync(ctx context.Context, owner string, workloads []string, knownIndex uint64) (*csisupdv1.SyncNodeClaimsResponse, error) {
	if !ids.ValidPluginID(owner) {
		return nil, status.Errorf(codes.InvalidArgument, "sync claims: owner %q must match %s", owner, ids.PluginIDPattern)
	}
	resp, err := callControl(ctx, l, "sync claims of owner "+owner, writeTimeout, func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.SyncNodeClaimsResponse, error) {
		return cl.SyncNodeClaims(ctx, &csisupdv1.SyncNodeClaimsRequest{
			NodeId: l.NodeID(), Owner: owner, WorkloadIds: workloads, KnownIndex: knownIndex,
		})
	})
	if err != nil {
		return nil, err
	}
	for _, ref := range resp.GetReleased() {
		if err := l.cfg.Leases.DropVolume(ref.GetVolumeId(), ref.GetWorkloadId()); err != nil {
			l.logger.Warn("cannot stop holding the lease of a claim the sync released; the renewals drop it once the servers hold no claim of the workload",
				"volume_id", ref.GetVolumeId(), "workload_id", ref.GetWorkloadId(), "error", err)
		}
	}
	if n := len(resp.GetReleased()); n > 0 {
		l.logger.Info("released the claims of workloads that no longer run", "owner", owner, "claims", n)
	}
	return resp, nil
}

// CreateVolume creates a cluster volume (Control.CreateVolume). The
// request's secrets go to the plugin and are never logged.
func (l *LocalClaims) CreateVolume(ctx context.Context, req *csisupdv1.VolumeCreateRequest) (*csisupdv1.Volume, error) {
	resp, err := callControl(ctx, l, "create volume "+req.GetId(), writeTimeout, func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.VolumeCreateResponse, error) {
		return cl.CreateVolume(ctx, req)
	})
	if err != nil {
		return nil, err
	}
	return resp.GetVolume(), nil
}

// GetVolume returns a cluster volume; an error with the NotFound gRPC
// status when there is none.
func (l *LocalClaims) GetVolume(ctx context.Context, id string) (*csisupdv1.Volume, error) {
	resp, err := callControl(ctx, l, "get volume "+id, l.cfg.Client.cfg.RPCTimeout, func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.VolumeGetResponse, error) {
		return cl.GetVolume(ctx, &csisupdv1.VolumeGetRequest{Id: id})
	})
	if err != nil {
		return nil, err
	}
	return resp.GetVolume(), nil
}

// ListVolumes returns every cluster volume, reading every page; more than
// maxListedVolumes is an error.
func (l *LocalClaims) ListVolumes(ctx context.Context) ([]*csisupdv1.Volume, error) {
	var out []*csisupdv1.Volume
	token := ""
	for {
		resp, err := callControl(ctx, l, "list volumes", l.cfg.Client.cfg.RPCTimeout, func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.VolumeListResponse, error) {
			return cl.ListVolumes(ctx, &csisupdv1.VolumeListRequest{PageSize: listPageSize, NextToken: token})
		})
		if err != nil {
			return nil, err
		}
		out = append(out, resp.GetVolumes()...)
		if len(out) > maxListedVolumes {
			return nil, fmt.Errorf("list volumes: more than %d volumes, the most this agent lists", maxListedVolumes)
		}
		next := resp.GetNextToken()
		if next == "" {
			return out, nil
		}
		if next == token {
			return nil, fmt.Errorf("list volumes: the servers answered the page of token %q with the same token", token)
		}
		token = next
	}
}

// DeleteVolume deletes a cluster volume through its plugin
// (Control.DeleteVolume); one with claims is refused (FailedPrecondition).
func (l *LocalClaims) DeleteVolume(ctx context.Context, id string) error {
	_, err := callControl(ctx, l, "delete volume "+id, writeTimeout, func(ctx context.Context, cl csisupdv1.ControlClient) (*csisupdv1.VolumeDeleteResponse, error) {
		return cl.DeleteVolume(ctx, &csisupdv1.VolumeDeleteRequest{Id: id})
	})
	return err
}

// callControl is callWithFailover of a Control call of the node client's
// servers, bounded by timeout. The servers forward it to the leader.
func callControl[Resp any](ctx context.Context, l *LocalClaims, what string, timeout time.Duration, call func(context.Context, csisupdv1.ControlClient) (Resp, error)) (Resp, error) {
	return callWithFailover(ctx, l.cfg.Client, what, timeout, csisupdv1.NewControlClient, call)
}

// checkLocalClaim checks the arguments of Claim.
func checkLocalClaim(volumeID, workloadID, owner string, lease time.Duration) error {
	if !ids.ValidPluginID(owner) {
		return fmt.Errorf("claim volume: owner %q must match %s", owner, ids.PluginIDPattern)
	}
	if err := checkHold(volumeID, workloadID, lease); err != nil {
		return fmt.Errorf("claim volume: %w", err)
	}
	return nil
}

// checkLocalRelease checks the arguments of Release: a workload id is
// required, since the servers release every claim of the volume on the
// node without one.
func checkLocalRelease(volumeID, workloadID string) error {
	switch {
	case !ids.ValidPathID(volumeID):
		return fmt.Errorf("release volume: volume_id %q must not be . or .. and must match %s", volumeID, ids.PluginIDPattern)
	case !ids.ValidPathID(workloadID):
		return fmt.Errorf("release volume: workload_id %q must not be . or .. and must match %s", workloadID, ids.PluginIDPattern)
	}
	return nil
}
