package volumeops

import (
	"context"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// SetVolumeAvailability runs on the leader: it records a volume's
// availability. A draining volume's claims are released by the volume
// watcher, which it wakes.
func (o *Ops) SetVolumeAvailability(req *csisupdv1.VolumeAvailabilityRequest) (*statepb.Volume, error) {
	a, err := rules.ParseAvailability(req.GetAvailability())
	if err != nil {
		return nil, err
	}
	if o.cfg.State().Volume(req.GetId()) == nil {
		return nil, status.Errorf(codes.NotFound, "volume %q not found", req.GetId())
	}
	v, err := o.applyVolume(req.GetId(), &statepb.LogEntry{Command: &statepb.LogEntry_VolumeAvailability{
		VolumeAvailability: &statepb.VolumeAvailabilityCommand{VolumeId: req.GetId(), Availability: a},
	}})
	if err != nil {
		return nil, err
	}
	o.logger.Info("volume availability set", "volume", req.GetId(), "availability", rules.AvailabilityName(a))
	if a == rules.AvailabilityDrain {
		o.cfg.KickWatcher()
	}
	return v, nil
}

// DrainPlugin runs on the leader: it starts or ends the drain of a plugin
// on a node, and answers what the node still holds of the plugin.
func (o *Ops) DrainPlugin(ctx context.Context, req *csisupdv1.PluginDrainRequest) (*csisupdv1.PluginDrainResponse, error) {
	if req.GetPluginId() == "" || req.GetNodeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "plugin drain: plugin_id and node_id are required")
	}
	if o.cfg.State().Node(req.GetNodeId()) == nil {
		return nil, status.Errorf(codes.NotFound, "node %q not found", req.GetNodeId())
	}
	if _, err := o.cfg.Apply(&statepb.LogEntry{Command: &statepb.LogEntry_PluginDrain{PluginDrain: &statepb.PluginDrainCommand{
		NodeId: req.GetNodeId(), PluginId: req.GetPluginId(), Draining: !req.GetCancel(),
	}}}); err != nil {
		return nil, err
	}
	o.logger.Info("plugin drain", "plugin", req.GetPluginId(), "node", req.GetNodeId(), "draining", !req.GetCancel())
	return o.PluginDrain(ctx, req.GetPluginId(), req.GetNodeId())
}

// PluginDrain returns the drain of plugin on node: whether it drains,
// the claims of the plugin's volumes on the node, and the plugin's mounts
// its agent reports (the evidence that nothing is left staged or
// published there).
func (o *Ops) PluginDrain(ctx context.Context, pluginID, nodeID string) (*csisupdv1.PluginDrainResponse, error) {
	node := o.cfg.State().Node(nodeID)
	if node == nil {
		return nil, status.Errorf(codes.NotFound, "node %q not found", nodeID)
	}
	resp := &csisupdv1.PluginDrainResponse{Draining: slices.Contains(node.GetDrainingPlugins(), pluginID)}
	for _, v := range o.cfg.State().Volumes(pluginID) {
		for _, c := range v.GetClaims() {
			if c.GetNodeId() == nodeID {
				resp.Claims = append(resp.Claims, &csisupdv1.PluginDrainClaim{VolumeId: v.GetId(), WorkloadId: c.GetWorkloadId(), State: c.GetState()})
			}
		}
	}
	lctx, cancel := context.WithTimeout(ctx, o.cfg.RPCTimeout)
	defer cancel()
	mounts, err := o.cfg.NodeVolumes.ListMounts(lctx, node.GetAddress(), &csisupdv1.ListMountsRequest{PluginId: pluginID})
	if err != nil {
		resp.MountsError = err.Error()
	}
	resp.Mounts = mounts
	return resp, nil
}
