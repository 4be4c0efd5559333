package nodevolumes

import (
	"context"
	"errors"
	"time"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/retry"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// Run finishes or undoes, in the background, every step that New found
// unfinished and every step whose Mount or Unmount failed halfway: mounts
// that never answered their caller (staging, publishing) are undone,
// unmounts (unpublishing, unstaging) are finished. Each is retried with
// cfg.Retry until it succeeds or ctx ends, one goroutine per mount, so a
// plugin that is not up yet holds up no other volume. With cfg.Claims set,
// Run also removes the cluster mounts the servers released (see
// TriggerReconcile). Run returns when ctx ends and its goroutines have
// stopped; their plugin calls end with ctx. It may be called once.
func (m *Manager) Run(ctx context.Context) error {
	m.mu.Lock()
	if m.ran {
		m.mu.Unlock()
		return errors.New("volumes: Manager.Run called twice")
	}
	m.ran = true
	m.runCtx = ctx
	for name := range m.pending {
		m.initial[name] = true
		m.startFinish(ctx, name)
	}
	if len(m.initial) == 0 {
		close(m.recovered)
	}
	m.mu.Unlock()
	if m.claims != nil {
		m.wg.Go(func() { m.reconcileLoop(ctx) })
	}
	if m.health != nil && m.healthIn > 0 {
		m.wg.Go(func() { m.healthLoop(ctx) })
	}

	<-ctx.Done()
	m.mu.Lock()
	m.runCtx = nil
	m.mu.Unlock()
	m.wg.Wait()
	return nil
}

// Recovered is closed once Run has finished or undone every step that
// New found unfinished.
func (m *Manager) Recovered() <-chan struct{} { return m.recovered }

// TriggerReconcile makes Run compare the cluster mounts with the servers'
// claims now rather than at the next interval. It does not block.
func (m *Manager) TriggerReconcile() {
	select {
	case m.trigger <- struct{}{}:
	default:
	}
}

// schedule makes the record named name finish or undo its step in the
// background: now when Run runs, else when it starts.
func (m *Manager) schedule(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pending[name] {
		return
	}
	m.pending[name] = true
	if m.runCtx != nil {
		m.startFinish(m.runCtx, name)
	}
}

// startFinish starts the goroutine that finishes name. The caller holds
// m.mu and Run runs.
func (m *Manager) startFinish(ctx context.Context, name string) {
	m.wg.Go(func() {
		b := m.retry.NewBackOff()
		for {
			if retry.Wait(ctx, m.settleDelay(name)) != nil {
				return
			}
			err := m.finish(ctx, name)
			if err == nil && m.settleDelay(name) > 0 {
				continue // undone, and settling: undo again later
			}
			if err == nil {
				m.finished(name)
				return
			}
			if ctx.Err() != nil {
				return
			}
			delay := b.NextBackOff()
			m.log.Warn("cannot finish an unfinished mount step yet; retrying", "record", name, "backoff", delay, "error", statusMessage(err))
			if retry.Wait(ctx, delay) != nil {
				return
			}
		}
	})
}

// settleDelay is how long the record named name settles still: until its
// SettleAt, at most the RPC timeout from now (a wall clock set back must
// not hold it for long).
func (m *Manager) settleDelay(name string) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.records[name]
	if r == nil || r.State != StateSettling {
		return 0
	}
	return min(max(time.Until(r.SettleAt), 0), m.timeout)
}

// finished marks name as no longer pending, and closes Recovered when it
// was the last of those New found.
func (m *Manager) finished(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.pending, name)
	if m.initial[name] {
		delete(m.initial, name)
		if len(m.initial) == 0 {
			close(m.recovered)
		}
	}
}

// finish makes one attempt at finishing or undoing the step of the record
// named name. A record that is gone or published needs nothing.
func (m *Manager) finish(ctx context.Context, name string) error {
	r, unlock, err := m.lockRecord(ctx, name)
	if err != nil || r == nil {
		return err
	}
	defer unlock()
	if r.State == StatePublished || r.State == StateRecordLost {
		return nil // the servers' release undoes a record-lost mount
	}
	if err := m.resolveFor(r, methodUnmount); err != nil {
		return err
	}
	state := r.State
	if r.State == StateSettling {
		if m.settleDelay(name) > 0 {
			return nil // settling still: the caller waits and comes back
		}
		// Undo again whatever the plugin did late.
		r.State = StateUnpublishing
	}
	unstaged, err := m.teardown(ctx, r, false)
	if err != nil {
		return err
	}
	m.log.Info("unfinished mount step resolved", "plugin", r.PluginID, "volume", r.VolumeID, "workload", r.WorkloadID,
		"usage", r.UsageKey, "was", state, "unstaged", unstaged)
	return nil
}

