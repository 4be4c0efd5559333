package server

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/server/state"
)

// Volume claim states, as VolumeClaim.state names them. A claim walks
// taken -> unpublishing -> node-unpublished -> controller-unpublished and
// is then removed from its volume (freed).
const (
	ClaimStateTaken                 = "taken"
	ClaimStateUnpublishing          = "unpublishing"
	ClaimStateNodeUnpublished       = "node-unpublished"
	ClaimStateControllerUnpublished = "controller-unpublished"
)

// releasing reports whether a claim state is one of a release.
func releasing(state string) bool {
	switch state {
	case ClaimStateUnpublishing, ClaimStateNodeUnpublished, ClaimStateControllerUnpublished:
		return true
	}
	return false
}

// claimRef names one claim of a volume: a volume has at most one claim per
// node and workload.
type claimRef struct {
	volumeID, nodeID, workloadID string
}

func refOf(volumeID string, c *csisupdv1.VolumeClaim) claimRef {
	return claimRef{volumeID: volumeID, nodeID: c.GetNodeId(), workloadID: c.GetWorkloadId()}
}

func (r claimRef) String() string {
	return fmt.Sprintf("volume %q, node %q, workload %q", r.volumeID, r.nodeID, r.workloadID)
}

// findClaim returns the index and the claim of v for a node and workload,
// or -1 and nil.
func findClaim(v *csisupdv1.Volume, nodeID, workloadID string) (int, *csisupdv1.VolumeClaim) {
	for i, c := range v.GetClaims() {
		if c.GetNodeId() == nodeID && c.GetWorkloadId() == workloadID {
			return i, c
		}
	}
	return -1, nil
}

// updateVolume applies fn to a copy of the stored volume and writes the
// copy through raft. The caller holds the volume's lock.
func (s *Server) updateVolume(id string, fn func(v *csisupdv1.Volume) error) (*csisupdv1.Volume, error) {
	cur := s.State().Volume(id)
	if cur == nil {
		return nil, status.Errorf(codes.NotFound, "volume %q not found", id)
	}
	v := proto.Clone(cur).(*csisupdv1.Volume)
	if err := fn(v); err != nil {
		return nil, err
	}
	return s.writeVolume(v)
}

// updateClaim applies fn to a copy of one stored claim and writes its
// volume through raft. It returns the stored volume and claim. The caller
// holds the volume's lock.
func (s *Server) updateClaim(ref claimRef, fn func(c *csisupdv1.VolumeClaim)) (*csisupdv1.Volume, *csisupdv1.VolumeClaim, error) {
	v, err := s.updateVolume(ref.volumeID, func(v *csisupdv1.Volume) error {
		_, c := findClaim(v, ref.nodeID, ref.workloadID)
		if c == nil {
			return status.Errorf(codes.NotFound, "claim of %s not found", ref)
		}
		fn(c)
		return nil
	})
	if err != nil {
		return nil, nil, err
	}
	_, c := findClaim(v, ref.nodeID, ref.workloadID)
	return v, c, nil
}

// setState moves a claim to state and stamps the time of the change.
func setState(c *csisupdv1.VolumeClaim, state string) {
	if c.State != state {
		c.State = state
		c.StateUpdatedAt = timestamppb.Now()
	}
}

