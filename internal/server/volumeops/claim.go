package volumeops

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/statepb"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// ClaimVolume runs on the leader. It admits a new claim, records it taken
// (claim_take, which the FSM admits again against the state it applies
// to), then publishes and mounts it and records both results in one
// claim_step. A claim that exists in state taken is finished and returned
// (so a caller that saw an error learns the outcome by claiming again);
// one that is being released is refused. When a step after the taken
// write fails, the claim is moved to unpublishing for the volume watcher
// to release, and the error returned.
func (o *Ops) ClaimVolume(ctx context.Context, req *csisupdv1.VolumeClaimRequest) (*statepb.Volume, *statepb.VolumeClaim, error) {
	if err := rules.CheckClaimRequest(req); err != nil {
		return nil, nil, err
	}
	// Registered first, so that it runs after the unlock below: the
	// watcher can take the volume then.
	kick := false
	defer func() {
		if kick {
			o.cfg.KickWatcher()
		}
	}()
	v, unlock, err := o.lockVolume(ctx, req.GetId())
	if err != nil {
		return nil, nil, err
	}
	defer unlock()
	ref := rules.Ref{VolumeID: v.GetId(), NodeID: req.GetNodeId(), WorkloadID: req.GetWorkloadId()}
	_, claim := rules.Find(v, ref.NodeID, ref.WorkloadID)
	switch {
	case claim != nil && claim.GetState() == rules.StateTaken && claim.GetLeaseTtl().AsDuration() != req.GetLeaseTtl().AsDuration():
		// A claim keeps the lease it was taken with: a caller that claims
		// again to learn the outcome sends the same request, and another
		// lease is another claim, taken after this one is released.
		return nil, nil, status.Errorf(codes.FailedPrecondition,
			"the claim of workload %q on node %q exists with lease_ttl %s; claim with the same lease_ttl, or release it and claim again",
			ref.WorkloadID, ref.NodeID, leaseText(claim.GetLeaseTtl().AsDuration()))
	case claim != nil && claim.GetState() != rules.StateTaken:
		return nil, nil, csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleReleasing,
			fmt.Sprintf("the claim of workload %q on node %q is being released (state %s); claim again once it is freed",
				ref.WorkloadID, ref.NodeID, claim.GetState()))
	case claim == nil:
		claim, err = rules.Admit(o.cfg.State(), v, req, timestamppb.Now())
		if err != nil {
			return nil, nil, err
		}
		if v, err = o.applyVolume(v.GetId(), &statepb.LogEntry{Command: &statepb.LogEntry_ClaimTake{ClaimTake: rules.Take(v, claim)}}); err != nil {
			return nil, nil, err
		}
		if _, claim = rules.Find(v, ref.NodeID, ref.WorkloadID); claim == nil {
			return nil, nil, status.Errorf(codes.Internal, "claim of %s: not stored after it was taken", ref)
		}
		o.logger.Info("volume claimed", "volume", ref.VolumeID, "node", ref.NodeID, "workload", ref.WorkloadID,
			"access_mode", claim.GetUsage().GetAccessMode(), "read_only", claim.GetReadOnly(), "claim_index", claim.GetClaimIndex())
	}
	// The lease counts from the take, and a claim again renews it: its
	// caller is alive. A lease that has expired is not revived.
	o.cfg.AddLease(ref, claim.GetClaimIndex(), claim.GetLeaseTtl().AsDuration())
	if claim.GetMounted() {
		// Mounted already: answered from this server's state.
		if err := o.confirmLeader(); err != nil {
			return nil, nil, err
		}
		return v, claim, nil
	}
	claimIndex := claim.GetClaimIndex()
	v, claim, err = o.finishClaim(ctx, v, claim, req.GetSecrets())
	if err != nil {
		msg := rules.ScrubSecrets(err.Error(), req.GetSecrets())
		o.logger.Warn("volume claim failed; releasing it", "volume", ref.VolumeID, "node", ref.NodeID,
			"workload", ref.WorkloadID, "error", msg)
		if uerr := o.failClaim(ref, claimIndex, msg); uerr != nil {
			o.logger.Warn("start the release of a failed claim", "volume", ref.VolumeID, "node", ref.NodeID,
				"workload", ref.WorkloadID, "error", uerr)
		} else {
			kick = true
		}
		return nil, nil, err
	}
	return v, claim, nil
}

// failClaim records a failed step of the claim of ref taken at
// claimIndex: a taken claim starts its release, one being released keeps
// its state. A claim that is gone or was taken again is left alone.
func (o *Ops) failClaim(ref rules.Ref, claimIndex uint64, msg string) error {
	v, c := o.readClaim(ref)
	if c == nil || c.GetClaimIndex() != claimIndex || (c.GetLastError() == msg && c.GetState() != rules.StateTaken) {
		return nil
	}
	_, _, err := o.stepClaim(rules.Fail(v, c, msg))
	return err
}

