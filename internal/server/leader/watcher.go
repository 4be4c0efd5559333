package leader

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/csisupd/csisupd/internal/keylock"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
	"github.com/csisupd/csisupd/internal/watchdog"
	"github.com/hashicorp/go-hclog"
)

// WatcherConfig configures the volume watcher.
type WatcherConfig struct {
	// Interval is the time between two passes over every claim, and the
	// first delay after a failed release step.
	Interval time.Duration
	// MaxBackoff caps the delay after repeated failures of one claim.
	MaxBackoff time.Duration
	// ClaimGCGrace is how long a claim's node may be down before the
	// claim is released without it.
	ClaimGCGrace time.Duration
	// ClaimResumeTimeout is how long a claim of the watcher's own term
	// may stay taken but not mounted before the watcher finishes it with
	// Work.Finish: its leader (this one) is alive but its caller's call
	// is stuck. Required.
	ClaimResumeTimeout time.Duration
	// Term returns this server's current raft term; Run reads it once, as
	// its term's loop starts, after the leader's barrier. An unfinished
	// claim taken in an earlier term (its leader_term is lower) has no
	// leader driving it any more, and is finished at once instead of
	// after ClaimResumeTimeout. Nil: every claim waits for
	// ClaimResumeTimeout.
	Term func() uint64
	// State returns the current replicated state. Required.
	State func() *state.Store
	// Locks are the volume locks the claim flow takes too; the watcher
	// skips a volume someone else works on. Required.
	Locks *keylock.Set
	// Work runs the volume steps the watcher resumes. Required.
	Work VolumeWork
	// Watchdog, when set, tracks each term's watcher loop.
	Watchdog *watchdog.Monitor
}

// VolumeWork is the volume work the watcher resumes; the servers' volume
// operations implement it.
type VolumeWork interface {
	// ReleaseWithoutNode records that a claim is released without its
	// node and returns the claim as stored. The caller holds the
	// volume's lock.
	ReleaseWithoutNode(ref rules.Ref) (*statepb.VolumeClaim, error)
	// StartRelease records that a taken claim of a draining volume
	// starts its release, and returns the claim as stored. The caller
	// holds the volume's lock.
	StartRelease(ref rules.Ref) (*statepb.VolumeClaim, error)
	// Release runs the release steps of one claim from its recorded
	// state until it is freed. The caller holds the volume's lock.
	Release(ctx context.Context, ref rules.Ref) error
	// Finish runs the steps a taken but unfinished claim lacks and
	// records the result, or starts its release when a step fails. The
	// caller holds the volume's lock.
	Finish(ctx context.Context, ref rules.Ref) error
	// FollowSnapshot does the next step of a volume snapshot that is
	// being created or deleted, or is not ready to use yet
	// (rules.SnapshotNeedsWork). It takes the snapshot's lock itself and
	// returns keylock.ErrHeld at once when someone else holds it.
	FollowSnapshot(ctx context.Context, id string) error
	// ResumeExpansion finishes the expansion under way of a volume. The
	// caller holds the volume's lock.
	ResumeExpansion(ctx context.Context, volumeID string) error
	// DeleteEphemeral deletes an ephemeral volume whose last claim is
	// gone (rules.EphemeralDone). It takes the plugin's and the volume's
	// locks itself and returns keylock.ErrHeld at once when someone else
	// holds one.
	DeleteEphemeral(ctx context.Context, volumeID string) error
}

// Watcher is the leader's loop that finishes from the replicated state
// what claims left half-done: the releases a failed step, a failed claim,
// a crash or a leader change left behind; the claims of volumes an
// operator drains (released); the claims taken but never
// mounted because their leader died or lost its term in the middle
// (finished, or released when a step fails: at once when the leader of an
// earlier term took them, once ClaimResumeTimeout has passed without a
// caller finishing them when this term's did); and the releases of claims
// whose node has been down for longer than ClaimGCGrace. Beyond one term
// it keeps only what it saw when (observations); everything else a new
// term's watcher reads from the state.
type Watcher struct {
	cfg    WatcherConfig
	logger hclog.Logger
	// kick wakes the watcher before its next interval.
	kick chan struct{}
	seen *observations
}

// NewWatcher returns a volume watcher; Run runs it for one term.
func NewWatcher(cfg WatcherConfig, logger hclog.Logger) *Watcher {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Watcher{cfg: cfg, logger: logger, kick: make(chan struct{}, 1), seen: newObservations()}
}

