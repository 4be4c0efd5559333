package stream

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
)

// Event is one published event.
type Event[T any] struct {
	// Index is the index of the batch the event was published in; Publish
	// sets it.
	Index uint64
	// Topic names the kind of thing the event is about, e.g. "plugin",
	// "node" or "volume".
	Topic string
	// Key names the thing itself, e.g. the plugin id. Filters match on it.
	Key string
	// Payload is the event's content; the buffer never looks into it.
	Payload T
}

// Config configures a Buffer. New validates it and nothing defaults it:
// the caller's configuration layer owns the defaults.
type Config struct {
	// Size is how many batches the buffer keeps for replay (> 0).
	Size int
	// MaxLag is how many batches a following subscriber may trail the
	// newest by before it is cut (0 < MaxLag < Size). Keeping it below
	// Size is what lets a cut subscriber resume without a gap: when it is
	// cut, the batches after its position are still buffered.
	MaxLag int
}

// validate reports the first thing wrong with c.
func (c Config) validate() error {
	switch {
	case c.Size <= 0:
		return fmt.Errorf("stream config: size %d must be greater than 0", c.Size)
	case c.MaxLag <= 0:
		return fmt.Errorf("stream config: max lag %d must be greater than 0", c.MaxLag)
	case c.MaxLag >= c.Size:
		return fmt.Errorf("stream config: max lag %d must be less than size %d, so that a subscriber cut for lagging can resume without a gap", c.MaxLag, c.Size)
	}
	return nil
}

// ErrClosed is returned by Publish once the buffer is closed, and by Next
// once its subscription is closed, or once the buffer is closed and the
// subscription has been given every batch buffered after its position.
var ErrClosed = errors.New("event buffer closed")

// FellBehindError is returned by Next to a following subscription that
// trails the newest batch by more than MaxLag batches. The batches after
// ResumeIndex were still buffered when Next returned it, so a subscription
// started promptly with Request{After: ResumeIndex} continues without a gap
// and without a duplicate.
type FellBehindError struct {
	// ResumeIndex is the index of the last batch the subscription dealt
	// with: resume with After set to it.
	ResumeIndex uint64
	// Lag is how many batches were published after ResumeIndex.
	Lag int
	// MaxLag is the configured limit it exceeded.
	MaxLag int
}

// Error implements error.
func (e *FellBehindError) Error() string {
	return fmt.Sprintf("fell behind: %d batches behind the newest (limit %d); resume from index %d",
		e.Lag, e.MaxLag, e.ResumeIndex)
}

// GoneError says that batches a subscription needed were dropped from the
// buffer before it read them: the events after After and before Oldest
// are lost to it, and the caller must re-read the state they describe.
type GoneError struct {
	// After is the index after which the subscription wanted batches.
	After uint64
	// Oldest is the index of the oldest batch still buffered.
	Oldest uint64
}

// Error implements error.
func (e *GoneError) Error() string {
	return fmt.Sprintf("events gone: the batches after index %d and before index %d were dropped from the buffer before they were read; re-read the state",
		e.After, e.Oldest)
}

// batch is one slot of the ring.
type batch[T any] struct {
	index uint64 // the index it was published with
	// total is the number of events published in batches up to and
	// including this one, for AfterLast.
	total  uint64
	events []Event[T]
}

// Buffer is an ordered, bounded log of event batches that any number of
// subscriptions read at their own pace. See the package documentation for
// the model. It is safe for concurrent use.
type Buffer[T any] struct {
	size   uint64
	maxLag uint64

	mu sync.RWMutex
	// ring holds the batches with sequence numbers oldestSeq() to seq; the
	// batch with sequence number q sits at ring[q%size]. Sequence numbers
	// count stored batches from 1 and, unlike indexes, have no gaps, so a
	// following subscription finds its next batch by arithmetic.
	ring    []batch[T]
	seq     uint64 // sequence number of the newest batch; 0 before the first
	count   uint64 // batches buffered, at most size
	latest  uint64 // the newest published index; 0 before the first
	dropped uint64 // index of the newest batch dropped; 0 before the first drop
	total   uint64 // events published
	closed  bool
	// wake is closed and replaced by the first Publish after a waiter took
	// it; taken says whether one did since it was made. Waiters set taken
	// under the read lock, hence the atomic.
	wake  chan struct{}
	taken atomic.Bool
}

// New returns an empty buffer.
func New[T any](cfg Config) (*Buffer[T], error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Buffer[T]{
		size:   uint64(cfg.Size),
		maxLag: uint64(cfg.MaxLag),
		ring:   make([]batch[T], cfg.Size),
		wake:   make(chan struct{}),
	}, nil
}

