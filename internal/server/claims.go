package server

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
	"github.com/csisupd/csisupd/internal/ids"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/server/leader"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// applyVolume writes one typed volume command through raft and returns
// the volume as stored after it (nil once deleted). The FSM refuses a
// command that no longer holds against the state (package rules), with
// the error the caller sees.
func (s *Server) applyVolume(volumeID string, e *statepb.LogEntry) (*statepb.Volume, error) {
	if _, err := s.node.Apply(e); err != nil {
		return nil, toStatus(err)
	}
	return s.State().Volume(volumeID), nil
}

// confirmLeader checks, with a quorum, that this server still leads, for
// an answer it gives from its own state without a raft write (a release
// with nothing left to release, a claim already mounted, a volume that
// exists). A leader that was paused and lost its term unnoticed would
// otherwise acknowledge, from a state the new leader has moved past, a
// release of a claim it never saw.
func (s *Server) confirmLeader() error {
	return s.fwd.consistentRead()
}

// lockVolume takes the lock of volume id and returns the volume as
// stored under it, with the function that releases the lock; an unknown
// volume is NotFound, with the lock already released.
func (s *Server) lockVolume(ctx context.Context, id string) (*statepb.Volume, func(), error) {
	unlock, err := s.volumeLocks.Lock(ctx, id)
	if err != nil {
		return nil, nil, toStatus(err)
	}
	v := s.State().Volume(id)
	if v == nil {
		unlock()
		return nil, nil, status.Errorf(codes.NotFound, "volume %q not found", id)
	}
	return v, unlock, nil
}

// stepClaim writes one claim_step command and returns the volume and the
// claim as stored after it.
func (s *Server) stepClaim(cmd *statepb.ClaimStepCommand) (*statepb.Volume, *statepb.VolumeClaim, error) {
	v, err := s.applyVolume(cmd.GetVolumeId(), &statepb.LogEntry{Command: &statepb.LogEntry_ClaimStep{ClaimStep: cmd}})
	if err != nil {
		return nil, nil, err
	}
	_, c := rules.Find(v, cmd.GetNodeId(), cmd.GetWorkloadId())
	if c == nil {
		return nil, nil, status.Errorf(codes.NotFound, "claim of %s not found", rules.Ref{VolumeID: cmd.GetVolumeId(), NodeID: cmd.GetNodeId(), WorkloadID: cmd.GetWorkloadId()})
	}
	return v, c, nil
}

// readClaim returns the stored volume and claim of ref, or nil and nil.
func (s *Server) readClaim(ref rules.Ref) (*statepb.Volume, *statepb.VolumeClaim) {
	v := s.State().Volume(ref.VolumeID)
	if v == nil {
		return nil, nil
	}
	_, c := rules.Find(v, ref.NodeID, ref.WorkloadID)
	if c == nil {
		return v, nil
	}
	return v, c
}

