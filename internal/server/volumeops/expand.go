package volumeops

import (
	"context"
	"errors"
	"slices"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// expansionPlugin is what the cluster knows of how a plugin expands
// volumes, from its instances' fingerprints.
type expansionPlugin struct {
	// controller: some controller instance has EXPAND_VOLUME.
	controller bool
	// node: some node instance has the EXPAND_VOLUME node capability.
	node bool
	// pluginCaps are the plugin capabilities of its instances.
	pluginCaps []string
}

func (o *Ops) expansionOf(pluginID string) expansionPlugin {
	var e expansionPlugin
	p := o.cfg.State().Plugin(pluginID)
	if p == nil {
		return e
	}
	for _, inst := range p.Instances {
		pl := inst.Plugin
		if slices.Contains(pl.GetControllerCapabilities(), plugin.CapExpandVolume) {
			e.controller = true
		}
		if slices.Contains(pl.GetNodeCapabilities(), plugin.CapExpandVolume) {
			e.node = true
		}
		for _, c := range pl.GetPluginCapabilities() {
			if !slices.Contains(e.pluginCaps, c) {
				e.pluginCaps = append(e.pluginCaps, c)
			}
		}
	}
	return e
}

// ExpandVolume runs on the leader: it records the expansion, then drives
// it to its end (driveExpansion). A failure leaves the expansion recorded
// with its last error, and the volume watcher finishes it.
func (o *Ops) ExpandVolume(ctx context.Context, req *csisupdv1.VolumeExpandRequest) (*statepb.Volume, error) {
	v, unlock, err := o.lockVolume(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	limit, done, err := rules.CheckExpandRequest(v, req.GetCapacityMinBytes(), req.GetCapacityMaxBytes())
	if err != nil || done {
		return v, err
	}
	if v.GetExpansion() == nil {
		exp := o.expansionOf(v.GetPluginId())
		if !exp.controller && !exp.node {
			return nil, csisupdv1.NewCapabilityMissingError(v.GetPluginId(), "ExpandVolume", plugin.CapExpandVolume)
		}
		if err := rules.CheckOfflineExpansion(v, exp.pluginCaps); err != nil {
			return nil, err
		}
		first := rules.ExpansionController
		if !exp.controller {
			first = rules.ExpansionNodes
		}
		if v, err = o.applyExpansion(rules.NewExpansion(v, req.GetCapacityMinBytes(), limit, first, timestamppb.Now())); err != nil {
			return nil, err
		}
	}
	return o.driveExpansion(ctx, v, req.GetSecrets())
}

// ResumeExpansion is the volume watcher's step for a volume whose
// expansion is under way; the caller holds the volume's lock.
func (o *Ops) ResumeExpansion(ctx context.Context, volumeID string) error {
	v := o.cfg.State().Volume(volumeID)
	if v == nil || v.GetExpansion() == nil {
		return nil
	}
	o.logger.Info("resuming volume expansion", "volume", volumeID, "capacity", v.GetExpansion().GetCapacityBytes(),
		"state", v.GetExpansion().GetState(), "nodes_pending", v.GetExpansion().GetNodesPending())
	_, err := o.driveExpansion(ctx, v, nil)
	return err
}

// driveExpansion runs the steps of v's expansion from its recorded state:
// ControllerExpandVolume (state controller), then NodeExpandVolume on each
// pending node (state nodes), recording each step through raft before the
// next, so that a new leader goes on where this one stopped.
func (o *Ops) driveExpansion(ctx context.Context, v *statepb.Volume, secrets map[string]string) (*statepb.Volume, error) {
	var err error
	if v.GetExpansion().GetState() == rules.ExpansionController {
		if v, err = o.expandController(ctx, v, secrets); err != nil {
			return nil, err
		}
	}
	for v.GetExpansion() != nil && len(v.GetExpansion().GetNodesPending()) > 0 {
		if v, err = o.expandNode(ctx, v, v.GetExpansion().GetNodesPending()[0], secrets); err != nil {
			return nil, err
		}
	}
	if e := v.GetExpansion(); e != nil {
		// Every node is done: the volume has the size asked for, or what
		// a node reported, whichever is larger.
		return o.applyExpansion(rules.ExpansionStep(v, nil, max(v.GetCapacityBytes(), e.GetCapacityBytes())))
	}
	return v, nil
}

// expandController calls ControllerExpandVolume through a controller that
// reaches the volume and records its answer: the new capacity, and the
// nodes that need NodeExpandVolume when the plugin says so.
func (o *Ops) expandController(ctx context.Context, v *statepb.Volume, secrets map[string]string) (*statepb.Volume, error) {
	e := v.GetExpansion()
	cands, err := o.placedControllers(v.GetPluginId(), plugin.CapExpandVolume, placementAt(v.GetAccessibleTopology(), v.GetControllerNodeId()))
	if err != nil {
		return nil, o.expansionFailed(v, err, false)
	}
	csiReq := &csi.ControllerExpandVolumeRequest{
		VolumeId:      v.GetExternalId(),
		CapacityRange: &csi.CapacityRange{RequiredBytes: e.GetCapacityBytes(), LimitBytes: e.GetLimitBytes()},
		Secrets:       secrets,
	}
	if caps := v.GetCapabilities(); len(caps) > 0 {
		if c, err := rules.CSICapability(caps[0]); err == nil {
			csiReq.VolumeCapability = c
		}
	}
	var resp *csi.ControllerExpandVolumeResponse
	if _, err := o.callControllers(ctx, "ControllerExpandVolume", cands, func(ctx context.Context, c candidate) error {
		var err error
		resp, err = o.cfg.Controllers.ExpandVolume(ctx, c.addr, v.GetPluginId(), csiReq)
		return err
	}); err != nil {
		return nil, o.expansionFailed(v, scrubbed(err, secrets), true)
	}
	next := proto.Clone(e).(*statepb.VolumeExpansion)
	next.State, next.LastError = rules.ExpansionNodes, ""
	if resp.GetNodeExpansionRequired() {
		next.NodesPending = rules.ExpansionNodesOf(v)
	}
	capacity := max(resp.GetCapacityBytes(), v.GetCapacityBytes())
	return o.applyExpansion(rules.ExpansionStep(v, next, capacity))
}

// expandNode calls NodeExpandVolume on node through its agent, which uses
// the volume and staging paths of its own mount of the volume, and
// records the node as done. A node that no longer mounts the volume has
// nothing to expand: it expands when the volume is staged there again.
func (o *Ops) expandNode(ctx context.Context, v *statepb.Volume, nodeID string, secrets map[string]string) (*statepb.Volume, error) {
	e := v.GetExpansion()
	node := o.cfg.State().Node(nodeID)
	stillMounted := slices.Contains(rules.ExpansionNodesOf(v), nodeID)
	if node != nil && stillMounted {
		cctx, cancel := context.WithTimeout(ctx, o.cfg.RPCTimeout)
		_, err := o.cfg.NodeVolumes.ExpandVolume(cctx, node.GetAddress(), &csisupdv1.ExpandVolumeRequest{
			PluginId:      v.GetPluginId(),
			VolumeId:      v.GetId(),
			RequiredBytes: e.GetCapacityBytes(),
			LimitBytes:    e.GetLimitBytes(),
			Secrets:       secrets,
		})
		cancel()
		if err != nil && status.Code(err) != codes.NotFound {
			return nil, o.expansionFailed(v, status.Errorf(status.Code(err), "node %s: %s", nodeID, status.Convert(scrubbed(err, secrets)).Message()), false)
		}
		if err == nil {
			o.cfg.Nodes.Confirm(nodeID)
		}
	}
	next := proto.Clone(e).(*statepb.VolumeExpansion)
	next.NodesPending = slices.DeleteFunc(next.NodesPending, func(n string) bool { return n == nodeID })
	next.NodesDone = append(next.NodesDone, nodeID)
	next.LastError = ""
	return o.applyExpansion(rules.ExpansionStep(v, next, 0))
}

// expansionFailed records a failed expansion step on the volume, for the
// volume watcher to try again, and returns the failure. When the plugin
// answered the controller step (answered is set) with a refusal (a size
// it will not give, for example), trying again would be refused again:
// the expansion is abandoned, after its error is recorded, and the volume
// keeps its size. A controller that could not be found or reached is not
// a refusal: the step may have happened.
func (o *Ops) expansionFailed(v *statepb.Volume, callErr error, answered bool) error {
	msg := status.Convert(callErr).Message()
	next := proto.Clone(v.GetExpansion()).(*statepb.VolumeExpansion)
	next.LastError = msg
	v, err := o.applyExpansion(rules.ExpansionStep(v, next, 0))
	if err != nil {
		return errors.Join(callErr, err)
	}
	if answered && v.GetExpansion().GetState() == rules.ExpansionController && pluginRefusal(callErr) {
		if _, err := o.applyExpansion(rules.ExpansionStep(v, nil, 0)); err != nil {
			return errors.Join(callErr, err)
		}
		return status.Errorf(status.Code(callErr), "expand volume %q: %s (the plugin refused; the expansion is abandoned)", v.GetId(), msg)
	}
	return status.Errorf(status.Code(callErr), "expand volume %q: %s (the expansion is recorded; the cluster keeps trying)", v.GetId(), msg)
}
