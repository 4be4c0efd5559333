// Package watchdog proves that the agent's supervision loops still turn.
//
// Each essential loop (the registry's watcher and reconciler, the Consul
// sync, the node registration, the server's leader loops, ...) registers
// a Loop and beats it on every turn, and at least every quarter timeout
// while idle (Loop.C). A Monitor pings systemd's watchdog (WATCHDOG=1)
// every third of the timeout, but only while every registered loop has
// beaten within the timeout: a deadlocked loop stops the pings and systemd
// restarts the agent, where a ping from a goroutine of its own would keep
// a wedged agent "active (running)" for ever.
//
// A loop about to block in a call with a deadline (a request bounded by a
// timeout) says so first with Loop.Busy(deadline): it counts as beating
// until that deadline, so it is wedged only when the call overruns its
// deadline by more than the timeout. Its next Beat ends the busy spell. A
// loop that blocks in a call without a deadline is a defect in itself:
// the watchdog cannot tell a slow call from a hung one.
//
// A chain of calls made for a loop, in packages that do not hold the
// Loop, beats it through the context: WithLoop puts the loop in a
// context, and Beat, Busy and BusyWith act on the loop a context carries
// (none for a request's context).
//
// A loop whose work has a hard deadline of its own (a configuration
// reload) says so with Loop.Due(deadline) instead: it is stale as soon as
// the deadline passes without a Beat, not a timeout later.
//
// Per-plugin supervisors are deliberately not loops: a plugin that hangs
// bounds its own calls with deadlines and must never restart the agent.
package watchdog

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultTimeout is the liveness timeout when systemd sets no watchdog:
// loops still beat, so /v1/health and the metrics can tell a wedged loop.
const DefaultTimeout = 30 * time.Second

// Config configures a Monitor.
type Config struct {
	// Timeout is how long a loop may go without a beat before the agent
	// counts as wedged: systemd's WatchdogSec (WATCHDOG_USEC) when set,
	// else DefaultTimeout. Required.
	Timeout time.Duration
	// Notify sends one sd_notify message ("WATCHDOG=1"). Nil: the monitor
	// tracks the loops but pings nothing (not under a systemd watchdog).
	Notify func(state string) error
	// Metrics receives csisupd_watchdog_* series. Nil registers nothing.
	Metrics prometheus.Registerer
	// Logger receives a warning naming the loops that stopped beating.
	// Nil discards it.
	Logger hclog.Logger
	// Now is the clock; nil is time.Now. Tests only.
	Now func() time.Time
}

// Monitor tracks the liveness of loops and pings systemd while all beat.
type Monitor struct {
	cfg Config
	log hclog.Logger

	mu    sync.Mutex
	loops map[*Loop]struct{}
	pings prometheus.Counter
}

// New validates cfg and returns a Monitor. Nothing runs until Run.
func New(cfg Config) (*Monitor, error) {
	if cfg.Timeout <= 0 {
		return nil, fmt.Errorf("watchdog: Timeout must be positive, got %s", cfg.Timeout)
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	m := &Monitor{cfg: cfg, log: cfg.Logger, loops: make(map[*Loop]struct{})}
	m.pings = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "csisupd_watchdog_pings_total",
		Help: "WATCHDOG=1 messages sent to systemd.",
	})
	if cfg.Metrics != nil {
		if err := errors.Join(
			cfg.Metrics.Register(m.pings),
			cfg.Metrics.Register(&collector{m: m, timeout: timeoutDesc, age: ageDesc}),
		); err != nil {
			return nil, fmt.Errorf("watchdog: metrics: %w", err)
		}
	}
	return m, nil
}

// Timeout is the liveness timeout the monitor enforces.
func (m *Monitor) Timeout() time.Duration { return m.cfg.Timeout }

// PingInterval is how often Run pings: a third of the timeout. systemd
// kills the service when a timeout passes without a ping; at a third, a
// ping delayed by a loaded machine, or one left out while a loop is
// stale for a moment, still leaves a third of the timeout to spare.
func (m *Monitor) PingInterval() time.Duration { return m.cfg.Timeout / 3 }

