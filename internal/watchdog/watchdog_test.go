package watchdog

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/csisupd/csisupd/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestNewValidates(t *testing.T) {
	for _, timeout := range []time.Duration{0, -time.Second} {
		if _, err := New(Config{Timeout: timeout}); err == nil || !strings.Contains(err.Error(), "Timeout") {
			t.Errorf("New(Timeout %s) = %v, want an error naming Timeout", timeout, err)
		}
	}
}

func TestStaleNamesLoopsWithoutBeat(t *testing.T) {
	c := testutil.NewClock(time.Unix(1000, 0))
	m, err := New(Config{Timeout: 10 * time.Second, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	watcher, reconciler := m.Loop("watcher"), m.Loop("reconciler")
	defer watcher.Done()
	defer reconciler.Done()

	steps := []struct {
		advance time.Duration
		beat    []*Loop
		want    string
	}{
		{0, nil, ""},
		{10 * time.Second, nil, ""}, // exactly the timeout is still alive
		{time.Second, []*Loop{watcher}, "reconciler"},
		{0, []*Loop{reconciler}, ""},
		{11 * time.Second, nil, "reconciler,watcher"},
	}
	for i, s := range steps {
		c.Advance(s.advance)
		for _, l := range s.beat {
			l.Beat()
		}
		if got := strings.Join(m.Stale(), ","); got != s.want {
			t.Errorf("step %d: Stale() = %q, want %q", i, got, s.want)
		}
	}
	reconciler.Done()
	if got := strings.Join(m.Stale(), ","); got != "watcher" {
		t.Errorf("after Done, Stale() = %q, want only watcher", got)
	}
}

func TestNilMonitorAndLoopAreNoOps(t *testing.T) {
	var m *Monitor
	l := m.Loop("x")
	if l != nil {
		t.Fatalf("nil Monitor returned a Loop")
	}
	l.Beat()
	l.Done()
	select {
	case <-l.C():
		t.Fatal("a nil Loop's channel fired")
	default:
	}
}

// pings collects the messages a Monitor sends.
type pings struct{ ch chan string }

func (p *pings) notify(state string) error {
	select {
	case p.ch <- state:
	default:
	}
	return nil
}

func (p *pings) next(t *testing.T, within time.Duration) bool {
	t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	select {
	case s := <-p.ch:
		if s != "WATCHDOG=1" {
			t.Fatalf("sent %q, want WATCHDOG=1", s)
		}
		return true
	case <-timer.C:
		return false
	}
}

func TestRunPingsOnlyWhileAllLoopsBeat(t *testing.T) {
	const timeout = 200 * time.Millisecond
	c := testutil.NewClock(time.Unix(1000, 0))
	p := &pings{ch: make(chan string, 1)}
	reg := prometheus.NewRegistry()
	logs := &testutil.SyncBuffer{}
	log := hclog.New(&hclog.LoggerOptions{Output: logs})
	m, err := New(Config{Timeout: timeout, Notify: p.notify, Now: c.Now, Metrics: reg, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	alive, wedged := m.Loop("alive"), m.Loop("wedged")
	defer alive.Done()
	defer wedged.Done()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	if !p.next(t, 10*timeout) {
		t.Fatal("no ping while every loop beats")
	}
	// Time passes; only one loop beats. The clock is manual, so the
	// monitor sees the other as stale at its very next tick.
	c.Advance(2 * timeout)
	alive.Beat()
	// Once the monitor has logged the wedge, every later turn sees it;
	// drain a ping sent before that.
	testutil.WaitFor(t, 10*timeout, "the monitor to report the wedged loop", func() bool {
		return strings.Contains(logs.String(), "stopped turning") && strings.Contains(logs.String(), "wedged")
	})
	for len(p.ch) > 0 {
		<-p.ch
	}
	// Observe three ping intervals: a wedged loop allows no ping at all.
	if p.next(t, 3*timeout/2) {
		t.Fatal("pinged although loop \"wedged\" has not beaten for twice the timeout")
	}
	if got := promtest.ToFloat64(m.pings); got < 1 {
		t.Errorf("csisupd_watchdog_pings_total = %v, want at least 1", got)
	}
	// The loop recovers: pings resume.
	wedged.Beat()
	if !p.next(t, 10*timeout) {
		t.Fatal("no ping after the wedged loop beat again")
	}
}

func TestMetrics(t *testing.T) {
	c := testutil.NewClock(time.Unix(1000, 0))
	reg := prometheus.NewRegistry()
	m, err := New(Config{Timeout: 30 * time.Second, Now: c.Now, Metrics: reg})
	if err != nil {
		t.Fatal(err)
	}
	a, b := m.Loop("reconciler"), m.Loop("reconciler")
	defer a.Done()
	defer b.Done()
	c.Advance(7 * time.Second)
	b.Beat()
	want := `
# HELP csisupd_watchdog_loop_beat_age_seconds Seconds since the supervision loop last beat; the agent is wedged when one exceeds csisupd_watchdog_timeout_seconds.
# TYPE csisupd_watchdog_loop_beat_age_seconds gauge
csisupd_watchdog_loop_beat_age_seconds{loop="reconciler"} 7
# HELP csisupd_watchdog_timeout_seconds How long a supervision loop may go without a beat before the agent counts as wedged.
# TYPE csisupd_watchdog_timeout_seconds gauge
csisupd_watchdog_timeout_seconds 30
`
	if err := promtest.GatherAndCompare(reg, strings.NewReader(want),
		"csisupd_watchdog_loop_beat_age_seconds", "csisupd_watchdog_timeout_seconds"); err != nil {
		t.Error(err)
	}
}

func TestWaitBeatsWhileWaiting(t *testing.T) {
	c := testutil.NewClock(time.Unix(1000, 0))
	m, err := New(Config{Timeout: 40 * time.Millisecond, Now: c.Now})
	if err != nil {
		t.Fatal(err)
	}
	l := m.Loop("backoff")
	defer l.Done()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Wait(ctx, time.Hour) }()
	// The manual clock moves past the timeout; the waiting loop's next
	// tick beats, so it is fresh again without returning.
	c.Advance(time.Minute)
	testutil.WaitFor(t, 5*time.Second, "the waiting loop to beat", func() bool { return len(m.Stale()) == 0 })
	cancel()
	if err := <-done; err != context.Canceled {
		t.Fatalf("Wait = %v, want context.Canceled", err)
	}
	var nilLoop *Loop
	if err := nilLoop.Wait(context.Background(), time.Millisecond); err != nil {
		t.Fatalf("nil Loop Wait = %v", err)
	}
}

// deadlineStep is one step of a deadline test: the monitor's clock
// advances, then the loop beats, goes busy until now+busy or takes work
// due by now+due, as set.
type deadlineStep struct {
	advance time.Duration
	busy    time.Duration // not 0: Busy(now + busy)
	due     time.Duration // not 0: Due(now + due)
	beat    bool
}

// deadlineCase is a deadline test: the steps, then whether the loop is
// stale and the beat age it reports.
type deadlineCase struct {
	name    string
	steps   []deadlineStep
	stale   bool
	wantAge time.Duration
}

// runDeadlineCases runs each case on a new monitor of timeout.
func runDeadlineCases(t *testing.T, timeout time.Duration, cases []deadlineCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := testutil.NewClock(time.Unix(1000, 0))
			reg := prometheus.NewRegistry()
			m, err := New(Config{Timeout: timeout, Now: c.Now, Metrics: reg})
			if err != nil {
				t.Fatal(err)
			}
			l := m.Loop("caller")
			defer l.Done()
			for _, s := range tc.steps {
				c.Advance(s.advance)
				if s.beat {
					l.Beat()
				}
				// A deadline is real time; the monitor measures it on its
				// own clock from the moment of the call.
				if s.busy != 0 {
					l.Busy(time.Now().Add(s.busy))
				}
				if s.due != 0 {
					l.Due(time.Now().Add(s.due))
				}
			}
			if stale := m.Stale(); (len(stale) > 0) != tc.stale || (tc.stale && stale[0] != "caller") {
				t.Errorf("Stale() = %v, want stale %v", stale, tc.stale)
			}
			// The real time that passed during the test moves the deadline
			// by as much; far less than the tolerance.
			age, ok := testutil.MetricValue(t, reg, "csisupd_watchdog_loop_beat_age_seconds", "loop", "caller")
			if !ok || math.Abs(age-tc.wantAge.Seconds()) > 0.05 {
				t.Errorf("beat age = %v (found %v), want %v", age, ok, tc.wantAge.Seconds())
			}
		})
	}
}