// claimVolume runs on the leader. It admits a new claim, records it taken
// (claim_take, which the FSM admits again against the state it applies
// to), then publishes and mounts it and records both results in one
// claim_step. A claim that exists in state taken is finished and returned
// (so a caller that saw an error learns the outcome by claiming again);
// one that is being released is refused. When a step after the taken
// write fails, the claim is moved to unpublishing for the volume watcher
// to release, and the error returned.
func (s *Server) claimVolume(ctx context.Context, req *csisupdv1.VolumeClaimRequest) (*statepb.Volume, *statepb.VolumeClaim, error) {
	if req.GetId() == "" || req.GetNodeId() == "" || req.GetWorkloadId() == "" {
		return nil, nil, status.Error(codes.InvalidArgument, "claim volume: id, node_id and workload_id are required")
	}
	// The agent names directories after them.
	if !ids.ValidPathID(req.GetWorkloadId()) {
		return nil, nil, status.Errorf(codes.InvalidArgument, "claim volume: workload_id %q must match %s and not be . or ..", req.GetWorkloadId(), ids.PluginIDPattern)
	}
	// Registered first, so that it runs after the unlock below: the
	// watcher can take the volume then.
	kick := false
	defer func() {
		if kick {
			s.watcher.Kick()
		}
	}()
	v, unlock, err := s.lockVolume(ctx, req.GetId())
	if err != nil {
		return nil, nil, err
	}
	defer unlock()
	ref := rules.Ref{VolumeID: v.GetId(), NodeID: req.GetNodeId(), WorkloadID: req.GetWorkloadId()}
	_, claim := rules.Find(v, ref.NodeID, ref.WorkloadID)
	switch {
	case claim != nil && claim.GetState() != rules.StateTaken:
		return nil, nil, csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleReleasing,
			fmt.Sprintf("the claim of workload %q on node %q is being released (state %s); claim again once it is freed",
				ref.WorkloadID, ref.NodeID, claim.GetState()))
	case claim == nil:
		claim, err = rules.Admit(s.State(), v, req, timestamppb.Now())
		if err != nil {
			return nil, nil, err
		}
		if v, err = s.applyVolume(v.GetId(), &statepb.LogEntry{Command: &statepb.LogEntry_ClaimTake{ClaimTake: rules.Take(v, claim)}}); err != nil {
			return nil, nil, err
		}
		if _, claim = rules.Find(v, ref.NodeID, ref.WorkloadID); claim == nil {
			return nil, nil, status.Errorf(codes.Internal, "claim of %s: not stored after it was taken", ref)
		}
		s.logger.Info("volume claimed", "volume", ref.VolumeID, "node", ref.NodeID, "workload", ref.WorkloadID,
			"access_mode", claim.GetUsage().GetAccessMode(), "read_only", claim.GetReadOnly(), "claim_index", claim.GetClaimIndex())
	}
	if claim.GetMounted() {
		// Mounted already: answered from this server's state.
		if err := s.confirmLeader(); err != nil {
			return nil, nil, err
		}
		return v, claim, nil
	}
	claimIndex := claim.GetClaimIndex()
	v, claim, err = s.finishClaim(ctx, v, claim, req.GetSecrets())
	if err != nil {
		msg := rules.ScrubSecrets(err.Error(), req.GetSecrets())
		s.logger.Warn("volume claim failed; releasing it", "volume", ref.VolumeID, "node", ref.NodeID,
			"workload", ref.WorkloadID, "error", msg)
		if uerr := s.failClaim(ref, claimIndex, msg); uerr != nil {
			s.logger.Warn("start the release of a failed claim", "volume", ref.VolumeID, "node", ref.NodeID,
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
func (s *Server) failClaim(ref rules.Ref, claimIndex uint64, msg string) error {
	v, c := s.readClaim(ref)
	if c == nil || c.GetClaimIndex() != claimIndex || (c.GetLastError() == msg && c.GetState() != rules.StateTaken) {
		return nil
	}
	_, _, err := s.stepClaim(rules.Fail(v, c, msg))
	return err
}

// controllerAdvertises reports whether a controller instance of the
// plugin, healthy or not, advertises a controller capability.
func (s *Server) controllerAdvertises(pluginID, capability string) bool {
	return rules.ControllerAdvertises(s.State().Plugin(pluginID), capability)
}

// publishCandidates returns the healthy controllers of v's plugin that can
// publish and unpublish and reach v: a node-local controller answers only
// for its own volumes, so the one that created v comes first, and only
// controllers whose node's topology reaches v's are tried.
func (s *Server) publishCandidates(v *statepb.Volume) ([]candidate, error) {
	cands, err := s.capableControllers(v.GetPluginId(), plugin.CapPublishUnpublishVolume)
	if err != nil {
		return nil, err
	}
	place := placementAt(v.GetAccessibleTopology(), v.GetControllerNodeId())
	ranked := place.rank(cands)
	if ranked == nil {
		return nil, place.unsatisfiable(v.GetPluginId(), cands)
	}
	return ranked, nil
}

// finishClaim runs the steps a taken claim still lacks: controller publish
// (shared with another claim of the volume on the node when one is
// published), then the mount on the node. Both results are recorded
// together, in one claim_step after the mount: a claim that stops between
// them is finished again (both steps are idempotent) or released (its
// controller publication with it, since the release unpublishes whenever
// the plugin publishes). Only the taken claim must be in raft before they
// start. Its callers pass a claim not mounted yet.
func (s *Server) finishClaim(ctx context.Context, v *statepb.Volume, claim *statepb.VolumeClaim, secrets map[string]string) (*statepb.Volume, *statepb.VolumeClaim, error) {
	var err error
	pc, published := claim.GetPublishContext(), claim.GetControllerPublished()
	if !published {
		switch shared := rules.SharedPublication(v, claim); {
		case shared != nil:
			pc, published = maps.Clone(shared.GetPublishContext()), true
		case s.controllerAdvertises(v.GetPluginId(), plugin.CapPublishUnpublishVolume):
			if pc, err = s.controllerPublish(ctx, v, claim, secrets); err != nil {
				return nil, nil, err
			}
			published = true
		}
	}
	node := s.State().Node(claim.GetNodeId())
	if node == nil {
		return nil, nil, status.Errorf(codes.NotFound, "node %q not found", claim.GetNodeId())
	}
	mctx, cancel := context.WithTimeout(ctx, s.cfg.RPCTimeout)
	leader.BusyWith(ctx, mctx)
	m, err := s.nodeVolumes.MountVolume(mctx, node.GetAddress(), &csisupdv1.MountVolumeRequest{
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
	s.heartbeats.Confirm(node.GetId())
	s.busyWriting(ctx)
	return s.stepClaim(rules.Mounted(v, claim, published, pc, m.GetHostPath(), m.GetStagingPath()))
}

// resumeClaim finishes, for the volume watcher, a claim that is taken but
// not mounted and that no caller finished within ClaimResumeTimeout (its
// leader died, or lost its term, in the middle). The steps are the
// claim's own, idempotent, so they learn what the node and the controller
// hold and record it; the watcher has no secrets of its own, so they
// carry only those the agents' secrets files add. When a step fails the
// claim is released.
func (s *Server) resumeClaim(ctx context.Context, ref rules.Ref) error {
	v, c := s.readClaim(ref)
	if c == nil || !rules.Unfinished(c) {
		return nil
	}
	if _, _, err := s.finishClaim(ctx, v, c, nil); err != nil {
		if ctx.Err() != nil {
			return toStatus(ctx.Err())
		}
		msg := err.Error()
		s.busyWriting(ctx)
		if uerr := s.failClaim(ref, c.GetClaimIndex(), msg); uerr != nil {
			return fmt.Errorf("release unfinished claim of %s after %v: %w", ref, err, uerr)
		}
		s.logger.Warn("unfinished volume claim could not be finished; releasing it", "volume", ref.VolumeID,
			"node", ref.NodeID, "workload", ref.WorkloadID, "error", msg)
		return nil
	}
	s.logger.Info("unfinished volume claim finished", "volume", ref.VolumeID, "node", ref.NodeID, "workload", ref.WorkloadID)
	return nil
}

// controllerPublish calls ControllerPublishVolume for a claim and returns
// the publish context.
func (s *Server) controllerPublish(ctx context.Context, v *statepb.Volume, claim *statepb.VolumeClaim, secrets map[string]string) (map[string]string, error) {
	cands, err := s.publishCandidates(v)
	if err != nil {
		return nil, err
	}
	csiCap, err := rules.CSICapability(rules.UsageCapability(claim.GetUsage()))
	if err != nil {
		return nil, err
	}
	var pc map[string]string
	_, err = s.callControllers(ctx, "ControllerPublishVolume", cands, func(ctx context.Context, c candidate) error {
		// A controller without PUBLISH_READONLY refuses the readonly
		// flag; the node publishes read-only then (NodePublishVolume's
		// readonly), as Kubernetes' attacher does.
		csiReq := &csi.ControllerPublishVolumeRequest{
			VolumeId: v.GetExternalId(), NodeId: claim.GetCsiNodeId(), VolumeCapability: csiCap,
			Readonly: claim.GetReadOnly() && slices.Contains(c.plugin.GetControllerCapabilities(), rules.CapPublishReadonly),
			Secrets:  secrets, VolumeContext: v.GetContext(),
		}
		resp, err := s.controllers.PublishVolume(ctx, c.addr, v.GetPluginId(), csiReq)
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

// releaseVolume runs on the leader: it moves the claims of a workload on a
// node (every claim on the node when workload_id is empty) to
// unpublishing, then runs their release steps. It returns the volume once
// they are freed, or the error of the first step that failed; the volume
// watcher goes on from there. A claim that does not exist is released.
func (s *Server) releaseVolume(ctx context.Context, req *csisupdv1.VolumeReleaseRequest) (*statepb.Volume, int, error) {
	if req.GetId() == "" || req.GetNodeId() == "" {
		return nil, 0, status.Error(codes.InvalidArgument, "release volume: id and node_id are required")
	}
	v, unlock, err := s.lockVolume(ctx, req.GetId())
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
		if err := s.confirmLeader(); err != nil {
			return nil, 0, err
		}
		return v, 0, nil
	}
	force := req.GetForce()
	if force == 1 {
		// Only a node that is down or gone may be left out of its
		// claims' release: one that answers still mounts them.
		if err := rules.CheckNodeGone(s.State().Node(req.GetNodeId()), refs[0]); err != nil {
			return nil, 0, status.Errorf(codes.FailedPrecondition, "%s; --force releases only the claims of a node that is down or gone "+
				"(give --force twice to release on a node that answers, skipping the steps that fail)", status.Convert(err).Message())
		}
	}
	for _, ref := range refs {
		v, c := s.readClaim(ref)
		if c == nil {
			continue
		}
		var cmd *statepb.ClaimStepCommand
		switch {
		case force == 1 && !c.GetNodeGone() && (c.GetState() == rules.StateTaken || c.GetState() == rules.StateUnpublishing):
			cmd = rules.ReleaseWithoutNode(v, c)
		case c.GetState() == rules.StateTaken:
			cmd = rules.StartRelease(v, c)
		default:
			continue
		}
		cmd.Forced = force > 0
		if _, _, err := s.stepClaim(cmd); err != nil {
			return nil, 0, err
		}
	}
	var first error
	for _, ref := range refs {
		if err := s.runRelease(ctx, ref, req.GetSecrets(), force == 2); err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return nil, 0, first
	}
	if v = s.State().Volume(req.GetId()); v == nil {
		return nil, 0, status.Errorf(codes.NotFound, "volume %q not found", req.GetId())
	}
	return v, len(refs), nil
}

// releaseWithoutNode records that a claim is released without its node
// (its node has been down for longer than ClaimGCGrace) and returns the
// stored claim. The caller holds the volume's lock.
func (s *Server) releaseWithoutNode(ref rules.Ref) (*statepb.VolumeClaim, error) {
	v, c := s.readClaim(ref)
	if c == nil {
		return nil, status.Errorf(codes.NotFound, "claim of %s not found", ref)
	}
	if !c.GetNodeGone() {
		if err := rules.CheckNodeGone(s.State().Node(ref.NodeID), ref); err != nil {
			return nil, err
		}
	}
	_, c, err := s.stepClaim(rules.ReleaseWithoutNode(v, c))
	return c, err
}

// startRelease records that a taken claim starts its release (a draining
// volume's, for the volume watcher) and returns the stored claim. The
// caller holds the volume's lock.
func (s *Server) startRelease(ref rules.Ref) (*statepb.VolumeClaim, error) {
	v, c := s.readClaim(ref)
	if c == nil {
		return nil, status.Errorf(codes.NotFound, "claim of %s not found", ref)
	}
	if c.GetState() != rules.StateTaken {
		return c, nil
	}
	_, c, err := s.stepClaim(rules.StartRelease(v, c))
	return c, err
}

// resumeRelease is runRelease for the volume watcher, which has no
// secrets of its own: a release it resumes carries only those the agents'
// secrets files add.
func (s *Server) resumeRelease(ctx context.Context, ref rules.Ref) error {
	return s.runRelease(ctx, ref, nil, false)
}

// runRelease runs the release steps of one claim from its recorded state
// until it is freed, each recorded through raft before the next begins. A
// failed step is recorded in the claim's last_error and returned; with
// skipFailed (an operator's --force --force) it is recorded as skipped on
// the claim instead, and the release goes on. The caller holds the
// volume's lock. A claim that is gone is done.
func (s *Server) runRelease(ctx context.Context, ref rules.Ref, secrets map[string]string, skipFailed bool) error {
	for {
		leader.Beat(ctx)
		if err := ctx.Err(); err != nil {
			return toStatus(err)
		}
		v := s.State().Volume(ref.VolumeID)
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
			err = s.nodeUnpublish(ctx, v, c)
		case rules.StateNodeUnpublished:
			err = s.controllerUnpublish(ctx, v, c, secrets)
		case rules.StateControllerUnpublished:
			s.busyWriting(ctx)
			_, err = s.applyVolume(ref.VolumeID, &statepb.LogEntry{Command: &statepb.LogEntry_ClaimRemove{ClaimRemove: rules.Remove(v, c)}})
			if err == nil {
				s.logger.Info("volume claim freed", "volume", ref.VolumeID, "node", ref.NodeID, "workload", ref.WorkloadID)
			}
		default:
			return status.Errorf(codes.FailedPrecondition, "claim of %s is %s, not being released", ref, c.GetState())
		}
		if err != nil && skipFailed && c.GetState() != rules.StateControllerUnpublished {
			if err = s.skipStep(ctx, ref, c, rules.ScrubSecrets(err.Error(), secrets)); err == nil {
				continue
			}
		}
		if err != nil {
			s.busyWriting(ctx)
			if uerr := s.failClaim(ref, c.GetClaimIndex(), rules.ScrubSecrets(err.Error(), secrets)); uerr != nil {
				s.logger.Warn("record a failed release step", "volume", ref.VolumeID, "node", ref.NodeID,
					"workload", ref.WorkloadID, "error", uerr)
			}
			return err
		}
	}
}

// skipStep records that a forced release skipped the failed step of
// claim c (its state's next step) and moves the claim past it.
func (s *Server) skipStep(ctx context.Context, ref rules.Ref, c *statepb.VolumeClaim, msg string) error {
	v, cur := s.readClaim(ref)
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
	s.logger.Warn("forced release skips a failed step", "volume", ref.VolumeID, "node", ref.NodeID, "workload", ref.WorkloadID, "skipped", cmd.Skipped)
	s.busyWriting(ctx)
	_, _, err := s.stepClaim(cmd)
	return err
}

// busyWriting tells the watchdog loop ctx carries (the volume watcher's)
// that a raft write, bounded by ApplyTimeout, follows.
func (s *Server) busyWriting(ctx context.Context) {
	leader.Busy(ctx, time.Now().Add(s.cfg.ApplyTimeout))
}

// nodeUnpublish unmounts a claim on its node's agent, unless the claim is
// released without its node, and records node-unpublished.
func (s *Server) nodeUnpublish(ctx context.Context, v *statepb.Volume, c *statepb.VolumeClaim) error {
	node := s.State().Node(c.GetNodeId())
	switch {
	case c.GetNodeGone():
	case node == nil:
		return status.Errorf(codes.NotFound, "unmount volume %q for workload %q: node %q not found", v.GetId(), c.GetWorkloadId(), c.GetNodeId())
	default:
		uctx, cancel := context.WithTimeout(ctx, s.cfg.RPCTimeout)
		leader.BusyWith(ctx, uctx)
		// The claim's paths go with the request, so that an agent that
		// lost its record of the mount still undoes it.
		err := s.nodeVolumes.UnmountVolume(uctx, node.GetAddress(), &csisupdv1.UnmountVolumeRequest{
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
	s.busyWriting(ctx)
	_, _, err := s.stepClaim(rules.NodeUnpublished(v, c))
	return err
}

// controllerUnpublish calls ControllerUnpublishVolume for a claim when the
// plugin publishes (or the claim was published) and no other claim of the
// volume is left on the node, and records controller-unpublished.
func (s *Server) controllerUnpublish(ctx context.Context, v *statepb.Volume, c *statepb.VolumeClaim, secrets map[string]string) error {
	if !rules.OthersOnNode(v, c) && (c.GetControllerPublished() || s.controllerAdvertises(v.GetPluginId(), plugin.CapPublishUnpublishVolume)) {
		cands, err := s.publishCandidates(v)
		if err != nil {
			return fmt.Errorf("controller unpublish volume %q from node %q: %w", v.GetId(), c.GetNodeId(), err)
		}
		csiReq := &csi.ControllerUnpublishVolumeRequest{VolumeId: v.GetExternalId(), NodeId: c.GetCsiNodeId(), Secrets: secrets}
		_, err = s.callControllers(ctx, "ControllerUnpublishVolume", cands, func(ctx context.Context, cand candidate) error {
			err := s.controllers.UnpublishVolume(ctx, cand.addr, v.GetPluginId(), csiReq)
			if csisupdv1.IsIgnorable(err) || (status.Code(err) == codes.NotFound && !csisupdv1.IsPluginNotFound(err)) {
				return nil // not published (any more)
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("controller unpublish volume %q from node %q: %w", v.GetId(), c.GetNodeId(), err)
		}
	}
	s.busyWriting(ctx)
	_, _, err := s.stepClaim(rules.ControllerUnpublished(v, c))
	return err
}
