package volumeops

import (
	"context"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/statepb"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// ReleaseVolume runs on the leader: it moves the claims of a workload on a
// node (every claim on the node when workload_id is empty) to
// unpublishing, then runs their release steps. It returns the volume once
// they are freed, or the error of the first step that failed; the volume
// watcher goes on from there. A claim that does not exist is released.
//
// An ephemeral volume whose last claim is freed is deleted then (the
// controller's DeleteVolume, then the volume_delete write), with the
// release's secrets; when that fails, the release still succeeded and
// the volume watcher deletes the volume later.
func (o *Ops) ReleaseVolume(ctx context.Context, req *csisupdv1.VolumeReleaseRequest) (*statepb.Volume, int, error) {
	v, released, err := o.releaseVolume(ctx, req)
	if err != nil || !rules.EphemeralDone(v) {
		return v, released, err
	}
	if err := o.deleteEphemeralAfterRelease(ctx, v, req.GetSecrets()); err != nil {
		o.logger.Warn("ephemeral volume released but not deleted; the volume watcher deletes it", "volume", v.GetId(),
			"error", rules.ScrubSecrets(err.Error(), req.GetSecrets()))
		o.cfg.KickWatcher()
	}
	return v, released, nil
}

// releaseVolume is ReleaseVolume's release, under the volume's lock.
func (o *Ops) releaseVolume(ctx context.Context, req *csisupdv1.VolumeReleaseRequest) (*statepb.Volume, int, error) {
	if req.GetId() == "" || req.GetNodeId() == "" {
		return nil, 0, status.Error(codes.InvalidArgument, "release volume: id and node_id are required")
	}
	v, unlock, err := o.lockVolume(ctx, req.GetId())
	if err != nil {
		return nil, 0, err
	}
	defer unlock()
	match := func(c *statepb.VolumeClaim) bool {
		return c.GetNodeId() == req.GetNodeId() && (req.GetWorkloadId() == "" || c.GetWorkloadId() == req.GetWorkloadId())
	}
	var refs []rules.Ref
	for _, c := range v.GetClaims() {
		if match(c) {
			refs = append(refs, rules.RefOf(v.GetId(), c))
		}
	}
	if len(refs) == 0 {
		if err := o.confirmLeader(); err != nil {
			return nil, 0, err
		}
		return v, 0, nil
	}
	force := req.GetForce()
	if force == 1 {
		// Only a node that is down or gone may be left out of its
		// claims' release: one that answers still mounts them.
		if err := rules.CheckNodeGone(o.cfg.State().Node(req.GetNodeId()), refs[0]); err != nil {
			return nil, 0, status.Errorf(codes.FailedPrecondition, "%s; --force releases only the claims of a node that is down or gone "+
				"(give --force twice to release on a node that answers, skipping the steps that fail)", status.Convert(err).Message())
		}
	}
	for _, ref := range refs {
		v, c := o.readClaim(ref)
		if c == nil {
			continue
		}
		var cmd *statepb.ClaimStepCommand
		switch {
		case force == 1 && !c.GetNodeGone() && (c.GetState() == rules.StateTaken || c.GetState() == rules.StateUnpublishing):
			cmd = rules.ReleaseWithoutNode(v, c)
		case c.GetState() == rules.StateTaken:
			cmd = rules.StartRelease(v, c, rules.ReasonReleased)
		default:
			continue
		}
		cmd.Forced = force > 0
		if _, _, err := o.stepClaim(cmd); err != nil {
			return nil, 0, err
		}
	}
	var first error
	for _, ref := range refs {
		if err := o.runRelease(ctx, ref, req.GetSecrets(), force == 2); err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return nil, 0, first
	}
	if v = o.cfg.State().Volume(req.GetId()); v == nil {
		return nil, 0, status.Errorf(codes.NotFound, "volume %q not found", req.GetId())
	}
	return v, len(refs), nil
}

// ReleaseWithoutNode records that a claim is released without its node
// (its node has been down for longer than ClaimGCGrace) and returns the
// stored claim. The caller holds the volume's lock.
func (o *Ops) ReleaseWithoutNode(ref rules.Ref) (*statepb.VolumeClaim, error) {
	v, c := o.readClaim(ref)
	if c == nil {
		return nil, status.Errorf(codes.NotFound, "claim of %s not found", ref)
	}
	if !c.GetNodeGone() {
		if err := rules.CheckNodeGone(o.cfg.State().Node(ref.NodeID), ref); err != nil {
			return nil, err
		}
	}
	_, c, err := o.stepClaim(rules.ReleaseWithoutNode(v, c))
	return c, err
}

// StartRelease records that a taken claim starts its release (a draining
// volume's, for the volume watcher) and returns the stored claim. The
// caller holds the volume's lock.
func (o *Ops) StartRelease(ref rules.Ref) (*statepb.VolumeClaim, error) {
	v, c := o.readClaim(ref)
	if c == nil {
		return nil, status.Errorf(codes.NotFound, "claim of %s not found", ref)
	}
	if c.GetState() != rules.StateTaken {
		return c, nil
	}
	_, c, err := o.stepClaim(rules.StartRelease(v, c, rules.ReasonDrained))
	return c, err
}

// Release is runRelease for the volume watcher, which has no
// secrets of its own: a release it resumes carries only those the agents'
// secrets files add.
func (o *Ops) Release(ctx context.Context, ref rules.Ref) error {
	return o.runRelease(ctx, ref, nil, false)
}

// runRelease runs the release steps of one claim from its recorded state
// until it is freed, each recorded through raft before the next begins. A
// failed step is recorded in the claim's last_error and returned; with
// skipFailed (an operator's --force --force) it is recorded as skipped on
// the claim instead, and the release goes on. The caller holds the
// volume's lock. A claim that is gone is done.
func (o *Ops) runRelease(ctx context.Context, ref rules.Ref, secrets map[string]string, skipFailed bool) error {
	for {
		watchdog.Beat(ctx)
		if err := ctx.Err(); err != nil {
			return ctxStatus(err)
		}
		v := o.cfg.State().Volume(ref.VolumeID)
		if v == nil {
			return nil
		}
		_, c := rules.Find(v, ref.NodeID, ref.WorkloadID)
		if c == nil {
			return nil
		}
		var err error
		switch c.GetState() {
		case rules.StateUnpublishing:
			if err = o.unmount(ctx, v, c); err != nil {
				break
			}
			if skipFailed {
				// A forced release records each step, so that the
				// step it skips next is the controller's.
				o.busyWriting(ctx)
				_, _, err = o.stepClaim(rules.NodeUnpublished(v, c))
			} else {
				err = o.releaseUnmounted(ctx, v, c, secrets)
			}
		case rules.StateNodeUnpublished:
			err = o.controllerUnpublish(ctx, v, c, secrets)
		case rules.StateControllerUnpublished:
			o.busyWriting(ctx)
			_, err = o.applyVolume(ref.VolumeID, &statepb.LogEntry{Command: &statepb.LogEntry_ClaimRemove{ClaimRemove: rules.Remove(v, c)}})
			if err == nil {
				o.logger.Info("volume claim freed", "volume", ref.VolumeID, "node", ref.NodeID, "workload", ref.WorkloadID)
			}
		default:
			return status.Errorf(codes.FailedPrecondition, "claim of %s is %s, not being released", ref, c.GetState())
		}
		if err != nil && skipFailed && c.GetState() != rules.StateControllerUnpublished {
			if err = o.skipStep(ctx, ref, c, rules.ScrubSecrets(err.Error(), secrets)); err == nil {
				continue
			}
		}
		if err != nil {
			o.busyWriting(ctx)
			if uerr := o.failClaim(ref, c.GetClaimIndex(), rules.ScrubSecrets(err.Error(), secrets)); uerr != nil {
				o.logger.Warn("record a failed release step", "volume", ref.VolumeID, "node", ref.NodeID,
					"workload", ref.WorkloadID, "error", uerr)
			}
			return err
		}
	}
}

// skipStep records that a forced release skipped the failed step of
// claim c (its state's next step) and moves the claim past it.
func (o *Ops) skipStep(ctx context.Context, ref rules.Ref, c *statepb.VolumeClaim, msg string) error {
	v, cur := o.readClaim(ref)
	if cur == nil || cur.GetClaimIndex() != c.GetClaimIndex() || cur.GetState() != c.GetState() {
		return nil // moved on meanwhile: runRelease reads it again
	}
	var cmd *statepb.ClaimStepCommand
	switch cur.GetState() {
	case rules.StateUnpublishing:
		cmd = rules.NodeUnpublished(v, cur)
		cmd.Skipped = "node-unpublish: " + msg
	default:
		cmd = rules.ControllerUnpublished(v, cur)
		cmd.Skipped = "controller-unpublish: " + msg
	}
	cmd.Forced = true
	o.logger.Warn("forced release skips a failed step", "volume", ref.VolumeID, "node", ref.NodeID, "workload", ref.WorkloadID, "skipped", cmd.Skipped)
	o.busyWriting(ctx)
	_, _, err := o.stepClaim(cmd)
	return err
}

// unmount unmounts a claim on its node's agent, unless the claim is
// released without its node.
func (o *Ops) unmount(ctx context.Context, v *statepb.Volume, c *statepb.VolumeClaim) error {
	node := o.cfg.State().Node(c.GetNodeId())
	switch {
	case c.GetNodeGone():
	case node == nil:
		return status.Errorf(codes.NotFound, "unmount volume %q for workload %q: node %q not found", v.GetId(), c.GetWorkloadId(), c.GetNodeId())
	default:
		uctx, cancel := context.WithTimeout(ctx, o.cfg.RPCTimeout)
		watchdog.BusyWith(ctx, uctx)
		// The claim's paths go with the request, so that an agent that
		// lost its record of the mount still undoes it.
		err := o.cfg.NodeVolumes.UnmountVolume(uctx, node.GetAddress(), &csisupdv1.UnmountVolumeRequest{
			PluginId: v.GetPluginId(), VolumeId: v.GetId(), WorkloadId: c.GetWorkloadId(), Usage: statepb.VolumeUsageToAPI(c.GetUsage()),
			ExternalId: v.GetExternalId(), HostPath: c.GetHostPath(), StagingPath: c.GetStagingPath(),
			Cluster: true, ClaimIndex: c.GetClaimIndex(),
		})
		cancel()
		if err != nil {
			return fmt.Errorf("unmount volume %q for workload %q on node %q (%s): %w",
				v.GetId(), c.GetWorkloadId(), node.GetId(), node.GetAddress(), err)
		}
	}
	return nil
}

// releaseUnmounted runs the rest of the release of claim c, unpublishing
// and unmounted on its node: the controller unpublish, then one raft entry
// that records node-unpublished, controller-unpublished and frees the
// claim. The node's step is recorded with the controller's rather than
// before it: a leader that stops in between leaves the claim
// unpublishing, whose unmount runs again (it is idempotent, and a mount
// the agent no longer holds is unmounted) before the controller
// unpublish, so the controller never unpublishes a volume that its node
// may still hold. When the controller unpublish fails, node-unpublished is
// recorded alone, with the error, as runRelease would have left it.
func (o *Ops) releaseUnmounted(ctx context.Context, v *statepb.Volume, c *statepb.VolumeClaim, secrets map[string]string) error {
	nodeStep := rules.NodeUnpublished(v, c)
	if err := o.unpublishController(ctx, v, c, secrets); err != nil {
		// runRelease's failClaim finds this error recorded and leaves
		// the claim as it is.
		nodeStep.Error = rules.ScrubSecrets(err.Error(), secrets)
		o.busyWriting(ctx)
		if _, _, werr := o.stepClaim(nodeStep); werr != nil {
			o.logger.Warn("record a failed release step", "volume", v.GetId(), "node", c.GetNodeId(),
				"workload", c.GetWorkloadId(), "error", werr)
		}
		return err
	}
	ctrlStep := rules.ControllerUnpublished(v, c)
	ctrlStep.From = rules.StateNodeUnpublished // after nodeStep, in the same entry
	o.busyWriting(ctx)
	return o.free(v, c, nodeStep, ctrlStep)
}

// controllerUnpublish calls ControllerUnpublishVolume for a claim in
// state node-unpublished (see unpublishController), and records
// controller-unpublished.
func (o *Ops) controllerUnpublish(ctx context.Context, v *statepb.Volume, c *statepb.VolumeClaim, secrets map[string]string) error {
	if err := o.unpublishController(ctx, v, c, secrets); err != nil {
		return err
	}
	o.busyWriting(ctx)
	return o.free(v, c, rules.ControllerUnpublished(v, c))
}

// unpublishController calls ControllerUnpublishVolume for claim c of v
// when the plugin publishes (or the claim was published) and no other
// claim of the volume is left on the node.
func (o *Ops) unpublishController(ctx context.Context, v *statepb.Volume, c *statepb.VolumeClaim, secrets map[string]string) error {
	if rules.OthersOnNode(v, c) || !(c.GetControllerPublished() || o.controllerAdvertises(v.GetPluginId(), plugin.CapPublishUnpublishVolume)) {
		return nil
	}
	cands, err := o.publishCandidates(v)
	if err != nil {
		return fmt.Errorf("controller unpublish volume %q from node %q: %w", v.GetId(), c.GetNodeId(), err)
	}
	csiReq := &csi.ControllerUnpublishVolumeRequest{VolumeId: v.GetExternalId(), NodeId: c.GetCsiNodeId(), Secrets: secrets}
	_, err = o.callControllers(ctx, "ControllerUnpublishVolume", cands, func(ctx context.Context, cand candidate) error {
		err := o.cfg.Controllers.UnpublishVolume(ctx, cand.addr, v.GetPluginId(), csiReq)
		if csisupdv1.IsIgnorable(err) || (status.Code(err) == codes.NotFound && !csisupdv1.IsPluginNotFound(err)) {
			return nil // not published (any more)
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("controller unpublish volume %q from node %q: %w", v.GetId(), c.GetNodeId(), err)
	}
	return nil
}

// free writes the steps that finish claim c of v (the last of them
// controller-unpublished), then frees the claim, in one raft entry:
// nothing happens between the commands, and a leader that stops before
// the entry commits leaves the claim as the first step found it, whose
// steps run again (they are idempotent). The FSM applies the entry's
// commands in order, each checked, so the claim is freed only once it is
// controller-unpublished.
func (o *Ops) free(v *statepb.Volume, c *statepb.VolumeClaim, steps ...*statepb.ClaimStepCommand) error {
	entries := make([]*statepb.LogEntry, 0, len(steps)+1)
	for _, step := range steps {
		entries = append(entries, &statepb.LogEntry{Command: &statepb.LogEntry_ClaimStep{ClaimStep: step}})
	}
	entries = append(entries, &statepb.LogEntry{Command: &statepb.LogEntry_ClaimRemove{ClaimRemove: rules.Remove(v, c)}})
	_, err := o.applyVolume(v.GetId(), &statepb.LogEntry{Command: &statepb.LogEntry_Batch{Batch: &statepb.LogBatch{Entries: entries}}})
	if err != nil {
		return err
	}
	o.logger.Info("volume claim freed", "volume", v.GetId(), "node", c.GetNodeId(), "workload", c.GetWorkloadId())
	return nil
}
