package registry

import (
	"cmp"
	"fmt"
	"github.com/csisupd/csisupd/internal/plugin"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/csisupd/csisupd/internal/fingerprint"
	"github.com/csisupd/csisupd/internal/heartbeat"
)

// Plugin is the registry's record of one plugin on this node.
type Plugin struct {
	ID           string                  `json:"id"`
	Instance     plugin.Instance         `json:"instance"`
	Fingerprint  fingerprint.Fingerprint `json:"fingerprint"`
	Health       heartbeat.Health        `json:"health"`
	RegisteredAt time.Time               `json:"registered_at"`
	// Fingerprinted is false until the plugin answered a fingerprint once.
	Fingerprinted bool `json:"fingerprinted"`
}

// Healthy reports whether the latest probe found the plugin healthy.
func (p Plugin) Healthy() bool { return p.Health.State == heartbeat.Healthy }

// Config configures a Registry.
type Config struct {
	// EventBuffer is how many recent events are kept for replay (default 1024).
	EventBuffer int
	// Logger receives one line per event. Optional.
	Logger hclog.Logger
	// Now returns the current time. Optional, for tests.
	Now func() time.Time
}

// Registry is the in-memory set of plugins on this node with its event log.
// It is safe for concurrent use. Writers never block on readers: subscribers
// get coalesced notifications and read the latest state themselves.
//
// Every write names the plugin instance (SocketID) it comes from; a write
// from an instance that is no longer the registered one is ignored, so an
// old supervisor can never change or deregister a newer instance.
type Registry struct {
	log hclog.Logger
	now func() time.Time

	mu       sync.Mutex
	plugins  map[string]*Plugin
	ignored  []plugin.Ignored
	version  uint64 // bumped on every visible change, events or not
	subs     map[*Subscription]struct{}
	modified chan struct{} // closed and replaced on every change; for waiters

	// ev is the event ring. It has its own lock, taken inside mu by
	// writers and alone by readers, so that hundreds of event streams
	// reading it never queue behind plugin writes on mu.
	ev eventRing
}

// New returns an empty registry.
func New(cfg Config) *Registry {
	if cfg.EventBuffer <= 0 {
		cfg.EventBuffer = 1024
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Registry{
		log:      cfg.Logger,
		now:      cfg.Now,
		plugins:  make(map[string]*Plugin),
		subs:     make(map[*Subscription]struct{}),
		modified: make(chan struct{}),
		ev:       eventRing{buf: make([]plugin.Event, cfg.EventBuffer), next: make(chan struct{})},
	}
}

// Register records a plugin instance with its first fingerprint, if it has
// one (fp may be nil when the plugin did not answer yet). A new id emits
// plugin-registered; a known id with a different instance (a replaced
// socket) takes over the record and emits plugin-registered again.
// Re-registering the current instance only records fp as SetFingerprint
// does.
func (r *Registry) Register(id string, inst plugin.Instance, fp *fingerprint.Fingerprint) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.plugins[id]
	switch {
	case ok && p.Instance == inst:
		if fp != nil {
			r.setFingerprintLocked(p, *fp)
		}
		return
	case ok:
		old := p.Instance
		p.Instance = inst
		p.Health = heartbeat.Health{State: heartbeat.Unknown, Since: r.now()}
		p.RegisteredAt = r.now()
		r.emitLocked(plugin.EventRegistered, id, fmt.Sprintf("new plugin instance at %s (replaces inode %d)", inst, old.Inode))
	default:
		p = &Plugin{
			ID:           id,
			Instance:     inst,
			Fingerprint:  fingerprint.Fingerprint{Type: fingerprint.TypeUnknown},
			Health:       heartbeat.Health{State: heartbeat.Unknown, Since: r.now()},
			RegisteredAt: r.now(),
		}
		r.plugins[id] = p
		r.emitLocked(plugin.EventRegistered, id, "plugin registered at "+inst.Path)
	}
	if fp != nil {
		// Part of registration: the first fingerprint is no change.
		p.Fingerprint = *fp
		p.Fingerprinted = true
	}
	r.changedLocked()
}

// SetFingerprint records a fingerprint. A fingerprint different from a
// previous one emits plugin-fingerprint-changed; the first one is part of
// registration and emits nothing.
func (r *Registry) SetFingerprint(id string, inst plugin.Instance, fp fingerprint.Fingerprint) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.currentLocked(id, inst); p != nil {
		r.setFingerprintLocked(p, fp)
	}
}

func (r *Registry) setFingerprintLocked(p *Plugin, fp fingerprint.Fingerprint) {
	if p.Fingerprinted && p.Fingerprint.Equal(fp) {
		return
	}
	if p.Fingerprinted {
		r.emitLocked(plugin.EventFingerprintChanged, p.ID, "changed: "+strings.Join(p.Fingerprint.Diff(fp), ", "))
	}
	p.Fingerprint = fp
	p.Fingerprinted = true
	r.changedLocked()
}

