package registry

import (
	"fmt"
	"github.com/csisupd/csisupd/internal/plugin"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/fingerprint"
	"github.com/csisupd/csisupd/internal/heartbeat"
)

func inst(inode uint64) plugin.Instance {
	return plugin.Instance{Path: "/plugins/a/csi.sock", Dev: 1, Inode: inode, Mtime: int64(inode) * 1000}
}

func healthy(desc string) heartbeat.Result {
	return heartbeat.Result{State: heartbeat.Healthy, Description: desc}
}

func unhealthy(desc string) heartbeat.Result {
	return heartbeat.Result{State: heartbeat.Unhealthy, Description: desc}
}

func indexes(evs []plugin.Event) []uint64 {
	var out []uint64
	for _, e := range evs {
		out = append(out, e.Index)
	}
	return out
}

func TestRegistryEventRingWrapsAround(t *testing.T) {
	r := New(Config{EventBuffer: 4})
	for i := range 6 {
		r.Register(fmt.Sprintf("p%d", i), inst(uint64(i)), nil)
	}
	tests := []struct {
		after uint64
		want  []uint64
	}{
		{after: 0, want: []uint64{3, 4, 5, 6}}, // 1 and 2 were overwritten
		{after: 2, want: []uint64{3, 4, 5, 6}},
		{after: 4, want: []uint64{5, 6}},
		{after: 6, want: nil},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("after=%d", tt.after), func(t *testing.T) {
			evs, latest := r.Events(tt.after)
			if latest != 6 {
				t.Errorf("latest index = %d, want 6", latest)
			}
			if got := indexes(evs); !slices.Equal(got, tt.want) {
				t.Errorf("Events(%d) indexes = %v, want %v", tt.after, got, tt.want)
			}
		})
	}
	if got := indexes(r.LastEvents(2)); !slices.Equal(got, []uint64{5, 6}) {
		t.Errorf("LastEvents(2) = %v, want [5 6]", got)
	}
	evs, _ := r.Events(0)
	if evs[0].PluginID != "p2" || evs[3].PluginID != "p5" {
		t.Errorf("events are for %s..%s, want p2..p5", evs[0].PluginID, evs[3].PluginID)
	}
}

func TestRegistryEventRingBeforeWrap(t *testing.T) {
	r := New(Config{EventBuffer: 4})
	r.Register("a", inst(1), nil)
	r.Register("b", inst(2), nil)
	evs, latest := r.Events(0)
	if latest != 2 || !slices.Equal(indexes(evs), []uint64{1, 2}) {
		t.Fatalf("Events(0) = %v latest %d, want [1 2] latest 2", indexes(evs), latest)
	}
}

func TestRegistryIgnoresWritesFromStaleInstance(t *testing.T) {
	r := New(Config{})
	fp := fingerprint.Fingerprint{VendorName: "v", Type: plugin.TypeNode}
	r.Register("a", inst(1), &fp)
	r.SetHealth("a", inst(1), healthy("healthy"))
	r.Register("a", inst(2), nil) // the socket was replaced

	p, _ := r.Get("a")
	if p.Instance != inst(2) {
		t.Fatalf("instance = %v, want inode 2", p.Instance)
	}
	if p.Health.State != heartbeat.Unknown {
		t.Errorf("health after new instance = %s, want unknown", p.Health.State)
	}
	e, ok := findEvent(r, "a", plugin.EventRegistered)
	if !ok {
		t.Fatal("no registered event")
	}
	last := r.LastEvents(1)[0]
	if last.Type != plugin.EventRegistered || !strings.Contains(last.Description, "replaces inode 1") {
		t.Errorf("last event = %+v, want plugin-registered replacing inode 1 (first: %+v)", last, e)
	}

	_, before := r.Events(0)
	version := r.Version()
	r.SetHealth("a", inst(1), unhealthy("stale"))
	r.SetFingerprint("a", inst(1), fingerprint.Fingerprint{VendorName: "other"})
	if r.Deregister("a", inst(1), "stale") {
		t.Error("Deregister from the stale instance returned true")
	}
	if _, after := r.Events(0); after != before {
		t.Errorf("stale writes emitted %d events", after-before)
	}
	if r.Version() != version {
		t.Error("stale writes changed the registry version")
	}
	p, ok = r.Get("a")
	if !ok || p.Health.State != heartbeat.Unknown || p.Fingerprint.VendorName != "v" {
		t.Errorf("record changed by stale writes: %+v", p)
	}
	if !r.Deregister("a", inst(2), "socket removed") {
		t.Error("Deregister from the current instance returned false")
	}
	if _, ok := r.Get("a"); ok {
		t.Error("plugin still registered after Deregister")
	}
}

