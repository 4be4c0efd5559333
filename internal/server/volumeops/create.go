package volumeops

import (
	"context"
	"fmt"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/ids"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// checkVolumeID refuses a volume id that cannot name a directory: agents
// stage and publish a volume under its id.
func checkVolumeID(op, id string) error {
	if !ids.ValidPathID(id) {
		return status.Errorf(codes.InvalidArgument, "%s: id %q must match %s and not be . or ..", op, id, ids.PluginIDPattern)
	}
	return nil
}

// CreateVolume runs on the leader.
func (o *Ops) CreateVolume(ctx context.Context, req *csisupdv1.VolumeCreateRequest) (*statepb.Volume, error) {
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
	unlock, err := o.lockPluginAndVolume(ctx, req.GetPluginId(), req.GetId())
	if err != nil {
		return nil, err
	}
	defer unlock()

	if v := o.cfg.State().Volume(req.GetId()); v != nil {
		if v.GetPluginId() != req.GetPluginId() {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q already exists for plugin %q", req.GetId(), v.GetPluginId())
		}
		if err := o.confirmLeader(); err != nil {
			return nil, err
		}
		return v, nil
	}
	place := placementOf(req.GetAccessibilityRequirements())
	source, err := o.contentSource(req, &place)
	if err != nil {
		return nil, err
	}
	capability := plugin.CapCreateDeleteVolume
	if req.GetContentSource().GetVolumeId() != "" {
		capability = plugin.CapCloneVolume
	}
	cands, err := o.placedControllers(req.GetPluginId(), capability, place)
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
	used, err := o.callControllers(ctx, "CreateVolume", cands, func(ctx context.Context, c candidate) error {
		var err error
		resp, err = o.cfg.Controllers.CreateVolume(ctx, c.addr, req.GetPluginId(), csiReq)
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
		return nil, o.undoMisplacedCreate(ctx, used, v, req.GetSecrets(), place)
	}
	return o.addVolume(v)
}

// addVolume writes a new volume through raft (volume_create, which the
// FSM refuses when the id is taken) and returns it as stored.
func (o *Ops) addVolume(v *statepb.Volume) (*statepb.Volume, error) {
	stored, err := o.applyVolume(v.GetId(), &statepb.LogEntry{Command: &statepb.LogEntry_VolumeCreate{
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

// RegisterVolume runs on the leader. v is the caller's copy, which it
// changes.
func (o *Ops) RegisterVolume(ctx context.Context, v *statepb.Volume) (*statepb.Volume, error) {
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
	unlock, err := o.lockPluginAndVolume(ctx, v.GetPluginId(), v.GetId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	if old := o.cfg.State().Volume(v.GetId()); old != nil {
		if old.GetPluginId() != v.GetPluginId() || old.GetExternalId() != v.GetExternalId() {
			return nil, status.Errorf(codes.AlreadyExists, "volume %q already exists as %s/%s", v.GetId(), old.GetPluginId(), old.GetExternalId())
		}
		return old, nil
	}
	return o.addVolume(v)
}

// contentSource checks the snapshot or volume a new volume starts from,
// adds where it lies to place, and returns it as the plugin knows it.
func (o *Ops) contentSource(req *csisupdv1.VolumeCreateRequest, place *placement) (*csi.VolumeContentSource, error) {
	src := req.GetContentSource()
	switch {
	case src.GetSnapshotId() != "":
		snap := o.cfg.State().VolumeSnapshot(src.GetSnapshotId())
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
		vol := o.cfg.State().Volume(src.GetVolumeId())
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
func (o *Ops) undoMisplacedCreate(ctx context.Context, used candidate, v *statepb.Volume, secrets map[string]string, place placement) error {
	var got []string
	for _, t := range v.GetAccessibleTopology() {
		got = append(got, segmentString(t.GetSegments()))
	}
	reason := fmt.Sprintf("the controller on node %s created volume %q (external id %q) accessible from [%s] only: the plugin ignored the requirement",
		used.nodeID, v.GetId(), v.GetExternalId(), strings.Join(got, " | "))
	o.logger.Warn("plugin created a volume outside its topology requirement; deleting it", "volume", v.GetId(), "plugin", v.GetPluginId(),
		"node", used.nodeID, "external_id", v.GetExternalId())
	dctx, cancel := context.WithTimeout(ctx, o.cfg.RPCTimeout)
	defer cancel()
	err := o.cfg.Controllers.DeleteVolume(dctx, used.addr, v.GetPluginId(), &csi.DeleteVolumeRequest{VolumeId: v.GetExternalId(), Secrets: secrets})
	if err != nil && !(status.Code(err) == codes.NotFound && !csisupdv1.IsPluginNotFound(err)) {
		reason += fmt.Sprintf("; deleting it failed, so it is left in the plugin: %v", rules.ScrubSecrets(err.Error(), secrets))
	} else {
		reason += "; it was deleted"
	}
	return csisupdv1.NewTopologyUnsatisfiableError(v.GetPluginId(), place.describe(), reason)
}
