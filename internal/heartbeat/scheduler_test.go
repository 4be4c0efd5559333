package heartbeat

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"

	"github.com/csisupd/csisupd/internal/testutil"
)

// probeFunc is an Identity client whose Probe calls f; the scheduler's
// tests are about its goroutines, not the wire (the monitor's tests run
// the scheduler against a plugin on a real socket too).
type probeFunc func(ctx context.Context) (*csi.ProbeResponse, error)

func (f probeFunc) Probe(ctx context.Context, _ *csi.ProbeRequest, _ ...grpc.CallOption) (*csi.ProbeResponse, error) {
	return f(ctx)
}

func (probeFunc) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest, ...grpc.CallOption) (*csi.GetPluginInfoResponse, error) {
	panic("not called")
}

func (probeFunc) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest, ...grpc.CallOption) (*csi.GetPluginCapabilitiesResponse, error) {
	panic("not called")
}

// probeGate holds the probes of the monitors it serves until released, and
// counts them.
type probeGate struct {
	mu       sync.Mutex
	inFlight int
	maxSeen  int            // the most probes in flight at once
	probes   map[string]int // finished probes by monitor
	release  chan struct{}  // each value lets one held probe finish
	hold     func(name string, n int) bool
}

func newProbeGate(hold func(name string, n int) bool) *probeGate {
	return &probeGate{probes: map[string]int{}, release: make(chan struct{}), hold: hold}
}

// identity is monitor name's Identity client: its nth probe (from 0) is
// held until released when hold says so, or until the probe's context ends.
func (g *probeGate) identity(name string) probeFunc {
	return func(ctx context.Context) (*csi.ProbeResponse, error) {
		g.mu.Lock()
		n := g.probes[name]
		held := g.hold(name, n)
		if held {
			g.inFlight++
			g.maxSeen = max(g.maxSeen, g.inFlight)
		}
		g.mu.Unlock()
		var err error
		if held {
			select {
			case <-g.release:
			case <-ctx.Done():
				err = ctx.Err()
			}
		}
		g.mu.Lock()
		defer g.mu.Unlock()
		if held {
			g.inFlight--
		}
		g.probes[name]++
		return &csi.ProbeResponse{}, err
	}
}

func (g *probeGate) count(name string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.probes[name]
}

func (g *probeGate) stats() (inFlight, maxSeen int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inFlight, g.maxSeen
}

// startMonitor starts a monitor named name on s with the gate's identity
// and stops it when the test ends, failing the test when it does not
// leave the scheduler.
func startMonitor(t *testing.T, s *Scheduler, g *probeGate, name string, interval time.Duration) *Monitor {
	t.Helper()
	m, err := New(Config{Identity: g.identity(name), Timing: fixed(interval, interval), OnProbe: func(Result) {}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := s.Start(ctx, m)
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Errorf("monitor %s did not leave the scheduler within 10s of cancel", name)
		}
	})
	return m
}

func TestSchedulerKeepsNoGoroutineBetweenProbes(t *testing.T) {
	before := runtime.NumGoroutine()
	s := NewScheduler(SchedulerConfig{Workers: 2})
	g := newProbeGate(func(string, int) bool { return false })
	const monitors = 200
	names := make([]string, monitors)
	for i := range names {
		names[i] = "m" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		startMonitor(t, s, g, names[i], time.Hour)
	}
	testutil.WaitFor(t, 10*time.Second, "every monitor's first probe", func() bool {
		for _, n := range names {
			if g.count(n) == 0 {
				return false
			}
		}
		return true
	})
	// Between probes, the 200 monitors wait in the scheduler's heap: the
	// goroutines that ran their first probes all exit.
	testutil.WaitFor(t, 10*time.Second, "the probe goroutines to exit", func() bool {
		return runtime.NumGoroutine() <= before
	})
}

