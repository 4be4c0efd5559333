package registry

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"

	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/retry"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// reconcilerConfig configures a reconciler.
type reconcilerConfig struct {
	Registry *Registry
	Grace    time.Duration
	Timing   timing
	// StopTimeout bounds the wait for one stopping supervisor, and for all
	// of them at shutdown.
	StopTimeout time.Duration
	// MaxMessageSize caps one reply from a plugin; zero is csiclient's
	// default.
	MaxMessageSize int
	// Redial and FingerprintRetry are every supervisor's (see
	// ManagerConfig.PluginRedial and FingerprintRetry).
	Redial           retry.Policy
	FingerprintRetry retry.Policy
	// DialOptions are every plugin connection's (ManagerConfig.PluginDialOptions).
	DialOptions []grpc.DialOption
	Logger      hclog.Logger
	// Watchdog, when set, gets the "plugin reconciler" loop, beaten on
	// every turn of run.
	Watchdog *watchdog.Monitor
}

// gone is a plugin whose socket is no longer in the desired set.
type gone struct {
	inst  plugin.Instance
	since time.Time
	// restored is true for a record loaded from disk whose socket was not
	// found after start-up.
	restored bool
}

// reconciler makes the running supervisors match the desired set, like
// kubelet's desired/actual state loop: it is level-triggered, so it only
// ever compares the latest desired state with what runs.
//
//   - a desired plugin without a supervisor gets one;
//   - a desired plugin whose socket identity changed (the socket was
//     replaced) gets its old supervisor stopped and a new one started;
//   - a plugin whose socket left the desired set keeps its supervisor for
//     the grace period and is deregistered when the socket stayed away that
//     long; a socket back within the grace cancels that;
//   - a record restored from disk without a socket is deregistered after
//     the grace period too.
//
// It never waits for a plugin: starting a supervisor dials nothing, and a
// supervisor to stop leaves the live set at once and is stopped in the
// background (see retire), so a plugin that stopped reading cannot hold up
// discovery, deregistration or shutdown. A supervisor that does not stop
// within StopTimeout is abandoned: logged and counted, never waited for
// again.
type reconciler struct {
	reg         *Registry
	grace       time.Duration
	stopTimeout time.Duration
	maxMessage  int
	redial      retry.Policy
	fpRetry     retry.Policy
	dialOpts    []grpc.DialOption
	log         hclog.Logger
	watchdog    *watchdog.Monitor

	// gone and expect are touched only by the run goroutine. expect is
	// the latest desired state's declared types: a plugin whose declared
	// type changes is supervised anew.
	gone   map[string]gone
	expect map[string]plugin.Type

	// stopping counts the background stops in progress; each ends by its
	// deadline.
	stopping  sync.WaitGroup
	abandoned atomic.Uint64

	// timing is the one copy of the probe and fingerprint timing, read by
	// every supervisor and monitor.
	timing *probeTiming
	// probes runs the probes of every supervisor's monitor.
	probes *heartbeat.Scheduler

	mu   sync.Mutex // guards transport and sups; held only briefly
	sups map[string]*supervisor
	// transport is shared by the supervision connections of the plugins
	// started with the current timing: writes to a plugin are bounded by
	// the probe timeout, replies by maxMessage.
	transport *csiclient.Transport
}

// newTransport is the supervision transport for timing t.
func (r *reconciler) newTransport(t timing) *csiclient.Transport {
	return csiclient.NewTransport(csiclient.TransportConfig{WriteTimeout: t.ProbeTimeout, MaxMessageSize: r.maxMessage})
}

func newReconciler(cfg reconcilerConfig) *reconciler {
	if cfg.StopTimeout <= 0 {
		cfg.StopTimeout = DefaultStopTimeout
	}
	r := &reconciler{
		reg:         cfg.Registry,
		grace:       cfg.Grace,
		stopTimeout: cfg.StopTimeout,
		maxMessage:  cfg.MaxMessageSize,
		redial:      cfg.Redial,
		fpRetry:     cfg.FingerprintRetry,
		dialOpts:    cfg.DialOptions,
		log:         cfg.Logger,
		watchdog:    cfg.Watchdog,
		gone:        make(map[string]gone),
		timing:      newProbeTiming(cfg.Timing),
		probes:      heartbeat.NewScheduler(heartbeat.SchedulerConfig{}),
		sups:        make(map[string]*supervisor),
	}
	r.transport = r.newTransport(cfg.Timing)
	return r
}

