package stream

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestNewValidatesConfig(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string // "" for a valid config
	}{
		{"valid", Config{Size: 16, MaxLag: 8}, ""},
		{"smallest", Config{Size: 2, MaxLag: 1}, ""},
		{"zero size", Config{Size: 0, MaxLag: 1}, "size 0 must be greater than 0"},
		{"negative size", Config{Size: -1, MaxLag: 1}, "size -1 must be greater than 0"},
		{"zero max lag", Config{Size: 4, MaxLag: 0}, "max lag 0 must be greater than 0"},
		{"max lag equal to size", Config{Size: 4, MaxLag: 4}, "max lag 4 must be less than size 4"},
		{"max lag above size", Config{Size: 4, MaxLag: 9}, "max lag 9 must be less than size 4"},
		{"zero config is not defaulted", Config{}, "size 0 must be greater than 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := New[int](tt.cfg)
			if tt.wantErr == "" {
				if err != nil || b == nil {
					t.Fatalf("New(%+v) = %v, %v; want a buffer", tt.cfg, b, err)
				}
				b.Close()
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("New(%+v) error = %v; want one containing %q", tt.cfg, err, tt.wantErr)
			}
		})
	}
}

// Events come out in publishing order, each with the index of its batch,
// also when the indexes have gaps.
func TestPublishOrderAndIndexes(t *testing.T) {
	b := newBuffer(t, 16, 8)
	batches := []struct {
		index  uint64
		events []Event[int]
	}{
		{3, []Event[int]{ev("plugin", "a", 1), ev("node", "n", 2)}},
		{7, []Event[int]{ev("plugin", "b", 3)}},
		{8, []Event[int]{ev("volume", "v", 4), ev("volume", "w", 5), ev("plugin", "a", 6)}},
		{1000, []Event[int]{ev("node", "n", 7)}},
	}
	s := subscribe(t, b, Request{})
	for _, bt := range batches {
		// Index is set by Publish whatever the caller put there.
		for i := range bt.events {
			bt.events[i].Index = 99999
		}
		publish(t, b, bt.index, bt.events...)
	}
	got, err := drain(s, 64)
	if err != nil {
		t.Fatalf("drain: %v", err)
	}
	wantIdx := []uint64{3, 3, 7, 8, 8, 8, 1000}
	if !slices.Equal(indexes(got), wantIdx) || !slices.Equal(payloads(got), []int{1, 2, 3, 4, 5, 6, 7}) {
		t.Errorf("got indexes %v payloads %v; want %v and 1..7", indexes(got), payloads(got), wantIdx)
	}
	if s.Index() != 1000 {
		t.Errorf("Index() = %d after reading everything, want 1000", s.Index())
	}
	if oldest, latest := b.Range(); oldest != 3 || latest != 1000 {
		t.Errorf("Range() = %d, %d; want 3, 1000", oldest, latest)
	}
}

// Publish copies the events: a caller reusing its slice changes nothing
// that was published.
func TestPublishCopiesEvents(t *testing.T) {
	b := newBuffer(t, 4, 2)
	evs := []Event[int]{ev("plugin", "a", 1)}
	publish(t, b, 1, evs...)
	evs[0] = ev("node", "x", 2)
	publish(t, b, 2, evs...)
	got, err := drain(subscribe(t, b, Request{}), 8)
	if err != nil || len(got) != 2 || got[0].Topic != "plugin" || got[0].Payload != 1 || got[1].Topic != "node" {
		t.Errorf("drain = %+v, %v; want plugin/a/1 then node/x/2", got, err)
	}
}

func TestPublishRefusesNonIncreasingIndex(t *testing.T) {
	tests := []struct {
		name      string
		published []uint64 // accepted first, each with one event; 0 entries publish nothing
		empty     []uint64 // then published without events
		refused   uint64
	}{
		{"zero on a new buffer", nil, nil, 0},
		{"equal to the latest", []uint64{1, 2, 5}, nil, 5},
		{"below the latest", []uint64{1, 2, 5}, nil, 3},
		{"zero after others", []uint64{4}, nil, 0},
		{"equal to an empty batch's index", []uint64{1}, []uint64{6}, 6},
		{"below an empty batch's index", []uint64{1}, []uint64{6}, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBuffer(t, 8, 4)
			for _, i := range tt.published {
				publish(t, b, i, ev("plugin", "p", int(i)))
			}
			for _, i := range tt.empty {
				publish(t, b, i)
			}
			oldest, latest := b.Range()
			s := subscribe(t, b, Request{After: latest})
			err := b.Publish(tt.refused, ev("plugin", "late", -1))
			if err == nil || !strings.Contains(err.Error(), "not greater than the latest published index") {
				t.Fatalf("Publish(%d) after %v = %v; want a refusal", tt.refused, append(tt.published, tt.empty...), err)
			}
			if o, l := b.Range(); o != oldest || l != latest {
				t.Errorf("Range() = %d, %d after the refusal; want %d, %d unchanged", o, l, oldest, latest)
			}
			if got, err := drain(s, 8); len(got) != 0 || err != nil {
				t.Errorf("a subscriber saw %+v, %v after the refusal; want nothing", got, err)
			}
		})
	}
}

