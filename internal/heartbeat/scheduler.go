package heartbeat

import (
	"container/heap"
	"context"
	"sync"
	"time"
)

// DefaultWorkers is how many probes a Scheduler runs at once unless told
// otherwise. The probes that fall due together (see alignedWait) are then
// written to their plugins in a few dozen at a time, whose answers the
// runtime's network poller wakes up for together: with 4 workers, 1,000
// plugins cost an agent 12-25 % more CPU than with a goroutine each, and
// with 64 as much (make bench, 1,000 plugins), for 0.5 MiB of stacks.
const DefaultWorkers = 64

// SchedulerConfig configures a Scheduler.
type SchedulerConfig struct {
	// Workers is how many probes the scheduler runs at once on its own
	// goroutines. Zero gives DefaultWorkers.
	Workers int
	// MaxQueueWait is how long a scheduled probe waits for a free worker
	// before it is run on a goroutine of its own, so that plugins whose
	// probes hang until their timeout never hold the probes of the others
	// back for longer. Zero gives alignGrid.
	MaxQueueWait time.Duration
}

// Scheduler runs the probes of many monitors on a few goroutines, instead
// of a goroutine for each (Monitor.Run): between probes a monitor costs a
// place in a heap and no goroutine at all. That is 8 KiB of stack less per
// plugin, and the collector scans none of it (make bench, 1,000 plugins).
//
// Probes that fall due are run by at most Workers goroutines, which take
// them in the order they fell due and exit once none is waiting. The first
// probe of a monitor and the probes asked for with ProbeNow are never
// queued: without a free worker they get a goroutine of their own at once,
// as does a scheduled probe that waited MaxQueueWait. A plugin that hangs
// therefore delays no other plugin's probe by more than MaxQueueWait.
//
// The scheduler has no goroutine of its own: one timer, which fires when
// the next probe falls due, moves the due probes to the workers. A monitor
// leaves the scheduler when the context it was started with ends.
type Scheduler struct {
	workers      int
	maxQueueWait time.Duration

	mu      sync.Mutex
	waiting dueHeap  // monitors between probes, the earliest due first
	queue   []*entry // scheduled probes due and waiting for a worker, in the order they fell due
	running int      // workers running
	timer   *time.Timer
	timerAt time.Time // when timer fires; zero when it is stopped
}

// NewScheduler returns a Scheduler. It starts no goroutine. Zero or
// negative fields of cfg take their defaults.
func NewScheduler(cfg SchedulerConfig) *Scheduler {
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.MaxQueueWait <= 0 {
		cfg.MaxQueueWait = alignGrid
	}
	s := &Scheduler{workers: cfg.Workers, maxQueueWait: cfg.MaxQueueWait}
	s.timer = time.AfterFunc(time.Hour, s.fire)
	s.timer.Stop()
	return s
}

// entryState is where a monitor is in its scheduler.
type entryState int

const (
	entryWaiting entryState = iota // in the heap until its next probe
	entryQueued                    // due, waiting for a worker
	entryRunning                   // being probed
	entryDone                      // left the scheduler
)

// entry is a monitor in a scheduler.
type entry struct {
	m     *Monitor
	ctx   context.Context
	state entryState
	at    time.Time // waiting: when the next probe is due; queued: when it fell due
	index int       // in the heap while waiting
	// kicked is set by a ProbeNow during the probe: the monitor is probed
	// again at once, unless Pace backs it off.
	kicked   bool
	dropKick func()        // drops a kick: the monitor's probe calls it (see Pace.Backoff)
	done     chan struct{} // closed when the entry left the scheduler
	sched    *Scheduler
}

// Start probes m at once, then as Monitor.Run would, until ctx ends. The
// returned channel is closed once m left the scheduler: ctx ended and no
// probe of m runs any more. A monitor is run once, by Run or by one
// scheduler; Start panics when m already runs here.
func (s *Scheduler) Start(ctx context.Context, m *Monitor) <-chan struct{} {
	e := &entry{m: m, ctx: ctx, index: -1, done: make(chan struct{}), sched: s}
	e.dropKick = func() {
		s.mu.Lock()
		e.kicked = false
		s.mu.Unlock()
	}
	if !m.sched.CompareAndSwap(nil, e) {
		panic("heartbeat: monitor started twice")
	}
	s.mu.Lock()
	if ctx.Err() != nil {
		e.state = entryDone
		close(e.done)
		s.mu.Unlock()
		return e.done
	}
	s.runNowLocked(e)
	s.mu.Unlock()
	context.AfterFunc(ctx, func() { s.remove(e) })
	return e.done
}

// kick is ProbeNow for a monitor in the scheduler.
func (s *Scheduler) kick(e *entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch e.state {
	case entryWaiting:
		heap.Remove(&s.waiting, e.index)
		s.runNowLocked(e)
		s.armLocked()
	case entryRunning:
		e.kicked = true
	case entryQueued, entryDone:
		// Queued: it is probed within MaxQueueWait anyway.
	}
}

