package registry

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/stream"
)

// poll reads what sub can read now, without waiting.
func poll(t *testing.T, sub *stream.Subscription[plugin.Event]) ([]stream.Event[plugin.Event], error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out []stream.Event[plugin.Event]
	for {
		evs, err := sub.Next(ctx, nil)
		if err != nil || len(evs) == 0 {
			if errors.Is(err, context.Canceled) {
				err = nil
			}
			return out, err
		}
		out = append(out, evs...)
	}
}

// Every registry event is published to the log under the plugin topic,
// keyed by the plugin id, with an index one above the previous one, so a
// subscriber can follow one plugin.
func TestEventLogCarriesPluginEvents(t *testing.T) {
	r := New(Config{})
	r.Register("a", inst(1), nil)
	r.Register("b", inst(2), nil)
	r.SetHealth("a", inst(1), healthy("ok"))
	r.Deregister("b", inst(2), "socket gone")

	all, err := r.EventLog().Subscribe(stream.Request{})
	if err != nil {
		t.Fatal(err)
	}
	defer all.Close()
	evs, err := poll(t, all)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for i, e := range evs {
		if e.Index != uint64(i+1) || e.Payload.Index != e.Index || e.Topic != plugin.EventTopic || e.Key != e.Payload.PluginID {
			t.Errorf("event %d = index %d (payload %d), topic %q, key %q for plugin %q", i, e.Index, e.Payload.Index, e.Topic, e.Key, e.Payload.PluginID)
		}
		got = append(got, e.Key+" "+string(e.Payload.Type))
	}
	want := []string{"a plugin-registered", "b plugin-registered", "a plugin-healthy", "b plugin-deregistered"}
	if !slices.Equal(got, want) {
		t.Errorf("events %v, want %v", got, want)
	}

	onlyB, err := r.EventLog().Subscribe(stream.Request{Topics: map[string][]string{plugin.EventTopic: {"b"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer onlyB.Close()
	evs, _ = poll(t, onlyB)
	if len(evs) != 2 || evs[0].Index != 2 || evs[1].Index != 4 {
		t.Errorf("plugin b's events: %v, want indexes 2 and 4", evs)
	}
	if got := indexes(r.LastEvents(2)); !slices.Equal(got, []uint64{3, 4}) {
		t.Errorf("LastEvents(2) = %v, want [3 4]", got)
	}
	if oldest, latest := r.EventLog().Range(); oldest != 1 || latest != 4 {
		t.Errorf("Range() = %d, %d; want 1, 4", oldest, latest)
	}
}

// A change without an event (a new description of the same state) moves
// nothing in the log.
func TestEventLogOnlyOnEvents(t *testing.T) {
	r := New(Config{})
	r.Register("a", inst(1), nil)
	r.SetHealth("a", inst(1), healthy("ok"))
	_, before := r.EventLog().Range()
	r.SetHealth("a", inst(1), heartbeat.Result{State: heartbeat.Healthy, Description: "still ok"})
	if _, after := r.EventLog().Range(); after != before {
		t.Errorf("latest index %d -> %d on a change without an event", before, after)
	}
}

// Readers following the log while writers emit see every event once, in
// order; one that falls behind is told where to resume and continues
// from there with no gap, or is told that events were lost. Never a torn,
// skipped or repeated event without an error.
func TestEventsFollowedConcurrently(t *testing.T) {
	r := New(Config{EventBuffer: 64, EventMaxLag: 32})
	const writers, perWriter, readers = 4, 500, 8
	const total = writers * perWriter
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, readers)
	resumed := make(chan int, readers)
	for reader := range readers {
		// Subscribed before the first event, so that the reader sees all.
		first, err := r.EventLog().Subscribe(stream.Request{})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			var after uint64
			resumes := 0
			defer func() { resumed <- resumes }()
			for after < total {
				sub := first
				var gone *stream.GoneError
				if after > 0 {
					var err error
					sub, err = r.EventLog().Subscribe(stream.Request{After: after})
					if errors.As(err, &gone) {
						after = gone.Oldest - 1 // events lost, and said so: carry on
						continue
					}
					if err != nil {
						errs <- err
						return
					}
				}
				buf := make([]stream.Event[plugin.Event], 0, 7)
				for after < total {
					evs, err := sub.Next(ctx, buf)
					var fell *stream.FellBehindError
					switch {
					case errors.As(err, &fell):
						if fell.ResumeIndex != after {
							errs <- fmt.Errorf("reader %d: resume from %d, but it read up to %d", reader, fell.ResumeIndex, after)
						}
					case errors.As(err, &gone):
						after = gone.Oldest - 1
					case err != nil:
						errs <- fmt.Errorf("reader %d stopped at %d of %d: %w", reader, after, total, err)
						sub.Close()
						return
					}
					if err != nil {
						resumes++
						break
					}
					for _, e := range evs {
						if e.Index != after+1 {
							errs <- fmt.Errorf("reader %d: event %d after %d", reader, e.Index, after)
							sub.Close()
							return
						}
						after = e.Index
					}
					if reader%2 == 1 && after%50 == 0 {
						time.Sleep(time.Millisecond) // a slow reader, so that some fall behind
					}
				}
				sub.Close()
			}
		})
	}
	var ww sync.WaitGroup
	for w := range writers {
		ww.Go(func() {
			for i := range perWriter {
				r.Register(fmt.Sprintf("w%d", w), inst(uint64(w*perWriter+i+1)), nil)
			}
		})
	}
	ww.Wait()
	wg.Wait()
	close(errs)
	close(resumed)
	for err := range errs {
		t.Error(err)
	}
	n := 0
	for r := range resumed {
		n += r
	}
	t.Logf("%d readers read %d events each, resuming %d times in all", readers, total, n)
}
