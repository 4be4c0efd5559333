package keylock

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestLockSerialisesOneKey(t *testing.T) {
	var s Set
	unlock, err := s.Lock(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.TryLock("a"); ok {
		t.Fatal("TryLock took a held key")
	}
	other, ok := s.TryLock("b")
	if !ok {
		t.Fatal("TryLock of another key failed")
	}
	other()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := s.Lock(ctx, "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock of a held key until the deadline: %v, want DeadlineExceeded", err)
	}

	got := make(chan func(), 1)
	go func() {
		u, err := s.Lock(context.Background(), "a")
		if err != nil {
			t.Error(err)
		}
		got <- u
	}()
	unlock()
	select {
	case u := <-got:
		u()
	case <-time.After(10 * time.Second):
		t.Fatal("a waiter did not get the key after it was released")
	}
}

func TestKeysGoWhenUnused(t *testing.T) {
	var s Set
	for _, key := range []string{"a", "b", "c"} {
		unlock, err := s.Lock(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		unlock()
	}
	held, _ := s.TryLock("d")
	if _, ok := s.TryLock("d"); ok {
		t.Fatal("TryLock took a held key")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Lock(ctx, "e"); !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock with an ended context: %v", err)
	}
	if n := s.Len(); n != 1 {
		t.Fatalf("%d keys kept while one is held, want 1", n)
	}
	held()
	if n := s.Len(); n != 0 {
		t.Fatalf("%d keys kept after every release, want 0", n)
	}
}