func TestRegistrySetHealthEmitsOnlyStateChanges(t *testing.T) {
	r := New(Config{})
	r.Register("a", inst(1), nil)
	steps := []struct {
		h         heartbeat.Result
		wantEvent plugin.EventType // "" for none
		wantBump  bool             // visible change (version bump)
	}{
		{h: healthy("healthy"), wantEvent: plugin.EventHealthy, wantBump: true},
		{h: healthy("healthy"), wantBump: false}, // only the probe time moved
		{h: unhealthy("plugin reports not ready"), wantEvent: plugin.EventUnhealthy, wantBump: true},
		{h: unhealthy("probe timed out after 1s"), wantBump: true}, // new description, same state
		{h: unhealthy("probe timed out after 1s"), wantBump: false},
		{h: healthy("healthy"), wantEvent: plugin.EventHealthy, wantBump: true},
	}
	var since time.Time
	for i, s := range steps {
		_, before := r.Events(0)
		v := r.Version()
		s.h.At = time.Unix(int64(i), 0)
		r.SetHealth("a", inst(1), s.h)
		evs, _ := r.Events(before)
		switch {
		case s.wantEvent == "" && len(evs) != 0:
			t.Errorf("step %d: events %+v, want none", i, evs)
		case s.wantEvent != "" && (len(evs) != 1 || evs[0].Type != s.wantEvent):
			t.Errorf("step %d: events %+v, want one %s", i, evs, s.wantEvent)
		}
		if bumped := r.Version() != v; bumped != s.wantBump {
			t.Errorf("step %d: version bumped = %v, want %v", i, bumped, s.wantBump)
		}
		if s.wantEvent != "" {
			since = s.h.At
		}
		p, _ := r.Get("a")
		if !p.Health.LastProbe.Equal(s.h.At) {
			t.Errorf("step %d: last probe not recorded", i)
		}
		if !p.Health.Since.Equal(since) {
			t.Errorf("step %d: since = %s, want %s: it moves only with the state", i, p.Health.Since, since)
		}
	}
}

func TestRegistryFingerprintChangeEvents(t *testing.T) {
	r := New(Config{})
	r.Register("a", inst(1), nil)
	fp := fingerprint.Fingerprint{VendorName: "v", VendorVersion: "1", Type: plugin.TypeNode}
	r.SetFingerprint("a", inst(1), fp) // first fingerprint: part of registration
	r.SetFingerprint("a", inst(1), fp) // same: nothing
	if got := eventsOf(r, "a"); !slices.Equal(got, []plugin.EventType{plugin.EventRegistered}) {
		t.Fatalf("events = %v, want only plugin-registered", got)
	}
	fp.VendorVersion = "2"
	r.SetFingerprint("a", inst(1), fp)
	e, ok := findEvent(r, "a", plugin.EventFingerprintChanged)
	if !ok || !strings.Contains(e.Description, "vendor_version") {
		t.Fatalf("fingerprint-changed event = %+v (found %v), want one naming vendor_version", e, ok)
	}
}

