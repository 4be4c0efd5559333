package registry

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// These tests drive reconcile with explicit times, so grace periods are
// exact and nothing waits for them. The sockets do not exist: supervisors
// register their plugin unhealthy, which is all the reconciler needs.

func newTestReconciler(t *testing.T, grace time.Duration) (*reconciler, *Registry, context.Context) {
	t.Helper()
	reg := New(Config{})
	r := newReconciler(reconcilerConfig{Registry: reg, Grace: grace, Timing: fastTiming, Logger: testLogger(t)})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		r.stopAll()
	})
	return r, reg, ctx
}

func supervisorOf(r *reconciler, id string) *supervisor {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sups[id]
}

func checkNext(t *testing.T, step string, gotNext time.Duration, gotOK bool, want time.Duration) {
	t.Helper()
	if want < 0 {
		if gotOK {
			t.Errorf("%s: a grace period is pending (%s), want none", step, gotNext)
		}
		return
	}
	if !gotOK || gotNext != want {
		t.Errorf("%s: next deadline in %s (pending %v), want %s", step, gotNext, gotOK, want)
	}
}

func TestReconcilerGracePeriod(t *testing.T) {
	const grace = 10 * time.Second
	r, reg, ctx := newTestReconciler(t, grace)
	dir := testutil.TempDir(t)
	a := SocketID{Path: filepath.Join(dir, "a.sock"), Inode: 1, Mtime: 1}
	t0 := time.Now()

	next, ok := r.reconcile(ctx, map[string]SocketID{"a": a}, t0)
	checkNext(t, "socket present", next, ok, -1)
	s := supervisorOf(r, "a")
	if s == nil || s.inst != a {
		t.Fatalf("supervisor = %v, want one for %v", s, a)
	}
	testutil.WaitFor(t, 10*time.Second, "plugin a registered", func() bool { _, ok := reg.Get("a"); return ok })

	next, ok = r.reconcile(ctx, map[string]SocketID{}, t0)
	checkNext(t, "socket removed", next, ok, grace)
	next, ok = r.reconcile(ctx, map[string]SocketID{}, t0.Add(4*time.Second))
	checkNext(t, "4s later", next, ok, 6*time.Second)
	if supervisorOf(r, "a") != s {
		t.Error("supervisor replaced during the grace period")
	}

	// Back within the grace: the same instance keeps its supervisor.
	next, ok = r.reconcile(ctx, map[string]SocketID{"a": a}, t0.Add(5*time.Second))
	checkNext(t, "socket back", next, ok, -1)
	if supervisorOf(r, "a") != s {
		t.Error("supervisor replaced when the same socket came back")
	}

	// Gone again: the grace starts over.
	next, ok = r.reconcile(ctx, map[string]SocketID{}, t0.Add(6*time.Second))
	checkNext(t, "removed again", next, ok, grace)
	next, ok = r.reconcile(ctx, map[string]SocketID{}, t0.Add(6*time.Second+grace-time.Nanosecond))
	checkNext(t, "just before the deadline", next, ok, time.Nanosecond)
	if _, found := findEvent(reg, "a", EventDeregistered); found {
		t.Fatal("deregistered before the grace period ended")
	}

	next, ok = r.reconcile(ctx, map[string]SocketID{}, t0.Add(6*time.Second+grace))
	checkNext(t, "deadline", next, ok, -1)
	if _, found := reg.Get("a"); found {
		t.Error("plugin a still registered after the grace period")
	}
	e, found := findEvent(reg, "a", EventDeregistered)
	if want := "socket " + a.Path + " removed 10s ago"; !found || e.Description != want {
		t.Errorf("deregistered event = %+v, want description %q", e, want)
	}
	if supervisorOf(r, "a") != nil {
		t.Error("supervisor still running after deregistration")
	}
	select {
	case <-s.done:
	default:
		t.Error("deregistered plugin's supervisor was not stopped")
	}
}

