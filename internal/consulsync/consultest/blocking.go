package consultest

import (
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"
)

// Blocking query limits, as Consul's agent applies them to ?wait=.
const (
	// DefaultQueryWait is the wait of a blocking query that gives none.
	DefaultQueryWait = 5 * time.Minute
	// MaxQueryWait is the longest wait; a longer one is cut to it.
	MaxQueryWait = 10 * time.Minute
	// queryJitterFraction: Consul adds a random wait of up to wait/16.
	queryJitterFraction = 16
)

// QueryWait returns how long a blocking query with the given ?wait= value
// (a duration string, "" when absent) may block, as Consul computes it:
// DefaultQueryWait when absent or not positive, at most MaxQueryWait,
// plus a random stagger in [0, wait/16). ok is false for a value that is
// not a duration, which Consul answers 400 "Invalid wait time".
func QueryWait(value string) (wait time.Duration, ok bool) {
	if value != "" {
		d, err := time.ParseDuration(value)
		if err != nil {
			return 0, false
		}
		wait = d
	}
	switch {
	case wait > MaxQueryWait:
		wait = MaxQueryWait
	case wait <= 0:
		wait = DefaultQueryWait
	}
	if j := wait / queryJitterFraction; j > 0 {
		wait += rand.N(j)
	}
	return wait, true
}

// blockingQuery is the ?index= and ?wait= of a read.
type blockingQuery struct {
	index uint64
	wait  time.Duration
}

// parseBlocking reads ?index= and ?wait= as Consul's HTTP layer does; it
// answers 400 and returns false when one is invalid.
func parseBlocking(w http.ResponseWriter, r *http.Request) (blockingQuery, bool) {
	q := r.URL.Query()
	var b blockingQuery
	wait, ok := QueryWait(q.Get("wait"))
	if !ok {
		http.Error(w, "Invalid wait time", http.StatusBadRequest)
		return b, false
	}
	b.wait = wait
	if v := q.Get("index"); v != "" {
		idx, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			http.Error(w, "Invalid index", http.StatusBadRequest)
			return b, false
		}
		b.index = idx
	}
	return b, true
}

// blockLocked waits, with the catalog's lock released, until index()
// moves past b.index, b.wait passes, the client goes away or the agent
// closes; without ?index= (or index=0) it returns at once, as Consul
// does. A request that starts to block wakes Changed. It is called and
// returns with the lock held.
func (a *Agent) blockLocked(r *http.Request, b blockingQuery, index func() uint64) {
	if b.index == 0 || index() > b.index {
		return
	}
	timer := time.NewTimer(b.wait)
	defer timer.Stop()
	cat := a.cat
	a.notifyLocked() // the request arrived: Changed wakes for it too
	for index() <= b.index {
		changed := a.changed
		cat.mu.Unlock()
		over := false
		select {
		case <-changed:
		case <-timer.C:
			over = true
		case <-r.Context().Done():
			over = true
		case <-a.quit:
			over = true
		}
		cat.mu.Lock()
		cat.refreshLocked()
		if over {
			return
		}
	}
}
