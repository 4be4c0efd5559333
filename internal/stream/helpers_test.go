package stream

import (
	"context"
	"errors"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newBuffer returns a buffer of int payloads or fails t.
func newBuffer(t testing.TB, size, maxLag int) *Buffer[int] {
	t.Helper()
	b, err := New[int](Config{Size: size, MaxLag: maxLag})
	if err != nil {
		t.Fatalf("New(size %d, max lag %d): %v", size, maxLag, err)
	}
	t.Cleanup(b.Close)
	return b
}

// ev is an event on topic with key and payload p.
func ev(topic, key string, p int) Event[int] { return Event[int]{Topic: topic, Key: key, Payload: p} }

// publish publishes one batch or fails t.
func publish(t testing.TB, b *Buffer[int], index uint64, events ...Event[int]) {
	t.Helper()
	if err := b.Publish(index, events...); err != nil {
		t.Fatalf("Publish(%d): %v", index, err)
	}
}

// publishRange publishes batches from to to, each of one "plugin" event
// whose payload is its index.
func publishRange(t testing.TB, b *Buffer[int], from, to uint64) {
	t.Helper()
	for i := from; i <= to; i++ {
		publish(t, b, i, ev("plugin", "p", int(i)))
	}
}

// subscribe subscribes or fails t.
func subscribe(t testing.TB, b *Buffer[int], req Request) *Subscription[int] {
	t.Helper()
	s, err := b.Subscribe(req)
	if err != nil {
		t.Fatalf("Subscribe(%+v): %v", req, err)
	}
	t.Cleanup(s.Close)
	return s
}

// doneCtx is a context that is already done: Next with it returns what is
// available without waiting.
func doneCtx() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// drain reads everything available to s, capacity events a call, and
// returns the events and the error that ended the reads (nil when s was
// caught up).
func drain(s *Subscription[int], capacity int) ([]Event[int], error) {
	var all []Event[int]
	dst := make([]Event[int], 0, capacity)
	ctx := doneCtx()
	for {
		var err error
		dst, err = s.Next(ctx, dst)
		all = append(all, dst...)
		if errors.Is(err, context.Canceled) {
			return all, nil
		}
		if err != nil {
			return all, err
		}
	}
}

// indexes returns the Index of each event.
func indexes(evs []Event[int]) []uint64 {
	out := make([]uint64, 0, len(evs))
	for _, e := range evs {
		out = append(out, e.Index)
	}
	return out
}

// payloads returns the Payload of each event.
func payloads(evs []Event[int]) []int {
	out := make([]int, 0, len(evs))
	for _, e := range evs {
		out = append(out, e.Payload)
	}
	return out
}

// seq returns from, from+1, ..., to.
func seq(from, to uint64) []uint64 {
	out := []uint64{}
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}
