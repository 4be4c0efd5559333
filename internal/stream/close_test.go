package stream

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// waitAll starts a Next on each subscription and waits until every one is
// waiting; the returned channel receives each Next's error.
func waitAll(t *testing.T, ctx context.Context, subs []*Subscription[int]) <-chan error {
	t.Helper()
	errs := make(chan error, len(subs))
	for _, s := range subs {
		go func() {
			_, err := s.Next(ctx, nil)
			errs <- err
		}()
	}
	testutil.WaitFor(t, 5*time.Second, "every Next to wait", func() bool {
		for _, s := range subs {
			if !s.waiting.Load() {
				return false
			}
		}
		return true
	})
	return errs
}

func TestCloseWakesWaiters(t *testing.T) {
	b := newBuffer(t, 8, 4)
	subs := make([]*Subscription[int], 20)
	for i := range subs {
		subs[i] = subscribe(t, b, Request{})
	}
	errs := waitAll(t, context.Background(), subs)
	b.Close()
	for range subs {
		if err := <-errs; !errors.Is(err, ErrClosed) {
			t.Errorf("a waiting Next returned %v at Close, want ErrClosed", err)
		}
	}
	b.Close() // idempotent
	if err := b.Publish(1, ev("plugin", "p", 1)); !errors.Is(err, ErrClosed) {
		t.Errorf("Publish after Close = %v, want ErrClosed", err)
	}
}

// A closed buffer is drained first: every subscriber is given what is
// buffered, then ErrClosed; one subscribing after Close too, so a
// subscriber that fell behind just before Close can resume.
func TestCloseDrains(t *testing.T) {
	b := newBuffer(t, 8, 2)
	s := subscribe(t, b, Request{})
	publishRange(t, b, 1, 1)
	if got, err := s.Next(context.Background(), nil); err != nil || len(got) != 1 {
		t.Fatalf("Next = %v, %v; want batch 1", got, err)
	}
	publishRange(t, b, 2, 5)
	b.Close()
	_, err := s.Next(context.Background(), nil)
	var fb *FellBehindError
	if !errors.As(err, &fb) || fb.ResumeIndex != 1 {
		t.Fatalf("Next = %v; want FellBehindError with ResumeIndex 1", err)
	}
	r := subscribe(t, b, Request{After: fb.ResumeIndex})
	var got []uint64
	dst := make([]Event[int], 0, 1)
	for {
		dst, err = r.Next(context.Background(), dst)
		got = append(got, indexes(dst)...)
		if err != nil {
			if !errors.Is(err, ErrClosed) {
				t.Errorf("after the last batch Next = %v, want ErrClosed", err)
			}
			break
		}
	}
	if !slices.Equal(got, seq(2, 5)) {
		t.Errorf("drained %v after Close, want 2 to 5", got)
	}
	if got, err := subscribe(t, b, Request{After: 5}).Next(context.Background(), nil); len(got) != 0 || !errors.Is(err, ErrClosed) {
		t.Errorf("Next of a caught-up subscription of a closed buffer = %v, %v; want ErrClosed at once", got, err)
	}
}

func TestSubscriptionClose(t *testing.T) {
	b := newBuffer(t, 8, 4)
	s := subscribe(t, b, Request{})
	other := subscribe(t, b, Request{})
	errs := waitAll(t, context.Background(), []*Subscription[int]{s})
	s.Close()
	if err := <-errs; !errors.Is(err, ErrClosed) {
		t.Errorf("a waiting Next returned %v at Subscription.Close, want ErrClosed", err)
	}
	publishRange(t, b, 1, 1)
	if got, err := s.Next(context.Background(), nil); len(got) != 0 || !errors.Is(err, ErrClosed) {
		t.Errorf("Next on a closed subscription = %v, %v; want ErrClosed", got, err)
	}
	s.Close() // idempotent
	if got, err := drain(other, 4); err != nil || !slices.Equal(indexes(got), []uint64{1}) {
		t.Errorf("another subscription got %v, %v; want [1], untouched", indexes(got), err)
	}
}

// Cancelling ctx ends a waiting Next with ctx.Err(); a passing deadline
// does the same.
func TestContextEndsWait(t *testing.T) {
	b := newBuffer(t, 8, 4)
	t.Run("cancelled", func(t *testing.T) {
		s := subscribe(t, b, Request{})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		errs := waitAll(t, ctx, []*Subscription[int]{s})
		cancel()
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Errorf("Next = %v, want context.Canceled", err)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		s := subscribe(t, b, Request{})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		if _, err := s.Next(ctx, nil); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Next = %v, want context.DeadlineExceeded", err)
		}
	})
	t.Run("events ready come out with ctx done", func(t *testing.T) {
		s := subscribe(t, b, Request{})
		_, latest := b.Range()
		publishRange(t, b, latest+1, latest+1)
		if got, err := s.Next(doneCtx(), nil); err != nil || !slices.Equal(indexes(got), []uint64{latest + 1}) {
			t.Errorf("Next with a done ctx and an event ready = %v, %v; want [%d]", indexes(got), err, latest+1)
		}
	})
}
