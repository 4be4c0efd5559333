// Package keylock is a set of mutexes by key, each taken with a context so
// that no wait is unbounded. A key's mutex exists while someone holds or
// waits for it, so a set keyed by volume or plugin ids does not grow with
// every id ever seen.
package keylock

import (
	"context"
	"errors"
	"sync"
)

// ErrHeld is what work returns when it would take a key's mutex that
// someone else holds (TryLock) and leaves the work to them: whoever
// retries it looks again later, without counting a failure.
var ErrHeld = errors.New("someone else works on it")

// Set is a set of mutexes by key. The zero value is ready to use; a Set
// must not be copied after first use.
type Set struct {
	mu    sync.Mutex
	locks map[string]*entry
}

// entry is one key's mutex.
type entry struct {
	ch   chan struct{} // holds a token while locked
	refs int           // holders and waiters
}

// acquire returns key's entry with one more reference.
func (s *Set) acquire(key string) *entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.locks == nil {
		s.locks = make(map[string]*entry)
	}
	e, ok := s.locks[key]
	if !ok {
		e = &entry{ch: make(chan struct{}, 1)}
		s.locks[key] = e
	}
	e.refs++
	return e
}

// release drops one reference to key's entry, and the entry with the last.
func (s *Set) release(key string, e *entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.refs--; e.refs == 0 {
		delete(s.locks, key)
	}
}

// Lock takes key's mutex, waiting until it is free or ctx ends; then it
// returns ctx's error. The returned function releases the mutex.
func (s *Set) Lock(ctx context.Context, key string) (unlock func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	e := s.acquire(key)
	select {
	case e.ch <- struct{}{}:
		return s.unlocker(key, e), nil
	case <-ctx.Done():
		s.release(key, e)
		return nil, ctx.Err()
	}
}

// TryLock takes key's mutex when it is free; ok is false when someone
// else holds it.
func (s *Set) TryLock(key string) (unlock func(), ok bool) {
	e := s.acquire(key)
	select {
	case e.ch <- struct{}{}:
		return s.unlocker(key, e), true
	default:
		s.release(key, e)
		return nil, false
	}
}

func (s *Set) unlocker(key string, e *entry) func() {
	return func() {
		<-e.ch
		s.release(key, e)
	}
}

// Len returns how many keys are held or waited for.
func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.locks)
}
