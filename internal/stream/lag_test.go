package stream

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// A following subscriber that trails by more than MaxLag is cut with its
// position; resuming from it gives every later event once.
func TestFellBehindResumesWithoutGap(t *testing.T) {
	b := newBuffer(t, 16, 3)
	var published []uint64
	pub := func(from, to uint64) {
		publishRange(t, b, from, to)
		published = append(published, seq(from, to)...)
	}
	pub(1, 2)
	s := subscribe(t, b, Request{})
	got, err := drain(s, 8)
	if err != nil {
		t.Fatalf("first read: %v", err)
	}
	pub(3, 10) // eight batches after its position 2: over the limit of 3

	_, err = s.Next(context.Background(), nil)
	var fb *FellBehindError
	if !errors.As(err, &fb) || *fb != (FellBehindError{ResumeIndex: 2, Lag: 8, MaxLag: 3}) {
		t.Fatalf("Next = %v; want FellBehindError{ResumeIndex: 2, Lag: 8, MaxLag: 3}", err)
	}
	want := "fell behind: 8 batches behind the newest (limit 3); resume from index 2"
	if err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
	if _, again := s.Next(doneCtx(), nil); !errors.As(again, &fb) || fb.ResumeIndex != 2 {
		t.Errorf("a second Next = %v; want the same FellBehindError", again)
	}
	s.Close()

	// The resumed subscription starts 8 batches back: it catches up, and
	// more batches published meanwhile do not cut it while they are
	// buffered (it is 9 behind after the second read).
	r := subscribe(t, b, Request{After: fb.ResumeIndex})
	dst := make([]Event[int], 0, 1)
	for range 2 {
		if dst, err = r.Next(doneCtx(), dst); err != nil {
			t.Fatalf("catching up: %v", err)
		}
		got = append(got, dst...)
	}
	pub(11, 13)
	rest, err := drain(r, 1)
	if err != nil {
		t.Fatalf("catching up: %v", err)
	}
	got = append(got, rest...)
	if !slices.Equal(indexes(got), published) {
		t.Errorf("read %v across the resume, want every published batch once: %v", indexes(got), published)
	}
}

// A following subscription whose next batch was dropped by the time it
// calls Next is gone, not behind: a resume could not be gap-free.
func TestFollowingSubscriberIdleTooLongIsGone(t *testing.T) {
	b := newBuffer(t, 4, 2)
	publishRange(t, b, 1, 2)
	s := subscribe(t, b, Request{After: 2})
	publishRange(t, b, 3, 10) // batches 3 to 6 dropped
	_, err := s.Next(doneCtx(), nil)
	var gone *GoneError
	if !errors.As(err, &gone) || *gone != (GoneError{After: 2, Oldest: 7}) {
		t.Errorf("Next = %v; want GoneError{After: 2, Oldest: 7}", err)
	}
}

// A filtered subscriber is cut only for a wanted batch it left unread, not
// for batches it does not want.
func TestFilteredSubscriberKeepingUpIsNotCut(t *testing.T) {
	volumes := Request{Topics: map[string][]string{"volume": {"*"}}}
	t.Run("unwanted batches while it is away", func(t *testing.T) {
		b := newBuffer(t, 64, 3)
		s := subscribe(t, b, volumes)
		for round := range 5 {
			base := uint64(round * 11)
			publishRange(t, b, base+1, base+10) // ten unwanted: lag 10 > 3
			publish(t, b, base+11, ev("volume", "v", int(base+11)))
			got, err := s.Next(doneCtx(), nil)
			if err != nil || !slices.Equal(payloads(got), []int{int(base + 11)}) {
				t.Fatalf("round %d: got %v, %v; want the volume event", round, payloads(got), err)
			}
		}
	})
	t.Run("unwanted batches while it waits", func(t *testing.T) {
		b := newBuffer(t, 64, 3)
		s := subscribe(t, b, volumes)
		type result struct {
			evs []Event[int]
			err error
		}
		done := make(chan result, 1)
		go func() {
			evs, err := s.Next(context.Background(), nil)
			done <- result{evs, err}
		}()
		testutil.WaitFor(t, 5*time.Second, "Next to wait", s.waiting.Load)
		publishRange(t, b, 1, 40)
		publish(t, b, 41, ev("volume", "v", 41))
		r := <-done
		if r.err != nil || !slices.Equal(payloads(r.evs), []int{41}) {
			t.Fatalf("got %v, %v; want the volume event", payloads(r.evs), r.err)
		}
	})
	t.Run("a wanted batch left unread cuts it", func(t *testing.T) {
		b := newBuffer(t, 64, 3)
		s := subscribe(t, b, volumes)
		publishRange(t, b, 1, 5)
		publish(t, b, 6, ev("volume", "v", 6))
		publishRange(t, b, 7, 10) // four batches after the wanted one
		_, err := s.Next(doneCtx(), nil)
		var fb *FellBehindError
		if !errors.As(err, &fb) || fb.ResumeIndex != 5 || fb.Lag != 5 {
			t.Fatalf("Next = %v; want FellBehindError with ResumeIndex 5 (the skipped batches dealt with), lag 5", err)
		}
		r := subscribe(t, b, Request{After: fb.ResumeIndex, Topics: volumes.Topics})
		if got, err := drain(r, 4); err != nil || !slices.Equal(payloads(got), []int{6}) {
			t.Errorf("resumed got %v, %v; want [6]", payloads(got), err)
		}
	})
}

