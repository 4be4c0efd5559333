package volumeops

import (
	"context"
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/keylock"
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
	return o.deleteLocked(ctx, v, req)
}

// deleteLocked deletes volume v as stored (the controller's DeleteVolume
// unless req only deregisters it, then the volume_delete write) and
// returns the claims a forced deregistration forgot. The caller holds the
// plugin's and the volume's locks.
func (o *Ops) deleteLocked(ctx context.Context, v *statepb.Volume, req *csisupdv1.VolumeDeleteRequest) ([]*statepb.VolumeClaim, error) {
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
	if _, err := o.applyVolume(v.GetId(), &statepb.LogEntry{Command: &statepb.LogEntry_VolumeDeleteChecked{VolumeDeleteChecked: cmd}}); err != nil {
		return nil, err
	}
	if n := len(v.GetClaims()); n > 0 {
		o.logger.Warn("volume deregistered by force with claims left", "volume", v.GetId(), "claims", n, "left", rules.Describe(v.GetClaims()))
	}
	return v.GetClaims(), nil
}

// DeleteEphemeral deletes an ephemeral volume whose last claim is gone
// (rules.EphemeralDone), for the volume watcher: the release that freed
// the claim did not, or not in full (its leader died, or the delete
// failed). It takes the plugin's and the volume's locks itself and
// returns keylock.ErrHeld at once when someone else holds one: a claim
// that creates the volume holds its lock until the claim is taken. A
// volume that is gone, not ephemeral, or claimed again is left alone.
func (o *Ops) DeleteEphemeral(ctx context.Context, volumeID string) error {
	v := o.cfg.State().Volume(volumeID)
	if v == nil {
		return nil
	}
	unlockPlugin, ok := o.pluginLocks.TryLock(v.GetPluginId())
	if !ok {
		return keylock.ErrHeld
	}
	defer unlockPlugin()
	unlockVolume, ok := o.volumeLocks.TryLock(volumeID)
	if !ok {
		return keylock.ErrHeld
	}
	defer unlockVolume()
	return o.deleteEphemeralLocked(ctx, volumeID, nil)
}

// deleteEphemeralAfterRelease deletes, after a release, the ephemeral
// volume whose last claim it freed, waiting for the plugin's and the
// volume's locks. It runs after the release left the volume's lock: the
// plugin's lock is taken first.
func (o *Ops) deleteEphemeralAfterRelease(ctx context.Context, v *statepb.Volume, secrets map[string]string) error {
	unlock, err := o.lockPluginAndVolume(ctx, v.GetPluginId(), v.GetId())
	if err != nil {
		return err
	}
	defer unlock()
	return o.deleteEphemeralLocked(ctx, v.GetId(), secrets)
}

// deleteEphemeralLocked deletes volume volumeID as stored when it is an
// ephemeral volume without claims. The caller holds the plugin's and the
// volume's locks.
func (o *Ops) deleteEphemeralLocked(ctx context.Context, volumeID string, secrets map[string]string) error {
	v := o.cfg.State().Volume(volumeID)
	if !rules.EphemeralDone(v) {
		return nil
	}
	if _, err := o.deleteLocked(ctx, v, &csisupdv1.VolumeDeleteRequest{Id: volumeID, Secrets: secrets}); err != nil {
		return fmt.Errorf("delete ephemeral volume %q: %w", volumeID, err)
	}
	o.logger.Info("ephemeral volume deleted after its last claim", "volume", volumeID, "plugin", v.GetPluginId(), "external_id", v.GetExternalId())
	return nil
}
