package registry

import (
	"cmp"
	"context"
	"fmt"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/stream"
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
	// FingerprintStale is true while Fingerprint is the one of an
	// instance that Instance replaced: the new instance has not answered
	// a fingerprint yet, and may be another version with other
	// capabilities.
	FingerprintStale bool `json:"fingerprint_stale,omitempty"`
}

// FingerprintOfInstance reports whether Fingerprint describes Instance.
func (p Plugin) FingerprintOfInstance() bool { return p.Fingerprinted && !p.FingerprintStale }

// Healthy reports whether the latest probe found the plugin healthy.
func (p Plugin) Healthy() bool { return p.Health.State == heartbeat.Healthy }

// Config configures a Registry.
type Config struct {
	// EventBuffer is how many recent events are kept for replay (default
	// DefaultEventBuffer).
	EventBuffer int
	// EventMaxLag is how many events a following subscriber may trail the
	// newest by before its stream ends with "fell behind, resume from
	// index N" (stream.FellBehindError). It is less than EventBuffer, so
	// the events after N are still buffered when the subscriber resumes.
	// Default: three quarters of EventBuffer.
	EventMaxLag int
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

	// events is the event log. It has its own lock, taken inside mu by
	// writers (Publish) and alone by readers, so that hundreds of event
	// streams reading it never queue behind plugin writes on mu.
	events  *stream.Buffer[plugin.Event]
	evIndex uint64 // index of the latest event; 0 before the first

	// metrics count what happens to the plugins; registered by the
	// Manager that fills the registry (ManagerConfig.Metrics).
	metrics *metrics

	// decls are the declared plugins (Manager.SetDeclarations); episodes
	// hold the state of the required ones (see checkRequired).
	decls    map[string]Declaration
	episodes map[string]*episode
}

// DefaultEventBuffer is Config.EventBuffer when it is zero.
const DefaultEventBuffer = 1024