// watchRun is one term's pass state.
type watchRun struct {
	*Watcher
	loop *watchdog.Loop
	// retries holds the claims whose last step failed: when to try again
	// and the delay after the next failure.
	retries map[string]*claimRetry
	// resumed holds the claims whose release this watcher logged.
	resumed map[string]bool
	// term is the raft term this watcher runs for (0 when unknown).
	term uint64
}

type claimRetry struct {
	next  time.Time
	delay time.Duration
}

// Kick wakes the watcher before its next interval.
func (w *Watcher) Kick() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// Run runs the volume watcher until ctx ends (leadership ends or the
// server stops).
func (w *Watcher) Run(ctx context.Context) {
	loop := w.cfg.Watchdog.Loop("volume watcher")
	defer loop.Done()
	// The release steps beat the loop between their calls to agents.
	ctx = watchdog.WithLoop(ctx, loop)
	r := &watchRun{Watcher: w, loop: loop, retries: map[string]*claimRetry{}, resumed: map[string]bool{}}
	if w.cfg.Term != nil {
		r.term = w.cfg.Term()
	}
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		loop.Beat()
		r.pass(ctx)
		for idle := true; idle; {
			loop.Beat()
			select {
			case <-ctx.Done():
				return
			case <-loop.C():
			case <-t.C:
				idle = false
			case <-w.kick:
				idle = false
			}
		}
	}
}

// watchKey names a claim for the watcher; the claim index tells a claim
// taken again after its release from the old one.
func watchKey(volumeID string, c *statepb.VolumeClaim) string {
	return fmt.Sprintf("%s\x00%s\x00%s\x00%d", volumeID, c.GetNodeId(), c.GetWorkloadId(), c.GetClaimIndex())
}

// Observe records, on a server that does not lead, which nodes are down
// and which claims unfinished in its replicated state, so that if it
// takes over, its grace periods count from when it first saw them rather
// than from its first pass as leader. What a follower saw is a lower
// bound of how long it has been so: its state lags the leader's.
func (w *Watcher) Observe(now time.Time) {
	w.seen.nodes(w.cfg.State().NodesWithStatus(state.NodeStatusDown), now)
	live := map[string]bool{}
	for _, v := range w.cfg.State().Volumes("") {
		for _, c := range v.GetClaims() {
			key := watchKey(v.GetId(), c)
			live[key] = true
			w.seen.claim(key, rules.Unfinished(c), now)
		}
	}
	w.seen.keepClaims(live)
}

// pass looks at every claim once.
func (r *watchRun) pass(ctx context.Context) {
	r.seen.nodes(r.cfg.State().NodesWithStatus(state.NodeStatusDown), time.Now())
	live := map[string]bool{}
	for _, v := range r.cfg.State().Volumes("") {
		for _, c := range v.GetClaims() {
			if ctx.Err() != nil {
				return
			}
			r.loop.Beat()
			key := watchKey(v.GetId(), c)
			live[key] = true
			now := time.Now()
			r.seen.claim(key, rules.Unfinished(c), now)
			switch {
			case r.nodeGoneDue(c, now) || rules.Releasing(c.GetState()) || drains(v, c):
				r.release(ctx, v.GetId(), c, key)
			case r.resumeDue(c, key, now):
				r.finish(ctx, v.GetId(), c, key)
			}
		}
	}
	r.seen.keepClaims(live)
	r.lifecycle(ctx, live)
	for key := range r.retries {
		if !live[key] {
			delete(r.retries, key)
		}
	}
	for key := range r.resumed {
		if !live[key] {
			delete(r.resumed, key)
		}
	}
}

// lifecycle resumes the volume work that is not about claims: the
// expansions under way, and the snapshots being created or deleted or
// not ready yet. Each is retried with backoff after a failure.
func (r *watchRun) lifecycle(ctx context.Context, live map[string]bool) {
	for _, v := range r.cfg.State().Volumes("") {
		if v.GetExpansion() == nil || ctx.Err() != nil {
			continue
		}
		r.loop.Beat()
		key := fmt.Sprintf("expand\x00%s\x00%d", v.GetId(), v.GetCreateIndex())
		live[key] = true
		r.retrying(ctx, key, "volume expansion", r.logger.With("volume", v.GetId()), func() error {
			unlock, ok := r.cfg.Locks.TryLock(v.GetId())
			if !ok {
				return keylock.ErrHeld
			}
			defer unlock()
			return r.cfg.Work.ResumeExpansion(ctx, v.GetId())
		})
	}
	for _, snap := range r.cfg.State().VolumeSnapshots() {
		if !rules.SnapshotNeedsWork(snap) || ctx.Err() != nil {
			continue
		}
		r.loop.Beat()
		key := fmt.Sprintf("snapshot\x00%s\x00%d", snap.GetId(), snap.GetCreateIndex())
		live[key] = true
		r.retrying(ctx, key, "volume snapshot step", r.logger.With("snapshot", snap.GetId(), "state", snap.GetState()), func() error {
			return r.cfg.Work.FollowSnapshot(ctx, snap.GetId())
		})
	}
	r.deleteEphemerals(ctx, live)
}