func TestReconcilerRestartsOnNewSocketIdentity(t *testing.T) {
	r, reg, ctx := newTestReconciler(t, time.Minute)
	path := filepath.Join(testutil.TempDir(t), "a.sock")
	old := SocketID{Path: path, Inode: 1, Mtime: 1}
	// Same inode number, later mtime: a re-created socket reusing the inode.
	renewed := SocketID{Path: path, Inode: 1, Mtime: 2}
	t0 := time.Now()

	r.reconcile(ctx, map[string]SocketID{"a": old}, t0)
	s1 := supervisorOf(r, "a")
	testutil.WaitFor(t, 10*time.Second, "plugin a registered", func() bool { _, ok := reg.Get("a"); return ok })

	next, ok := r.reconcile(ctx, map[string]SocketID{"a": renewed}, t0)
	checkNext(t, "replaced", next, ok, -1)
	s2 := supervisorOf(r, "a")
	if s2 == nil || s2 == s1 || s2.inst != renewed {
		t.Fatalf("supervisor after replacement = %+v, want a new one for %v", s2, renewed)
	}
	select {
	case <-s1.done:
	default:
		t.Error("old supervisor still running")
	}
	testutil.WaitFor(t, 10*time.Second, "record of the new instance", func() bool {
		p, _ := reg.Get("a")
		return p.Instance == renewed
	})
	want := []EventType{EventRegistered, EventUnhealthy, EventRegistered}
	if got := eventsOf(reg, "a"); len(got) < 3 || !slices.Equal(got[:3], want) {
		t.Errorf("events = %v, want them to start with %v", got, want)
	}
	if _, found := findEvent(reg, "a", EventDeregistered); found {
		t.Error("a replaced socket deregistered its plugin")
	}
}

func TestReconcilerDeregistersRestoredWithoutSocket(t *testing.T) {
	const grace = 3 * time.Second
	r, reg, ctx := newTestReconciler(t, grace)
	dir := testutil.TempDir(t)
	present := SocketID{Path: filepath.Join(dir, "present.sock"), Inode: 1}
	missing := SocketID{Path: filepath.Join(dir, "missing.sock"), Inode: 2}
	reg.Restore([]Plugin{{ID: "present", Instance: present}, {ID: "missing", Instance: missing}})
	t0 := time.Now()

	next, ok := r.reconcile(ctx, map[string]SocketID{"present": present}, t0)
	checkNext(t, "start-up", next, ok, grace)
	if supervisorOf(r, "missing") != nil {
		t.Error("a supervisor for a socket that does not exist")
	}
	next, ok = r.reconcile(ctx, map[string]SocketID{"present": present}, t0.Add(grace))
	checkNext(t, "after the grace", next, ok, -1)

	if _, found := reg.Get("missing"); found {
		t.Error("restored plugin without a socket still registered")
	}
	e, _ := findEvent(reg, "missing", EventDeregistered)
	if !strings.Contains(e.Description, missing.Path) || !strings.Contains(e.Description, "after restart") {
		t.Errorf("deregistered event description = %q", e.Description)
	}
	if p, found := reg.Get("present"); !found || p.Instance != present {
		t.Errorf("restored plugin with its socket = %+v (found %v)", p, found)
	}
	if got := eventsOf(reg, "present"); slices.Contains(got, EventRegistered) || slices.Contains(got, EventDeregistered) {
		t.Errorf("restored plugin with its socket got events %v", got)
	}
}

func TestReconcilerZeroGraceDeregistersAtOnce(t *testing.T) {
	r, reg, ctx := newTestReconciler(t, 0)
	a := SocketID{Path: filepath.Join(testutil.TempDir(t), "a.sock"), Inode: 1}
	t0 := time.Now()
	r.reconcile(ctx, map[string]SocketID{"a": a}, t0)
	testutil.WaitFor(t, 10*time.Second, "plugin a registered", func() bool { _, ok := reg.Get("a"); return ok })
	next, ok := r.reconcile(ctx, map[string]SocketID{}, t0)
	checkNext(t, "removed", next, ok, -1)
	if _, found := reg.Get("a"); found {
		t.Error("plugin a still registered with a zero grace")
	}
}
