package leader

import (
	"fmt"
	"sync"
	"time"

	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// observations hold, on this server's monotonic clock, when its volume
// watcher first saw each node down and each claim taken but unfinished.
// The grace periods count from there, never from a replicated wall-clock
// time: a clock that jumps, here or on the leader that wrote the time,
// neither cuts one short nor stretches it.
//
// They outlive a term, and a follower keeps them current too (Observe):
// a leader whose lease lapsed under load, or another server that takes
// over, goes on counting from when it first saw a claim unfinished or a
// node down, instead of starting again at every change of leader. A
// claim unfinished under the same claim index has been unfinished all
// along (a claim is never unmounted while taken); a node is keyed by when
// its status last changed, so a node that came back and went down again
// is counted anew. What a server saw is a lower bound of the truth: its
// state lags the leader's, which can only make it wait longer.
type observations struct {
	mu              sync.Mutex
	downSince       map[string]time.Time // by downKey
	unfinishedSince map[string]time.Time // by watchKey
}

func newObservations() *observations {
	return &observations{downSince: map[string]time.Time{}, unfinishedSince: map[string]time.Time{}}
}

// downKey names one down spell of a node: its id and when its status
// last changed, as stored (an identity, never compared with a clock).
func downKey(n *statepb.ClusterNode) string {
	return fmt.Sprintf("%s\x00%d", n.GetId(), n.GetStatusUpdatedAt().AsTime().UnixNano())
}

// nodes records the nodes that are down now, and forgets the spells that
// ended. nodes holds every node that is down and may hold others; the
// watchers pass only the down ones (state.Store.NodesWithStatus).
func (o *observations) nodes(nodes []*statepb.ClusterNode, now time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	live := map[string]bool{}
	for _, n := range nodes {
		if n.GetStatus() != state.NodeStatusDown {
			continue
		}
		k := downKey(n)
		live[k] = true
		if _, seen := o.downSince[k]; !seen {
			o.downSince[k] = now
		}
	}
	for k := range o.downSince {
		if !live[k] {
			delete(o.downSince, k)
		}
	}
}

// downFor returns how long this server has seen node down (0 when it is
// not down, or not seen so yet).
func (o *observations) downFor(node *statepb.ClusterNode, now time.Time) time.Duration {
	if node == nil {
		return 0
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if since, ok := o.downSince[downKey(node)]; ok {
		return now.Sub(since)
	}
	return 0
}

// claim records the claim key as unfinished from now, when it is and was
// not seen so.
func (o *observations) claim(key string, unfinished bool, now time.Time) {
	if !unfinished {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, seen := o.unfinishedSince[key]; !seen {
		o.unfinishedSince[key] = now
	}
}

// unfinishedFor returns how long this server has seen the claim key
// unfinished, and whether it has.
func (o *observations) unfinishedFor(key string, now time.Time) (time.Duration, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	since, ok := o.unfinishedSince[key]
	return now.Sub(since), ok
}

// keepClaims forgets the claims not in live.
func (o *observations) keepClaims(live map[string]bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for k := range o.unfinishedSince {
		if !live[k] {
			delete(o.unfinishedSince, k)
		}
	}
}