// Loop registers a loop under name and returns it, counted as having just
// beaten. A nil Monitor returns a nil Loop, whose methods do nothing, so
// components take an optional *Monitor.
func (m *Monitor) Loop(name string) *Loop {
	if m == nil {
		return nil
	}
	interval := m.cfg.Timeout / 4
	l := &Loop{m: m, name: name, ticker: time.NewTicker(interval), last: m.cfg.Now()}
	m.mu.Lock()
	m.loops[l] = struct{}{}
	m.mu.Unlock()
	return l
}

// Stale returns the names of the loops that have not beaten within the
// timeout, sorted; empty when all are alive. A loop busy in a bounded
// call counts as beating until the call's deadline (Loop.Busy).
func (m *Monitor) Stale() []string {
	now := m.cfg.Now()
	var stale []string
	m.mu.Lock()
	for l := range m.loops {
		if l.age(now) > m.cfg.Timeout {
			stale = append(stale, l.name)
		}
	}
	m.mu.Unlock()
	slices.Sort(stale)
	return stale
}

// Run pings systemd every PingInterval while no loop is stale, until ctx
// ends. Without Notify it returns at once.
func (m *Monitor) Run(ctx context.Context) {
	if m.cfg.Notify == nil {
		return
	}
	t := time.NewTicker(m.PingInterval())
	defer t.Stop()
	wedged := false
	for {
		if stale := m.Stale(); len(stale) > 0 {
			if !wedged {
				m.log.Error("supervision loops stopped turning; not pinging the systemd watchdog, which will restart the agent",
					"loops", stale, "timeout", m.cfg.Timeout)
			}
			wedged = true
		} else {
			wedged = false
			if err := m.cfg.Notify("WATCHDOG=1"); err != nil {
				m.log.Debug("watchdog ping failed", "error", err)
			} else {
				m.pings.Inc()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Loop is one registered loop. Its methods are safe for concurrent use and
// do nothing on a nil Loop.
type Loop struct {
	m      *Monitor
	name   string
	ticker *time.Ticker

	mu   sync.Mutex
	last time.Time
	// busyUntil is the deadline of the call the loop is in (Busy); zero
	// when it is not in one.
	busyUntil time.Time
	// dueBy is the deadline of the work the loop is in (Due); zero when
	// it is not in any.
	dueBy time.Time
}

// Beat records that the loop turned. It ends a busy spell (Busy).
func (l *Loop) Beat() {
	l.turn(time.Time{}, time.Time{})
}

// Busy records that the loop turned and is about to block in a call whose
// deadline is until: the loop counts as beating until then, so it is
// stale only once until plus the timeout passed without a beat. The
// loop's next Beat ends the busy spell. Pass the call's own deadline
// (that of its context, in real time, whatever clock Config.Now is), not
// a guess: a call that overruns it is what the watchdog must see.
func (l *Loop) Busy(until time.Time) {
	l.turn(until, time.Time{})
}

// Due records that the loop turned and is about to run work that must end
// by deadline: the loop counts as beating until then, and as stale from
// the moment deadline passes until its next Beat, which ends the work.
// Where Busy gives a call its deadline plus the timeout, Due is for work
// whose deadline is itself the bound the watchdog enforces. Pass the
// deadline in real time, as for Busy.
func (l *Loop) Due(deadline time.Time) {
	l.turn(time.Time{}, deadline)
}

// turn records a turn of the loop, busy until busyUntil and with work due
// by dueBy, each a real-time deadline or zero for none. The deadlines are
// moved to the monitor's clock by the real time left until them.
func (l *Loop) turn(busyUntil, dueBy time.Time) {
	if l == nil {
		return
	}
	now := l.m.cfg.Now()
	onClock := func(deadline time.Time) time.Time {
		if deadline.IsZero() {
			return time.Time{}
		}
		return now.Add(time.Until(deadline))
	}
	l.mu.Lock()
	l.last, l.busyUntil, l.dueBy = now, onClock(busyUntil), onClock(dueBy)
	l.mu.Unlock()
}

// C fires every quarter timeout, so an idle loop wakes up to Beat (a
// select arm `case <-loop.C(): loop.Beat()`). A nil Loop's channel never
// fires.
func (l *Loop) C() <-chan time.Time {
	if l == nil {
		return nil
	}
	return l.ticker.C
}

// Wait waits d, or until ctx ends, beating meanwhile: a loop that waits
// out a backoff is idle, not wedged. It returns ctx.Err() when ctx ended
// first. With a nil Loop it is a plain wait.
func (l *Loop) Wait(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		l.Beat()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-l.C():
		}
	}
}

// Done unregisters the loop: call it when the loop returns normally (its
// context ended), so a stopped loop does not count as wedged.
func (l *Loop) Done() {
	if l == nil {
		return
	}
	l.ticker.Stop()
	l.m.mu.Lock()
	delete(l.m.loops, l)
	l.m.mu.Unlock()
}

// age is how long before now the loop last counted as beating: at its
// last Beat, or, while it is busy, at now until the call's deadline and
// at the deadline after it. Past the deadline of its work (Due) it is
// the timeout plus the overrun, so that the loop is stale at once.
func (l *Loop) age(now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.dueBy.IsZero() {
		if now.After(l.dueBy) {
			return l.m.cfg.Timeout + now.Sub(l.dueBy)
		}
		return 0
	}
	last := l.last
	switch {
	case !l.busyUntil.After(last):
	case now.Before(l.busyUntil):
		last = now
	default:
		last = l.busyUntil
	}
	return now.Sub(last)
}

var (
	timeoutDesc = prometheus.NewDesc("csisupd_watchdog_timeout_seconds",
		"How long a supervision loop may go without a beat before the agent counts as wedged.", nil, nil)
	ageDesc = prometheus.NewDesc("csisupd_watchdog_loop_beat_age_seconds",
		"Seconds since the supervision loop last beat; the agent is wedged when one exceeds csisupd_watchdog_timeout_seconds.",
		[]string{"loop"}, nil)
)

// collector reports the loops at scrape time.
type collector struct {
	m            *Monitor
	timeout, age *prometheus.Desc
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.timeout
	ch <- c.age
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.timeout, prometheus.GaugeValue, c.m.cfg.Timeout.Seconds())
	now := c.m.cfg.Now()
	// Loops sharing a name (a component started twice in one process)
	// report their oldest beat.
	ages := map[string]float64{}
	c.m.mu.Lock()
	for l := range c.m.loops {
		age := l.age(now).Seconds()
		if cur, ok := ages[l.name]; !ok || age > cur {
			ages[l.name] = age
		}
	}
	c.m.mu.Unlock()
	for name, age := range ages {
		ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, age, name)
	}
}