// A Publish without events moves the latest index and stores nothing.
func TestPublishEmptyBatch(t *testing.T) {
	b := newBuffer(t, 4, 2)
	s := subscribe(t, b, Request{})
	publish(t, b, 5)
	if oldest, latest := b.Range(); oldest != 0 || latest != 5 {
		t.Errorf("Range() = %d, %d after an empty batch; want 0, 5", oldest, latest)
	}
	if got, err := drain(s, 4); len(got) != 0 || err != nil {
		t.Errorf("an empty batch delivered %+v, %v; want nothing", got, err)
	}
	publish(t, b, 6, ev("plugin", "p", 6))
	if got, err := drain(s, 4); !slices.Equal(indexes(got), []uint64{6}) || err != nil {
		t.Errorf("after an empty batch got %v, %v; want [6]", indexes(got), err)
	}
}

func TestTopicFilters(t *testing.T) {
	events := []Event[int]{
		ev("plugin", "a", 1), ev("plugin", "b", 2), ev("node", "x", 3),
		ev("volume", "v1", 4), ev("plugin", "a", 5), ev("node", "y", 6),
	}
	tests := []struct {
		name   string
		topics map[string][]string
		want   []int // payloads
	}{
		{"nil filter: everything", nil, []int{1, 2, 3, 4, 5, 6}},
		{"empty filter: everything", map[string][]string{}, []int{1, 2, 3, 4, 5, 6}},
		{"topic, every key", map[string][]string{"plugin": {"*"}}, []int{1, 2, 5}},
		{"topic and key", map[string][]string{"plugin": {"a"}}, []int{1, 5}},
		{"topic and two keys", map[string][]string{"node": {"x", "y"}}, []int{3, 6}},
		{"star among keys", map[string][]string{"node": {"x", "*"}}, []int{3, 6}},
		{"two topics", map[string][]string{"plugin": {"b"}, "volume": {"*"}}, []int{2, 4}},
		{"no such key", map[string][]string{"volume": {"v2"}}, nil},
		{"no such topic", map[string][]string{"job": {"*"}}, nil},
		{"key of another topic", map[string][]string{"plugin": {"x"}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBuffer(t, 16, 8)
			// One event a batch, and once all in one batch.
			for i, e := range events {
				publish(t, b, uint64(i+1), e)
			}
			publish(t, b, 100, events...)
			got, err := drain(subscribe(t, b, Request{Topics: tt.topics}), 16)
			want := append(slices.Clone(tt.want), tt.want...)
			if err != nil || !slices.Equal(payloads(got), want) {
				t.Errorf("filter %v got %v, %v; want %v", tt.topics, payloads(got), err, want)
			}
		})
	}
}

func TestSubscribeRefusesTopicWithoutKeys(t *testing.T) {
	b := newBuffer(t, 4, 2)
	s, err := b.Subscribe(Request{Topics: map[string][]string{"plugin": {"*"}, "node": nil}})
	if err == nil || !strings.Contains(err.Error(), `topic "node" lists no key`) {
		t.Errorf("Subscribe with a topic without keys = %v, %v; want a refusal naming the topic", s, err)
	}
}

// The filter is the subscription's own: changing the request's map after
// Subscribe changes nothing.
func TestSubscribeCopiesTopics(t *testing.T) {
	b := newBuffer(t, 4, 2)
	topics := map[string][]string{"plugin": {"a"}}
	s := subscribe(t, b, Request{Topics: topics})
	topics["plugin"][0] = "b"
	topics["node"] = []string{"*"}
	publish(t, b, 1, ev("plugin", "a", 1), ev("plugin", "b", 2), ev("node", "n", 3))
	if got, err := drain(s, 4); err != nil || !slices.Equal(payloads(got), []int{1}) {
		t.Errorf("got %v, %v; want [1], the filter as subscribed", payloads(got), err)
	}
}

