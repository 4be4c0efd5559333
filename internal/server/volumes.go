package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/ids"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/server/leader"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// candidate is one controller instance a volume operation may use.
type candidate struct {
	nodeID string
	addr   string
	plugin *statepb.Plugin
	// confirmed is set when the node has heartbeated to, or answered a
	// call of, this leader since it took over or restored a snapshot.
	confirmed bool
}

// controllerCandidates returns the healthy controller instances of a plugin
// on ready nodes: first those on nodes this leader has heard from since it
// took over or restored a snapshot, then those on nodes it has not heard
// from yet, each group in node id order. A node not heard from is still
// tried, so that volume work goes on at once after a leader change rather
// than after the nodes' next heartbeats; a successful call confirms it
// (callControllers).
func (s *Server) controllerCandidates(pluginID string) ([]candidate, error) {
	p := s.State().Plugin(pluginID)
	if p == nil {
		return nil, csisupdv1.NewPluginNotKnownError(pluginID)
	}
	var confirmed, unconfirmed []candidate
	for _, inst := range p.Instances {
		if ctrl, _ := plugin.Type(inst.Plugin.GetType()).Roles(); !ctrl || !inst.Healthy {
			continue
		}
		node := s.State().Node(inst.NodeID)
		if node == nil || node.GetStatus() != state.NodeStatusReady {
			continue
		}
		c := candidate{nodeID: node.GetId(), addr: node.GetAddress(), plugin: inst.Plugin, confirmed: s.heartbeats.Confirmed(node.GetId())}
		if c.confirmed {
			confirmed = append(confirmed, c)
		} else {
			unconfirmed = append(unconfirmed, c)
		}
	}
	if out := append(confirmed, unconfirmed...); len(out) > 0 {
		return out, nil
	}
	return nil, status.Errorf(codes.FailedPrecondition,
		"plugin %q has no healthy controller instance on a ready node (%d of %d controllers healthy)",
		pluginID, p.ControllersHealthy, p.ControllersExpected)
}

// capableControllers returns the plugin's controller candidates that
// advertise capability, or the error that says there are none.
func (s *Server) capableControllers(pluginID, capability string) ([]candidate, error) {
	cands, err := s.controllerCandidates(pluginID)
	if err != nil {
		return nil, err
	}
	if cands = withCapability(cands, capability); len(cands) == 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "plugin %q has no healthy controller with %s", pluginID, capability)
	}
	return cands, nil
}

// withCapability keeps the candidates that advertise a controller capability.
func withCapability(cands []candidate, capability string) []candidate {
	var out []candidate
	for _, c := range cands {
		if slices.Contains(c.plugin.GetControllerCapabilities(), capability) {
			out = append(out, c)
		}
	}
	return out
}

// callControllers calls fn on each candidate in order, moving to the next
// one on a retryable error, and, for a node this leader has not heard from
// yet, also when its agent could not be reached in time: such a node may
// be long gone. The first node that answers is confirmed, as a heartbeat
// would; a node whose call failed is not. It returns the candidate that
// answered.
func (s *Server) callControllers(ctx context.Context, op string, cands []candidate, fn func(ctx context.Context, c candidate) error) (candidate, error) {
	var errs []error
	for _, c := range cands {
		leader.Beat(ctx)
		cctx, cancel := context.WithTimeout(ctx, s.cfg.RPCTimeout)
		leader.BusyWith(ctx, cctx)
		err := fn(cctx, c)
		cancel()
		if err == nil {
			s.heartbeats.Confirm(c.nodeID)
			return c, nil
		}
		errs = append(errs, fmt.Errorf("node %s (%s): %w", c.nodeID, c.addr, err))
		if ctx.Err() != nil || !tryNext(s.cfg.IsRetryable, c, err) {
			return c, err
		}
		s.logger.Warn("controller call failed; trying the next candidate", "op", op, "node", c.nodeID, "confirmed", c.confirmed, "error", err)
	}
	return candidate{}, status.Errorf(codes.Unavailable, "%s: every controller candidate failed: %v", op, errors.Join(errs...))
}

