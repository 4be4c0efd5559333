package stream

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// Publishers race for indexes (with gaps) while many subscribers follow,
// some slowly and some filtered. Every subscriber must see exactly the
// published sequence it asked for, in order, across resumes after falling
// behind, or end with an explicit GoneError after a gap-free prefix of it.
// The buffer holds every batch, so that however the scheduler runs the
// goroutines (a loaded machine may run the publishers to the end before a
// subscriber reads), a subscriber that falls behind can always resume:
// none may be gone, and each must read the whole sequence. The model test
// covers subscribers that are gone.
func TestConcurrentPublishersAndSubscribers(t *testing.T) {
	const (
		publishers  = 3
		perPub      = 400
		subscribers = 48
	)
	b := newBuffer(t, 2048, 32) // more than publishers*perPub batches
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	type result struct {
		filter     map[string][]string
		got        []Event[int]
		gone       bool
		fellBehind int
		err        error
	}
	results := make([]result, subscribers)
	var subs sync.WaitGroup
	for i := range subscribers {
		r := &results[i]
		r.filter = modelFilters[i%len(modelFilters)]
		// Subscribed before the first Publish: each asks for everything.
		s := subscribe(t, b, Request{Topics: r.filter})
		slow := i%3 == 0
		subs.Go(func() {
			dst := make([]Event[int], 0, 1+i%8)
			for {
				var err error
				dst, err = s.Next(ctx, dst)
				r.got = append(r.got, dst...)
				if slow {
					for range 50 {
						runtime.Gosched()
					}
				}
				var fb *FellBehindError
				switch {
				case err == nil:
					continue
				case errors.Is(err, ErrClosed):
					s.Close()
					return
				case errors.As(err, &fb):
					r.fellBehind++
					s.Close()
					if s, err = b.Subscribe(Request{After: fb.ResumeIndex, Topics: r.filter}); err != nil {
						r.gone = errors.As(err, new(*GoneError))
						r.err = err
						return
					}
				default:
					s.Close()
					r.gone = errors.As(err, new(*GoneError))
					r.err = err
					return
				}
			}
		})
	}

	var mu sync.Mutex
	published := map[uint64][]Event[int]{} // index -> events, with Index set
	var pubs sync.WaitGroup
	for p := range publishers {
		pubs.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(p), 7))
			for k := 0; k < perPub; {
				events := make([]Event[int], 1+rng.IntN(3))
				for i := range events {
					tk := modelTopics[rng.IntN(len(modelTopics))]
					events[i] = Event[int]{Topic: tk.topic, Key: tk.key, Payload: p*1_000_000 + k*10 + i}
				}
				_, latest := b.Range()
				index := latest + 1 + uint64(rng.IntN(3))
				if err := b.Publish(index, events...); err != nil {
					if !strings.Contains(err.Error(), "not greater than the latest") {
						t.Errorf("Publish(%d): %v", index, err)
						return
					}
					continue // another publisher took it: try a later index
				}
				for i := range events {
					events[i].Index = index
				}
				mu.Lock()
				published[index] = events
				mu.Unlock()
				k++
			}
		})
	}

	pubs.Wait()
	b.Close()
	subs.Wait()

	order := make([]uint64, 0, len(published))
	for index := range published {
		order = append(order, index)
	}
	sort.Slice(order, func(i, j int) bool { return order[i] < order[j] })
	if len(order) != publishers*perPub {
		t.Fatalf("%d batches published, want %d", len(order), publishers*perPub)
	}
	behind, gone := 0, 0
	for i, r := range results {
		if r.err != nil && !r.gone {
			t.Errorf("subscriber %d: %v", i, r.err)
			continue
		}
		var want []Event[int]
		for _, index := range order {
			for _, e := range published[index] {
				if wants(r.filter, e) {
					want = append(want, e)
				}
			}
		}
		behind += r.fellBehind
		if r.gone {
			gone++
			if len(r.got) > len(want) || !slices.Equal(r.got, want[:len(r.got)]) {
				k := 0
				for k < len(r.got) && k < len(want) && r.got[k] == want[k] {
					k++
				}
				t.Errorf("subscriber %d (gone: %v, filter %v, %d resumes) read %d events that are not a prefix of the %d published: event %d is %+v, want %+v; before: %+v", i, r.err, r.filter, r.fellBehind, len(r.got), len(want), k, r.got[k], want[min(k, len(want)-1)], r.got[max(0, k-2):k])
			}
			continue
		}
		if !slices.Equal(r.got, want) {
			t.Errorf("subscriber %d (filter %v, %d resumes) read %d events, want the %d published, in order, once",
				i, r.filter, r.fellBehind, len(r.got), len(want))
		}
	}
	t.Logf("%d batches; %d resumes after falling behind; %d subscribers gone", len(order), behind, gone)
	if gone > 0 {
		t.Errorf("%d subscribers were gone although the buffer holds every batch", gone)
	}
}