// claimVolume runs on the leader. It admits a new claim, records it taken,
// then publishes and mounts it, each result recorded through raft. A claim
// that exists in state taken is finished, one that is being released is
// refused. When a step after the taken write fails, the claim is moved to
// unpublishing for the volume watcher to release, and the error returned.
func (s *Server) claimVolume(ctx context.Context, req *csisupdv1.VolumeClaimRequest) (*csisupdv1.Volume, *csisupdv1.VolumeClaim, error) {
	if req.GetId() == "" || req.GetNodeId() == "" || req.GetWorkloadId() == "" {
		return nil, nil, status.Error(codes.InvalidArgument, "claim volume: id, node_id and workload_id are required")
	}
	// The agent names directories after them.
	if !config.ValidPathID(req.GetWorkloadId()) {
		return nil, nil, status.Errorf(codes.InvalidArgument, "claim volume: workload_id %q must match %s and not be . or ..", req.GetWorkloadId(), config.PluginIDPattern)
	}
	// Registered first, so that it runs after the unlock below: the
	// watcher can take the volume then.
	kick := false
	defer func() {
		if kick {
			s.kickVolumeWatcher()
		}
	}()
	unlock, err := s.volumeLocks.Lock(ctx, req.GetId())
	if err != nil {
		return nil, nil, toStatus(err)
	}
	defer unlock()

	v := s.State().Volume(req.GetId())
	if v == nil {
		return nil, nil, status.Errorf(codes.NotFound, "volume %q not found", req.GetId())
	}
	ref := claimRef{volumeID: v.GetId(), nodeID: req.GetNodeId(), workloadID: req.GetWorkloadId()}
	_, claim := findClaim(v, ref.nodeID, ref.workloadID)
	switch {
	case claim != nil && claim.GetState() != ClaimStateTaken:
		return nil, nil, csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleReleasing,
			fmt.Sprintf("the claim of workload %q on node %q is being released (state %s); claim again once it is freed",
				ref.workloadID, ref.nodeID, claim.GetState()))
	case claim == nil:
		claim, err = s.admitClaim(v, req)
		if err != nil {
			return nil, nil, err
		}
		v, err = s.updateVolume(v.GetId(), func(v *csisupdv1.Volume) error {
			v.Claims = append(v.Claims, claim)
			return nil
		})
		if err != nil {
			return nil, nil, err
		}
		_, claim = findClaim(v, ref.nodeID, ref.workloadID)
		s.logger.Info("volume claimed", "volume", ref.volumeID, "node", ref.nodeID, "workload", ref.workloadID,
			"access_mode", claim.GetUsage().GetAccessMode(), "read_only", claim.GetReadOnly(), "claim_index", claim.GetClaimIndex())
	}
	v, claim, err = s.finishClaim(ctx, v, claim, req.GetSecrets())
	if err != nil {
		msg := scrubSecrets(err.Error(), req.GetSecrets())
		s.logger.Warn("volume claim failed; releasing it", "volume", ref.volumeID, "node", ref.nodeID,
			"workload", ref.workloadID, "error", msg)
		_, _, uerr := s.updateClaim(ref, func(c *csisupdv1.VolumeClaim) {
			if c.State == ClaimStateTaken {
				setState(c, ClaimStateUnpublishing)
			}
			c.LastError = msg
		})
		if uerr != nil {
			s.logger.Warn("start the release of a failed claim", "volume", ref.volumeID, "node", ref.nodeID,
				"workload", ref.workloadID, "error", uerr)
		} else {
			kick = true
		}
		return nil, nil, err
	}
	return v, claim, nil
}

// claimUsage returns the usage of a claim request with its defaults: the
// volume's first capability when the request has none; otherwise the
// access type mount and the access mode of the volume's first capability
// where the request leaves them empty.
func claimUsage(v *csisupdv1.Volume, req *csisupdv1.VolumeClaimRequest) (*csisupdv1.VolumeUsage, error) {
	first := defaultCapabilities(v.GetCapabilities())[0]
	var u *csisupdv1.VolumeUsage
	if req.GetUsage() == nil {
		u = &csisupdv1.VolumeUsage{
			AccessMode: first.GetAccessMode(), AccessType: first.GetAccessType(),
			FsType: first.GetFsType(), MountFlags: first.GetMountFlags(),
		}
	} else {
		u = proto.Clone(req.GetUsage()).(*csisupdv1.VolumeUsage)
	}
	if u.AccessType == "" {
		u.AccessType = "mount"
	}
	if u.AccessMode == "" {
		u.AccessMode = first.GetAccessMode()
	}
	if u.AccessMode == "" {
		u.AccessMode = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER.String()
	}
	if _, err := csiCapability(usageCapability(u)); err != nil {
		return nil, err
	}
	if _, ok := accessModes[u.AccessMode]; !ok {
		return nil, status.Errorf(codes.InvalidArgument, "claim usage: access_mode %q cannot be claimed", u.AccessMode)
	}
	if u.AccessType == "block" && (u.FsType != "" || len(u.MountFlags) > 0) {
		return nil, status.Error(codes.InvalidArgument, "claim usage: fs_type and mount_flags are for access_type mount only")
	}
	return u, nil
}