// SetHealth applies a probe result to the plugin's health, which only the
// registry holds (heartbeat.Health.Apply: Since moves on a change of
// state). A change of state emits plugin-healthy or plugin-unhealthy;
// anything else updates the record quietly (last probe time, a new
// description of the same state). It returns the health before the result,
// and false, changing nothing, when inst is not the current instance.
func (r *Registry) SetHealth(id string, inst plugin.Instance, res heartbeat.Result) (heartbeat.Health, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.currentLocked(id, inst)
	if p == nil {
		return heartbeat.Health{}, false
	}
	if res.At.IsZero() {
		res.At = r.now()
	}
	prev := p.Health
	next, transition := prev.Apply(res)
	p.Health = next
	switch {
	case transition && next.State == heartbeat.Healthy:
		r.emitLocked(plugin.EventHealthy, id, next.Description)
	case transition && next.State == heartbeat.Unhealthy:
		r.emitLocked(plugin.EventUnhealthy, id, next.Description)
	case !transition && prev.Description == next.Description:
		return prev, true // only the probe time moved: not a visible change
	}
	r.changedLocked()
	return prev, true
}

// Deregister removes a plugin instance and emits plugin-deregistered. It
// returns false, changing nothing, when inst is not the current instance.
func (r *Registry) Deregister(id string, inst plugin.Instance, reason string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.currentLocked(id, inst) == nil {
		return false
	}
	delete(r.plugins, id)
	r.emitLocked(plugin.EventDeregistered, id, reason)
	r.changedLocked()
	return true
}

// Restore loads plugins saved by a previous run. Their health is unknown
// until probed again. Restore emits no events; it is meant for start-up.
func (r *Registry) Restore(plugins []Plugin) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range plugins {
		p.Health = heartbeat.Health{State: heartbeat.Unknown, Description: "restored from disk; not probed yet", Since: r.now()}
		r.plugins[p.ID] = &p
	}
	r.changedLocked()
}

// SetIgnored replaces the list of ignored directory entries.
func (r *Registry) SetIgnored(ignored []plugin.Ignored) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if slices.Equal(r.ignored, ignored) {
		return
	}
	r.ignored = slices.Clone(ignored)
	r.changedLocked()
}

// Ignored returns the ignored directory entries.
func (r *Registry) Ignored() []plugin.Ignored {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ignored)
}

// Get returns a copy of one plugin's record.
func (r *Registry) Get(id string) (Plugin, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.plugins[id]
	if !ok {
		return Plugin{}, false
	}
	return *p, true
}

// List returns copies of all plugin records sorted by id.
func (r *Registry) List() []Plugin {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Plugin, 0, len(r.plugins))
	for _, p := range r.plugins {
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b Plugin) int { return cmp.Compare(a.ID, b.ID) })
	return out
}

// Version returns a number that grows with every visible change.
func (r *Registry) Version() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.version
}

// eventRing keeps the latest len(buf) events. Indexes are consecutive from
// 1, so the event with index i sits at buf[(i-1) % len(buf)] and a read
// finds its start by arithmetic, without scanning the ring.
type eventRing struct {
	mu     sync.RWMutex
	buf    []plugin.Event
	latest uint64        // index of the latest event; 0 before the first
	next   chan struct{} // closed and replaced when an event is emitted
}

// oldestLocked is the index of the oldest buffered event, or latest+1 when
// the ring is empty.
func (g *eventRing) oldestLocked() uint64 {
	if n := uint64(len(g.buf)); g.latest > n {
		return g.latest - n + 1
	}
	return 1
}

// DefaultEventBatch is a sensible limit for EventsAfter: a batch of 32 events
// is about 2.5 KiB however long the backlog is.
const DefaultEventBatch = 32

// EventsAfter returns at most limit buffered events with an index greater
// than after, oldest first, together with the index range the ring holds:
// oldest is the index of the oldest buffered event (latest+1 when none is
// buffered) and latest the index of the latest event (0 before the first).
//
// When after+1 < oldest, the events after+1 to oldest-1 were overwritten
// before the caller read them; the batch then starts at oldest. Callers
// that must not miss events compare after+1 with oldest themselves.
//
// The work and the memory are proportional to limit, never to the backlog:
// a stream reads the backlog batch by batch. limit <= 0 copies nothing
// and only reports the range.
func (r *Registry) EventsAfter(after uint64, limit int) (events []plugin.Event, oldest, latest uint64) {
	g := &r.ev
	g.mu.RLock()
	defer g.mu.RUnlock()
	oldest, latest = g.oldestLocked(), g.latest
	if limit <= 0 || after >= latest {
		return nil, oldest, latest
	}
	first := max(after+1, oldest)
	count := min(latest-first+1, uint64(limit))
	events = make([]plugin.Event, 0, count)
	return g.appendLocked(events, first, count), oldest, latest
}

