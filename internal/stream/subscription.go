package stream

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
)

// Request says what a subscription delivers.
type Request struct {
	// After makes the subscription deliver the batches with an index
	// greater than After; 0 means from the oldest buffered batch.
	After uint64
	// Topics filters the events: nil or empty delivers every event, else
	// only the events whose topic is listed, with one of the topic's keys;
	// the key "*" stands for every key of its topic. A topic listed with no
	// key is refused (use "*").
	Topics map[string][]string
}

// keySet is the keys of one topic a subscription wants.
type keySet struct {
	all  bool // the key "*"
	keys map[string]struct{}
}

// filter is a compiled Request.Topics; nil matches every event.
type filter map[string]keySet

func newFilter(topics map[string][]string) (filter, error) {
	if len(topics) == 0 {
		return nil, nil
	}
	f := make(filter, len(topics))
	for topic, keys := range topics {
		if len(keys) == 0 {
			return nil, fmt.Errorf("subscribe: topic %q lists no key (the key \"*\" stands for every key)", topic)
		}
		ks := keySet{keys: make(map[string]struct{}, len(keys))}
		for _, k := range keys {
			if k == "*" {
				ks.all = true
			}
			ks.keys[k] = struct{}{}
		}
		f[topic] = ks
	}
	return f, nil
}

// match reports whether f lets e through.
func (f filter) match(topic, key string) bool {
	if f == nil {
		return true
	}
	ks, ok := f[topic]
	if !ok {
		return false
	}
	if ks.all {
		return true
	}
	_, ok = ks.keys[key]
	return ok
}

// Subscription is one reader of a Buffer. It holds its position and its
// filter and nothing else, whatever the backlog.
//
// Next must not be called from two goroutines at once; Index and Close may
// be called from any goroutine.
type Subscription[T any] struct {
	b      *Buffer[T]
	filter filter
	// seq is the sequence number of the last batch dealt with; only Next
	// touches it.
	seq uint64
	// following is set once the subscription trailed the newest batch by
	// MaxLag batches or fewer; from then on a lag beyond MaxLag cuts it.
	following bool
	index     atomic.Uint64 // the index of the last batch dealt with
	waiting   atomic.Bool   // inside Next, waiting for a batch
	done      chan struct{} // closed by Close
	closeOnce sync.Once
}

