package registry

import (
	"fmt"
	"github.com/csisupd/csisupd/internal/plugin"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/heartbeat"
)

// ring returns a registry with a ring of size holding events 1 to n.
func ring(size, n int) *Registry {
	r := New(Config{EventBuffer: size})
	for i := range n {
		r.Register(fmt.Sprintf("p%d", i), inst(uint64(i+1)), nil)
	}
	return r
}

func seq(from, to uint64) []uint64 {
	var out []uint64
	for i := from; i <= to; i++ {
		out = append(out, i)
	}
	return out
}

// EventsAfter and ReadEvents return one batch from after, never more than
// the limit, with the range the ring holds; a gap shows as after+1 < oldest.
func TestEventsAfterBatches(t *testing.T) {
	tests := []struct {
		name           string
		size, n        int
		after          uint64
		limit          int
		want           []uint64
		oldest, latest uint64
	}{
		{"empty ring", 4, 0, 0, 10, nil, 1, 0},
		{"before wrap, all", 8, 5, 0, 10, seq(1, 5), 1, 5},
		{"before wrap, limited", 8, 5, 0, 2, seq(1, 2), 1, 5},
		{"before wrap, from the middle", 8, 5, 3, 10, seq(4, 5), 1, 5},
		{"caught up", 8, 5, 5, 10, nil, 1, 5},
		{"ahead of latest", 8, 5, 9, 10, nil, 1, 5},
		{"wrapped, all", 4, 10, 6, 10, seq(7, 10), 7, 10},
		{"wrapped, gap", 4, 10, 2, 10, seq(7, 10), 7, 10},
		{"wrapped, gap, limited", 4, 10, 0, 3, seq(7, 9), 7, 10},
		{"wrapped, limited across the seam", 4, 10, 7, 2, seq(8, 9), 7, 10},
		{"zero limit reports the range only", 4, 10, 0, 0, nil, 7, 10},
		{"latest index only", 4, 10, ^uint64(0), 1, nil, 7, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ring(tt.size, tt.n)
			evs, oldest, latest := r.EventsAfter(tt.after, tt.limit)
			if got := indexes(evs); !slices.Equal(got, tt.want) || oldest != tt.oldest || latest != tt.latest {
				t.Errorf("EventsAfter(%d, %d) = %v, %d, %d; want %v, %d, %d",
					tt.after, tt.limit, got, oldest, latest, tt.want, tt.oldest, tt.latest)
			}
			for _, e := range evs {
				if want := fmt.Sprintf("p%d", e.Index-1); e.PluginID != want {
					t.Errorf("event %d is of %s, want %s", e.Index, e.PluginID, want)
				}
			}
			buf := make([]plugin.Event, tt.limit)
			n, oldest, latest := r.ReadEvents(buf, tt.after)
			if got := indexes(buf[:n]); !slices.Equal(got, tt.want) || oldest != tt.oldest || latest != tt.latest {
				t.Errorf("ReadEvents(len %d, %d) = %v, %d, %d; want %v, %d, %d",
					tt.limit, tt.after, got, oldest, latest, tt.want, tt.oldest, tt.latest)
			}
		})
	}
}

// A read copies its batch and nothing else, however long the backlog: the
// cost of a stream does not grow with the ring.
func TestEventsAfterCostIsOneBatch(t *testing.T) {
	r := ring(1<<16, 1<<16+10)
	_, oldest, _ := r.EventsAfter(0, 0)
	var evs []plugin.Event
	allocs := testing.AllocsPerRun(100, func() {
		evs, _, _ = r.EventsAfter(oldest-1, DefaultEventBatch)
	})
	if allocs != 1 || len(evs) != DefaultEventBatch || cap(evs) != DefaultEventBatch {
		t.Errorf("EventsAfter of a 65,536-event backlog: %v allocations, len %d cap %d; want 1 allocation of %d events",
			allocs, len(evs), cap(evs), DefaultEventBatch)
	}
	buf := make([]plugin.Event, DefaultEventBatch)
	if allocs := testing.AllocsPerRun(100, func() { r.ReadEvents(buf, oldest-1) }); allocs != 0 {
		t.Errorf("ReadEvents into a buffer: %v allocations, want 0", allocs)
	}
}

// NextEvent's channel closes when an event is emitted, and not on a change
// that emits none (a new description of the same health state).
func TestNextEventOnlyOnEvents(t *testing.T) {
	r := New(Config{})
	r.Register("a", inst(1), nil)
	next := r.NextEvent()
	r.SetHealth("a", inst(1), heartbeat.Result{State: heartbeat.Unknown, Description: "still starting"})
	select {
	case <-next:
		t.Fatal("NextEvent closed by a change without an event")
	default:
	}
	r.SetHealth("a", inst(1), healthy("ok"))
	select {
	case <-next:
	case <-time.After(5 * time.Second):
		t.Fatal("NextEvent not closed within 5s of an event")
	}
	if again := r.NextEvent(); again == next {
		t.Error("NextEvent returned the closed channel again")
	}
}

// Readers following the ring while writers emit see every event once, in
// order, or a gap they can detect; never a torn or repeated one.
func TestEventsFollowedConcurrently(t *testing.T) {
	r := New(Config{EventBuffer: 64})
	const writers, perWriter, readers = 4, 500, 8
	done := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, readers)
	for range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var after uint64
			for {
				next := r.NextEvent()
				evs, oldest, latest := r.EventsAfter(after, 7)
				if after+1 < oldest {
					after = oldest - 1 // fell behind: a stream ends here; carry on
					continue
				}
				for _, e := range evs {
					if e.Index != after+1 {
						errs <- fmt.Errorf("event %d after %d", e.Index, after)
						return
					}
					after = e.Index
				}
				if after == writers*perWriter {
					return
				}
				if after < latest {
					continue
				}
				select {
				case <-next:
				case <-done:
					errs <- fmt.Errorf("stopped at %d of %d", after, writers*perWriter)
					return
				}
			}
		}()
	}
	var ww sync.WaitGroup
	for w := range writers {
		ww.Add(1)
		go func() {
			defer ww.Done()
			for i := range perWriter {
				r.Register(fmt.Sprintf("w%d", w), inst(uint64(w*perWriter+i+1)), nil)
			}
		}()
	}
	ww.Wait()
	finished := make(chan struct{})
	go func() {
		wg.Wait()
		close(finished)
	}()
	select {
	case <-finished:
	case <-time.After(30 * time.Second):
		close(done)
		<-finished
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
