package volumeops

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// DeleteVolume runs on the leader. A forced deregistration forgets a
// volume with claims, and returns them: what the nodes may still hold.
func (o *Ops) DeleteVolume(ctx context.Context, req *csisupdv1.VolumeDeleteRequest) ([]*statepb.VolumeClaim, error) {
	v := o.cfg.State().Volume(req.GetId())
	if v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %q not found", req.GetId())
	}
	// The volume lock keeps claims out until the volume is gone.
	unlock, err := o.lockPluginAndVolume(ctx, v.GetPluginId(), req.GetId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	// Read again under the locks: another call may have changed it.
	if v = o.cfg.State().Volume(req.GetId()); v == nil {
		return nil, status.Errorf(codes.NotFound, "volume %q not found", req.GetId())
	}
	cmd := &statepb.VolumeDeleteCommand{VolumeId: v.GetId(), VolumeIndex: v.GetModifyIndex(), Forced: req.GetForce() && req.GetDeregisterOnly()}
	if err := rules.CheckDelete(v, cmd); err != nil {
		return nil, err
	}
	// Refused before the plugin is called, as the FSM would refuse it
	// after.
	if err := rules.CheckDeleteWithSnapshots(v, o.cfg.State().VolumeSnapshots()); err != nil {
		return nil, err
	}
	if !req.GetDeregisterOnly() {
		// A node-local controller answers success for a volume it does
		// not have (CSI: deleting an unknown volume succeeds), so the
		// delete must reach one that holds it.
		cands, err := o.placedControllers(v.GetPluginId(), plugin.CapCreateDeleteVolume, placementAt(v.GetAccessibleTopology(), v.GetControllerNodeId()))
		if err != nil {
			return nil, err
		}
		csiReq := &csi.DeleteVolumeRequest{VolumeId: v.GetExternalId(), Secrets: req.GetSecrets()}
		_, err = o.callControllers(ctx, "DeleteVolume", cands, func(ctx context.Context, c candidate) error {
			err := o.cfg.Controllers.DeleteVolume(ctx, c.addr, v.GetPluginId(), csiReq)
			if status.Code(err) == codes.NotFound && !csisupdv1.IsPluginNotFound(err) {
				return nil // already gone
			}
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	if _, err = o.applyVolume(v.GetId(), &statepb.LogEntry{Command: &statepb.LogEntry_VolumeDeleteChecked{VolumeDeleteChecked: cmd}}); err != nil {
		return nil, err
	}
	if n := len(v.GetClaims()); n > 0 {
		o.logger.Warn("volume deregistered by force with claims left", "volume", v.GetId(), "claims", n, "left", rules.Describe(v.GetClaims()))
	}
	return v.GetClaims(), nil
}