// tryNext reports whether the failed call to c leaves the next candidate
// worth a try: the error is retryable, or c is on a node this leader has
// not heard from and its agent could not be reached, or not in time.
func tryNext(isRetryable func(error) bool, c candidate, err error) bool {
	if isRetryable(err) {
		return true
	}
	if c.confirmed {
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	return errors.Is(err, context.DeadlineExceeded)
}

// checkVolumeID refuses a volume id that cannot name a directory: agents
// stage and publish a volume under its id.
func checkVolumeID(op, id string) error {
	if !ids.ValidPathID(id) {
		return status.Errorf(codes.InvalidArgument, "%s: id %q must match %s and not be . or ..", op, id, ids.PluginIDPattern)
	}
	return nil
}

// createVolume runs on the leader.
func (s *Server) createVolume(ctx context.Context, req *csisupdv1.VolumeCreateRequest) (*statepb.Volume, error) {
	if req.GetId() == "" || req.GetPluginId() == "" {
		return nil, status.Error(codes.InvalidArgument, "create volume: id and plugin_id are required")
	}
	if err := checkVolumeID("create volume", req.GetId()); err != nil {
		return nil, err
	}
	caps := rules.DefaultCapabilities(statepb.VolumeCapabilitiesFromAPI(req.GetCapabilities()))
	var csiCaps []*csi.VolumeCapability
	for _, c := range caps {
		cc, err := rules.CSICapability(c)
		if err != nil {
			return nil, err
		}
		csiCaps = append(csiCaps, cc)
	}
	unlock, err := s.pluginLocks.Lock(ctx, req.GetPluginId())
	if err != nil {
		return nil, toStatus(err)
	}
	defer unlock()
	unlockVolume, err := s.volumeLocks.Lock(ctx, req.GetId())
	if err != nil {
		return nil, toStatus(err)
	}
	defer unlockVolume()

	if v := s.State().Volume(req.GetId()); v != nil {
		if v.GetPluginId() != req.GetPluginId() {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q already exists for plugin %q", req.GetId(), v.GetPluginId())
		}
		if err := s.confirmLeader(); err != nil {
			return nil, err
		}
		return v, nil
	}
	place := placementOf(req.GetAccessibilityRequirements())
	source, err := s.contentSource(req, &place)
	if err != nil {
		return nil, err
	}
	capability := plugin.CapCreateDeleteVolume
	if req.GetContentSource().GetVolumeId() != "" {
		capability = plugin.CapCloneVolume
	}
	cands, err := s.placedControllers(req.GetPluginId(), capability, place)
	if err != nil {
		return nil, err
	}
	csiReq := &csi.CreateVolumeRequest{
		Name:                      req.GetId(),
		VolumeCapabilities:        csiCaps,
		Parameters:                req.GetParameters(),
		Secrets:                   req.GetSecrets(),
		AccessibilityRequirements: place.csiRequirement(),
		VolumeContentSource:       source,
		MutableParameters:         req.GetMutableParameters(),
	}
	if req.GetCapacityMinBytes() > 0 || req.GetCapacityMaxBytes() > 0 {
		csiReq.CapacityRange = &csi.CapacityRange{RequiredBytes: req.GetCapacityMinBytes(), LimitBytes: req.GetCapacityMaxBytes()}
	}
	var resp *csi.CreateVolumeResponse
	used, err := s.callControllers(ctx, "CreateVolume", cands, func(ctx context.Context, c candidate) error {
		var err error
		resp, err = s.controllers.CreateVolume(ctx, c.addr, req.GetPluginId(), csiReq)
		return err
	})
	if err != nil {
		return nil, err
	}
	v := &statepb.Volume{
		Id:                 req.GetId(),
		PluginId:           req.GetPluginId(),
		ExternalId:         resp.GetVolume().GetVolumeId(),
		CapacityBytes:      resp.GetVolume().GetCapacityBytes(),
		Context:            resp.GetVolume().GetVolumeContext(),
		Parameters:         req.GetParameters(),
		Capabilities:       caps,
		ControllerNodeId:   used.nodeID,
		CreatedAt:          timestamppb.Now(),
		CapacityLimitBytes: req.GetCapacityMaxBytes(),
		ContentSource:      statepb.VolumeContentSourceFromAPI(req.GetContentSource()),
		MutableParameters:  req.GetMutableParameters(),
	}
	for _, t := range resp.GetVolume().GetAccessibleTopology() {
		v.AccessibleTopology = append(v.AccessibleTopology, &statepb.TopologySegment{Segments: t.GetSegments()})
	}
	if !place.createdWithin(v.AccessibleTopology) {
		return nil, s.undoMisplacedCreate(ctx, used, v, req.GetSecrets(), place)
	}
	return s.addVolume(v)
}

// addVolume writes a new volume through raft (volume_create, which the
// FSM refuses when the id is taken) and returns it as stored.
func (s *Server) addVolume(v *statepb.Volume) (*statepb.Volume, error) {
	stored, err := s.applyVolume(v.GetId(), &statepb.LogEntry{Command: &statepb.LogEntry_VolumeCreate{
		VolumeCreate: &statepb.VolumeCreateCommand{Volume: v},
	}})
	if err != nil {
		return nil, err
	}
	if stored == nil {
		return nil, status.Errorf(codes.Internal, "volume %q: not stored after it was added", v.GetId())
	}
	return stored, nil
}

// registerVolume runs on the leader. v is the caller's copy, which it
// changes.
func (s *Server) registerVolume(ctx context.Context, v *statepb.Volume) (*statepb.Volume, error) {
	if v.GetId() == "" || v.GetPluginId() == "" || v.GetExternalId() == "" {
		return nil, status.Error(codes.InvalidArgument, "register volume: id, plugin_id and external_id are required")
	}
	if err := checkVolumeID("register volume", v.GetId()); err != nil {
		return nil, err
	}
	v.Claims = nil
	v.Capabilities = rules.DefaultCapabilities(v.Capabilities)
	for _, c := range v.Capabilities {
		if _, err := rules.CSICapability(c); err != nil {
			return nil, err
		}
	}
	unlock, err := s.pluginLocks.Lock(ctx, v.GetPluginId())
	if err != nil {
		return nil, toStatus(err)
	}
	defer unlock()
	unlockVolume, err := s.volumeLocks.Lock(ctx, v.GetId())
	if err != nil {
		return nil, toStatus(err)
	}
	defer unlockVolume()
	if old := s.State().Volume(v.GetId()); old != nil {
		if old.GetPluginId() != v.GetPluginId() || old.GetExternalId() != v.GetExternalId() {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q already exists as %s/%s", v.GetId(), old.GetPluginId(), old.GetExternalId())
		}
		return old, nil
	}
	return s.addVolume(v)
}

// deleteVolume runs on the leader. A forced deregistration forgets a
// volume with claims, and returns them: what the nodes may still hold.
func (s *Server) deleteVolume(ctx context.Context, req *csisupdv1.VolumeDeleteRequest) ([]*statepb.VolumeClaim, error) {
	v := s.State().Volume(req.GetId())
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %q not found", req.GetId())
	}
	unlock, err := s.pluginLocks.Lock(ctx, v.GetPluginId())
	if err != nil {
		return nil, toStatus(err)
	}
	defer unlock()
	// The volume lock keeps claims out until the volume is gone.
	unlockVolume, err := s.volumeLocks.Lock(ctx, req.GetId())
	if err != nil {
		return nil, toStatus(err)
	}
	defer unlockVolume()
	// Read again under the locks: another call may have changed it.
	if v = s.State().Volume(req.GetId()); v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %q not found", req.GetId())
	}
	cmd := &statepb.VolumeDeleteCommand{VolumeId: v.GetId(), VolumeIndex: v.GetModifyIndex(), Forced: req.GetForce() && req.GetDeregisterOnly()}
	if err := rules.CheckDelete(v, cmd); err != nil {
		return nil, err
	}
	// Refused before the plugin is called, as the FSM would refuse it
	// after.
	if err := rules.CheckDeleteWithSnapshots(v, s.State().VolumeSnapshots()); err != nil {
		return nil, err
	}
	if !req.GetDeregisterOnly() {
		// A node-local controller answers success for a volume it does
		// not have (CSI: deleting an unknown volume succeeds), so the
		// delete must reach one that holds it.
		cands, err := s.placedControllers(v.GetPluginId(), plugin.CapCreateDeleteVolume, placementAt(v.GetAccessibleTopology(), v.GetControllerNodeId()))
		if err != nil {
			return nil, err
		}
		csiReq := &csi.DeleteVolumeRequest{VolumeId: v.GetExternalId(), Secrets: req.GetSecrets()}
		_, err = s.callControllers(ctx, "DeleteVolume", cands, func(ctx context.Context, c candidate) error {
			err := s.controllers.DeleteVolume(ctx, c.addr, v.GetPluginId(), csiReq)
			if status.Code(err) == codes.NotFound && !csisupdv1.IsPluginNotFound(err) {
				return nil // already gone
			}
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	if _, err = s.applyVolume(v.GetId(), &statepb.LogEntry{Command: &statepb.LogEntry_VolumeDeleteChecked{VolumeDeleteChecked: cmd}}); err != nil {
		return nil, err
	}
	if n := len(v.GetClaims()); n > 0 {
		s.logger.Warn("volume deregistered by force with claims left", "volume", v.GetId(), "claims", n, "left", rules.Describe(v.GetClaims()))
	}
	return v.GetClaims(), nil
}

// placedControllers returns the controller candidates of a plugin that
// advertise capability and that place allows, in the order place ranks
// them; it refuses with a typed error when none qualifies.
func (s *Server) placedControllers(pluginID, capability string, place placement) ([]candidate, error) {
	cands, err := s.controllerCandidates(pluginID)
	if err != nil {
		return nil, err
	}
	if cands = withCapability(cands, capability); len(cands) == 0 {
		return nil, csisupdv1.NewCapabilityMissingError(pluginID, "the volume operation", capability)
	}
	ranked := place.rank(cands)
	if ranked == nil {
		return nil, place.unsatisfiable(pluginID, cands)
	}
	return ranked, nil
}

// contentSource checks the snapshot or volume a new volume starts from,
// adds where it lies to place, and returns it as the plugin knows it.
func (s *Server) contentSource(req *csisupdv1.VolumeCreateRequest, place *placement) (*csi.VolumeContentSource, error) {
	src := req.GetContentSource()
	switch {
	case src.GetSnapshotId() != "":
		snap := s.State().VolumeSnapshot(src.GetSnapshotId())
		if snap == nil {
			return nil, status.Errorf(codes.NotFound, "create volume %q: snapshot %q not found", req.GetId(), src.GetSnapshotId())
		}
		if snap.GetPluginId() != req.GetPluginId() {
			return nil, status.Errorf(codes.InvalidArgument, "create volume %q: snapshot %q belongs to plugin %q, not %q", req.GetId(), snap.GetId(), snap.GetPluginId(), req.GetPluginId())
		}
		if snap.GetState() != rules.SnapshotCreated || !snap.GetReadyToUse() {
			return nil, status.Errorf(codes.FailedPrecondition, "create volume %q: snapshot %q is not ready to use yet (state %s)", req.GetId(), snap.GetId(), snap.GetState())
		}
		place.source, place.sourceNode = snap.GetAccessibleTopology(), snap.GetControllerNodeId()
		return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetExternalId()},
		}}, nil
	case src.GetVolumeId() != "":
		vol := s.State().Volume(src.GetVolumeId())
		if vol == nil {
			return nil, status.Errorf(codes.NotFound, "create volume %q: source volume %q not found", req.GetId(), src.GetVolumeId())
		}
		if vol.GetPluginId() != req.GetPluginId() {
			return nil, status.Errorf(codes.InvalidArgument, "create volume %q: volume %q belongs to plugin %q, not %q", req.GetId(), vol.GetId(), vol.GetPluginId(), req.GetPluginId())
		}
		place.source, place.sourceNode = vol.GetAccessibleTopology(), vol.GetControllerNodeId()
		return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
			Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: vol.GetExternalId()},
		}}, nil
	}
	return nil, nil
}

