package heartbeat

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// State is a plugin's health state.
type State string

// Health states. Every plugin starts Unknown until its first probe.
const (
	Unknown   State = "unknown"
	Healthy   State = "healthy"
	Unhealthy State = "unhealthy"
)

// Result is what one probe found.
type Result struct {
	State       State
	Description string
	At          time.Time // when the probe finished
	// Duration is how long the Probe call took; zero in results that do
	// not come from a probe.
	Duration time.Duration
	// Err is the Probe call's error: nil when the plugin answered, ready
	// or not. The owner reads it to tell why a probe failed (its metrics
	// count failures by reason); Health keeps only the description.
	Err error
}

// Health is a plugin's health as its owner records it: the latest probe's
// result and since when its state holds. The Monitor keeps no Health; its
// owner applies each Result to the one it holds (the registry record).
type Health struct {
	State       State     `json:"state"`
	Description string    `json:"description"`
	Since       time.Time `json:"since"`      // when State began
	LastProbe   time.Time `json:"last_probe"` // when the latest probe finished
}

// Apply returns h after the probe result r, and whether r changed the state
// (a transition). Since moves only on a transition.
func (h Health) Apply(r Result) (Health, bool) {
	transition := r.State != h.State
	if transition {
		h.Since = r.At
	}
	h.State, h.Description, h.LastProbe = r.State, r.Description, r.At
	return h, transition
}

// Pace is what Config.Pace decides after a probe.
type Pace struct {
	// Wait is the time until the next probe. Zero (or less) means the
	// interval.
	Wait time.Duration
	// Backoff marks Wait as a backoff: a ProbeNow that arrived during the
	// probe is dropped, because it reports the very failure being backed
	// off (the failing probe broke the connection, and the broken
	// connection asked for a probe). A ProbeNow after the probe still
	// probes at once.
	Backoff bool
	// Description, when not empty, replaces the probe's health
	// description, to say why the next probe waits.
	Description string
}

// Config configures a Monitor.
type Config struct {
	// Identity is the plugin's Identity service. Required.
	Identity csi.IdentityClient
	// Timing returns the interval between probes and the timeout of one
	// probe, read before every probe. The owner holds them, so a reload
	// changes them in one place; it calls ProbeNow after a change, so that
	// a new interval starts now rather than after the current wait. It
	// must return a positive interval and a timeout in (0, interval].
	// Required.
	Timing func() (interval, timeout time.Duration)
	// OnProbe is called with the result of every probe. Called from the
	// monitor's goroutine; it must not block for long.
	OnProbe func(r Result)
	// Pace, when set, decides after every probe how long to wait before the
	// next one, from that probe's error (nil when the plugin answered) and
	// the current interval. The owner uses it to back off a plugin that
	// misbehaves in a way probing faster cannot fix. Nil waits Interval
	// after every probe. Called from the monitor's goroutine before
	// OnProbe; it must not block.
	Pace func(err error, interval time.Duration) Pace
	// Now returns the current time. Optional, for tests.
	Now func() time.Time
}

func (c *Config) validate() error {
	var errs []error
	if c.Identity == nil {
		errs = append(errs, errors.New("heartbeat: Identity is required"))
	}
	if c.Timing == nil {
		errs = append(errs, errors.New("heartbeat: Timing is required"))
	} else if err := ValidateTiming(c.Timing()); err != nil {
		errs = append(errs, err)
	}
	if c.OnProbe == nil {
		errs = append(errs, errors.New("heartbeat: OnProbe is required"))
	}
	return errors.Join(errs...)
}

// ValidateTiming checks a probe interval and timeout as Config.Timing must
// return them.
func ValidateTiming(interval, timeout time.Duration) error {
	var errs []error
	if interval <= 0 {
		errs = append(errs, fmt.Errorf("heartbeat: probe interval must be positive, got %s", interval))
	}
	if timeout <= 0 || timeout > interval {
		errs = append(errs, fmt.Errorf("heartbeat: probe timeout must be in (0, interval %s], got %s", interval, timeout))
	}
	return errors.Join(errs...)
}

// Monitor probes one plugin. Create it with New and run it with Run, on a
// goroutine of its own, or with a Scheduler's Start, which shares a few
// goroutines among many monitors.
type Monitor struct {
	cfg  Config
	kick chan struct{} // Run's
	// sched is the monitor's place in the Scheduler that runs it, if one
	// does.
	sched atomic.Pointer[entry]
	// req is every probe's request: it is empty, and only read.
	req *csi.ProbeRequest
}