func TestRegistryReplacedInstanceFingerprintIsStale(t *testing.T) {
	// A replaced instance that did not answer its fingerprint yet (CI
	// under load: the new instance's fingerprint timed out) keeps the
	// old one's fingerprint for display, marked stale, so that Lookup
	// does not pair it with the new instance's connection.
	r := New(Config{})
	v1 := fingerprint.Fingerprint{VendorName: "v", VendorVersion: "1", Type: plugin.TypeNode}
	r.Register("a", inst(1), &v1)
	if p, _ := r.Get("a"); !p.FingerprintOfInstance() {
		t.Fatalf("first instance: %+v, want its fingerprint current", p)
	}
	r.Register("a", inst(2), nil)
	p, _ := r.Get("a")
	if p.FingerprintOfInstance() || !p.FingerprintStale || p.Fingerprint.VendorVersion != "1" {
		t.Fatalf("replaced instance before its fingerprint: %+v, want version 1's fingerprint, stale", p)
	}
	version := r.Version()
	r.SetFingerprint("a", inst(2), v1) // the same fingerprint: current again, no event
	if p, _ := r.Get("a"); !p.FingerprintOfInstance() || r.Version() == version {
		t.Fatalf("after the new instance's fingerprint: %+v (version moved: %v), want it current", p, r.Version() != version)
	}
	if _, ok := findEvent(r, "a", plugin.EventFingerprintChanged); ok {
		t.Error("an unchanged fingerprint of the new instance emitted fingerprint-changed")
	}
	r.Register("a", inst(3), nil)
	v2 := v1
	v2.VendorVersion = "2"
	r.SetFingerprint("a", inst(3), v2) // an upgrade
	if e, ok := findEvent(r, "a", plugin.EventFingerprintChanged); !ok || !strings.Contains(e.Description, "vendor_version") {
		t.Errorf("upgrade: fingerprint-changed event %+v (found %v), want one naming vendor_version", e, ok)
	}
	if p, _ := r.Get("a"); !p.FingerprintOfInstance() || p.Fingerprint.VendorVersion != "2" {
		t.Errorf("after the upgrade: %+v", p)
	}
}

func TestRegistrySubscriptionCoalesces(t *testing.T) {
	r := New(Config{})
	sub := r.Subscribe()
	defer sub.Close()

	// One notification is pending at once, for the initial state.
	select {
	case <-sub.C():
	default:
		t.Fatal("no initial notification")
	}
	changed := r.Changed()
	for i := range 10 {
		r.Register(fmt.Sprintf("p%d", i), inst(uint64(i)), nil)
	}
	select {
	case <-changed:
	default:
		t.Error("Changed channel not closed after a change")
	}
	// Ten changes while the subscriber was busy: exactly one notification.
	select {
	case <-sub.C():
	default:
		t.Fatal("no notification after changes")
	}
	select {
	case <-sub.C():
		t.Fatal("a second notification for changes already covered")
	default:
	}

	sub.Close()
	r.Register("late", inst(99), nil)
	select {
	case <-sub.C():
		t.Fatal("notification after Close")
	default:
	}
}

func TestRegistryRestoreIsQuietAndUnknown(t *testing.T) {
	r := New(Config{})
	r.Restore([]Plugin{
		{ID: "a", Instance: inst(1), Health: heartbeat.Health{State: heartbeat.Healthy, Description: "healthy"}, Fingerprinted: true},
		{ID: "b", Instance: inst(2), Health: heartbeat.Health{State: heartbeat.Unhealthy, Description: "down"}},
	})
	if evs, _ := r.Events(0); len(evs) != 0 {
		t.Errorf("Restore emitted events: %+v", evs)
	}
	for _, p := range r.List() {
		if p.Health.State != heartbeat.Unknown {
			t.Errorf("restored %s health = %s, want unknown", p.ID, p.Health.State)
		}
	}
	// The restored instance is current: its supervisor's writes count.
	r.SetHealth("a", inst(1), healthy("healthy"))
	if got := eventsOf(r, "a"); !slices.Equal(got, []plugin.EventType{plugin.EventHealthy}) {
		t.Errorf("events = %v, want [plugin-healthy]", got)
	}
}

func TestRegistrySetIgnoredOnlyChangesOnDifference(t *testing.T) {
	r := New(Config{})
	ign := []plugin.Ignored{{Path: "/p/x.sock", Reason: "not a unix socket (regular file)"}}
	r.SetIgnored(ign)
	v := r.Version()
	r.SetIgnored(slices.Clone(ign))
	if r.Version() != v {
		t.Error("setting the same ignored list bumped the version")
	}
	if got := r.Ignored(); !slices.Equal(got, ign) {
		t.Errorf("Ignored() = %v, want %v", got, ign)
	}
}