// A loop busy in a call with a deadline counts as beating until that
// deadline: it is stale only once the deadline plus the timeout passed,
// and its next beat ends the busy spell. The beat age it reports counts
// from the deadline.
func TestBusyUntilDeadline(t *testing.T) {
	const timeout = 10 * time.Second
	runDeadlineCases(t, timeout, []deadlineCase{
		{"before the deadline, past the timeout", []deadlineStep{{busy: time.Minute}, {advance: 30 * time.Second}}, false, 0},
		{"at the deadline", []deadlineStep{{busy: time.Minute}, {advance: time.Minute}}, false, 0},
		{"within the timeout after the deadline", []deadlineStep{{busy: time.Minute}, {advance: time.Minute + timeout - time.Second}}, false, timeout - time.Second},
		{"past deadline plus the timeout", []deadlineStep{{busy: time.Minute}, {advance: time.Minute + timeout + time.Second}}, true, timeout + time.Second},
		{"a beat ends the busy spell", []deadlineStep{{busy: time.Minute}, {advance: time.Second, beat: true}, {advance: timeout + time.Second}}, true, timeout + time.Second},
		{"busy again after a beat", []deadlineStep{{busy: time.Minute}, {advance: time.Second, beat: true}, {busy: time.Minute}, {advance: 30 * time.Second}}, false, 0},
		{"a deadline already past is a beat", []deadlineStep{{busy: -time.Second}, {advance: timeout + time.Second}}, true, timeout + time.Second},
		{"a short deadline, then the timeout", []deadlineStep{{busy: time.Second}, {advance: time.Second + timeout - time.Second/2}}, false, timeout - time.Second/2},
	})
	var nilLoop *Loop
	nilLoop.Busy(time.Now()) // does nothing
}

