package stream

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
)

// A subscriber that follows and reuses its dst allocates nothing, and
// neither does the Publish before it when nobody waits.
func TestFollowingAllocatesNothing(t *testing.T) {
	b := newBuffer(t, 1024, 512)
	s := subscribe(t, b, Request{Topics: map[string][]string{"plugin": {"a"}}})
	dst := make([]Event[int], 0, 32)
	ctx := context.Background()
	index := uint64(0)
	e := []Event[int]{ev("plugin", "a", 1), ev("node", "x", 2)}
	// Fill the ring once, so Publish reuses every slot's array.
	for range 1024 {
		index++
		publish(t, b, index, e...)
		dst, _ = s.Next(ctx, dst)
	}
	var err error
	allocs := testing.AllocsPerRun(1000, func() {
		index++
		if err = b.Publish(index, e...); err != nil {
			return
		}
		dst, err = s.Next(ctx, dst)
	})
	if err != nil || len(dst) != 1 || dst[0].Index != index {
		t.Fatalf("last Next = %v, %v; want the event of batch %d", dst, err, index)
	}
	if allocs != 0 {
		t.Errorf("Publish then Next with a reused dst: %v allocations, want 0", allocs)
	}
}

// BenchmarkPublish publishes one-event batches beside subscribers that do
// not read: a pull buffer does no work for them, so the cost does not
// depend on their number.
func BenchmarkPublish(b *testing.B) {
	for _, n := range []int{0, 2000} {
		b.Run(fmt.Sprintf("idle=%d", n), func(b *testing.B) {
			buf := newBuffer(b, 1024, 512)
			for range n {
				subscribe(b, buf, Request{})
			}
			publishEach(b, buf)
		})
	}
}

// publishEach publishes a one-event batch per benchmark iteration.
func publishEach(b *testing.B, buf *Buffer[int]) {
	b.Helper()
	e := ev("plugin", "a", 1)
	b.ReportAllocs()
	index := uint64(0)
	for b.Loop() {
		index++
		if err := buf.Publish(index, e); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPublishWaiting publishes beside 2,000 subscribers that each wait
// in Next for the next batch: every Publish closes one channel, off its
// own goroutine, however many wait. The subscribers' reads share the
// machine's cores with the publisher, so this measures the whole system.
func BenchmarkPublishWaiting(b *testing.B) {
	const waiters = 2000
	buf := newBuffer(b, 1024, 512)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range waiters {
		s := subscribe(b, buf, Request{})
		wg.Go(func() {
			dst := make([]Event[int], 0, 32)
			for {
				var err error
				if dst, err = s.Next(ctx, dst); err != nil {
					var fb *FellBehindError
					if errors.As(err, &fb) || errors.As(err, new(*GoneError)) {
						// A waiter starved of the cores: start again at
						// the newest batch.
						s.Close()
						_, latest := buf.Range()
						if s, err = buf.Subscribe(Request{After: latest}); err == nil {
							continue
						}
					}
					return
				}
			}
		})
	}
	publishEach(b, buf)
	b.StopTimer()
	cancel()
	buf.Close()
	wg.Wait()
}

// BenchmarkNextFollowing is one Publish and the Next of a subscriber that
// follows it with a reused dst: 0 allocations per operation.
func BenchmarkNextFollowing(b *testing.B) {
	buf := newBuffer(b, 1024, 512)
	s := subscribe(b, buf, Request{})
	dst := make([]Event[int], 0, 32)
	ctx := context.Background()
	e := ev("plugin", "a", 1)
	b.ReportAllocs()
	index := uint64(0)
	for b.Loop() {
		index++
		if err := buf.Publish(index, e); err != nil {
			b.Fatal(err)
		}
		var err error
		if dst, err = s.Next(ctx, dst); err != nil || len(dst) != 1 {
			b.Fatalf("Next = %v, %v", dst, err)
		}
	}
}

// BenchmarkSubscribeReplay starts subscriptions at a random index of a full
// ring of 65,536 batches: a binary search, nothing copied.
func BenchmarkSubscribeReplay(b *testing.B) {
	const size = 1 << 16
	buf := newBuffer(b, size, size/2)
	for i := uint64(1); i <= size; i++ {
		if err := buf.Publish(i*3, ev("plugin", "a", int(i))); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	i := uint64(0)
	for b.Loop() {
		i = (i*7919 + 1) % size
		s, err := buf.Subscribe(Request{After: i * 3})
		if err != nil {
			b.Fatal(err)
		}
		s.Close()
	}
}