// remove takes e out of the scheduler: its context ended.
func (s *Scheduler) remove(e *entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch e.state {
	case entryWaiting:
		heap.Remove(&s.waiting, e.index)
		s.finishLocked(e)
		s.armLocked()
	case entryQueued:
		// The worker that takes it from the queue skips it.
		s.finishLocked(e)
	case entryRunning, entryDone:
		// Running: its worker sees the context ended and finishes it.
	}
}

func (s *Scheduler) finishLocked(e *entry) {
	e.state = entryDone
	close(e.done)
}

// runNowLocked probes e at once: on a free worker, or else on a goroutine
// of its own.
func (s *Scheduler) runNowLocked(e *entry) {
	if !s.startWorkerLocked(e) {
		e.state = entryRunning
		go s.probeOnce(e)
	}
}

// startWorkerLocked starts a worker with e as its first probe, unless
// Workers run already. It reports whether it did.
func (s *Scheduler) startWorkerLocked(e *entry) bool {
	if s.running >= s.workers {
		return false
	}
	e.state = entryRunning
	s.running++
	go s.work(e)
	return true
}

// work is a worker: it probes e, then the queued probes, until none waits.
func (s *Scheduler) work(e *entry) {
	for e != nil {
		if !s.probe(e) {
			e = s.next()
		}
	}
}

// next returns the next queued probe for a worker, marked running, or nil
// when none waits: the worker exits.
func (s *Scheduler) next() *entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.queueHeadLocked()
	if e == nil {
		s.queue = nil // let the array go
		s.running--
		return nil
	}
	s.popQueueLocked()
	e.state = entryRunning
	return e
}

// queueHeadLocked returns the oldest queued probe, or nil when none is
// queued. It drops the monitors that left the scheduler meanwhile.
func (s *Scheduler) queueHeadLocked() *entry {
	for len(s.queue) > 0 {
		if e := s.queue[0]; e.state == entryQueued {
			return e
		}
		s.popQueueLocked()
	}
	return nil
}

func (s *Scheduler) popQueueLocked() {
	s.queue[0] = nil
	s.queue = s.queue[1:]
}

// probeOnce probes e on a goroutine that is not a worker.
func (s *Scheduler) probeOnce(e *entry) {
	for s.probe(e) {
	}
}

// probe probes e once and puts it back in the heap, or finishes it when its
// context ended. It returns true, with e still running, when e was kicked
// during the probe: the caller probes it again at once.
func (s *Scheduler) probe(e *entry) (again bool) {
	wait, ok := e.m.probe(e.ctx, e.dropKick)
	s.mu.Lock()
	defer s.mu.Unlock()
	kicked := e.kicked
	e.kicked = false
	switch {
	case !ok || e.ctx.Err() != nil:
		// The context ended during the probe or after it: remove, which
		// ran meanwhile or runs next, left e to this worker.
		s.finishLocked(e)
	case kicked:
		return true
	default:
		now := time.Now()
		e.state, e.at = entryWaiting, now.Add(alignedWait(now, wait))
		heap.Push(&s.waiting, e)
		s.armLocked()
	}
	return false
}

// fire runs when the timer does: the probes that fell due go to the
// workers, and those that waited MaxQueueWait for one get a goroutine of
// their own.
func (s *Scheduler) fire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.timerAt = time.Time{}
	now := time.Now()
	for len(s.waiting) > 0 && !s.waiting[0].at.After(now) {
		e := heap.Pop(&s.waiting).(*entry)
		if !s.startWorkerLocked(e) {
			e.state = entryQueued
			s.queue = append(s.queue, e)
		}
	}
	for {
		e := s.queueHeadLocked()
		if e == nil || now.Sub(e.at) < s.maxQueueWait {
			break
		}
		s.popQueueLocked()
		e.state = entryRunning
		go s.probeOnce(e)
	}
	s.armLocked()
}

// armLocked sets the timer to the next time fire has something to do: the
// earliest due probe, or the oldest queued probe's MaxQueueWait.
func (s *Scheduler) armLocked() {
	var next time.Time
	if len(s.waiting) > 0 {
		next = s.waiting[0].at
	}
	if e := s.queueHeadLocked(); e != nil {
		if late := e.at.Add(s.maxQueueWait); next.IsZero() || late.Before(next) {
			next = late
		}
	}
	switch {
	case next.Equal(s.timerAt):
	case next.IsZero():
		s.timer.Stop()
		s.timerAt = time.Time{}
	default:
		s.timer.Reset(time.Until(next))
		s.timerAt = next
	}
}

// dueHeap orders waiting entries by when their next probe is due.
type dueHeap []*entry

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h dueHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *dueHeap) Push(x any) {
	e := x.(*entry)
	e.index = len(*h)
	*h = append(*h, e)
}
func (h *dueHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	e.index = -1
	*h = old[:len(old)-1]
	return e
}
