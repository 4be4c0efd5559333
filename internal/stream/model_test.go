package stream

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

// The tests here run schedules of publishes, subscribes, reads and closes
// against a Buffer and against a plain model of its documented behaviour
// (a list of every batch ever published), and compare every answer.

const (
	modelSize   = 8
	modelMaxLag = 3
)

// modelFilters are the filters a schedule picks from.
var modelFilters = []map[string][]string{
	nil,
	{"plugin": {"*"}},
	{"plugin": {"a"}},
	{"node": {"x"}, "volume": {"*"}},
}

var modelTopics = []struct{ topic, key string }{
	{"plugin", "a"}, {"plugin", "b"}, {"node", "x"}, {"volume", "v"},
}

type modelBatch struct {
	index  uint64
	events []Event[int]
}

// model is the oracle: every batch published, of which the newest
// modelSize are buffered.
type model struct {
	batches []modelBatch
	latest  uint64
}

// dropped is how many of the oldest batches are no longer buffered.
func (m *model) dropped() int { return max(0, len(m.batches)-modelSize) }

// droppedIndex is the index of the newest dropped batch, 0 if none.
func (m *model) droppedIndex() uint64 {
	if d := m.dropped(); d > 0 {
		return m.batches[d-1].index
	}
	return 0
}

func (m *model) oldestIndex() uint64 {
	if len(m.batches) == 0 {
		return 0
	}
	return m.batches[m.dropped()].index
}

// after returns the position in m.batches of the first batch with an index
// greater than index.
func (m *model) after(index uint64) int {
	return sort.Search(len(m.batches), func(i int) bool { return m.batches[i].index > index })
}

// modelSub is a subscription beside the model's idea of it.
type modelSub struct {
	s         *Subscription[int]
	filter    map[string][]string
	pos       uint64
	following bool
}

func wants(filter map[string][]string, e Event[int]) bool {
	if len(filter) == 0 {
		return true
	}
	keys, ok := filter[e.Topic]
	return ok && (slices.Contains(keys, "*") || slices.Contains(keys, e.Key))
}

func (ms *modelSub) wanted(b modelBatch) []Event[int] {
	var out []Event[int]
	for _, e := range b.events {
		if wants(ms.filter, e) {
			out = append(out, e)
		}
	}
	return out
}

// predictNext returns what Next with a done context and a dst of capacity
// limit must return, and updates ms as Next must update the subscription.
func (m *model) predictNext(ms *modelSub, limit int) ([]Event[int], error) {
	j := m.after(ms.pos)
	if j < len(m.batches) && j < m.dropped() {
		return nil, &GoneError{After: ms.pos, Oldest: m.oldestIndex()}
	}
	for j < len(m.batches) && len(ms.wanted(m.batches[j])) == 0 {
		ms.pos = m.batches[j].index
		j++
	}
	if lag := len(m.batches) - j; ms.following && lag > modelMaxLag && ms.pos != 0 {
		return nil, &FellBehindError{ResumeIndex: ms.pos, Lag: lag, MaxLag: modelMaxLag}
	}
	var out []Event[int]
	for ; j < len(m.batches); j++ {
		w := ms.wanted(m.batches[j])
		if len(w) > 0 && len(out) > 0 && len(out)+len(w) > limit {
			break
		}
		out = append(out, w...)
		ms.pos = m.batches[j].index
	}
	if len(m.batches)-j <= modelMaxLag {
		ms.following = true
	}
	if len(out) == 0 {
		return nil, context.Canceled
	}
	return out, nil
}

// outcomes counts what the reads of schedules returned.
type outcomes struct{ events, empty, fellBehind, gone, goneAtSubscribe, refused int }