// Publish appends one batch of events with the given index, which must be
// greater than every index published before (consecutive or not); it sets
// each event's Index to it. A refused Publish changes nothing. Publish
// without events records the index as published (Range reports it) but
// stores no batch, so it takes no slot and wakes nobody.
//
// The events are copied: the caller may reuse the slice. Publish never
// waits for a subscriber and does no work per subscriber: it wakes every
// waiting one by closing a single channel, on a goroutine of its own, so a
// caller that holds a lock of its own around Publish is not held up by the
// number of waiters either.
func (b *Buffer[T]) Publish(index uint64, events ...Event[T]) error {
	b.mu.Lock()
	switch {
	case b.closed:
		b.mu.Unlock()
		return fmt.Errorf("publish batch %d: %w", index, ErrClosed)
	case index <= b.latest:
		latest := b.latest
		b.mu.Unlock()
		return fmt.Errorf("publish batch %d: index not greater than the latest published index %d", index, latest)
	}
	b.latest = index
	if len(events) == 0 {
		b.mu.Unlock()
		return nil
	}
	b.seq++
	slot := &b.ring[b.seq%b.size]
	if b.count == b.size {
		b.dropped = slot.index // the oldest batch shares the slot
	} else {
		b.count++
	}
	// Reuse the slot's array, clearing what it held so that no payload
	// stays reachable; one far larger than needed is let go, so that a
	// single huge batch does not pin its memory in the slot forever.
	clear(slot.events)
	if cap(slot.events) > 4*max(len(events), 16) {
		slot.events = nil
	}
	slot.events = append(slot.events[:0], events...)
	for i := range slot.events {
		slot.events[i].Index = index
	}
	b.total += uint64(len(events))
	slot.index, slot.total = index, b.total
	var woken chan struct{}
	if b.taken.Swap(false) {
		woken = b.wake
		b.wake = make(chan struct{})
	}
	b.mu.Unlock()
	if woken != nil {
		// Closing readies each waiter in turn: off this goroutine, that
		// work never holds up the publisher.
		go close(woken)
	}
	return nil
}

// Range returns the index of the oldest buffered batch (0 when none is
// buffered) and the newest published index (0 before the first Publish).
func (b *Buffer[T]) Range() (oldest, latest uint64) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return b.oldestLocked(), b.latest
}

// AfterLast returns the After of a Request whose subscription starts with
// the n most recent events, counted over every topic. It rounds out to
// whole batches: the batch holding the n-th most recent event is delivered
// whole, so the subscription may start with a few more than n events. It
// returns 0 (everything buffered) when n covers every buffered event, and
// the latest index (only what is published from now on) when n <= 0. The
// work is O(log Size).
func (b *Buffer[T]) AfterLast(n int) uint64 {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if n <= 0 || b.count == 0 {
		return b.latest
	}
	first := b.seq - b.count + 1
	oldest := &b.ring[first%b.size]
	before := oldest.total - uint64(len(oldest.events)) // events dropped
	if uint64(n) >= b.total-before {
		return 0
	}
	// The n-th most recent event is event number target; find the first
	// batch that holds it, then answer the index of the batch before.
	target := b.total - uint64(n) + 1
	i := uint64(sort.Search(int(b.count), func(i int) bool {
		return b.ring[(first+uint64(i))%b.size].total >= target
	}))
	if i == 0 {
		return 0
	}
	return b.ring[(first+i-1)%b.size].index
}

// Close closes the buffer: Publish returns ErrClosed from now on, and
// every subscription is woken; each gets the batches it had not read yet,
// then ErrClosed. Subscribe still works, to drain what is buffered. Close
// is idempotent.
func (b *Buffer[T]) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	b.closed = true
	// The channel stays closed: a waiter that takes it later does not wait.
	close(b.wake)
}

// oldestSeqLocked is the sequence number of the oldest buffered batch,
// b.seq+1 when none is.
func (b *Buffer[T]) oldestSeqLocked() uint64 { return b.seq - b.count + 1 }

// oldestLocked is the index of the oldest buffered batch, 0 when none is.
func (b *Buffer[T]) oldestLocked() uint64 {
	if b.count == 0 {
		return 0
	}
	return b.ring[b.oldestSeqLocked()%b.size].index
}

// batchLocked returns the buffered batch with sequence number q.
func (b *Buffer[T]) batchLocked(q uint64) *batch[T] { return &b.ring[q%b.size] }

// firstAfterLocked returns the sequence number of the oldest buffered batch
// with an index greater than after, b.seq+1 when there is none. Indexes
// grow with sequence numbers, so it is a binary search: O(log Size).
func (b *Buffer[T]) firstAfterLocked(after uint64) uint64 {
	first := b.oldestSeqLocked()
	i := sort.Search(int(b.count), func(i int) bool {
		return b.batchLocked(first+uint64(i)).index > after
	})
	return first + uint64(i)
}

// takeWakeLocked returns the channel that the next Publish closes. The
// caller holds the read lock and has just found nothing to read: no
// Publish can come in between, so no wake-up is lost.
func (b *Buffer[T]) takeWakeLocked() <-chan struct{} {
	b.taken.Store(true)
	return b.wake
}