// loopKey is the context key of the Loop that a long chain of calls made
// for that loop beats between calls (Beat).
type loopKey struct{}

// WithLoop returns ctx carrying l, so that the calls made with it beat l
// between steps. The server's volume watcher uses it: one release makes
// several calls to agents, each bounded by its own timeout, and may take
// longer in all than the watchdog timeout without being stuck.
func WithLoop(ctx context.Context, l *Loop) context.Context {
	return context.WithValue(ctx, loopKey{}, l)
}

// Busy tells the loop ctx carries, if any, that it is in a call bounded
// by deadline (Loop.Busy): it is not wedged until then. A request's
// context carries none, and Busy does nothing then.
func Busy(ctx context.Context, deadline time.Time) {
	if l, ok := ctx.Value(loopKey{}).(*Loop); ok {
		l.Busy(deadline)
	}
}

// BusyWith is Busy until call's deadline, for a call made with call, a
// context derived from ctx with a deadline.
func BusyWith(ctx, call context.Context) {
	if d, ok := call.Deadline(); ok {
		Busy(ctx, d)
	}
}

// Beat beats the loop ctx carries, if any.
func Beat(ctx context.Context) {
	if l, ok := ctx.Value(loopKey{}).(*Loop); ok {
		l.Beat()
	}
}
