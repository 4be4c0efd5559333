package registry

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/csisupd/csisupd/internal/fingerprint"
	"github.com/csisupd/csisupd/internal/heartbeat"
)

// EventType names a kind of registry event. The values are part of the
// external contract (`csisupd events --json`).
type EventType string

// Event types.
const (
	EventRegistered         EventType = "plugin-registered"
	EventHealthy            EventType = "plugin-healthy"
	EventUnhealthy          EventType = "plugin-unhealthy"
	EventDeregistered       EventType = "plugin-deregistered"
	EventFingerprintChanged EventType = "plugin-fingerprint-changed"
)

// SocketID identifies one instance of a plugin's socket. A socket removed and
// created again at the same path is a new instance: it has a new inode, or,
// when the file system reuses the inode number, a new modification time.
// The modification time of a socket is set by bind(2) and, unlike the
// change time, is not touched by chmod or chown, so re-permissioning a
// socket never restarts its plugin.
type SocketID struct {
	Path  string `json:"path"`
	Dev   uint64 `json:"dev"`
	Inode uint64 `json:"inode"`
	Mtime int64  `json:"mtime_ns"`
}

// String formats the identity for logs.
func (s SocketID) String() string { return fmt.Sprintf("%s (inode %d)", s.Path, s.Inode) }

// Plugin is the registry's record of one plugin on this node.
type Plugin struct {
	ID           string                  `json:"id"`
	Instance     SocketID                `json:"instance"`
	Fingerprint  fingerprint.Fingerprint `json:"fingerprint"`
	Health       heartbeat.Health        `json:"health"`
	RegisteredAt time.Time               `json:"registered_at"`
	// Fingerprinted is false until the plugin answered a fingerprint once.
	Fingerprinted bool `json:"fingerprinted"`
}

// Healthy reports whether the latest probe found the plugin healthy.
func (p Plugin) Healthy() bool { return p.Health.State == heartbeat.Healthy }

// Event is one change in the registry.
type Event struct {
	Index       uint64    `json:"index"`
	Time        time.Time `json:"time"`
	Type        EventType `json:"type"`
	PluginID    string    `json:"plugin_id"`
	Description string    `json:"description"`
}

// Ignored is a plugin directory entry that is not supervised, with why.
type Ignored struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

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
	ignored  []Ignored
	events   []Event // ring buffer
	next     int     // ring position of the next event
	full     bool
	index    uint64 // index of the latest event
	version  uint64 // bumped on every visible change, events or not
	subs     map[*Subscription]struct{}
	modified chan struct{} // closed and replaced on every change; for waiters
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
		events:   make([]Event, cfg.EventBuffer),
		subs:     make(map[*Subscription]struct{}),
		modified: make(chan struct{}),
	}
}

// Register records a plugin instance with its first fingerprint, if it has
// one (fp may be nil when the plugin did not answer yet). A new id emits
// plugin-registered; a known id with a different instance (a replaced
// socket) takes over the record and emits plugin-registered again.
// Re-registering the current instance only records fp as SetFingerprint
// does.
func (r *Registry) Register(id string, inst SocketID, fp *fingerprint.Fingerprint) {
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
		r.emitLocked(EventRegistered, id, fmt.Sprintf("new plugin instance at %s (replaces inode %d)", inst, old.Inode))
	default:
		p = &Plugin{
			ID:           id,
			Instance:     inst,
			Fingerprint:  fingerprint.Fingerprint{Type: fingerprint.TypeUnknown},
			Health:       heartbeat.Health{State: heartbeat.Unknown, Since: r.now()},
			RegisteredAt: r.now(),
		}
		r.plugins[id] = p
		r.emitLocked(EventRegistered, id, "plugin registered at "+inst.Path)
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
func (r *Registry) SetFingerprint(id string, inst SocketID, fp fingerprint.Fingerprint) {
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
		r.emitLocked(EventFingerprintChanged, p.ID, "changed: "+strings.Join(p.Fingerprint.Diff(fp), ", "))
	}
	p.Fingerprint = fp
	p.Fingerprinted = true
	r.changedLocked()
}

// SetHealth records a probe result. A change of health state emits
// plugin-healthy or plugin-unhealthy; anything else updates the record
// quietly (last probe time, a new description of the same state).
func (r *Registry) SetHealth(id string, inst SocketID, h heartbeat.Health) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.currentLocked(id, inst)
	if p == nil {
		return
	}
	prev := p.Health
	p.Health = h
	switch {
	case prev.State != h.State && h.State == heartbeat.Healthy:
		r.emitLocked(EventHealthy, id, h.Description)
	case prev.State != h.State && h.State == heartbeat.Unhealthy:
		r.emitLocked(EventUnhealthy, id, h.Description)
	case prev.Description == h.Description:
		return // only the probe time moved: not a visible change
	}
	r.changedLocked()
}

// Deregister removes a plugin instance and emits plugin-deregistered. It
// returns false, changing nothing, when inst is not the current instance.
func (r *Registry) Deregister(id string, inst SocketID, reason string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.currentLocked(id, inst) == nil {
		return false
	}
	delete(r.plugins, id)
	r.emitLocked(EventDeregistered, id, reason)
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
func (r *Registry) SetIgnored(ignored []Ignored) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if slices.Equal(r.ignored, ignored) {
		return
	}
	r.ignored = slices.Clone(ignored)
	r.changedLocked()
}

// Ignored returns the ignored directory entries.
func (r *Registry) Ignored() []Ignored {
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

// Events returns buffered events with an index greater than after, oldest
// first, and the index of the latest event. When the buffer no longer holds
// every event after `after`, the oldest buffered ones are returned.
func (r *Registry) Events(after uint64) ([]Event, uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Event
	n := len(r.events)
	start, count := 0, r.next
	if r.full {
		start, count = r.next, n
	}
	for i := 0; i < count; i++ {
		e := r.events[(start+i)%n]
		if e.Index > after {
			out = append(out, e)
		}
	}
	return out, r.index
}

// LastEvents returns up to n of the most recent events, oldest first.
func (r *Registry) LastEvents(n int) []Event {
	all, _ := r.Events(0)
	if n >= 0 && len(all) > n {
		all = all[len(all)-n:]
	}
	return all
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

func (r *Registry) currentLocked(id string, inst SocketID) *Plugin {
	p, ok := r.plugins[id]
	if !ok || p.Instance != inst {
		return nil
	}
	return p
}

func (r *Registry) emitLocked(t EventType, id, desc string) {
	r.index++
	e := Event{Index: r.index, Time: r.now(), Type: t, PluginID: id, Description: desc}
	r.events[r.next] = e
	r.next = (r.next + 1) % len(r.events)
	if r.next == 0 {
		r.full = true
	}
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