func TestSchedulerRunsScheduledProbesOnItsWorkers(t *testing.T) {
	const workers, monitors = 2, 12
	s := NewScheduler(SchedulerConfig{Workers: workers, MaxQueueWait: time.Hour})
	// The first probes pass; every later one is held until released.
	g := newProbeGate(func(_ string, n int) bool { return n >= 1 })
	var names []string
	for i := range monitors {
		names = append(names, string(rune('a'+i)))
		startMonitor(t, s, g, names[i], 50*time.Millisecond)
	}
	// The scheduled probes fall due together: the workers take two and
	// the others wait for them, as nothing waited an hour.
	testutil.WaitFor(t, 10*time.Second, "the workers to hold two probes", func() bool {
		inFlight, _ := g.stats()
		return inFlight == workers
	})
	// Let probes finish one at a time until every monitor had its second.
	testutil.WaitFor(t, 20*time.Second, "every monitor's second probe", func() bool {
		for _, n := range names {
			if g.count(n) < 2 {
				select {
				case g.release <- struct{}{}:
				case <-time.After(10 * time.Millisecond):
				}
				return false
			}
		}
		return true
	})
	if _, maxSeen := g.stats(); maxSeen > workers {
		t.Errorf("%d scheduled probes ran at once, want at most the %d workers", maxSeen, workers)
	}
	close(g.release) // the probes still held, and those to come, pass
}

func TestSchedulerHungProbesHoldNoOtherBack(t *testing.T) {
	s := NewScheduler(SchedulerConfig{Workers: 1, MaxQueueWait: 20 * time.Millisecond})
	// Every probe of "hung" after its first waits until released, which
	// is at the end of the test: its timeout is an hour.
	g := newProbeGate(func(name string, n int) bool { return name == "hung" && n >= 1 })
	hung := startMonitor(t, s, g, "hung", time.Hour)
	startMonitor(t, s, g, "scheduled", 50*time.Millisecond)
	kicked := startMonitor(t, s, g, "kicked", time.Hour)
	t.Cleanup(func() { close(g.release) }) // before the monitors stop
	testutil.WaitFor(t, 10*time.Second, "the first probes", func() bool {
		return g.count("hung") == 1 && g.count("scheduled") >= 1 && g.count("kicked") == 1
	})

	// The hung plugin's probe takes a worker (the only one, or another
	// goroutine: either way it never returns)...
	hung.ProbeNow()
	testutil.WaitFor(t, 10*time.Second, "the hung probe", func() bool {
		inFlight, _ := g.stats()
		return inFlight == 1
	})
	// ...yet the other plugin's scheduled probes go on, each on a
	// goroutine of its own once it waited MaxQueueWait, when the worker
	// is held...
	from := g.count("scheduled")
	testutil.WaitFor(t, 10*time.Second, "three more scheduled probes", func() bool {
		return g.count("scheduled") >= from+3
	})
	// ...and a ProbeNow is run at once.
	kicked.ProbeNow()
	testutil.WaitFor(t, 10*time.Second, "the kicked probe", func() bool { return g.count("kicked") == 2 })
	if n := g.count("hung"); n != 1 {
		t.Errorf("the hung probe finished (%d probes)", n)
	}
}

func TestSchedulerStopsProbingWhenTheContextEnds(t *testing.T) {
	s := NewScheduler(SchedulerConfig{})
	g := newProbeGate(func(string, int) bool { return false })
	m, err := New(Config{Identity: g.identity("m"), Timing: fixed(20*time.Millisecond, 20*time.Millisecond), OnProbe: func(Result) {}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := s.Start(ctx, m)
	testutil.WaitFor(t, 10*time.Second, "three probes", func() bool { return g.count("m") >= 3 })
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the monitor did not leave the scheduler within 10s of cancel")
	}
	after := g.count("m")
	m.ProbeNow() // a kick after the end probes nothing
	s.mu.Lock()
	waiting, queued := len(s.waiting), len(s.queue)
	s.mu.Unlock()
	if waiting != 0 || queued != 0 {
		t.Errorf("the scheduler still holds %d waiting and %d queued monitors", waiting, queued)
	}
	if n := g.count("m"); n != after {
		t.Errorf("%d probes after the monitor left the scheduler", n-after)
	}

	// A monitor started with an ended context is never probed.
	m2, err := New(Config{Identity: g.identity("m2"), Timing: fixed(time.Hour, time.Hour), OnProbe: func(Result) {}})
	if err != nil {
		t.Fatal(err)
	}
	<-s.Start(ctx, m2)
	if n := g.count("m2"); n != 0 {
		t.Errorf("a monitor started with an ended context was probed %d times", n)
	}
}

func TestSchedulerStartTwicePanics(t *testing.T) {
	s := NewScheduler(SchedulerConfig{})
	g := newProbeGate(func(string, int) bool { return false })
	m, err := New(Config{Identity: g.identity("m"), Timing: fixed(time.Hour, time.Hour), OnProbe: func(Result) {}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := s.Start(ctx, m)
	defer func() {
		if recover() == nil {
			t.Error("a second Start did not panic")
		}
		cancel()
		<-done
	}()
	s.Start(ctx, m)
}
