package server

import (
	"context"
	"fmt"
	"time"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// volumeWatcher is the leader's loop that finishes volume claim releases
// from the replicated state: the releases a failed step, a failed claim,
// a crash or a leader change left behind, and the releases of claims whose
// node has been down for longer than ClaimGCGrace. It holds no state that
// matters beyond one term: a new leader's watcher starts from the state.
type volumeWatcher struct {
	s    *Server
	loop *watchdog.Loop
	// retries holds the claims whose last step failed: when to try again
	// and the delay after the next failure.
	retries map[string]*claimRetry
	// resumed holds the claims whose release this watcher logged.
	resumed map[string]bool
}

type claimRetry struct {
	next  time.Time
	delay time.Duration
}

// kickVolumeWatcher wakes the watcher before its next interval.
func (s *Server) kickVolumeWatcher() {
	select {
	case s.volumeKick <- struct{}{}:
	default:
	}
}

// runVolumeWatcher runs the volume watcher until ctx ends (leadership
// ends or the server stops).
func (s *Server) runVolumeWatcher(ctx context.Context) {
	loop := s.cfg.Watchdog.Loop("volume watcher")
	defer loop.Done()
	// The release steps beat the loop between their calls to agents.
	ctx = withLoop(ctx, loop)
	w := &volumeWatcher{s: s, loop: loop, retries: map[string]*claimRetry{}, resumed: map[string]bool{}}
	t := time.NewTicker(s.cfg.VolumeWatchInterval)
	defer t.Stop()
	for {
		loop.Beat()
		w.pass(ctx)
		for idle := true; idle; {
			loop.Beat()
			select {
			case <-ctx.Done():
				return
			case <-loop.C():
			case <-t.C:
				idle = false
			case <-s.volumeKick:
				idle = false
			}
		}
	}
}

// watchKey names a claim for the watcher; the claim index tells a claim
// taken again after its release from the old one.
func watchKey(volumeID string, c *csisupdv1.VolumeClaim) string {
	return fmt.Sprintf("%s\x00%s\x00%s\x00%d", volumeID, c.GetNodeId(), c.GetWorkloadId(), c.GetClaimIndex())
}

// pass looks at every claim once.
func (w *volumeWatcher) pass(ctx context.Context) {
	live := map[string]bool{}
	for _, v := range w.s.State().Volumes("") {
		for _, c := range v.GetClaims() {
			if ctx.Err() != nil {
				return
			}
			w.loop.Beat()
			key := watchKey(v.GetId(), c)
			live[key] = true
			if w.nodeGoneDue(c, time.Now()) || releasing(c.GetState()) {
				w.release(ctx, v.GetId(), c, key)
			}
		}
	}
	for key := range w.retries {
		if !live[key] {
			delete(w.retries, key)
		}
	}
	for key := range w.resumed {
		if !live[key] {
			delete(w.resumed, key)
		}
	}
}

// nodeGoneDue reports whether a claim must be released without its node:
// it is taken or unmounting, and its node has been down for longer than
// ClaimGCGrace (or is not known to the cluster any more).
func (w *volumeWatcher) nodeGoneDue(c *csisupdv1.VolumeClaim, now time.Time) bool {
	if c.GetNodeGone() || (c.GetState() != ClaimStateTaken && c.GetState() != ClaimStateUnpublishing) {
		return false
	}
	node := w.s.State().Node(c.GetNodeId())
	if node == nil {
		return true
	}
	return node.GetStatus() == state.NodeStatusDown && now.Sub(node.GetStatusUpdatedAt().AsTime()) > w.s.cfg.ClaimGCGrace
}

// release runs the release steps of one claim, unless its last failure
// was too recent or someone else works on the volume now.
func (w *volumeWatcher) release(ctx context.Context, volumeID string, c *csisupdv1.VolumeClaim, key string) {
	now := time.Now()
	if r := w.retries[key]; r != nil && now.Before(r.next) {
		return
	}
	unlock, ok := w.s.volumeLocks.TryLock(volumeID)
	if !ok {
		return // a claim or release of the volume runs; look again next pass
	}
	defer unlock()
	ref := refOf(volumeID, c)
	// Read again under the lock.
	v := w.s.State().Volume(volumeID)
	if v == nil {
		return
	}
	if _, c = findClaim(v, ref.nodeID, ref.workloadID); c == nil || watchKey(volumeID, c) != key {
		return
	}
	log := w.s.logger.With("volume", ref.volumeID, "node", ref.nodeID, "workload", ref.workloadID)
	if w.nodeGoneDue(c, now) {
		log.Info("node down for longer than the claim gc grace; releasing the claim without it",
			"claim_gc_grace", w.s.cfg.ClaimGCGrace, "state", c.GetState())
		var err error
		if _, c, err = w.s.updateClaim(ref, func(c *csisupdv1.VolumeClaim) {
			c.NodeGone = true
			setState(c, ClaimStateUnpublishing)
		}); err != nil {
			log.Warn("mark a claim's node gone", "error", err)
			w.failed(key, now)
			return
		}
		w.resumed[key] = true
	}
	if !releasing(c.GetState()) {
		return
	}
	if !w.resumed[key] {
		w.resumed[key] = true
		log.Info("resuming volume claim release", "state", c.GetState(), "node_gone", c.GetNodeGone(), "last_error", c.GetLastError())
	}
	if err := w.s.runRelease(ctx, ref, nil); err != nil {
		if ctx.Err() != nil {
			return
		}
		d := w.failed(key, now)
		log.Warn("volume claim release step failed; retrying", "retry_in", d, "error", err)
		return
	}
	delete(w.retries, key)
}

// failed records a failure of a claim's release and returns the delay
// before the next attempt: VolumeWatchInterval, doubled with each failure
// up to config.MaxVolumeWatchBackoff.
func (w *volumeWatcher) failed(key string, now time.Time) time.Duration {
	r := w.retries[key]
	if r == nil {
		r = &claimRetry{delay: w.s.cfg.VolumeWatchInterval}
		w.retries[key] = r
	} else {
		r.delay = min(2*r.delay, config.MaxVolumeWatchBackoff)
	}
	r.next = now.Add(r.delay)
	return r.delay
}
