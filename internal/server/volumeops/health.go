package volumeops

import (
	"context"
	"slices"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/statepb"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// PollControllerHealth lists ControllerListVolumeHealth from the healthy
// controllers of every plugin that has LIST_VOLUME_HEALTH and records the
// condition of each listed volume the cluster knows, when it changed.
func (o *Ops) PollControllerHealth(ctx context.Context, loop *watchdog.Loop) {
	for _, p := range o.cfg.State().Plugins() {
		cands, err := o.capableControllers(p.ID, plugin.CapListVolumeHealth)
		if err != nil {
			continue // no controller that can say
		}
		l := listControllers(ctx, o.cfg.RPCTimeout, cands, func(ctx context.Context, c candidate, token string) ([]*csi.VolumeHealth, string, error) {
			loop.Busy(time.Now().Add(o.cfg.RPCTimeout))
			resp, err := o.cfg.Controllers.ListVolumeHealth(ctx, c.addr, p.ID, &csi.ControllerListVolumeHealthRequest{MaxEntries: externalPageSize, StartingToken: token})
			return resp.GetEntries(), resp.GetNextToken(), err
		}, func(h *csi.VolumeHealth) string { return h.GetVolumeId() })
		for _, e := range l.errs {
			o.logger.Warn("volume health not listed", "plugin", p.ID, "error", e)
		}
		for _, v := range o.cfg.State().Volumes(p.ID) {
			h, listed := l.entries[v.GetExternalId()]
			if !listed && !listedWhole(l.answered, v) {
				continue // its controller was not heard in full: nothing is known
			}
			// A volume left out of a whole listing is healthy: CSI
			// recommends listing only abnormal volumes.
			abnormal, msg := plugin.VolumeCondition(h)
			if err := o.RecordHealth(v, rules.HealthSourceController, abnormal, msg); err != nil {
				o.logger.Warn("record a volume's health", "volume", v.GetId(), "error", err)
			}
			loop.Beat()
		}
	}
}

// listedWhole reports whether a controller that reaches v listed in full:
// the one that created it when it is recorded (a node-local controller
// lists only its own volumes), else any.
func listedWhole(answered map[string]bool, v *statepb.Volume) bool {
	if n := v.GetControllerNodeId(); n != "" {
		return answered[n]
	}
	return len(answered) > 0
}

// RecordHealth writes through raft what source reports of v's health
// when it changes what is stored: the leader's monitor and the nodes'
// reports alike, so that a steady state writes nothing.
func (o *Ops) RecordHealth(v *statepb.Volume, source string, abnormal bool, message string) error {
	if !rules.HealthChanged(v, source, abnormal, message) {
		return nil
	}
	_, err := o.cfg.Apply(&statepb.LogEntry{Command: &statepb.LogEntry_VolumeHealth{VolumeHealth: &statepb.VolumeHealthCommand{
		VolumeId: v.GetId(), Source: source, Abnormal: abnormal, Message: message,
	}}})
	return err
}

// VolumeHealth runs GetVolumeHealth on the leader: the controller's
// answer, then each node's that mounts the volume, each bounded by
// RPCTimeout; a source that cannot answer gives its error.
func (o *Ops) VolumeHealth(ctx context.Context, id string) (*csisupdv1.VolumeHealthGetResponse, error) {
	v := o.cfg.State().Volume(id)
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %q not found", id)
	}
	resp := &csisupdv1.VolumeHealthGetResponse{Volume: statepb.VolumeToAPI(v)}
	ctrl := &csisupdv1.VolumeHealthAnswer{Source: rules.HealthSourceController}
	cands, err := o.placedControllers(v.GetPluginId(), plugin.CapGetVolumeHealth, placementAt(v.GetAccessibleTopology(), v.GetControllerNodeId()))
	if err == nil {
		_, err = o.callControllers(ctx, "ControllerGetVolumeHealth", cands, func(ctx context.Context, c candidate) error {
			h, err := o.cfg.Controllers.GetVolumeHealth(ctx, c.addr, v.GetPluginId(), &csi.ControllerGetVolumeHealthRequest{VolumeId: v.GetExternalId()})
			if err == nil {
				ctrl.NodeId = c.nodeID
				ctrl.Abnormal, ctrl.Message = plugin.VolumeCondition(h.GetVolumeHealth())
			}
			return err
		})
	}
	if err != nil {
		ctrl.Error = status.Convert(err).Message()
	}
	resp.Answers = append(resp.Answers, ctrl)

	var nodes []string
	for _, c := range v.GetClaims() {
		if c.GetMounted() && !slices.Contains(nodes, c.GetNodeId()) {
			nodes = append(nodes, c.GetNodeId())
		}
	}
	slices.Sort(nodes)
	for _, id := range nodes {
		a := &csisupdv1.VolumeHealthAnswer{Source: id, NodeId: id}
		node := o.cfg.State().Node(id)
		if node == nil {
			a.Error = "node not found"
			resp.Answers = append(resp.Answers, a)
			continue
		}
		hctx, cancel := context.WithTimeout(ctx, o.cfg.RPCTimeout)
		h, err := o.cfg.NodeVolumes.VolumeHealth(hctx, node.GetAddress(), &csisupdv1.VolumeHealthRequest{PluginId: v.GetPluginId(), VolumeId: v.GetId()})
		cancel()
		if err != nil {
			a.Error = status.Convert(err).Message()
		} else {
			a.Abnormal, a.Message = plugin.VolumeCondition(h.GetVolumeHealth())
		}
		resp.Answers = append(resp.Answers, a)
	}
	return resp, nil
}