// usageCapability is the capability a usage asks of the volume.
func usageCapability(u *csisupdv1.VolumeUsage) *csisupdv1.VolumeCapability {
	return &csisupdv1.VolumeCapability{
		AccessType: u.GetAccessType(), AccessMode: u.GetAccessMode(), FsType: u.GetFsType(), MountFlags: u.GetMountFlags(),
	}
}

// accessRule is what one access mode allows of the claims of a volume.
type accessRule struct {
	// oneNode: every claim is on the same node.
	oneNode bool
	// oneWriter: at most one claim is not read-only.
	oneWriter bool
	// readersOnly: every claim is read-only.
	readersOnly bool
}

// accessModes are the CSI access modes a claim may use.
var accessModes = map[string]accessRule{
	csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER.String():        {oneNode: true, oneWriter: true},
	csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER.String(): {oneNode: true, oneWriter: true},
	csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER.String():  {oneNode: true},
	csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY.String():   {oneNode: true, readersOnly: true},
	csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY.String():    {readersOnly: true},
	csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER.String():  {oneWriter: true},
	csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER.String():   {},
}

// ruleOf returns the rule of a claim's access mode; a mode that is not
// known gets the strictest rule.
func ruleOf(c *csisupdv1.VolumeClaim) (string, accessRule) {
	mode := c.GetUsage().GetAccessMode()
	if r, ok := accessModes[mode]; ok {
		return mode, r
	}
	return mode, accessRule{oneNode: true, oneWriter: true, readersOnly: true}
}

func rw(readOnly bool) string {
	if readOnly {
		return "read-only"
	}
	return "read-write"
}

// accessConflict returns why claim c cannot be added next to the existing
// claim old, or "". Both claims' access modes are respected: the stricter
// wins.
func accessConflict(c, old *csisupdv1.VolumeClaim) string {
	for _, cl := range []*csisupdv1.VolumeClaim{c, old} {
		mode, r := ruleOf(cl)
		var why string
		switch {
		case r.oneNode && c.GetNodeId() != old.GetNodeId():
			why = "keeps the volume on one node"
		case r.readersOnly && (!c.GetReadOnly() || !old.GetReadOnly()):
			why = "allows read-only claims only"
		case r.oneWriter && !c.GetReadOnly() && !old.GetReadOnly():
			why = "allows one writer"
		}
		if why != "" {
			oldMode, _ := ruleOf(old)
			return fmt.Sprintf("access mode %s %s, and workload %q holds a claim on node %q (%s, %s, state %s)",
				mode, why, old.GetWorkloadId(), old.GetNodeId(), oldMode, rw(old.GetReadOnly()), old.GetState())
		}
	}
	return ""
}

// nodePlugin returns the plugin instance a node reports for a plugin id,
// or nil.
func nodePlugin(node *csisupdv1.ClusterNode, pluginID string) *csisupdv1.Plugin {
	for _, p := range node.GetPlugins() {
		if p.GetId() == pluginID {
			return p
		}
	}
	return nil
}

// topologyFits reports whether a node with the topology have can reach a
// volume reachable from segs: have holds every key and value of one
// segment. No segments means everywhere.
func topologyFits(segs []*csisupdv1.TopologySegment, have map[string]string) bool {
	if len(segs) == 0 {
		return true
	}
	for _, seg := range segs {
		fits := true
		for k, val := range seg.GetSegments() {
			if got, ok := have[k]; !ok || got != val {
				fits = false
				break
			}
		}
		if fits {
			return true
		}
	}
	return false
}