func TestSubscribeReplay(t *testing.T) {
	// Batches 10, 20, ..., 80 in a ring of 16: nothing dropped.
	tests := []struct {
		name      string
		after     uint64
		want      []uint64
		wantIndex uint64 // Index() before the first Next
	}{
		{"from 0: everything buffered", 0, []uint64{10, 20, 30, 40, 50, 60, 70, 80}, 0},
		{"from before the oldest", 5, []uint64{10, 20, 30, 40, 50, 60, 70, 80}, 5},
		{"from the oldest", 10, []uint64{20, 30, 40, 50, 60, 70, 80}, 10},
		{"from a middle index", 40, []uint64{50, 60, 70, 80}, 40},
		{"from between two indexes", 45, []uint64{50, 60, 70, 80}, 45},
		{"from the latest", 80, nil, 80},
		{"from beyond the latest", 85, nil, 85},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBuffer(t, 16, 4)
			for i := uint64(10); i <= 80; i += 10 {
				publish(t, b, i, ev("plugin", "p", int(i)))
			}
			s := subscribe(t, b, Request{After: tt.after})
			if s.Index() != tt.wantIndex {
				t.Errorf("Index() = %d at the start, want %d", s.Index(), tt.wantIndex)
			}
			got, err := drain(s, 3)
			if err != nil || !slices.Equal(indexes(got), tt.want) {
				t.Errorf("replay after %d got %v, %v; want %v", tt.after, indexes(got), err, tt.want)
			}
			// Then it follows: only batches beyond both After and 80.
			publish(t, b, 83, ev("plugin", "p", 83))
			publish(t, b, 90, ev("plugin", "p", 90))
			want := []uint64{83, 90}
			if tt.after >= 83 {
				want = []uint64{90}
			}
			if got, err := drain(s, 3); err != nil || !slices.Equal(indexes(got), want) {
				t.Errorf("following after %d got %v, %v; want %v", tt.after, indexes(got), err, want)
			}
		})
	}
}

func TestSubscribeGone(t *testing.T) {
	// A ring of 4 after batches 10, 20, ..., 100: 10 to 60 were dropped,
	// 70 to 100 are buffered.
	tests := []struct {
		name  string
		after uint64
		gone  bool
		want  []uint64
	}{
		{"0 is never gone", 0, false, []uint64{70, 80, 90, 100}},
		{"after the last dropped batch", 60, false, []uint64{70, 80, 90, 100}},
		{"between the last dropped and the oldest", 65, false, []uint64{70, 80, 90, 100}},
		{"from the oldest", 70, false, []uint64{80, 90, 100}},
		{"one batch dropped", 55, true, nil},
		{"several dropped", 15, true, nil},
		{"before everything", 1, true, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBuffer(t, 4, 2)
			for i := uint64(10); i <= 100; i += 10 {
				publish(t, b, i, ev("plugin", "p", int(i)))
			}
			s, err := b.Subscribe(Request{After: tt.after})
			if tt.gone {
				var gone *GoneError
				if !errors.As(err, &gone) || gone.After != tt.after || gone.Oldest != 70 {
					t.Fatalf("Subscribe(After: %d) = %v, %v; want GoneError{After: %d, Oldest: 70}", tt.after, s, err, tt.after)
				}
				if msg := err.Error(); !strings.Contains(msg, "after index "+strconv.FormatUint(tt.after, 10)+" and before index 70") {
					t.Errorf("error %q does not name the lost range", msg)
				}
				return
			}
			if err != nil {
				t.Fatalf("Subscribe(After: %d): %v", tt.after, err)
			}
			defer s.Close()
			if got, err := drain(s, 8); err != nil || !slices.Equal(indexes(got), tt.want) {
				t.Errorf("after %d got %v, %v; want %v", tt.after, indexes(got), err, tt.want)
			}
		})
	}
}