// deleteEphemerals deletes the ephemeral volumes left without claims: a
// release that freed the last claim deletes its volume, unless its leader
// died between the two or the delete failed. A volume being created for a
// claim is never seen so: its claim holds the volume's lock from the
// create to the claim_take, and a new leader's barrier ran before this
// watcher, so no claim of an earlier leader can be taken after it looks.
func (r *watchRun) deleteEphemerals(ctx context.Context, live map[string]bool) {
	for _, v := range r.cfg.State().Volumes("") {
		if !rules.EphemeralDone(v) || ctx.Err() != nil {
			continue
		}
		r.loop.Beat()
		key := fmt.Sprintf("ephemeral\x00%s\x00%d", v.GetId(), v.GetCreateIndex())
		live[key] = true
		r.retrying(ctx, key, "ephemeral volume delete", r.logger.With("volume", v.GetId()), func() error {
			return r.cfg.Work.DeleteEphemeral(ctx, v.GetId())
		})
	}
}

// retrying runs fn unless its last failure (under key) was too recent,
// and delays the next attempt with backoff when it fails.
func (r *watchRun) retrying(ctx context.Context, key, what string, log hclog.Logger, fn func() error) {
	now := time.Now()
	if cr := r.retries[key]; cr != nil && now.Before(cr.next) {
		return
	}
	if err := fn(); err != nil {
		if ctx.Err() != nil || errors.Is(err, keylock.ErrHeld) {
			return
		}
		d := r.failed(key, now)
		log.Warn(what+" failed; retrying", "retry_in", d, "error", err)
		return
	}
	delete(r.retries, key)
}

// nodeGoneDue reports whether a claim must be released without its node:
// it is taken or unmounting, and this server's watcher has seen its node
// down for longer than ClaimGCGrace (or the node is not known to the
// cluster any more).
func (r *watchRun) nodeGoneDue(c *statepb.VolumeClaim, now time.Time) bool {
	node := r.cfg.State().Node(c.GetNodeId())
	return rules.NodeGoneDue(c, node, r.seen.downFor(node, now), r.cfg.ClaimGCGrace)
}

// resumeDue reports whether a claim is taken but not mounted, and either
// orphaned (taken in an earlier term) or seen so by this server's watcher
// for longer than ClaimResumeTimeout: no caller finished it.
func (r *watchRun) resumeDue(c *statepb.VolumeClaim, key string, now time.Time) bool {
	if !rules.Unfinished(c) {
		return false
	}
	if r.orphaned(c) {
		return true
	}
	d, ok := r.seen.unfinishedFor(key, now)
	return ok && d > r.cfg.ClaimResumeTimeout
}

// orphaned reports whether claim c was taken by the leader of an earlier
// term than this watcher's: that leader is dead, or has lost its term and
// can no longer record a step, so nobody else drives the claim. It is
// finished at once, without a wait:
//   - the leader's barrier, before the watcher starts, applied every
//     write of the earlier terms, so the state shows all the claim has;
//   - the claim's steps are idempotent and its node's agent runs those of
//     one volume one at a time, so a mount still in flight from the old
//     leader and this one's end the same; a mount the old leader makes
//     after this leader released the claim is undone by the agent, which
//     removes the mounts of claims the servers do not hold;
//   - a caller that claims again on this leader is finished under the
//     volume's lock, which the watcher takes too (and skips when held).
//
// A claim taken by this very leader is of this term, and waits for
// ClaimResumeTimeout: its own caller is still at it. Claims stored before
// leader terms were recorded have leader_term 0 and count as orphaned:
// every leader since then runs in a later term.
func (r *watchRun) orphaned(c *statepb.VolumeClaim) bool {
	return c.GetLeaderTerm() < r.term
}