// runSchedule interprets data as a schedule, two bytes an operation, and
// fails t at the first answer that differs from the model's.
func runSchedule(t *testing.T, data []byte, seen *outcomes) {
	b, err := New[int](Config{Size: modelSize, MaxLag: modelMaxLag})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	m := &model{}
	var subs []*modelSub
	payload := 0
	subscribe := func(after uint64, filter map[string][]string) {
		s, err := b.Subscribe(Request{After: after, Topics: filter})
		if after != 0 && after < m.droppedIndex() {
			var gone *GoneError
			if !errors.As(err, &gone) || *gone != (GoneError{After: after, Oldest: m.oldestIndex()}) {
				t.Fatalf("Subscribe(After: %d) with batches to %d dropped = %v; want GoneError", after, m.droppedIndex(), err)
			}
			seen.goneAtSubscribe++
			return
		}
		if err != nil {
			t.Fatalf("Subscribe(After: %d): %v", after, err)
		}
		pos := after
		if after == 0 {
			pos = m.droppedIndex()
		}
		if s.Index() != pos {
			t.Fatalf("Subscribe(After: %d).Index() = %d, want %d", after, s.Index(), pos)
		}
		j := max(m.after(after), m.dropped())
		subs = append(subs, &modelSub{s: s, filter: filter, pos: pos, following: len(m.batches)-j <= modelMaxLag})
	}
	for len(data) >= 2 {
		op, arg := data[0], data[1]
		data = data[2:]
		switch op % 5 {
		case 0, 1: // publish; a gap of 0 is a refused index
			index := m.latest + uint64(arg%4)
			n := int(arg/4) % 4 // 0: an empty batch
			events := make([]Event[int], n)
			for i := range events {
				tk := modelTopics[(int(arg)+i*int(op))%len(modelTopics)]
				payload++
				events[i] = Event[int]{Topic: tk.topic, Key: tk.key, Payload: payload}
			}
			err := b.Publish(index, events...)
			if index <= m.latest {
				if err == nil {
					t.Fatalf("Publish(%d) after %d accepted", index, m.latest)
				}
				seen.refused++
				continue
			}
			if err != nil {
				t.Fatalf("Publish(%d): %v", index, err)
			}
			m.latest = index
			if n > 0 {
				for i := range events {
					events[i].Index = index
				}
				m.batches = append(m.batches, modelBatch{index: index, events: events})
			}
			if oldest, latest := b.Range(); oldest != m.oldestIndex() || latest != m.latest {
				t.Fatalf("Range() = %d, %d; want %d, %d", oldest, latest, m.oldestIndex(), m.latest)
			}
		case 2: // read
			if len(subs) == 0 {
				continue
			}
			k := int(arg) % len(subs)
			ms := subs[k]
			limit := int(arg/16) % 5
			var dst []Event[int]
			if limit > 0 {
				dst = make([]Event[int], 0, limit)
			}
			want, wantErr := m.predictNext(ms, limit)
			got, err := ms.s.Next(doneCtx(), dst)
			if !slices.Equal(got, want) || !sameError(err, wantErr) {
				t.Fatalf("Next(cap %d) from %d = %v, %v; want %v, %v", limit, ms.pos, got, err, want, wantErr)
			}
			if ms.s.Index() != ms.pos {
				t.Fatalf("Index() = %d after Next, want %d", ms.s.Index(), ms.pos)
			}
			var fb *FellBehindError
			var gone *GoneError
			switch {
			case err == nil:
				seen.events++
			case errors.Is(err, context.Canceled):
				seen.empty++
			case errors.As(err, &fb):
				seen.fellBehind++
				// Resume at once: it must be gap-free, which the
				// model checks from the next read on.
				ms.s.Close()
				subs = slices.Delete(subs, k, k+1)
				subscribe(fb.ResumeIndex, ms.filter)
				if len(subs) == 0 || subs[len(subs)-1].pos != fb.ResumeIndex {
					t.Fatalf("resume from %d was refused", fb.ResumeIndex)
				}
			case errors.As(err, &gone):
				seen.gone++
				ms.s.Close()
				subs = slices.Delete(subs, k, k+1)
			}
		case 3: // subscribe
			var after uint64
			switch arg % 4 {
			case 0:
				after = 0
			case 1:
				after = m.latest
			case 2:
				after = b.AfterLast(int(arg / 4 % 12))
			case 3:
				if len(m.batches) > 0 {
					after = m.batches[int(arg/4)%len(m.batches)].index
				}
			}
			subscribe(after, modelFilters[int(arg/64)%len(modelFilters)])
		case 4: // close one
			if len(subs) > 0 {
				k := int(arg) % len(subs)
				subs[k].s.Close()
				subs = slices.Delete(subs, k, k+1)
			}
		}
	}
	// Every subscription drains what is left, then sees ErrClosed.
	b.Close()
	for _, ms := range subs {
		if _, err := ms.s.Next(doneCtx(), make([]Event[int], 0, 2*modelSize*3)); err != nil && !errors.Is(err, ErrClosed) {
			var fb *FellBehindError
			var gone *GoneError
			if !errors.As(err, &fb) && !errors.As(err, &gone) {
				t.Fatalf("Next after Close: %v", err)
			}
		}
		ms.s.Close()
	}
}

// sameError reports whether got is the error want describes.
func sameError(got, want error) bool {
	var gfb, wfb *FellBehindError
	var ggone, wgone *GoneError
	switch {
	case want == nil:
		return got == nil
	case errors.As(want, &wfb):
		return errors.As(got, &gfb) && *gfb == *wfb
	case errors.As(want, &wgone):
		return errors.As(got, &ggone) && *ggone == *wgone
	default:
		return errors.Is(got, want)
	}
}

func TestScheduleModel(t *testing.T) {
	var seen outcomes
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 1))
		data := make([]byte, 400)
		for i := range data {
			data[i] = byte(rng.UintN(256))
		}
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) { runSchedule(t, data, &seen) })
	}
	// The schedules must reach every outcome, or they test less than
	// they seem to.
	t.Logf("outcomes: %+v", seen)
	if seen.events == 0 || seen.empty == 0 || seen.fellBehind == 0 || seen.gone == 0 || seen.goneAtSubscribe == 0 || seen.refused == 0 {
		t.Errorf("the schedules missed an outcome: %+v", seen)
	}
}

func FuzzSchedule(f *testing.F) {
	f.Add([]byte{0, 5, 0, 9, 3, 0, 2, 0, 0, 13, 0, 13, 0, 13, 0, 13, 2, 0})
	f.Add([]byte{3, 1, 0, 5, 0, 5, 0, 5, 0, 5, 0, 5, 2, 16, 2, 32})
	f.Fuzz(func(t *testing.T, data []byte) { runSchedule(t, data, &outcomes{}) })
}