func TestRangeAndAfterLast(t *testing.T) {
	// Batch sizes and indexes: (10: 1 event) (20: 3) (30: 1) (40: 2).
	load := func(t *testing.T, size int) *Buffer[int] {
		b := newBuffer(t, size, 1)
		publish(t, b, 10, ev("a", "k", 1))
		publish(t, b, 20, ev("a", "k", 2), ev("a", "k", 3), ev("a", "k", 4))
		publish(t, b, 30, ev("a", "k", 5))
		publish(t, b, 40, ev("a", "k", 6), ev("a", "k", 7))
		return b
	}
	tests := []struct {
		name       string
		size, n    int
		wantAfter  uint64
		wantEvents []int // what a subscription from there starts with
	}{
		{"negative: only new events", 8, -1, 40, nil},
		{"zero: only new events", 8, 0, 40, nil},
		{"the last event", 8, 1, 30, []int{6, 7}}, // its batch, whole
		{"the last two", 8, 2, 30, []int{6, 7}},
		{"the last three", 8, 3, 20, []int{5, 6, 7}},
		{"inside a batch: rounded out", 8, 4, 10, []int{2, 3, 4, 5, 6, 7}},
		{"the last six", 8, 6, 10, []int{2, 3, 4, 5, 6, 7}},
		{"all seven", 8, 7, 0, []int{1, 2, 3, 4, 5, 6, 7}},
		{"more than buffered", 8, 100, 0, []int{1, 2, 3, 4, 5, 6, 7}},
		{"wrapped: all buffered", 3, 6, 0, []int{2, 3, 4, 5, 6, 7}},
		{"wrapped: inside the oldest batch", 3, 5, 0, []int{2, 3, 4, 5, 6, 7}},
		{"wrapped: the last three", 3, 3, 20, []int{5, 6, 7}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := load(t, tt.size)
			after := b.AfterLast(tt.n)
			if after != tt.wantAfter {
				t.Errorf("AfterLast(%d) = %d, want %d", tt.n, after, tt.wantAfter)
			}
			got, err := drain(subscribe(t, b, Request{After: after}), 16)
			if err != nil || !slices.Equal(payloads(got), tt.wantEvents) {
				t.Errorf("from AfterLast(%d) got %v, %v; want %v", tt.n, payloads(got), err, tt.wantEvents)
			}
		})
	}
	t.Run("empty buffer", func(t *testing.T) {
		b := newBuffer(t, 4, 1)
		if oldest, latest := b.Range(); oldest != 0 || latest != 0 {
			t.Errorf("Range() = %d, %d on an empty buffer; want 0, 0", oldest, latest)
		}
		if a := b.AfterLast(5); a != 0 {
			t.Errorf("AfterLast(5) = %d on an empty buffer, want 0", a)
		}
	})
	t.Run("range after wrapping", func(t *testing.T) {
		b := load(t, 3)
		if oldest, latest := b.Range(); oldest != 20 || latest != 40 {
			t.Errorf("Range() = %d, %d; want 20, 40", oldest, latest)
		}
	})
}

// Next appends whole batches up to cap(dst), and a single larger batch
// whole.
func TestBatchesAreNeverSplit(t *testing.T) {
	tests := []struct {
		name   string
		cap    int
		topics map[string][]string
		want   [][]uint64 // indexes returned by each call
	}{
		{"nil dst: one batch a call", 0, nil, [][]uint64{{1, 1, 1}, {2, 2, 2}, {3}, {4, 4, 4, 4, 4}}},
		{"one batch fits, then two", 4, nil, [][]uint64{{1, 1, 1}, {2, 2, 2, 3}, {4, 4, 4, 4, 4}}},
		{"two batches fit exactly", 6, nil, [][]uint64{{1, 1, 1, 2, 2, 2}, {3, 4, 4, 4, 4, 4}}},
		{"smaller than every batch", 2, nil, [][]uint64{{1, 1, 1}, {2, 2, 2}, {3}, {4, 4, 4, 4, 4}}},
		{"everything fits", 100, nil, [][]uint64{{1, 1, 1, 2, 2, 2, 3, 4, 4, 4, 4, 4}}},
		// The filter keeps one event of batch 1 and 2, none of 3, all of 4.
		{"filtered: counts matching events only", 3, map[string][]string{"x": {"*"}}, [][]uint64{{1, 2}, {4, 4, 4, 4, 4}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBuffer(t, 8, 4)
			publish(t, b, 1, ev("x", "k", 0), ev("y", "k", 0), ev("y", "k", 0))
			publish(t, b, 2, ev("y", "k", 0), ev("x", "k", 0), ev("y", "k", 0))
			publish(t, b, 3, ev("y", "k", 0))
			publish(t, b, 4, ev("x", "k", 0), ev("x", "k", 0), ev("x", "k", 0), ev("x", "k", 0), ev("x", "k", 0))
			s := subscribe(t, b, Request{Topics: tt.topics})
			var dst []Event[int]
			if tt.cap > 0 {
				dst = make([]Event[int], 0, tt.cap)
			}
			ctx := doneCtx()
			for i, want := range tt.want {
				got, err := s.Next(ctx, dst)
				if err != nil || !slices.Equal(indexes(got), want) {
					t.Fatalf("call %d: got %v, %v; want %v", i+1, indexes(got), err, want)
				}
			}
			if got, err := s.Next(ctx, dst); len(got) != 0 || err == nil {
				t.Errorf("after the last batch got %v, %v; want nothing and ctx's error", indexes(got), err)
			}
		})
	}
}

// Batches the filter does not want move the position.
func TestFilteredIndexAdvances(t *testing.T) {
	b := newBuffer(t, 8, 4)
	s := subscribe(t, b, Request{Topics: map[string][]string{"volume": {"*"}}})
	publish(t, b, 1, ev("volume", "v", 1))
	publish(t, b, 2, ev("plugin", "p", 2))
	publish(t, b, 3, ev("plugin", "p", 3))
	if got, err := drain(s, 8); err != nil || !slices.Equal(payloads(got), []int{1}) {
		t.Fatalf("got %v, %v; want [1]", payloads(got), err)
	}
	if s.Index() != 3 {
		t.Errorf("Index() = %d, want 3: the skipped batches 2 and 3 are dealt with", s.Index())
	}
}
