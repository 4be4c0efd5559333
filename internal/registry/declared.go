package registry

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/ids"
	"github.com/csisupd/csisupd/internal/plugin"
)

// Declaration is what the agent's configuration says about one plugin: a
// plugin "<id>" block that sets socket, type or required.
type Declaration struct {
	// Socket is the plugin's socket path, supervised like a socket of the
	// plugin directory wherever it lies. Empty when the plugin comes from
	// the plugin directory or a kubelet registration.
	Socket string
	// Type is the type the plugin must have; a plugin fingerprinted as
	// another type is unhealthy. Empty expects none.
	Type plugin.Type
	// Required makes the plugin expected: without a healthy instance for
	// HealthTimeout it emits plugin-missing, and until it has one the read
	// model lists it, not healthy, with why.
	Required bool
	// HealthTimeout is how long a required plugin may have no healthy
	// instance before plugin-missing. Required when Required is set.
	HealthTimeout time.Duration
}

// HealthMissing is the health state of a required plugin that has no
// record: its socket was never found, or is gone. It is a state of the
// read model only; a supervised plugin is unknown, healthy or unhealthy.
const HealthMissing = "missing"

// validateDeclarations checks declarations as the configuration does, for
// callers that build them some other way.
func validateDeclarations(decls map[string]Declaration) error {
	var errs []error
	for _, id := range slices.Sorted(maps.Keys(decls)) {
		d := decls[id]
		if !ids.ValidPluginID(id) {
			errs = append(errs, fmt.Errorf("registry: declared plugin %q: %s", id, invalidIDReason(id)))
		}
		if d.Socket != "" && (!filepath.IsAbs(d.Socket) || filepath.Clean(d.Socket) != d.Socket) {
			errs = append(errs, fmt.Errorf("registry: declared plugin %q: socket %q is not a clean absolute path", id, d.Socket))
		}
		switch d.Type {
		case "", plugin.TypeNode, plugin.TypeController, plugin.TypeMonolith:
		default:
			errs = append(errs, fmt.Errorf("registry: declared plugin %q: type %q is not node, controller or monolith", id, d.Type))
		}
		if d.Required && d.HealthTimeout <= 0 {
			errs = append(errs, fmt.Errorf("registry: declared plugin %q: HealthTimeout must be positive, got %s", id, d.HealthTimeout))
		}
	}
	return errors.Join(errs...)
}

// episode is the state of one required plugin: since when it has had no
// healthy instance (zero while it has one), whether plugin-missing was
// emitted for that episode, and why no socket is supervised for it ("" when
// one is).
type episode struct {
	since    time.Time
	reported bool
	absent   string
}

// setDeclarations replaces the declared plugins. A required plugin that is
// new starts its episode now; one that stays keeps it.
func (r *Registry) setDeclarations(decls map[string]Declaration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if maps.Equal(r.decls, decls) {
		return
	}
	r.decls = maps.Clone(decls)
	for id, d := range decls {
		if _, ok := r.episodes[id]; d.Required && !ok {
			r.episodes[id] = &episode{since: r.now()}
		}
	}
	for id := range r.episodes {
		if !r.decls[id].Required {
			delete(r.episodes, id)
		}
	}
	r.changedLocked()
}

// declarations returns the declared plugins; the caller owns the map.
func (r *Registry) declarations() map[string]Declaration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.decls)
}

// setAbsent records, for the required plugins, why no socket is
// supervised for them (absent maps id to the reason; a plugin that is
// supervised is not in it).
func (r *Registry) setAbsent(absent map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	changed := false
	for id, ep := range r.episodes {
		if ep.absent != absent[id] {
			ep.absent, changed = absent[id], true
		}
	}
	if changed {
		r.changedLocked()
	}
}

// checkRequired ends the episode of every required plugin that has a
// healthy instance, and emits plugin-missing for those whose episode has
// lasted their HealthTimeout. It returns how long until the next episode
// reaches its timeout, and false when none is pending.
func (r *Registry) checkRequired(now time.Time) (time.Duration, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var next time.Duration
	pending := false
	for _, id := range slices.Sorted(maps.Keys(r.episodes)) {
		ep, d := r.episodes[id], r.decls[id]
		p, ok := r.plugins[id]
		if ok && p.Healthy() {
			ep.since, ep.reported = time.Time{}, false
			continue
		}
		if ep.since.IsZero() {
			ep.since = now
		}
		if ep.reported {
			continue
		}
		if left := ep.since.Add(d.HealthTimeout).Sub(now); left > 0 {
			if !pending || left < next {
				next, pending = left, true
			}
			continue
		}
		ep.reported = true
		why := ep.absent
		if ok {
			why = fmt.Sprintf("its plugin is %s: %s", p.Health.State, p.Health.Description)
		}
		r.emitLocked(plugin.EventMissing, id, fmt.Sprintf("required plugin has had no healthy instance for %s (health_timeout): %s",
			d.HealthTimeout, why))
		r.changedLocked()
	}
	return next, pending
}

// watchRequired runs checkRequired after every change of the registry and
// whenever an episode reaches its timeout, until ctx ends.
func (r *Registry) watchRequired(ctx context.Context) {
	sub := r.Subscribe()
	defer sub.Close()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		if next, ok := r.checkRequired(r.now()); ok {
			timer.Reset(next)
		} else {
			timer.Stop()
		}
		select {
		case <-ctx.Done():
			return
		case <-sub.C():
		case <-timer.C:
		}
	}
}

// missingLocked returns the read model of every required plugin that has
// no record, sorted by id: expected, not healthy, with why.
func (r *Registry) missingLocked() []*csisupdv1.Plugin {
	var out []*csisupdv1.Plugin
	for _, id := range slices.Sorted(maps.Keys(r.episodes)) {
		if _, ok := r.plugins[id]; ok {
			continue
		}
		out = append(out, r.placeholderLocked(id))
	}
	return out
}

// placeholderLocked is the read model of required plugin id while it has
// no record.
func (r *Registry) placeholderLocked(id string) *csisupdv1.Plugin {
	ep, d := r.episodes[id], r.decls[id]
	why := ep.absent
	if why == "" {
		why = "its socket has not been found yet"
	}
	m := &csisupdv1.Plugin{
		Id:                plugin.WireString(id),
		Type:              plugin.WireString(string(d.Type.OrUnknown())),
		HealthState:       HealthMissing,
		HealthDescription: plugin.WireString("required plugin is not running: " + why),
		Socket:            plugin.WireString(d.Socket),
	}
	if !ep.since.IsZero() {
		m.HealthSince = timestamppb.New(ep.since)
	}
	return m
}
