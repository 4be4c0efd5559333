package watchdog

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// TestBusyMarksTheLoopCtxCarries: a call bounded by a deadline keeps the
// loop a context carries from counting as wedged until that deadline, and
// a context without a loop (a request's) is left alone.
func TestBusyMarksTheLoopCtxCarries(t *testing.T) {
	const timeout = 10 * time.Second
	tests := []struct {
		name      string
		call      func(ctx context.Context) // what the loop's work does before the clock moves
		advance   time.Duration
		wantStale bool
	}{
		{"no call, past the timeout", func(context.Context) {}, 2 * timeout, true},
		{"busy in a call with an hour left", func(ctx context.Context) {
			call, cancel := context.WithTimeout(ctx, time.Hour)
			defer cancel()
			BusyWith(ctx, call)
		}, 30 * time.Minute, false},
		{"busy in a call past its deadline and the timeout", func(ctx context.Context) {
			Busy(ctx, time.Now().Add(time.Minute))
		}, time.Minute + 2*timeout, true},
		{"a call without a deadline is no busy spell", func(ctx context.Context) {
			BusyWith(ctx, context.Background())
		}, 2 * timeout, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clock := testutil.NewClock(time.Unix(1_000_000, 0))
			mon, err := New(Config{Timeout: timeout, Now: clock.Now})
			if err != nil {
				t.Fatal(err)
			}
			loop := mon.Loop("volume watcher")
			defer loop.Done()
			ctx := WithLoop(context.Background(), loop)
			tc.call(ctx)
			clock.Advance(tc.advance)
			stale := slices.Contains(mon.Stale(), "volume watcher")
			if stale != tc.wantStale {
				t.Errorf("stale = %v after %s, want %v", stale, tc.advance, tc.wantStale)
			}
		})
	}
	// A request's context carries no loop: nothing to mark, no panic.
	Busy(context.Background(), time.Now().Add(time.Minute))
	BusyWith(context.Background(), context.Background())
}
