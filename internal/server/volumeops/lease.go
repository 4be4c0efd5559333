package volumeops

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csisupd/csisupd/internal/server/rules"
)

// ExpireLease runs on the leader when the lease of the claim of ref taken
// at claimIndex expired: under the volume's lock, it starts the claim's
// release with release_reason lease_expired (one raft write) and wakes
// the volume watcher, which runs the release steps. What it does is
// rules.LeaseExpiry's decision: a claim no longer taken, or gone, is done
// (true) with nothing written; a claim whose node is down or gone is left
// to the claim gc grace, as every claim of a down node is, and the lease
// table asks again later (false).
func (o *Ops) ExpireLease(ctx context.Context, ref rules.Ref, claimIndex uint64) (bool, error) {
	// Registered first, so that it runs after the unlock below: the
	// watcher can take the volume then.
	kick := false
	defer func() {
		if kick {
			o.cfg.KickWatcher()
		}
	}()
	v, unlock, err := o.lockVolume(ctx, ref.VolumeID)
	if status.Code(err) == codes.NotFound {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("expire the lease of the claim of %s: %w", ref, err)
	}
	defer unlock()
	_, c := rules.Find(v, ref.NodeID, ref.WorkloadID)
	cmd, wait := rules.LeaseExpiry(v, c, claimIndex, o.cfg.State().Node(ref.NodeID))
	switch {
	case wait:
		o.logger.Debug("volume claim lease expired on a node that is down; the claim waits for the node or the claim gc grace",
			"volume", ref.VolumeID, "node", ref.NodeID, "workload", ref.WorkloadID)
		return false, nil
	case cmd == nil:
		return true, nil
	}
	if _, _, err := o.stepClaim(cmd); err != nil {
		return false, fmt.Errorf("start the release of the expired claim of %s: %w", ref, err)
	}
	o.logger.Info("volume claim lease expired; release started", "volume", ref.VolumeID, "node", ref.NodeID,
		"workload", ref.WorkloadID, "claim_index", claimIndex)
	kick = true
	return true, nil
}