// A loop in work with a deadline (Due) counts as beating until the
// deadline and is stale as soon as it passes, not a timeout later; its
// next beat, or a Busy call, ends the work. The beat age it reports past
// the deadline is the timeout plus the overrun.
func TestDueStaleAtTheDeadline(t *testing.T) {
	const timeout = 10 * time.Second
	runDeadlineCases(t, timeout, []deadlineCase{
		{"before the deadline, past the timeout", []deadlineStep{{due: time.Minute}, {advance: 50 * time.Second}}, false, 0},
		{"past the deadline", []deadlineStep{{due: time.Minute}, {advance: time.Minute + time.Second}}, true, timeout + time.Second},
		{"a deadline shorter than the timeout", []deadlineStep{{due: time.Second}, {advance: 2 * time.Second}}, true, timeout + time.Second},
		{"a beat ends the work", []deadlineStep{{due: time.Second}, {advance: time.Second / 2, beat: true}, {advance: 5 * time.Second}}, false, 5 * time.Second},
		{"Busy ends the work", []deadlineStep{{due: time.Second}, {advance: time.Second / 2, busy: time.Minute}, {advance: 5 * time.Second}}, false, 0},
		{"Due again after a beat", []deadlineStep{{due: time.Second}, {advance: time.Second / 2, beat: true}, {due: time.Minute}, {advance: 30 * time.Second}}, false, 0},
	})
	var nilLoop *Loop
	nilLoop.Due(time.Now()) // does nothing
}

func TestPingIntervalIsAThirdOfTheTimeout(t *testing.T) {
	m, err := New(Config{Timeout: 400 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := m.PingInterval(), 400*time.Millisecond/3; got != want {
		t.Errorf("PingInterval() = %s, want %s", got, want)
	}
}