// A subscription that starts far back reads its backlog batch by batch
// without being cut; once it has caught up, it is following and a lag
// beyond MaxLag cuts it.
func TestCatchingUpSubscriberIsNotCut(t *testing.T) {
	b := newBuffer(t, 16, 2)
	publishRange(t, b, 1, 10)
	s := subscribe(t, b, Request{}) // lag 10 > 2
	dst := make([]Event[int], 0, 1)
	var got []uint64
	next := uint64(11)
	for len(got) < 14 {
		var err error
		if dst, err = s.Next(doneCtx(), dst); err != nil {
			t.Fatalf("catching up after %v: %v", got, err)
		}
		got = append(got, indexes(dst)...)
		if next <= 14 { // keep it behind, within the buffer
			publishRange(t, b, next, next)
			next++
		}
	}
	if !slices.Equal(got, seq(1, 14)) {
		t.Fatalf("caught up with %v, want 1 to 14", got)
	}
	publishRange(t, b, 15, 17) // following now: lag 3 > 2
	_, err := s.Next(doneCtx(), dst)
	var fb *FellBehindError
	if !errors.As(err, &fb) || fb.ResumeIndex != 14 || fb.Lag != 3 {
		t.Errorf("Next after catching up = %v; want FellBehindError{ResumeIndex: 14, Lag: 3}", err)
	}
}

// A catching-up subscription whose next batch is dropped before it reads
// it gets GoneError naming its position, never a silent skip.
func TestCatchingUpSubscriberOverrunIsGone(t *testing.T) {
	b := newBuffer(t, 4, 2)
	publishRange(t, b, 1, 4)
	s := subscribe(t, b, Request{})
	got, err := s.Next(doneCtx(), make([]Event[int], 0, 1))
	if err != nil || !slices.Equal(indexes(got), []uint64{1}) {
		t.Fatalf("first read %v, %v; want [1]", indexes(got), err)
	}
	publishRange(t, b, 5, 7) // drops 1 (read), 2 and 3 (not read)
	_, err = s.Next(doneCtx(), got)
	var gone *GoneError
	if !errors.As(err, &gone) || *gone != (GoneError{After: 1, Oldest: 4}) {
		t.Fatalf("Next = %v; want GoneError{After: 1, Oldest: 4}", err)
	}
	if s.Index() != 1 {
		t.Errorf("Index() = %d after GoneError, want 1 (unchanged)", s.Index())
	}
	if !strings.Contains(err.Error(), "after index 1 and before index 4") {
		t.Errorf("error %q does not name the lost range", err)
	}
}

// The lag that builds up while a subscriber waits inside Next does not
// cut it.
func TestLagWhileWaitingDoesNotCut(t *testing.T) {
	b := newBuffer(t, 64, 2)
	s := subscribe(t, b, Request{})
	done := make(chan error, 1)
	var got []Event[int]
	go func() {
		var err error
		got, err = s.Next(context.Background(), make([]Event[int], 0, 64))
		done <- err
	}()
	testutil.WaitFor(t, 5*time.Second, "Next to wait", s.waiting.Load)
	// A burst in one critical section of the publisher's choosing: the
	// waiter may wake after any number of these.
	publishRange(t, b, 1, 10)
	if err := <-done; err != nil || len(got) == 0 || got[0].Index != 1 {
		t.Fatalf("Next = %v, %v; want events from 1", indexes(got), err)
	}
}

// A subscription that has dealt with no batch, in a buffer that had
// dropped none, is not cut: its resume index would be 0, which means
// "whatever is buffered" and could hide a gap. It reads on, or is gone.
func TestSubscriberAtIndexZeroIsNotCut(t *testing.T) {
	b := newBuffer(t, 8, 2)
	s := subscribe(t, b, Request{}) // following: lag 0
	publishRange(t, b, 1, 5)        // lag 5 > 2
	got, err := drain(s, 8)
	if err != nil || !slices.Equal(indexes(got), seq(1, 5)) {
		t.Fatalf("got %v, %v; want 1 to 5 without a cut", indexes(got), err)
	}
	r := subscribe(t, b, Request{})
	publishRange(t, b, 6, 20) // drops 1 to 12, r's next batch among them
	_, err = r.Next(doneCtx(), nil)
	var gone *GoneError
	if !errors.As(err, &gone) || *gone != (GoneError{After: 0, Oldest: 13}) {
		t.Errorf("Next = %v; want GoneError{After: 0, Oldest: 13}", err)
	}
}