// ReadEvents is EventsAfter into the caller's buffer: it copies at most
// len(buf) events into buf and returns how many. A stream that follows
// the log reuses one buffer and allocates nothing per read.
func (r *Registry) ReadEvents(buf []plugin.Event, after uint64) (n int, oldest, latest uint64) {
	g := &r.ev
	g.mu.RLock()
	defer g.mu.RUnlock()
	oldest, latest = g.oldestLocked(), g.latest
	if len(buf) == 0 || after >= latest {
		return 0, oldest, latest
	}
	first := max(after+1, oldest)
	count := min(latest-first+1, uint64(len(buf)))
	return len(g.appendLocked(buf[:0], first, count)), oldest, latest
}

// appendLocked appends count events starting at index first, which must
// be buffered.
func (g *eventRing) appendLocked(dst []plugin.Event, first, count uint64) []plugin.Event {
	n := uint64(len(g.buf))
	for i := first; i < first+count; i++ {
		dst = append(dst, g.buf[(i-1)%n])
	}
	return dst
}

// NextEvent returns a channel closed when the next event is emitted. Take
// it before reading with EventsAfter, so that an event emitted in between
// is not missed. Waiting on it never holds up the registry: emitting an
// event only closes the channel.
func (r *Registry) NextEvent() <-chan struct{} {
	r.ev.mu.RLock()
	defer r.ev.mu.RUnlock()
	return r.ev.next
}

// Events returns every buffered event with an index greater than after,
// oldest first, and the index of the latest event. When the buffer no
// longer holds every event after `after`, the oldest buffered ones are
// returned. It copies the whole backlog: a caller that follows the log
// should read it in batches with EventsAfter instead.
func (r *Registry) Events(after uint64) ([]plugin.Event, uint64) {
	evs, _, latest := r.EventsAfter(after, len(r.ev.buf))
	return evs, latest
}

// LastEvents returns up to n of the most recent events, oldest first; a
// negative n returns every buffered event.
func (r *Registry) LastEvents(n int) []plugin.Event {
	g := &r.ev
	g.mu.RLock()
	defer g.mu.RUnlock()
	oldest := g.oldestLocked()
	count := g.latest + 1 - oldest
	if n >= 0 && uint64(n) < count {
		count = uint64(n)
	}
	if count == 0 {
		return nil
	}
	return g.appendLocked(make([]plugin.Event, 0, count), g.latest-count+1, count)
}

// Changed returns a channel closed at the next visible change.
func (r *Registry) Changed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.modified
}

// Subscription delivers coalesced change notifications: however many changes
// happen while the subscriber is busy, it sees one pending notification and
// then reads the latest state. It never blocks the registry.
type Subscription struct {
	r *Registry
	c chan struct{}
}

// Subscribe returns a subscription with one notification already pending, so
// the subscriber reads the initial state without a special case.
func (r *Registry) Subscribe() *Subscription {
	s := &Subscription{r: r, c: make(chan struct{}, 1)}
	s.c <- struct{}{}
	r.mu.Lock()
	r.subs[s] = struct{}{}
	r.mu.Unlock()
	return s
}

// C receives a value after every change (coalesced).
func (s *Subscription) C() <-chan struct{} { return s.c }

// Close stops notifications.
func (s *Subscription) Close() {
	s.r.mu.Lock()
	delete(s.r.subs, s)
	s.r.mu.Unlock()
}

func (r *Registry) currentLocked(id string, inst plugin.Instance) *Plugin {
	p, ok := r.plugins[id]
	if !ok || p.Instance != inst {
		return nil
	}
	return p
}

func (r *Registry) emitLocked(t plugin.EventType, id, desc string) {
	g := &r.ev
	g.mu.Lock()
	g.latest++
	e := plugin.Event{Index: g.latest, Time: r.now(), Type: t, PluginID: id, Description: desc}
	g.buf[(e.Index-1)%uint64(len(g.buf))] = e
	woken := g.next
	g.next = make(chan struct{})
	g.mu.Unlock()
	// Wake every stream waiting for an event. Closing never blocks, but it
	// readies each waiter in turn, about 0.3 ms per thousand: done on its
	// own goroutine, that work never holds up this writer (which holds
	// r.mu), however many streams wait.
	go close(woken)
	r.log.Info("plugin event", "type", string(t), "plugin", id, "description", desc)
}

func (r *Registry) changedLocked() {
	r.version++
	close(r.modified)
	r.modified = make(chan struct{})
	for s := range r.subs {
		select {
		case s.c <- struct{}{}:
		default:
		}
	}
}