// run reconciles every desired state from updates and every expired grace
// period until ctx ends, then stops all supervisors, waiting for them for
// at most StopTimeout. ready is closed after the first desired state has
// been reconciled.
func (r *reconciler) run(ctx context.Context, updates <-chan desiredState, ready chan<- struct{}) {
	defer r.stopAll()
	// Done before stopAll, which is bounded by StopTimeout on its own.
	l := r.watchdog.Loop("plugin reconciler")
	defer l.Done()

	graceTimer := time.NewTimer(time.Hour)
	graceTimer.Stop()
	defer graceTimer.Stop()
	var desired map[string]plugin.Instance
	first := true
	for {
		// Every turn ends here. A turn waits for no plugin, so only a
		// wedged agent (a lock never released, a log sink that blocks)
		// stops the beats.
		l.Beat()
		select {
		case <-ctx.Done():
			return
		case <-l.C():
			continue // idle: the beat above is the turn
		case st := <-updates:
			desired, r.expect = st.Sockets, st.Expect
		case <-graceTimer.C:
		}
		next, ok := r.reconcile(ctx, desired, time.Now())
		if ok {
			graceTimer.Reset(next)
		} else {
			graceTimer.Stop()
		}
		if first {
			first = false
			close(ready)
		}
	}
}

// reconcile applies one desired state at time now. It returns how long
// until the next grace period ends, and false when none is running.
func (r *reconciler) reconcile(ctx context.Context, desired map[string]plugin.Instance, now time.Time) (time.Duration, bool) {
	// Desired plugins: start, restart on a new socket identity, and cancel
	// a pending deregistration.
	for id, inst := range desired {
		if g, ok := r.gone[id]; ok {
			delete(r.gone, id)
			if g.inst == inst {
				r.log.Info("plugin socket is back within the grace period", "plugin", id, "socket", inst.Path)
			}
		}
		r.mu.Lock()
		old := r.sups[id]
		r.mu.Unlock()
		if old != nil && old.inst == inst && old.expect == r.expect[id] {
			continue
		}
		if old != nil {
			if old.inst == inst {
				r.log.Info("plugin's declared type changed; restarting its supervisor", "plugin", id,
					"old", string(old.expect), "new", string(r.expect[id]))
			} else {
				r.log.Info("plugin socket replaced; restarting its supervisor", "plugin", id,
					"old", old.inst.String(), "new", inst.String())
			}
			// The new instance starts now, not when the old one has
			// stopped; the old one is fenced before the new one starts,
			// so it cannot write over the new record.
			r.removeSupervisor(id, old)
			r.retire(old, time.Now().Add(r.stopTimeout))
		}
		r.startSupervisor(ctx, id, inst)
	}

	// Supervised plugins whose socket went away start their grace period.
	r.mu.Lock()
	for id, s := range r.sups {
		if _, ok := desired[id]; ok {
			continue
		}
		if _, ok := r.gone[id]; !ok {
			r.gone[id] = gone{inst: s.inst, since: now}
			r.log.Info("plugin socket removed; deregistering after the grace period unless it returns",
				"plugin", id, "socket", s.inst.Path, "grace", r.grace)
		}
	}
	supervised := make(map[string]bool, len(r.sups))
	for id := range r.sups {
		supervised[id] = true
	}
	r.mu.Unlock()

	// Records without a supervisor (restored from disk) whose socket is
	// missing start their grace period too.
	for _, p := range r.reg.List() {
		_, isDesired := desired[p.ID]
		_, isGone := r.gone[p.ID]
		if !isDesired && !isGone && !supervised[p.ID] {
			r.gone[p.ID] = gone{inst: p.Instance, since: now, restored: true}
			r.log.Info("restored plugin has no socket; deregistering after the grace period unless it appears",
				"plugin", p.ID, "socket", p.Instance.Path, "grace", r.grace)
		}
	}

	// Deregister what stayed gone for the grace period; find the next
	// deadline of the rest.
	var next time.Duration
	pending := false
	for id, g := range r.gone {
		left := g.since.Add(r.grace).Sub(now)
		if left > 0 {
			if !pending || left < next {
				next, pending = left, true
			}
			continue
		}
		delete(r.gone, id)
		r.mu.Lock()
		s := r.sups[id]
		r.mu.Unlock()
		if s != nil {
			// Fenced before the record goes, so it cannot register
			// again; stopped in the background.
			r.removeSupervisor(id, s)
			r.retire(s, time.Now().Add(r.stopTimeout))
		}
		reason := fmt.Sprintf("socket %s removed %s ago", g.inst.Path, r.grace)
		if g.restored {
			reason = fmt.Sprintf("socket %s not found for %s after restart", g.inst.Path, r.grace)
		}
		// No supervisor runs for id any more, so whatever instance the
		// record holds is stale (normally g.inst; another one when a
		// supervisor never got to register its own instance).
		if p, ok := r.reg.Get(id); ok {
			r.reg.Deregister(id, p.Instance, reason)
		} else {
			// Nothing to deregister, but the plugin's metrics may have
			// series (a supervisor stopped before it registered): the
			// label set stays bounded by the live plugins.
			r.reg.metrics.forget(id)
		}
	}
	return next, pending
}