// finish runs Finish for one unfinished claim.
func (r *watchRun) finish(ctx context.Context, volumeID string, c *statepb.VolumeClaim, key string) {
	r.locked(ctx, volumeID, c, key, "finishing an unfinished volume claim", func(now time.Time, ref rules.Ref, c *statepb.VolumeClaim, log hclog.Logger) error {
		if !r.resumeDue(c, key, now) {
			return nil // its caller finished it
		}
		log.Info("resuming unfinished volume claim", "claim_index", c.GetClaimIndex(), "taken_at", c.GetStateUpdatedAt().AsTime(),
			"controller_published", c.GetControllerPublished(), "leader_term", c.GetLeaderTerm(), "orphaned", r.orphaned(c))
		return r.cfg.Work.Finish(ctx, ref)
	})
}

// drains reports whether claim c of v is to be released because an
// operator drains v.
func drains(v *statepb.Volume, c *statepb.VolumeClaim) bool {
	return v.GetAvailability() == rules.AvailabilityDrain && c.GetState() == rules.StateTaken
}

// release runs the release steps of one claim, first marking its node
// gone when it has been down for longer than ClaimGCGrace, or starting
// its release when its volume drains.
func (r *watchRun) release(ctx context.Context, volumeID string, c *statepb.VolumeClaim, key string) {
	r.locked(ctx, volumeID, c, key, "volume claim release step", func(now time.Time, ref rules.Ref, c *statepb.VolumeClaim, log hclog.Logger) error {
		if drains(r.cfg.State().Volume(volumeID), c) {
			log.Info("volume drains; releasing its claim")
			var err error
			if c, err = r.cfg.Work.StartRelease(ref); err != nil {
				return fmt.Errorf("start the release of a draining volume's claim: %w", err)
			}
			r.resumed[key] = true
		}
		if r.nodeGoneDue(c, now) {
			log.Info("node down for longer than the claim gc grace; releasing the claim without it",
				"claim_gc_grace", r.cfg.ClaimGCGrace, "state", c.GetState())
			var err error
			if c, err = r.cfg.Work.ReleaseWithoutNode(ref); err != nil {
				return fmt.Errorf("mark the claim's node gone: %w", err)
			}
			r.resumed[key] = true
		}
		if !rules.Releasing(c.GetState()) {
			return nil
		}
		if !r.resumed[key] {
			r.resumed[key] = true
			log.Info("resuming volume claim release", "state", c.GetState(), "node_gone", c.GetNodeGone(), "last_error", c.GetLastError())
		}
		return r.cfg.Work.Release(ctx, ref)
	})
}

// locked runs fn for the claim c of volume volumeID as stored now, under
// the volume's lock, unless the claim's last failure was too recent,
// someone else works on the volume now (look again next pass), or the
// claim is gone or was taken again since the pass read it. A failure of fn
// (what names the work in the log) delays the next attempt with backoff.
func (r *watchRun) locked(ctx context.Context, volumeID string, c *statepb.VolumeClaim, key, what string,
	fn func(now time.Time, ref rules.Ref, c *statepb.VolumeClaim, log hclog.Logger) error,
) {
	now := time.Now()
	if cr := r.retries[key]; cr != nil && now.Before(cr.next) {
		return
	}
	unlock, ok := r.cfg.Locks.TryLock(volumeID)
	if !ok {
		return
	}
	defer unlock()
	ref := rules.RefOf(volumeID, c)
	v := r.cfg.State().Volume(volumeID)
	if v == nil {
		return
	}
	if _, c = rules.Find(v, ref.NodeID, ref.WorkloadID); c == nil || watchKey(volumeID, c) != key {
		return
	}
	log := r.logger.With("volume", ref.VolumeID, "node", ref.NodeID, "workload", ref.WorkloadID)
	if err := fn(now, ref, c, log); err != nil {
		if ctx.Err() != nil {
			return
		}
		d := r.failed(key, now)
		log.Warn(what+" failed; retrying", "retry_in", d, "error", err)
		return
	}
	delete(r.retries, key)
}

// failed records a failure of a claim's release and returns the delay
// before the next attempt: Interval, doubled with each failure up to
// MaxBackoff.
func (r *watchRun) failed(key string, now time.Time) time.Duration {
	cr := r.retries[key]
	if cr == nil {
		cr = &claimRetry{delay: r.cfg.Interval}
		r.retries[key] = cr
	} else {
		cr.delay = min(2*cr.delay, r.cfg.MaxBackoff)
	}
	cr.next = now.Add(cr.delay)
	return cr.delay
}