// finishClaim runs the steps a taken claim still lacks: controller publish
// (shared with another claim of the volume on the node when one is
// published), then the mount on the node. Both results are recorded
// together, in one claim_step after the mount: a claim that stops between
// them is finished again (both steps are idempotent) or released (its
// controller publication with it, since the release unpublishes whenever
// the plugin publishes). Only the taken claim must be in raft before they
// start. Its callers pass a claim not mounted yet.
func (o *Ops) finishClaim(ctx context.Context, v *statepb.Volume, claim *statepb.VolumeClaim, secrets map[string]string) (*statepb.Volume, *statepb.VolumeClaim, error) {
	var err error
	pc, published := claim.GetPublishContext(), claim.GetControllerPublished()
	if !published {
		switch shared := rules.SharedPublication(v, claim); {
		case shared != nil:
			pc, published = maps.Clone(shared.GetPublishContext()), true
		case o.controllerAdvertises(v.GetPluginId(), plugin.CapPublishUnpublishVolume):
			if pc, err = o.controllerPublish(ctx, v, claim, secrets); err != nil {
				return nil, nil, err
			}
			published = true
		}
	}
	node := o.cfg.State().Node(claim.GetNodeId())
	if node == nil {
		return nil, nil, status.Errorf(codes.NotFound, "node %q not found", claim.GetNodeId())
	}
	mctx, cancel := context.WithTimeout(ctx, o.cfg.RPCTimeout)
	watchdog.BusyWith(ctx, mctx)
	m, err := o.cfg.NodeVolumes.MountVolume(mctx, node.GetAddress(), &csisupdv1.MountVolumeRequest{
		PluginId:       v.GetPluginId(),
		VolumeId:       v.GetId(),
		ExternalId:     v.GetExternalId(),
		WorkloadId:     claim.GetWorkloadId(),
		Usage:          statepb.VolumeUsageToAPI(claim.GetUsage()),
		VolumeContext:  v.GetContext(),
		PublishContext: pc,
		Secrets:        secrets,
		Cluster:        true,
		ClaimIndex:     claim.GetClaimIndex(),
	})
	cancel()
	if err != nil {
		return nil, nil, fmt.Errorf("mount volume %q for workload %q on node %q (%s): %w",
			v.GetId(), claim.GetWorkloadId(), node.GetId(), node.GetAddress(), err)
	}
	// The node's agent answered: the node is alive for this leader even
	// before its next heartbeat.
	o.cfg.Nodes.Confirm(node.GetId())
	o.busyWriting(ctx)
	return o.stepClaim(rules.Mounted(v, claim, published, pc, m.GetHostPath(), m.GetStagingPath()))
}

// Finish finishes, for the volume watcher, a claim that is taken but
// not mounted and that no caller finished within ClaimResumeTimeout (its
// leader died, or lost its term, in the middle). The steps are the
// claim's own, idempotent, so they learn what the node and the controller
// hold and record it; the watcher has no secrets of its own, so they
// carry only those the agents' secrets files add. When a step fails the
// claim is released.
func (o *Ops) Finish(ctx context.Context, ref rules.Ref) error {
	v, c := o.readClaim(ref)
	if c == nil || !rules.Unfinished(c) {
		return nil
	}
	if _, _, err := o.finishClaim(ctx, v, c, nil); err != nil {
		if ctx.Err() != nil {
			return ctxStatus(ctx.Err())
		}
		msg := err.Error()
		o.busyWriting(ctx)
		if uerr := o.failClaim(ref, c.GetClaimIndex(), msg); uerr != nil {
			return fmt.Errorf("release unfinished claim of %s after %v: %w", ref, err, uerr)
		}
		o.logger.Warn("unfinished volume claim could not be finished; releasing it", "volume", ref.VolumeID,
			"node", ref.NodeID, "workload", ref.WorkloadID, "error", msg)
		return nil
	}
	o.logger.Info("unfinished volume claim finished", "volume", ref.VolumeID, "node", ref.NodeID, "workload", ref.WorkloadID)
	return nil
}

// controllerPublish calls ControllerPublishVolume for a claim and returns
// the publish context.
func (o *Ops) controllerPublish(ctx context.Context, v *statepb.Volume, claim *statepb.VolumeClaim, secrets map[string]string) (map[string]string, error) {
	cands, err := o.publishCandidates(v)
	if err != nil {
		return nil, err
	}
	csiCap, err := rules.CSICapability(rules.UsageCapability(claim.GetUsage()))
	if err != nil {
		return nil, err
	}
	var pc map[string]string
	_, err = o.callControllers(ctx, "ControllerPublishVolume", cands, func(ctx context.Context, c candidate) error {
		// A controller without PUBLISH_READONLY refuses the readonly
		// flag; the node publishes read-only then (NodePublishVolume's
		// readonly), as Kubernetes' attacher does.
		csiReq := &csi.ControllerPublishVolumeRequest{
			VolumeId: v.GetExternalId(), NodeId: claim.GetCsiNodeId(), VolumeCapability: csiCap,
			Readonly: claim.GetReadOnly() && slices.Contains(c.plugin.GetControllerCapabilities(), rules.CapPublishReadonly),
			Secrets:  secrets, VolumeContext: v.GetContext(),
		}
		resp, err := o.cfg.Controllers.PublishVolume(ctx, c.addr, v.GetPluginId(), csiReq)
		if err == nil {
			pc = resp.GetPublishContext()
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("controller publish volume %q to node %q: %w", v.GetId(), claim.GetNodeId(), err)
	}
	return pc, nil
}

// leaseText names a claim's lease_ttl in a message.
func leaseText(ttl time.Duration) string {
	if ttl == 0 {
		return "none"
	}
	return ttl.String()
}