func (r *reconciler) startSupervisor(ctx context.Context, id string, inst plugin.Instance) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, err := startSupervisor(ctx, supervisorConfig{
		ID:               id,
		Instance:         inst,
		Expect:           r.expect[id],
		Registry:         r.reg,
		Timing:           r.timing,
		Probes:           r.probes,
		Transport:        r.transport,
		Redial:           r.redial,
		FingerprintRetry: r.fpRetry,
		DialOptions:      r.dialOpts,
		Logger:           r.log.Named(id),
	})
	if err != nil {
		// Retried with the next desired state (at the latest, the next rescan).
		r.log.Error("cannot supervise plugin", "plugin", id, "socket", inst.Path, "error", err)
		return
	}
	r.log.Info("supervising plugin", "plugin", id, "socket", inst.String())
	r.sups[id] = s
}

// removeSupervisor forgets s if it still is id's supervisor.
func (r *reconciler) removeSupervisor(id string, s *supervisor) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sups[id] == s {
		delete(r.sups, id)
	}
}

// retire stops s, which has left the live set, in the background: it
// closes s's connection and cancels it now (beginStop never waits for the
// plugin) and waits for it until deadline on a goroutine of its own, then
// abandons it.
func (r *reconciler) retire(s *supervisor, deadline time.Time) {
	s.beginStop()
	r.stopping.Go(func() {
		if s.awaitStop(deadline) {
			return
		}
		r.abandoned.Add(1)
		r.log.Warn("plugin supervisor did not stop in time; abandoned", "plugin", s.id,
			"socket", s.inst.Path, "timeout", r.stopTimeout)
	})
}

// stopAll stops every supervisor at once and waits for all of them, and for
// the stops already in progress, for at most StopTimeout in all: every
// connection is closed and every supervisor cancelled first, then they
// share one deadline, and whatever has not stopped by then is abandoned.
func (r *reconciler) stopAll() {
	deadline := time.Now().Add(r.stopTimeout)
	r.mu.Lock()
	sups := r.sups
	r.sups = make(map[string]*supervisor)
	r.mu.Unlock()
	for _, s := range sups {
		r.retire(s, deadline)
	}
	// Bounded: each stop ends by its own deadline, none later than this
	// one.
	r.stopping.Wait()
}

// abandonedCount returns how many supervisors did not stop in time.
func (r *reconciler) abandonedCount() uint64 { return r.abandoned.Load() }

// lookup returns the instance plugin id's supervisor runs and its live
// connection.
func (r *reconciler) lookup(id string) (plugin.Instance, *csiclient.Client, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.sups[id]
	if !ok {
		return plugin.Instance{}, nil, false
	}
	return s.inst, s.client, true
}

// setTiming applies new timing to every supervisor and to future ones: it
// replaces the one copy they all read, then has each probe at once so that
// the new interval starts now.
func (r *reconciler) setTiming(t timing) {
	r.mu.Lock()
	if t.ProbeTimeout != r.timing.get().ProbeTimeout {
		// Plugins started from now on get writes bounded by the new
		// timeout; running connections keep theirs until the plugin's
		// next instance.
		r.transport = r.newTransport(t)
	}
	r.timing.set(t)
	sups := make([]*supervisor, 0, len(r.sups))
	for _, s := range r.sups {
		sups = append(sups, s)
	}
	r.mu.Unlock()
	for _, s := range sups {
		s.timingChanged()
	}
}