// New validates cfg and returns a Monitor.
func New(cfg Config) (*Monitor, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Monitor{cfg: cfg, kick: make(chan struct{}, 1), req: &csi.ProbeRequest{}}, nil
}

// ProbeNow asks the monitor to probe as soon as it can. It never blocks.
func (m *Monitor) ProbeNow() {
	if e := m.sched.Load(); e != nil {
		e.sched.kick(e)
		return
	}
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// Run probes at once, then every interval (or after the wait Config.Pace
// decides) and whenever ProbeNow is called, until ctx ends. Callers wire ProbeNow to what tells them first that a
// plugin died (csiclient's OnDisconnect), so a death is noticed within
// milliseconds rather than at the next interval.
func (m *Monitor) Run(ctx context.Context) {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-m.kick:
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
		}
		wait, ok := m.probe(ctx, m.dropKick)
		if !ok {
			return
		}
		timer.Reset(alignedWait(time.Now(), wait))
	}
}

// alignGrid is the grid that scheduled probes are aligned to, when the wait
// is at least minAlignedWait.
const (
	alignGrid      = 250 * time.Millisecond
	minAlignedWait = 10 * alignGrid
)

// alignedWait moves the end of a wait that starts at now to the nearest
// multiple of alignGrid (of the wall clock), so that the probes of all the
// plugins of a node fall due on a few shared instants instead of at 1,000
// scattered ones: the runtime fires all timers due at one instant in one
// wake-up, and an agent woken 4 times a second instead of 200 spends a
// third less CPU on the same probes (make bench, 1,000 plugins). A wait
// changes by at most half the grid, and only waits of at least
// minAlignedWait are moved, so an interval is kept within 5 %, and on
// average exactly. Probes asked for with ProbeNow are never delayed.
func alignedWait(now time.Time, wait time.Duration) time.Duration {
	if wait < minAlignedWait {
		return wait
	}
	due := now.Add(wait).Add(alignGrid / 2).Truncate(alignGrid)
	return due.Sub(now)
}

// dropKick drops a ProbeNow that Run has not acted on yet.
func (m *Monitor) dropKick() {
	select {
	case <-m.kick:
	default:
	}
}

// probe probes once, reports the result and returns the wait until the
// next probe. When Pace backs the plugin off, it calls dropKick before it
// reports the result, to drop a ProbeNow that came during the probe (see
// Pace.Backoff). ok is false when ctx ended during the probe.
func (m *Monitor) probe(ctx context.Context, dropKick func()) (wait time.Duration, ok bool) {
	interval, timeout := m.cfg.Timing()

	pctx, cancel := context.WithTimeout(ctx, timeout)
	start := time.Now()
	resp, err := m.cfg.Identity.Probe(pctx, m.req)
	took := time.Since(start)
	cancel()
	if ctx.Err() != nil {
		return 0, false // shutting down: the result says nothing about the plugin
	}
	state, desc := Classify(resp, err, timeout)
	wait = interval
	if m.cfg.Pace != nil {
		p := m.cfg.Pace(err, interval)
		if p.Wait > 0 {
			wait = p.Wait
		}
		if p.Description != "" {
			desc = p.Description
		}
		if p.Backoff {
			dropKick()
		}
	}

	m.cfg.OnProbe(Result{State: state, Description: desc, At: m.cfg.Now(), Duration: took, Err: err})
	return wait, true
}

// Classify turns one Probe answer into a health state and description:
// ready=false is unhealthy "not ready", ready absent or true is healthy, and
// an error is unhealthy with its text.
func Classify(resp *csi.ProbeResponse, err error, timeout time.Duration) (State, string) {
	if err != nil {
		st, ok := status.FromError(err)
		if !ok {
			// A bare context error (not from gRPC) still classifies by
			// its meaning, not as Unknown.
			st = status.FromContextError(err)
		}
		switch st.Code() {
		case codes.DeadlineExceeded:
			return Unhealthy, fmt.Sprintf("probe timed out after %s", timeout)
		case codes.Unavailable:
			return Unhealthy, "plugin unreachable: " + st.Message()
		default:
			return Unhealthy, fmt.Sprintf("probe failed: %s: %s", st.Code(), st.Message())
		}
	}
	if r := resp.GetReady(); r != nil && !r.GetValue() {
		return Unhealthy, "plugin reports not ready"
	}
	return Healthy, "healthy"
}