// New returns an empty registry. It panics when cfg.EventBuffer or
// cfg.EventMaxLag are negative, or the lag is not below the buffer: those
// are programming errors, not configuration.
func New(cfg Config) *Registry {
	if cfg.EventBuffer == 0 {
		cfg.EventBuffer = DefaultEventBuffer
	}
	if cfg.EventMaxLag == 0 {
		cfg.EventMaxLag = max(1, cfg.EventBuffer*3/4)
	}
	events, err := stream.New[plugin.Event](stream.Config{Size: cfg.EventBuffer, MaxLag: cfg.EventMaxLag})
	if err != nil {
		panic(fmt.Sprintf("registry: event log: %v", err))
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
		events:   events,
		metrics:  newMetrics(),
		episodes: make(map[string]*episode),
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
		p.FingerprintStale = p.Fingerprinted
		p.Health = heartbeat.Health{State: heartbeat.Unknown, Since: r.now()}
		p.RegisteredAt = r.now()
		r.emitLocked(plugin.EventRegistered, id, fmt.Sprintf("new plugin instance at %s (replaces inode %d)", inst, old.Inode))
	default:
		p = &Plugin{
			ID:           id,
			Instance:     inst,
			Fingerprint:  fingerprint.Fingerprint{Type: plugin.TypeUnknown},
			Health:       heartbeat.Health{State: heartbeat.Unknown, Since: r.now()},
			RegisteredAt: r.now(),
		}
		r.plugins[id] = p
		r.metrics.added(id)
		r.emitLocked(plugin.EventRegistered, id, "plugin registered at "+inst.Path)
	}
	if fp != nil {
		// Part of registration: the first fingerprint is no change.
		p.Fingerprint, p.Fingerprinted, p.FingerprintStale = *fp, true, false
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
	same := p.Fingerprinted && p.Fingerprint.Equal(fp)
	if same && !p.FingerprintStale {
		return
	}
	if p.Fingerprinted && !same {
		// Also for a replaced instance: an upgrade shows as a change.
		r.metrics.fingerprintChanged(p.ID)
		r.emitLocked(plugin.EventFingerprintChanged, p.ID, "changed: "+strings.Join(p.Fingerprint.Diff(fp), ", "))
	}
	p.Fingerprint, p.Fingerprinted, p.FingerprintStale = fp, true, false
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
	return r.setHealthLocked(id, inst, res)
}

// probed is SetHealth for the result of a probe: it also records the
// probe in the metrics (its duration, and a failure by reason or the time
// of a healthy probe). Both happen under mu and only while inst is the
// current instance, so a probe that ends after its plugin was deregistered
// cannot bring back the series Deregister deleted.
func (r *Registry) probed(id string, inst plugin.Instance, res heartbeat.Result) (heartbeat.Health, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if res.At.IsZero() {
		res.At = r.now()
	}
	prev, ok := r.setHealthLocked(id, inst, res)
	if ok {
		r.metrics.probed(id, res)
	}
	return prev, ok
}

// fingerprinted records in the metrics that a fingerprint of plugin
// instance inst took d; nothing when inst is not the current instance
// (see probed).
func (r *Registry) fingerprinted(id string, inst plugin.Instance, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.currentLocked(id, inst) != nil {
		r.metrics.fingerprinted(id, d)
	}
}

func (r *Registry) setHealthLocked(id string, inst plugin.Instance, res heartbeat.Result) (heartbeat.Health, bool) {
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
	if transition {
		r.metrics.transition(id, next.State)
	}
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
	// Under mu, with the record: a write of the plugin's that was
	// refused because the record is gone cannot bring a series back.
	r.metrics.forget(id)
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
		r.metrics.added(p.ID)
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

// socketIgnored emits plugin-socket-ignored for plugin id: the entry at
// path (a socket, or the plugin's subdirectory) is not dialled, for reason.
func (r *Registry) socketIgnored(id, path, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.emitLocked(plugin.EventSocketIgnored, id, path+" ignored: "+reason)
}

// emitConflict emits plugin-conflict for plugin id: two sources claim it
// at different paths (see conflict.description).
func (r *Registry) emitConflict(id, desc string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.emitLocked(plugin.EventConflict, id, desc)
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

// EventLog returns the registry's event log, for subscribers; only the
// registry publishes to it.
func (r *Registry) EventLog() plugin.EventLog { return r.events }

// LastEvents returns up to n of the most recent events, oldest first; a
// negative n returns every buffered event. It copies what it returns, so
// it is meant for small n (tests, a status page), not for following:
// followers subscribe to EventLog.
func (r *Registry) LastEvents(n int) []plugin.Event {
	after := r.events.AfterLast(n)
	if n < 0 {
		after = 0
	}
	evs, _ := r.eventsAfter(after)
	return evs
}

// Events returns every buffered event with an index greater than after,
// oldest first (the oldest buffered ones when some after `after` were
// dropped), and the index of the latest event. Like LastEvents it copies
// the backlog.
func (r *Registry) Events(after uint64) ([]plugin.Event, uint64) {
	if oldest, _ := r.events.Range(); oldest > 0 && after+1 < oldest {
		after = oldest - 1
	}
	return r.eventsAfter(after)
}

func (r *Registry) eventsAfter(after uint64) ([]plugin.Event, uint64) {
	_, latest := r.events.Range()
	sub, err := r.events.Subscribe(stream.Request{After: after})
	if err != nil {
		return nil, latest
	}
	defer sub.Close()
	done, cancel := context.WithCancel(context.Background())
	cancel() // Next only reads what is buffered: a poll
	var out []plugin.Event
	buf := make([]stream.Event[plugin.Event], 0, DefaultEventBatch)
	for sub.Index() < latest {
		evs, err := sub.Next(done, buf)
		if err != nil || len(evs) == 0 {
			break
		}
		for _, e := range evs {
			if e.Index <= latest {
				out = append(out, e.Payload)
			}
		}
	}
	return out, latest
}

// DefaultEventBatch is how many events LastEvents reads at a time.
const DefaultEventBatch = 32

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
	r.publishLocked(plugin.Event{Type: t, PluginID: id, Description: desc})
}

// Emit adds an event that another part of the agent made (the node volume
// manager's volume events) to the node's event log, after the registry's
// own. Index and Time are set here.
func (r *Registry) Emit(e plugin.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.publishLocked(e)
}

func (r *Registry) publishLocked(e plugin.Event) {
	r.evIndex++
	e.Index, e.Time = r.evIndex, r.now()
	// Indexes grow by one under mu, so Publish never refuses one.
	_ = r.events.Publish(e.Index, stream.Event[plugin.Event]{Topic: plugin.EventTopic, Key: e.PluginID, Payload: e})
	if e.VolumeID != "" {
		r.log.Info("volume event", "type", string(e.Type), "plugin", e.PluginID, "volume", e.VolumeID, "workload", e.WorkloadID, "description", e.Description)
		return
	}
	r.log.Info("plugin event", "type", string(e.Type), "plugin", e.PluginID, "description", e.Description)
}

func (r *Registry) changedLocked() {
	r.version++
	close(r.modified)
	r.modified = make(chan struct{})
	for s := range r.subs {
		select {
		case s.c <- struct{}{}:
		default:
			// The subscriber has not read the previous notification:
			// this change folds into it.
			r.metrics.coalesced.Inc()
		}
	}
}