// admitClaim checks a new claim against the node, the volume and its
// claims, and returns the claim to record, in state taken.
func (s *Server) admitClaim(v *csisupdv1.Volume, req *csisupdv1.VolumeClaimRequest) (*csisupdv1.VolumeClaim, error) {
	node := s.State().Node(req.GetNodeId())
	if node == nil {
		return nil, status.Errorf(codes.NotFound, "node %q not found", req.GetNodeId())
	}
	if node.GetStatus() != state.NodeStatusReady {
		return nil, csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleNodeNotReady,
			fmt.Sprintf("node %q is %s (%s)", node.GetId(), node.GetStatus(), node.GetStatusDescription()))
	}
	if !s.heartbeats.confirmedNode(node.GetId()) {
		return nil, nodeInitializingError(node.GetId(), s.heartbeats.view().desc)
	}
	p := nodePlugin(node, v.GetPluginId())
	if _, nodeService := state.PluginRoles(p.GetType()); p == nil || !nodeService || !p.GetHealthy() || p.GetNodeId() == "" {
		why := "does not run there"
		switch {
		case p == nil:
		case !nodeService:
			why = fmt.Sprintf("runs there as a %s plugin, without the node service", p.GetType())
		case !p.GetHealthy():
			why = fmt.Sprintf("is unhealthy there (%s)", p.GetHealthDescription())
		default:
			why = "reports no CSI node id there"
		}
		return nil, csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRulePlugin,
			fmt.Sprintf("plugin %q of volume %q %s: node %q", v.GetPluginId(), v.GetId(), why, node.GetId()))
	}
	usage, err := claimUsage(v, req)
	if err != nil {
		return nil, err
	}
	if !slices.ContainsFunc(defaultCapabilities(v.GetCapabilities()), func(c *csisupdv1.VolumeCapability) bool {
		typ, mode := c.GetAccessType(), c.GetAccessMode()
		if typ == "" {
			typ = "mount"
		}
		if mode == "" {
			mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER.String()
		}
		return typ == usage.GetAccessType() && mode == usage.GetAccessMode()
	}) {
		var have []string
		for _, c := range defaultCapabilities(v.GetCapabilities()) {
			have = append(have, c.GetAccessType()+" "+c.GetAccessMode())
		}
		return nil, csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleCapability,
			fmt.Sprintf("volume %q has no capability %s %s (it has: %s)", v.GetId(), usage.GetAccessType(), usage.GetAccessMode(), strings.Join(have, ", ")))
	}
	if !topologyFits(v.GetAccessibleTopology(), p.GetAccessibleTopology()) {
		var segs []string
		for _, seg := range v.GetAccessibleTopology() {
			segs = append(segs, fmt.Sprint(seg.GetSegments()))
		}
		return nil, csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleTopology,
			fmt.Sprintf("volume %q is reachable from %s; node %q has topology %v", v.GetId(), strings.Join(segs, " or "), node.GetId(), p.GetAccessibleTopology()))
	}
	if limit := p.GetMaxVolumes(); limit > 0 {
		used := map[string]bool{}
		for _, other := range s.State().Volumes(v.GetPluginId()) {
			if other.GetId() == v.GetId() {
				continue
			}
			if slices.ContainsFunc(other.GetClaims(), func(c *csisupdv1.VolumeClaim) bool { return c.GetNodeId() == node.GetId() }) {
				used[other.GetId()] = true
			}
		}
		if len(used) >= int(limit) {
			return nil, csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleMaxVolumes,
				fmt.Sprintf("node %q already has %d volumes of plugin %q claimed, its max_volumes", node.GetId(), len(used), v.GetPluginId()))
		}
	}
	claim := &csisupdv1.VolumeClaim{
		NodeId:         node.GetId(),
		CsiNodeId:      p.GetNodeId(),
		ReadOnly:       usage.GetReadOnly(),
		ClaimedAt:      timestamppb.Now(),
		WorkloadId:     req.GetWorkloadId(),
		State:          ClaimStateTaken,
		Usage:          usage,
		StateUpdatedAt: timestamppb.Now(),
	}
	if mode, r := ruleOf(claim); r.readersOnly && !claim.GetReadOnly() {
		return nil, csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleAccessMode,
			fmt.Sprintf("access mode %s allows read-only claims only; the claim of workload %q is read-write", mode, claim.GetWorkloadId()))
	}
	for _, old := range v.GetClaims() {
		if why := accessConflict(claim, old); why != "" {
			return nil, csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleAccessMode, why)
		}
	}
	// Claims on one node share one controller publication: a read-write
	// claim cannot use a read-only one.
	if !claim.GetReadOnly() && s.controllerAdvertises(v.GetPluginId(), capPublishReadonly) {
		for _, old := range v.GetClaims() {
			if old.GetNodeId() == claim.GetNodeId() && old.GetControllerPublished() && old.GetReadOnly() &&
				!slices.ContainsFunc(v.GetClaims(), func(c *csisupdv1.VolumeClaim) bool {
					return c.GetNodeId() == claim.GetNodeId() && c.GetControllerPublished() && !c.GetReadOnly()
				}) {
				return nil, csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleAccessMode,
					fmt.Sprintf("volume %q is published read-only to node %q for workload %q; a read-write claim there needs the read-only claims released first",
						v.GetId(), claim.GetNodeId(), old.GetWorkloadId()))
			}
		}
	}
	return claim, nil
}

