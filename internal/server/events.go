package server

import (
	"sync"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// eventBroker keeps a bounded ring of recent cluster events and fans new ones
// out to subscribers. A subscriber that falls a full buffer behind is closed
// rather than allowed to block the FSM; it can resume from the last index it
// saw.
type eventBroker struct {
	mu     sync.Mutex
	ring   []*csisupdv1.ClusterEvent // circular once full
	next   int                       // slot of the next event once full
	size   int
	subs   map[*eventSub]struct{}
	closed bool
}

type eventSub struct {
	ch     chan *csisupdv1.ClusterEvent
	lagged bool
}

func newEventBroker(size int) *eventBroker {
	return &eventBroker{size: size, subs: map[*eventSub]struct{}{}}
}

func (b *eventBroker) publish(events []*csisupdv1.ClusterEvent) {
	if len(events) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, e := range events {
		if len(b.ring) < b.size {
			b.ring = append(b.ring, e)
			continue
		}
		b.ring[b.next] = e
		b.next = (b.next + 1) % b.size
	}
	for s := range b.subs {
		for _, e := range events {
			select {
			case s.ch <- e:
			default:
				s.lagged = true
				close(s.ch)
				delete(b.subs, s)
			}
			if s.lagged {
				break
			}
		}
	}
}

// subscribe returns buffered events with an index above fromIndex (none when
// noReplay) and a subscription for new events.
func (b *eventBroker) subscribe(fromIndex uint64, noReplay bool) ([]*csisupdv1.ClusterEvent, *eventSub) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var replay []*csisupdv1.ClusterEvent
	if !noReplay {
		for i := range b.ring {
			e := b.ring[(b.next+i)%len(b.ring)]
			if e.GetIndex() > fromIndex {
				replay = append(replay, e)
			}
		}
	}
	s := &eventSub{ch: make(chan *csisupdv1.ClusterEvent, 256)}
	if b.closed {
		close(s.ch)
		return replay, s
	}
	b.subs[s] = struct{}{}
	return replay, s
}

func (b *eventBroker) unsubscribe(s *eventSub) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.subs[s]; ok {
		delete(b.subs, s)
		close(s.ch)
	}
}

// isLagged reports whether the broker closed s because it fell behind.
func (b *eventBroker) isLagged(s *eventSub) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return s.lagged
}

func (b *eventBroker) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	for s := range b.subs {
		close(s.ch)
		delete(b.subs, s)
	}
}
