package volumeops

import (
	"cmp"
	"context"
	"fmt"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
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
	if _, _, err := createCapabilities(req); err != nil {
		return nil, err
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
	return o.createLocked(ctx, req, placementOf(req.GetAccessibilityRequirements()), false)
}

// createCapabilities returns the capabilities a new volume records (the
// request's, or the default) and the same as the plugin takes them.
func createCapabilities(req *csisupdv1.VolumeCreateRequest) ([]*statepb.VolumeCapability, []*csi.VolumeCapability, error) {
	caps := rules.DefaultCapabilities(statepb.VolumeCapabilitiesFromAPI(req.GetCapabilities()))
	var csiCaps []*csi.VolumeCapability
	for _, c := range caps {
		cc, err := rules.CSICapability(c)
		if err != nil {
			return nil, nil, err
		}
		csiCaps = append(csiCaps, cc)
	}
	return caps, csiCaps, nil
}

// createLocked creates the volume req names, which does not exist, through
// a controller that place allows, and records it (ephemeral: deleted at
// its last release). The caller holds the plugin's and the volume's
// locks.
func (o *Ops) createLocked(ctx context.Context, req *csisupdv1.VolumeCreateRequest, place placement, ephemeral bool) (*statepb.Volume, error) {
	caps, csiCaps, err := createCapabilities(req)
	if err != nil {
		return nil, err
	}
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
		Name:                      cmp.Or(req.GetName(), req.GetId()),
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
		Ephemeral:          ephemeral,
	}
	for _, t := range resp.GetVolume().GetAccessibleTopology() {
		v.AccessibleTopology = append(v.AccessibleTopology, &statepb.TopologySegment{Segments: t.GetSegments()})
	}
	if !place.createdWithin(v.AccessibleTopology) {
		return nil, o.undoMisplacedCreate(ctx, used, v, req.GetSecrets(), place)
	}
	return o.addVolume(v)
}

// volumeForClaim returns the volume a claim with create names, with the
// volume's lock held and the function that releases it. An existing
// volume is returned as it is (never created again; the admission of the
// claim checks that its capabilities serve the usage), unless it belongs
// to another plugin than the create's. A missing one is created first,
// under the plugin's lock too, as CreateVolume creates (create's fields,
// the claim's id), where rules.CreateTopology places it: on the claiming
// node's topology of the plugin. The claim is admitted against the volume
// it would make before the plugin is called, so that a claim refused
// anyway creates nothing. With ephemeral the volume records that its last
// release deletes it.
func (o *Ops) volumeForClaim(ctx context.Context, req *csisupdv1.VolumeClaimRequest) (*statepb.Volume, func(), error) {
	cr := req.GetCreate()
	if err := checkVolumeID("claim volume", req.GetId()); err != nil {
		return nil, nil, err
	}
	caps, _, err := createCapabilities(cr)
	if err != nil {
		return nil, nil, err
	}
	unlockPlugin, err := o.pluginLocks.Lock(ctx, cr.GetPluginId())
	if err != nil {
		return nil, nil, ctxStatus(err)
	}
	// Only the create needs the plugin's lock; the volume's is kept for
	// the claim.
	defer unlockPlugin()
	unlockVolume, err := o.volumeLocks.Lock(ctx, req.GetId())
	if err != nil {
		return nil, nil, ctxStatus(err)
	}
	fail := func(err error) (*statepb.Volume, func(), error) {
		unlockVolume()
		return nil, nil, err
	}
	// Read under the locks: a racing claim may have created it.
	if v := o.cfg.State().Volume(req.GetId()); v != nil {
		if v.GetPluginId() != cr.GetPluginId() {
			return fail(status.Errorf(codes.AlreadyExists, "claim volume: volume %q exists for plugin %q, not the create's %q",
				req.GetId(), v.GetPluginId(), cr.GetPluginId()))
		}
		return v, unlockVolume, nil
	}
	node := o.cfg.State().Node(req.GetNodeId())
	if node == nil {
		return fail(status.Errorf(codes.NotFound, "node %q not found", req.GetNodeId()))
	}
	topology, err := rules.CreateTopology(node, cr.GetPluginId(), cr.GetAccessibilityRequirements())
	if err != nil {
		return fail(err)
	}
	planned := &statepb.Volume{Id: req.GetId(), PluginId: cr.GetPluginId(), Capabilities: caps, AccessibleTopology: topology}
	if _, err := rules.Admit(o.cfg.State(), planned, req, timestamppb.Now()); err != nil {
		return fail(err)
	}
	creq := proto.Clone(cr).(*csisupdv1.VolumeCreateRequest)
	creq.Id = req.GetId()
	v, err := o.createLocked(ctx, creq, placement{requisite: topology, preferred: topology}, req.GetEphemeral())
	if err != nil {
		return fail(fmt.Errorf("create volume %q for the claim of workload %q on node %q: %w", req.GetId(), req.GetWorkloadId(), req.GetNodeId(), err))
	}
	o.logger.Info("volume created for its first claim", "volume", v.GetId(), "plugin", v.GetPluginId(), "node", req.GetNodeId(),
		"workload", req.GetWorkloadId(), "controller_node", v.GetControllerNodeId(), "ephemeral", v.GetEphemeral())
	return v, unlockVolume, nil
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