// nodeInitializingError refuses a claim on a node stored ready that has
// not heartbeated to this leader yet: Unavailable and retryable, since the
// node's next heartbeat, due within the failover TTL, admits it.
func nodeInitializingError(nodeID, why string) error {
	if why == "" {
		why = "no heartbeat to the current leader yet"
	}
	return csisupdv1.NewClaimDeferredError(csisupdv1.ClaimRuleNodeNotReady,
		fmt.Sprintf("node %q is %s (%s)", nodeID, state.NodeStatusInitializing, why),
		"the node's next heartbeat to the leader confirms it")
}

// controllerAdvertises reports whether a controller instance of the
// plugin, healthy or not, advertises a controller capability:
// PUBLISH_UNPUBLISH_VOLUME (the plugin's claims are published by the
// controller) or PUBLISH_READONLY (read-only claims are published
// read-only).
func (s *Server) controllerAdvertises(pluginID, capability string) bool {
	for _, inst := range s.State().Plugin(pluginID).GetInstances() {
		if ctrl, _ := state.PluginRoles(inst.GetPlugin().GetType()); ctrl &&
			slices.Contains(inst.GetPlugin().GetControllerCapabilities(), capability) {
			return true
		}
	}
	return false
}

// publishCandidates returns the healthy controllers of a plugin that can
// publish and unpublish.
func (s *Server) publishCandidates(pluginID string) ([]candidate, error) {
	cands, err := s.controllerCandidates(pluginID)
	if err != nil {
		return nil, err
	}
	if cands = withCapability(cands, capPublishUnpublish); len(cands) == 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "plugin %q has no healthy controller with %s", pluginID, capPublishUnpublish)
	}
	return cands, nil
}