// reconcileLoop compares the cluster mounts with the servers' claims at
// start, every interval and on TriggerReconcile, until ctx ends. A round
// that could not ask the servers (they are not reachable yet, say, at the
// agent's start) is tried again with backoff, never later than the
// interval.
func (m *Manager) reconcileLoop(ctx context.Context) {
	loop := m.watchdog.Loop("volume reconcile")
	defer loop.Done()
	var failures *retry.BackOff
	quietUntil := time.Now().Add(m.quiet)
	compared := false
	for {
		loop.Beat()
		wait := m.interval
		if m.reconcile(ctx, loop, time.Now().Before(quietUntil)) {
			quietUntil = time.Time{} // the servers answered: later failures are faults
			failures = nil
			if !compared {
				compared = true
				records, lost := m.countRecords()
				m.log.Info("compared mount records with the servers' claims", "records", records, "record_lost", lost)
			}
		} else {
			if failures == nil {
				failures = m.retry.NewBackOff()
			}
			wait = min(failures.NextBackOff(), m.interval)
		}
		if !m.waitRound(ctx, loop, wait) {
			return
		}
	}
}

// waitRound waits wait, or for TriggerReconcile, beating loop meanwhile.
// It returns false when ctx ended.
func (m *Manager) waitRound(ctx context.Context, loop *watchdog.Loop, wait time.Duration) bool {
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-m.trigger:
			return true
		case <-loop.C():
			loop.Beat()
		}
	}
}

// reconcile keeps every claim the servers hold as mounted here and that
// has no record as a record-lost mount (see noteLost), and removes every
// cluster mount whose claim index is at most the answer's index and whose
// volume and workload the servers no longer claim. Mounts made by a local
// scheduler (not cluster) are never touched.
// Errors are logged (a "no cluster leader" answer at debug while quiet);
// the next round tries again. It reports whether the round did all it had
// to.
func (m *Manager) reconcile(ctx context.Context, loop *watchdog.Loop, quiet bool) bool {
	cctx, cancel := context.WithTimeout(ctx, m.timeout)
	deadline, _ := cctx.Deadline()
	loop.Busy(deadline)
	since := m.removalsNow()
	defer m.pruneRemovals(since)
	claims, index, err := m.claims(cctx)
	cancel()
	if err != nil {
		switch {
		case ctx.Err() != nil:
		case quiet && csisupdv1.IsNoLeader(err):
			m.log.Debug("waiting for the servers to elect a leader before comparing this node's mounts with their claims", "error", err)
		default:
			m.log.Warn("cannot read the servers' claims of this node; trying again", "error", err)
		}
		return false
	}
	m.noteLost(ctx, loop, claims, since)
	held := make(map[[2]string]bool, len(claims))
	for _, c := range claims {
		held[[2]string{c.GetVolumeId(), c.GetWorkloadId()}] = true
	}
	var released []*record
	m.mu.Lock()
	for _, r := range m.records {
		if r.Cluster && r.ClaimIndex <= index && !held[[2]string{r.VolumeID, r.WorkloadID}] && r.State != StateSettling {
			released = append(released, r.clone())
		}
	}
	m.mu.Unlock()
	ok := true
	for _, r := range released {
		if ctx.Err() != nil {
			return true
		}
		// Unpublish and unstage, each bounded by the RPC timeout.
		loop.Busy(time.Now().Add(2 * m.timeout))
		if err := m.removeReleased(ctx, r.name(), index); err != nil {
			ok = false
			m.log.Warn("cannot unmount a mount whose claim the servers released; trying again",
				"plugin", r.PluginID, "volume", r.VolumeID, "workload", r.WorkloadID, "usage", r.UsageKey, "error", statusMessage(err))
		}
	}
	return ok
}

// removeReleased unmounts the cluster mount named name, when it still is
// one claimed at or before index.
func (m *Manager) removeReleased(ctx context.Context, name string, index uint64) error {
	r, unlock, err := m.lockRecord(ctx, name)
	if err != nil || r == nil {
		return err
	}
	defer unlock()
	// The mount may have been made again for a newer claim meanwhile.
	if !r.Cluster || r.ClaimIndex > index {
		return nil
	}
	if err := m.resolveFor(r, methodUnmount); err != nil {
		return err
	}
	unstaged, err := m.teardown(ctx, r, false)
	if err != nil {
		return err
	}
	m.log.Info("unmounted a volume whose claim the servers released", "plugin", r.PluginID, "volume", r.VolumeID,
		"workload", r.WorkloadID, "usage", r.UsageKey, "claim_index", r.ClaimIndex, "unstaged", unstaged)
	return nil
}

// lockRecord takes the volume lock of the record named name and returns a
// copy of the record as it is under that lock, with the unlock function.
// It returns a nil record (and nothing to unlock) when there is none, or
// none any more once the lock is held.
func (m *Manager) lockRecord(ctx context.Context, name string) (*record, func(), error) {
	m.mu.Lock()
	r := m.records[name]
	m.mu.Unlock()
	if r == nil {
		return nil, nil, nil
	}
	unlock, err := m.lockVolume(ctx, r.PluginID, r.VolumeID)
	if err != nil {
		return nil, nil, err
	}
	m.mu.Lock()
	r = m.records[name]
	if r != nil {
		r = r.clone()
	}
	m.mu.Unlock()
	if r == nil {
		unlock()
		return nil, nil, nil
	}
	return r, unlock, nil
}