// undoMisplacedCreate deletes a volume the plugin created outside every
// requisite segment (it ignored the requirement) and returns the refusal
// that says so; the volume is not recorded.
func (s *Server) undoMisplacedCreate(ctx context.Context, used candidate, v *statepb.Volume, secrets map[string]string, place placement) error {
	var got []string
	for _, t := range v.GetAccessibleTopology() {
		got = append(got, segmentString(t.GetSegments()))
	}
	reason := fmt.Sprintf("the controller on node %s created volume %q (external id %q) accessible from [%s] only: the plugin ignored the requirement",
		used.nodeID, v.GetId(), v.GetExternalId(), strings.Join(got, " | "))
	s.logger.Warn("plugin created a volume outside its topology requirement; deleting it", "volume", v.GetId(), "plugin", v.GetPluginId(),
		"node", used.nodeID, "external_id", v.GetExternalId())
	dctx, cancel := context.WithTimeout(ctx, s.cfg.RPCTimeout)
	defer cancel()
	err := s.controllers.DeleteVolume(dctx, used.addr, v.GetPluginId(), &csi.DeleteVolumeRequest{VolumeId: v.GetExternalId(), Secrets: secrets})
	if err != nil && !(status.Code(err) == codes.NotFound && !csisupdv1.IsPluginNotFound(err)) {
		reason += fmt.Sprintf("; deleting it failed, so it is left in the plugin: %v", rules.ScrubSecrets(err.Error(), secrets))
	} else {
		reason += "; it was deleted"
	}
	return csisupdv1.NewTopologyUnsatisfiableError(v.GetPluginId(), place.describe(), reason)
}