// finishClaim runs the steps a taken claim still lacks: controller publish
// (shared with another claim of the volume on the node when one is
// published), then the mount on the node. The result of each is recorded
// through raft before the next begins.
func (s *Server) finishClaim(ctx context.Context, v *csisupdv1.Volume, claim *csisupdv1.VolumeClaim, secrets map[string]string) (*csisupdv1.Volume, *csisupdv1.VolumeClaim, error) {
	ref := refOf(v.GetId(), claim)
	var err error
	// The publication and the mount are recorded together, in one write
	// after both: a claim that stops between them is released (its
	// controller publication with it) or claimed again, and both steps are
	// idempotent. Only the taken claim must be in raft before they start.
	pc, published := claim.GetPublishContext(), claim.GetControllerPublished()
	if !published {
		// A read-write publication serves every claim; a read-only one
		// serves read-only claims (admitClaim refused the others).
		var shared *csisupdv1.VolumeClaim
		for _, c := range v.GetClaims() {
			if c != claim && c.GetNodeId() == claim.GetNodeId() && c.GetControllerPublished() &&
				(shared == nil || !c.GetReadOnly()) {
				shared = c
			}
		}
		switch {
		case shared != nil:
			pc, published = maps.Clone(shared.GetPublishContext()), true
		case s.controllerAdvertises(v.GetPluginId(), capPublishUnpublish):
			if pc, err = s.controllerPublish(ctx, v, claim, secrets); err != nil {
				return nil, nil, err
			}
			published = true
		}
	}
	hostPath, mounted := claim.GetHostPath(), claim.GetMounted()
	if !mounted {
		node := s.State().Node(claim.GetNodeId())
		if node == nil {
			return nil, nil, status.Errorf(codes.NotFound, "node %q not found", claim.GetNodeId())
		}
		mctx, cancel := context.WithTimeout(ctx, s.cfg.RPCTimeout)
		m, err := s.nodeVolumes.MountVolume(mctx, node.GetAddress(), &csisupdv1.MountVolumeRequest{
			PluginId:       v.GetPluginId(),
			VolumeId:       v.GetId(),
			ExternalId:     v.GetExternalId(),
			WorkloadId:     claim.GetWorkloadId(),
			Usage:          claim.GetUsage(),
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
		hostPath, mounted = m.GetHostPath(), true
	}
	if published != claim.GetControllerPublished() || mounted != claim.GetMounted() {
		if v, claim, err = s.updateClaim(ref, func(c *csisupdv1.VolumeClaim) {
			c.PublishContext, c.ControllerPublished = pc, published
			c.HostPath, c.Mounted = hostPath, mounted
		}); err != nil {
			return nil, nil, err
		}
	}
	return v, claim, nil
}

// controllerPublish calls ControllerPublishVolume for a claim and returns
// the publish context.
func (s *Server) controllerPublish(ctx context.Context, v *csisupdv1.Volume, claim *csisupdv1.VolumeClaim, secrets map[string]string) (map[string]string, error) {
	cands, err := s.publishCandidates(v.GetPluginId())
	if err != nil {
		return nil, err
	}
	csiCap, err := csiCapability(usageCapability(claim.GetUsage()))
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
			Readonly: claim.GetReadOnly() && slices.Contains(c.plugin.GetControllerCapabilities(), capPublishReadonly),
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
func (s *Server) releaseVolume(ctx context.Context, req *csisupdv1.VolumeReleaseRequest) (*csisupdv1.Volume, error) {
	if req.GetId() == "" || req.GetNodeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "release volume: id and node_id are required")
	}
	unlock, err := s.volumeLocks.Lock(ctx, req.GetId())
	if err != nil {
		return nil, toStatus(err)
	}
	defer unlock()
	v := s.State().Volume(req.GetId())
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %q not found", req.GetId())
	}
	match := func(c *csisupdv1.VolumeClaim) bool {
		return c.GetNodeId() == req.GetNodeId() && (req.GetWorkloadId() == "" || c.GetWorkloadId() == req.GetWorkloadId())
	}
	var refs []claimRef
	taken := false
	for _, c := range v.GetClaims() {
		if match(c) {
			refs = append(refs, refOf(v.GetId(), c))
			taken = taken || c.GetState() == ClaimStateTaken
		}
	}
	if len(refs) == 0 {
		return v, nil
	}
	if taken {
		if _, err := s.updateVolume(v.GetId(), func(v *csisupdv1.Volume) error {
			for _, c := range v.GetClaims() {
				if match(c) && c.GetState() == ClaimStateTaken {
					setState(c, ClaimStateUnpublishing)
					c.LastError = ""
				}
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	var first error
	for _, ref := range refs {
		if err := s.runRelease(ctx, ref, req.GetSecrets()); err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return nil, first
	}
	if v = s.State().Volume(req.GetId()); v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %q not found", req.GetId())
	}
	return v, nil
}

// runRelease runs the release steps of one claim from its recorded state
// until it is freed, each recorded through raft before the next begins. A
// failed step is recorded in the claim's last_error and returned. The
// caller holds the volume's lock. A claim that is gone is done.
func (s *Server) runRelease(ctx context.Context, ref claimRef, secrets map[string]string) error {
	for {
		beatCtx(ctx)
		if err := ctx.Err(); err != nil {
			return toStatus(err)
		}
		v := s.State().Volume(ref.volumeID)
		if v == nil {
			return nil
		}
		_, c := findClaim(v, ref.nodeID, ref.workloadID)
		if c == nil {
			return nil
		}
		var err error
		switch c.GetState() {
		case ClaimStateUnpublishing:
			err = s.nodeUnpublish(ctx, v, c)
		case ClaimStateNodeUnpublished:
			err = s.controllerUnpublish(ctx, v, c, secrets)
		case ClaimStateControllerUnpublished:
			_, err = s.updateVolume(ref.volumeID, func(v *csisupdv1.Volume) error {
				if i, _ := findClaim(v, ref.nodeID, ref.workloadID); i >= 0 {
					v.Claims = slices.Delete(v.Claims, i, i+1)
				}
				return nil
			})
			if err == nil {
				s.logger.Info("volume claim freed", "volume", ref.volumeID, "node", ref.nodeID, "workload", ref.workloadID)
			}
		default:
			return status.Errorf(codes.FailedPrecondition, "claim of %s is %s, not being released", ref, c.GetState())
		}
		if err != nil {
			msg := scrubSecrets(err.Error(), secrets)
			if c.GetLastError() != msg {
				if _, _, uerr := s.updateClaim(ref, func(c *csisupdv1.VolumeClaim) { c.LastError = msg }); uerr != nil {
					s.logger.Warn("record a failed release step", "volume", ref.volumeID, "node", ref.nodeID,
						"workload", ref.workloadID, "error", uerr)
				}
			}
			return err
		}
	}
}

// nodeUnpublish unmounts a claim on its node's agent, unless the claim is
// released without its node, and records node-unpublished.
func (s *Server) nodeUnpublish(ctx context.Context, v *csisupdv1.Volume, c *csisupdv1.VolumeClaim) error {
	ref := refOf(v.GetId(), c)
	node := s.State().Node(c.GetNodeId())
	switch {
	case c.GetNodeGone():
	case node == nil:
		return status.Errorf(codes.NotFound, "unmount volume %q for workload %q: node %q not found", v.GetId(), c.GetWorkloadId(), c.GetNodeId())
	default:
		uctx, cancel := context.WithTimeout(ctx, s.cfg.RPCTimeout)
		err := s.nodeVolumes.UnmountVolume(uctx, node.GetAddress(), &csisupdv1.UnmountVolumeRequest{
			PluginId: v.GetPluginId(), VolumeId: v.GetId(), WorkloadId: c.GetWorkloadId(), Usage: c.GetUsage(),
		})
		cancel()
		if err != nil {
			return fmt.Errorf("unmount volume %q for workload %q on node %q (%s): %w",
				v.GetId(), c.GetWorkloadId(), node.GetId(), node.GetAddress(), err)
		}
	}
	_, _, err := s.updateClaim(ref, func(c *csisupdv1.VolumeClaim) {
		setState(c, ClaimStateNodeUnpublished)
		c.Mounted, c.LastError = false, ""
	})
	return err
}

// controllerUnpublish calls ControllerUnpublishVolume for a claim when the
// plugin publishes (or the claim was published) and no other claim of the
// volume is left on the node, and records controller-unpublished.
func (s *Server) controllerUnpublish(ctx context.Context, v *csisupdv1.Volume, c *csisupdv1.VolumeClaim, secrets map[string]string) error {
	ref := refOf(v.GetId(), c)
	others := slices.ContainsFunc(v.GetClaims(), func(o *csisupdv1.VolumeClaim) bool {
		return o != c && o.GetNodeId() == c.GetNodeId()
	})
	if !others && (c.GetControllerPublished() || s.controllerAdvertises(v.GetPluginId(), capPublishUnpublish)) {
		cands, err := s.publishCandidates(v.GetPluginId())
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
	_, _, err := s.updateClaim(ref, func(c *csisupdv1.VolumeClaim) {
		setState(c, ClaimStateControllerUnpublished)
		c.ControllerPublished, c.LastError = false, ""
	})
	return err
}

// scrubSecrets replaces the secret values in msg, so that a plugin's error
// that repeats one is neither logged nor stored.
func scrubSecrets(msg string, secrets map[string]string) string {
	for _, val := range secrets {
		if val != "" {
			msg = strings.ReplaceAll(msg, val, "[redacted]")
		}
	}
	return msg
}

// nodeClaims returns the claims the cluster holds for a node, except
// those released without it, sorted by volume and workload.
func (s *Server) nodeClaims(nodeID string) *csisupdv1.NodeClaimsResponse {
	st := s.State()
	out := &csisupdv1.NodeClaimsResponse{Index: st.LatestIndex()}
	for _, v := range st.Volumes("") {
		for _, c := range v.GetClaims() {
			if c.GetNodeId() == nodeID && !c.GetNodeGone() {
				out.Claims = append(out.Claims, &csisupdv1.NodeClaimRef{
					VolumeId: v.GetId(), WorkloadId: c.GetWorkloadId(), ClaimIndex: c.GetClaimIndex(),
				})
			}
		}
	}
	slices.SortFunc(out.Claims, func(a, b *csisupdv1.NodeClaimRef) int {
		return cmp.Or(strings.Compare(a.GetVolumeId(), b.GetVolumeId()), strings.Compare(a.GetWorkloadId(), b.GetWorkloadId()))
	})
	return out
}
