package volumeops

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// ModifyVolume runs on the leader: ControllerModifyVolume through a
// controller that reaches the volume, then the mutable parameters are
// recorded.
func (o *Ops) ModifyVolume(ctx context.Context, req *csisupdv1.VolumeModifyRequest) (*statepb.Volume, error) {
	if len(req.GetMutableParameters()) == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "modify volume %q: mutable_parameters are required", req.GetId())
	}
	v, unlock, err := o.lockVolume(ctx, req.GetId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	cands, err := o.placedControllers(v.GetPluginId(), plugin.CapModifyVolume, placementAt(v.GetAccessibleTopology(), v.GetControllerNodeId()))
	if err != nil {
		return nil, err
	}
	csiReq := &csi.ControllerModifyVolumeRequest{VolumeId: v.GetExternalId(), MutableParameters: req.GetMutableParameters(), Secrets: req.GetSecrets()}
	if _, err := o.callControllers(ctx, "ControllerModifyVolume", cands, func(ctx context.Context, c candidate) error {
		return o.cfg.Controllers.ModifyVolume(ctx, c.addr, v.GetPluginId(), csiReq)
	}); err != nil {
		return nil, scrubbed(err, req.GetSecrets())
	}
	return o.applyVolume(v.GetId(), &statepb.LogEntry{Command: &statepb.LogEntry_VolumeModify{VolumeModify: &statepb.VolumeModifyCommand{
		VolumeId: v.GetId(), VolumeIndex: v.GetModifyIndex(), MutableParameters: req.GetMutableParameters(),
	}}})
}