// Subscribe starts a subscription at req.After. It returns a *GoneError when
// batches with an index greater than After were dropped already (a resume
// that came too late: the caller missed events and must re-read state);
// After == 0 is never gone, it means whatever is buffered. Finding the
// start is a binary search, and nothing is copied.
//
// A closed buffer can still be subscribed to: the subscription is given
// what is buffered after After, then ErrClosed. That lets a subscriber
// that fell behind just before Close resume and drain what it missed.
func (b *Buffer[T]) Subscribe(req Request) (*Subscription[T], error) {
	f, err := newFilter(req.Topics)
	if err != nil {
		return nil, err
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	if req.After != 0 && req.After < b.dropped {
		return nil, fmt.Errorf("subscribe after index %d: %w", req.After, &GoneError{After: req.After, Oldest: b.oldestLocked()})
	}
	s := &Subscription[T]{b: b, filter: f, done: make(chan struct{})}
	s.seq = b.firstAfterLocked(req.After) - 1
	start := req.After
	if start == 0 {
		// Nothing before the oldest buffered batch is wanted: the
		// subscription stands where the buffer starts.
		start = b.dropped
	}
	s.index.Store(start)
	s.following = b.seq-s.seq <= b.maxLag
	return s, nil
}

// Next waits until at least one matching event is available, then appends
// whole batches of matching events to dst[:0] and returns it. It appends
// at most cap(dst) events, except that a single batch larger than that is
// appended whole: a batch is never split, so a nil dst gets one batch per
// call. A caller that reuses dst allocates nothing per call.
//
// Events already available are returned even when ctx is done: ctx ends
// only a wait, so a done context makes Next a poll. On an error Next
// returns dst[:0] and one of:
//   - ctx.Err(), when ctx ended the wait;
//   - ErrClosed, when the subscription was closed, or the buffer was
//     closed and every batch published before was given (a closed buffer
//     is drained first);
//   - *FellBehindError, when the subscription is following and, after
//     skipping the batches its filter does not want, trails the newest
//     batch by more than MaxLag batches when Next is called (never at
//     index 0: see the package documentation);
//   - *GoneError, when the next batch it needed was dropped before it read
//     it (a subscription catching up from far back, or one that did not
//     call Next for more than Size batches).
//
// An error leaves the position where it was, so a repeated call returns it
// again.
func (s *Subscription[T]) Next(ctx context.Context, dst []Event[T]) ([]Event[T], error) {
	dst = dst[:0]
	limit := cap(dst) // appending a larger batch grows dst; the limit stays
	b := s.b
	called := true
	for {
		select {
		case <-s.done:
			return dst, fmt.Errorf("next event: subscription %w", ErrClosed)
		default:
		}
		b.mu.RLock()
		var err error
		dst, err = s.readLocked(dst, limit, called)
		closed := b.closed
		var wake <-chan struct{}
		if err == nil && len(dst) == 0 && !closed {
			wake = b.takeWakeLocked()
		}
		b.mu.RUnlock()
		called = false
		switch {
		case err != nil:
			return dst, err
		case len(dst) > 0:
			return dst, nil
		case closed:
			return dst, fmt.Errorf("next event: %w", ErrClosed)
		}
		s.waiting.Store(true)
		select {
		case <-ctx.Done():
			s.waiting.Store(false)
			return dst, ctx.Err()
		case <-s.done:
			s.waiting.Store(false)
			return dst, fmt.Errorf("next event: subscription %w", ErrClosed)
		case <-wake:
			s.waiting.Store(false)
		}
	}
}

// readLocked appends the next batches to dst, at most limit events unless
// the first is larger, as Next documents. called is
// true on the first read of a call to Next, when the lag is checked: lag
// that builds up while the subscription waits inside Next is not its
// fault.
func (s *Subscription[T]) readLocked(dst []Event[T], limit int, called bool) ([]Event[T], error) {
	b := s.b
	if s.seq < b.seq && s.seq+1 < b.oldestSeqLocked() {
		return dst, &GoneError{After: s.index.Load(), Oldest: b.oldestLocked()}
	}
	if called {
		// Batches the filter does not want cost the subscription nothing:
		// skip them before measuring the lag.
		for s.seq < b.seq && s.wanted(b.batchLocked(s.seq+1)) == 0 {
			s.advance(b.batchLocked(s.seq + 1))
		}
		// A subscription at index 0 has dealt with no batch, and nothing
		// was dropped when it started: it is never cut, because its
		// resume index would be 0, which Subscribe takes for "whatever is
		// buffered" and so could not tell a gap. It reads on instead, and
		// is gone if the buffer drops its next batch first.
		lag := b.seq - s.seq
		if s.following && lag > b.maxLag && s.index.Load() != 0 {
			return dst, &FellBehindError{ResumeIndex: s.index.Load(), Lag: int(lag), MaxLag: int(b.maxLag)}
		}
	}
	for s.seq < b.seq {
		next := b.batchLocked(s.seq + 1)
		n := s.wanted(next)
		if n > 0 && len(dst) > 0 && len(dst)+n > limit {
			break // the batch does not fit whole
		}
		if n > 0 {
			dst = s.appendMatching(dst, next.events, n)
		}
		s.advance(next)
	}
	if b.seq-s.seq <= b.maxLag {
		s.following = true
	}
	return dst, nil
}

// wanted returns how many events of bt the subscription wants.
func (s *Subscription[T]) wanted(bt *batch[T]) int {
	if bt.index <= s.index.Load() {
		return 0 // at or before After: a subscription that started ahead
	}
	if s.filter == nil {
		return len(bt.events)
	}
	n := 0
	for i := range bt.events {
		if s.filter.match(bt.events[i].Topic, bt.events[i].Key) {
			n++
		}
	}
	return n
}

// appendMatching appends the n events of events that the filter lets
// through.
func (s *Subscription[T]) appendMatching(dst, events []Event[T], n int) []Event[T] {
	if n == len(events) {
		return append(dst, events...)
	}
	for i := range events {
		if s.filter.match(events[i].Topic, events[i].Key) {
			dst = append(dst, events[i])
		}
	}
	return dst
}

// advance moves the position past bt, the batch after it.
func (s *Subscription[T]) advance(bt *batch[T]) {
	s.seq++
	if bt.index > s.index.Load() {
		s.index.Store(bt.index)
	}
}

// Index returns the index of the last batch the subscription has dealt
// with, delivered or skipped by its filter. It starts at Request.After, or
// for After == 0 at the index just before the oldest buffered batch (0
// when the buffer never dropped one).
func (s *Subscription[T]) Index() uint64 { return s.index.Load() }

// Close ends the subscription: a Next waiting returns ErrClosed, and so
// does every later one. It frees nothing in the buffer, which holds no
// state of its subscriptions. Close is idempotent.
func (s *Subscription[T]) Close() { s.closeOnce.Do(func() { close(s.done) }) }
