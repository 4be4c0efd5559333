package registry

import (
	"context"
	"github.com/csisupd/csisupd/internal/plugin"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/testutil"
)

// These tests drive reconcile with explicit times, so grace periods are
// exact and nothing waits for them. The sockets do not exist: supervisors
// register their plugin unhealthy, which is all the reconciler needs.

func newTestReconciler(t *testing.T, grace time.Duration) (*reconciler, *Registry, context.Context) {
	t.Helper()
	reg := New(Config{})
	r := newReconciler(reconcilerConfig{Registry: reg, Grace: grace, Timing: fastTiming, StopTimeout: 200 * time.Millisecond, Logger: testLogger(t),
		Redial: testRetry.PluginRedial, FingerprintRetry: testRetry.Fingerprint})
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
	a := plugin.Instance{Path: filepath.Join(dir, "a.sock"), Inode: 1, Mtime: 1}
	t0 := time.Now()

	next, ok := r.reconcile(ctx, map[string]plugin.Instance{"a": a}, t0)
	checkNext(t, "socket present", next, ok, -1)
	s := supervisorOf(r, "a")
	if s == nil || s.inst != a {
		t.Fatalf("supervisor = %v, want one for %v", s, a)
	}
	testutil.WaitFor(t, 10*time.Second, "plugin a registered", func() bool { _, ok := reg.Get("a"); return ok })

	next, ok = r.reconcile(ctx, map[string]plugin.Instance{}, t0)
	checkNext(t, "socket removed", next, ok, grace)
	next, ok = r.reconcile(ctx, map[string]plugin.Instance{}, t0.Add(4*time.Second))
	checkNext(t, "4s later", next, ok, 6*time.Second)
	if supervisorOf(r, "a") != s {
		t.Error("supervisor replaced during the grace period")
	}

	// Back within the grace: the same instance keeps its supervisor.
	next, ok = r.reconcile(ctx, map[string]plugin.Instance{"a": a}, t0.Add(5*time.Second))
	checkNext(t, "socket back", next, ok, -1)
	if supervisorOf(r, "a") != s {
		t.Error("supervisor replaced when the same socket came back")
	}

	// Gone again: the grace starts over.
	next, ok = r.reconcile(ctx, map[string]plugin.Instance{}, t0.Add(6*time.Second))
	checkNext(t, "removed again", next, ok, grace)
	next, ok = r.reconcile(ctx, map[string]plugin.Instance{}, t0.Add(6*time.Second+grace-time.Nanosecond))
	checkNext(t, "just before the deadline", next, ok, time.Nanosecond)
	if _, found := findEvent(reg, "a", plugin.EventDeregistered); found {
		t.Fatal("deregistered before the grace period ended")
	}

	next, ok = r.reconcile(ctx, map[string]plugin.Instance{}, t0.Add(6*time.Second+grace))
	checkNext(t, "deadline", next, ok, -1)
	if _, found := reg.Get("a"); found {
		t.Error("plugin a still registered after the grace period")
	}
	e, found := findEvent(reg, "a", plugin.EventDeregistered)
	if want := "socket " + a.Path + " removed 10s ago"; !found || e.Description != want {
		t.Errorf("deregistered event = %+v, want description %q", e, want)
	}
	if supervisorOf(r, "a") != nil {
		t.Error("supervisor still running after deregistration")
	}
	// Stopped in the background, not by reconcile itself.
	testutil.WaitFor(t, 10*time.Second, "the deregistered plugin's supervisor stopped", func() bool { return isClosed(s.done) })
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func TestReconcilerRestartsOnNewSocketIdentity(t *testing.T) {
	r, reg, ctx := newTestReconciler(t, time.Minute)
	path := filepath.Join(testutil.TempDir(t), "a.sock")
	old := plugin.Instance{Path: path, Inode: 1, Mtime: 1}
	// Same inode number, later mtime: a re-created socket reusing the inode.
	renewed := plugin.Instance{Path: path, Inode: 1, Mtime: 2}
	t0 := time.Now()

	r.reconcile(ctx, map[string]plugin.Instance{"a": old}, t0)
	s1 := supervisorOf(r, "a")
	testutil.WaitFor(t, 10*time.Second, "plugin a registered", func() bool { _, ok := reg.Get("a"); return ok })

	next, ok := r.reconcile(ctx, map[string]plugin.Instance{"a": renewed}, t0)
	checkNext(t, "replaced", next, ok, -1)
	s2 := supervisorOf(r, "a")
	if s2 == nil || s2 == s1 || s2.inst != renewed {
		t.Fatalf("supervisor after replacement = %+v, want a new one for %v", s2, renewed)
	}
	testutil.WaitFor(t, 10*time.Second, "old supervisor stopped", func() bool { return isClosed(s1.done) })
	testutil.WaitFor(t, 10*time.Second, "record of the new instance", func() bool {
		p, _ := reg.Get("a")
		return p.Instance == renewed
	})
	want := []plugin.EventType{plugin.EventRegistered, plugin.EventUnhealthy, plugin.EventRegistered}
	if got := eventsOf(reg, "a"); len(got) < 3 || !slices.Equal(got[:3], want) {
		t.Errorf("events = %v, want them to start with %v", got, want)
	}
	if _, found := findEvent(reg, "a", plugin.EventDeregistered); found {
		t.Error("a replaced socket deregistered its plugin")
	}
}

func TestReconcilerDeregistersRestoredWithoutSocket(t *testing.T) {
	const grace = 3 * time.Second
	r, reg, ctx := newTestReconciler(t, grace)
	dir := testutil.TempDir(t)
	present := plugin.Instance{Path: filepath.Join(dir, "present.sock"), Inode: 1}
	missing := plugin.Instance{Path: filepath.Join(dir, "missing.sock"), Inode: 2}
	reg.Restore([]Plugin{{ID: "present", Instance: present}, {ID: "missing", Instance: missing}})
	t0 := time.Now()

	next, ok := r.reconcile(ctx, map[string]plugin.Instance{"present": present}, t0)
	checkNext(t, "start-up", next, ok, grace)
	if supervisorOf(r, "missing") != nil {
		t.Error("a supervisor for a socket that does not exist")
	}
	next, ok = r.reconcile(ctx, map[string]plugin.Instance{"present": present}, t0.Add(grace))
	checkNext(t, "after the grace", next, ok, -1)

	if _, found := reg.Get("missing"); found {
		t.Error("restored plugin without a socket still registered")
	}
	e, _ := findEvent(reg, "missing", plugin.EventDeregistered)
	if !strings.Contains(e.Description, missing.Path) || !strings.Contains(e.Description, "after restart") {
		t.Errorf("deregistered event description = %q", e.Description)
	}
	if p, found := reg.Get("present"); !found || p.Instance != present {
		t.Errorf("restored plugin with its socket = %+v (found %v)", p, found)
	}
	if got := eventsOf(reg, "present"); slices.Contains(got, plugin.EventRegistered) || slices.Contains(got, plugin.EventDeregistered) {
		t.Errorf("restored plugin with its socket got events %v", got)
	}
}

func TestReconcilerZeroGraceDeregistersAtOnce(t *testing.T) {
	r, reg, ctx := newTestReconciler(t, 0)
	a := plugin.Instance{Path: filepath.Join(testutil.TempDir(t), "a.sock"), Inode: 1}
	t0 := time.Now()
	r.reconcile(ctx, map[string]plugin.Instance{"a": a}, t0)
	testutil.WaitFor(t, 10*time.Second, "plugin a registered", func() bool { _, ok := reg.Get("a"); return ok })
	next, ok := r.reconcile(ctx, map[string]plugin.Instance{}, t0)
	checkNext(t, "removed", next, ok, -1)
	if _, found := reg.Get("a"); found {
		t.Error("plugin a still registered with a zero grace")
	}
}

// hangStop makes the stop of plugin id's supervisor hang, as closing a
// connection whose writer is stuck on a plugin that does not read does,
// until the returned release is called (also at the end of the test). It
// returns the supervisor. The hook is set under the reconciler's lock,
// which the reconciler takes before it stops a supervisor.
func hangStop(t *testing.T, r *reconciler, id string) (*supervisor, func()) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sups[id]
	if s == nil {
		t.Fatalf("no supervisor for %s", id)
	}
	release := make(chan struct{})
	var once sync.Once
	closeConn := s.closeConn
	s.closeConn = func() error {
		<-release
		return closeConn()
	}
	releaseFn := func() {
		once.Do(func() { close(release) })
		s.beginStop() // when the test failed before stopping it
		// Let the abandoned supervisor finish before goleak looks.
		testutil.WaitFor(t, 10*time.Second, "the released supervisor stopped", func() bool {
			return isClosed(s.done) && isClosed(s.closed)
		})
	}
	t.Cleanup(releaseFn)
	return s, releaseFn
}

// reconcileWithin runs one reconcile and fails the test unless it returns
// within bound: the reconciler must never wait for a plugin.
func reconcileWithin(t *testing.T, r *reconciler, ctx context.Context, bound time.Duration, desired map[string]plugin.Instance, now time.Time) {
	t.Helper()
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		r.reconcile(ctx, desired, now)
	}()
	select {
	case <-done:
		t.Logf("reconcile took %s", time.Since(start))
	case <-time.After(bound):
		t.Fatalf("reconcile did not return within %s: it waits for a stuck supervisor", bound)
	}
}

func TestReconcilerNeverWaitsForAStuckSupervisor(t *testing.T) {
	tests := []struct {
		name string
		// next is the desired state after the stuck supervisor's socket
		// changed, and when.
		next func(dir string) map[string]plugin.Instance
		at   time.Duration
		// wantInstance is a's record afterwards, or nil for none.
		wantInstance func(next map[string]plugin.Instance) *plugin.Instance
	}{
		{
			name: "socket replaced",
			next: func(dir string) map[string]plugin.Instance {
				return map[string]plugin.Instance{
					"a": {Path: filepath.Join(dir, "a.sock"), Inode: 1, Mtime: 2},
					"b": {Path: filepath.Join(dir, "b.sock"), Inode: 3},
				}
			},
			wantInstance: func(next map[string]plugin.Instance) *plugin.Instance { si := next["a"]; return &si },
		},
		{
			name: "socket removed past the grace period",
			next: func(dir string) map[string]plugin.Instance {
				return map[string]plugin.Instance{"b": {Path: filepath.Join(dir, "b.sock"), Inode: 3}}
			},
			at:           time.Second, // the grace
			wantInstance: func(map[string]plugin.Instance) *plugin.Instance { return nil },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, reg, ctx := newTestReconciler(t, time.Second)
			dir := testutil.TempDir(t)
			old := plugin.Instance{Path: filepath.Join(dir, "a.sock"), Inode: 1, Mtime: 1}
			t0 := time.Now()
			r.reconcile(ctx, map[string]plugin.Instance{"a": old}, t0)
			testutil.WaitFor(t, 10*time.Second, "plugin a registered", func() bool { _, ok := reg.Get("a"); return ok })
			stuck, release := hangStop(t, r, "a")

			next := tt.next(dir)
			if tt.at > 0 {
				// The grace period starts, then ends.
				reconcileWithin(t, r, ctx, time.Second, next, t0)
			}
			reconcileWithin(t, r, ctx, time.Second, next, t0.Add(tt.at))

			// Whatever happened to a, b is supervised at once.
			if s := supervisorOf(r, "b"); s == nil {
				t.Error("plugin b has no supervisor")
			}
			testutil.WaitFor(t, 10*time.Second, "plugin b registered", func() bool { _, ok := reg.Get("b"); return ok })
			want := tt.wantInstance(next)
			checkRecord := func(when string) {
				t.Helper()
				p, ok := reg.Get("a")
				switch {
				case want == nil && ok:
					t.Errorf("%s: record of a = %+v, want none", when, p.Instance)
				case want != nil && (!ok || p.Instance != *want):
					t.Errorf("%s: record of a = %+v (found %v), want instance %+v", when, p.Instance, ok, *want)
				}
			}
			if want != nil {
				testutil.WaitFor(t, 10*time.Second, "the new instance's record", func() bool {
					p, ok := reg.Get("a")
					return ok && p.Instance == *want
				})
				if s := supervisorOf(r, "a"); s == nil || s == stuck || s.inst != *want {
					t.Errorf("supervisor of a = %+v, want a new one for %+v", s, *want)
				}
			}
			checkRecord("after the change")

			testutil.WaitFor(t, 10*time.Second, "the stuck supervisor abandoned", func() bool { return r.abandonedCount() == 1 })

			// The stuck instance is fenced: nothing it would still write
			// reaches the registry, not even a registration, which would
			// otherwise take the record over.
			version := r.reg.Version()
			if stuck.write(func() { reg.Register("a", old, nil) }) {
				t.Error("a stopping supervisor could still write to the registry")
			}
			stuck.write(func() { reg.SetHealth("a", old, heartbeat.Result{State: heartbeat.Unhealthy, Description: "stale"}) })
			if v := reg.Version(); v != version {
				t.Errorf("the stuck supervisor changed the registry %d times", v-version)
			}
			checkRecord("after the stuck instance's writes")

			release()
			if got := r.abandonedCount(); got != 1 {
				t.Errorf("abandoned = %d, want 1", got)
			}
		})
	}
}

func TestReconcilerStopAllIsBounded(t *testing.T) {
	const stopTimeout = 200 * time.Millisecond
	r, reg, ctx := newTestReconciler(t, time.Minute)
	dir := testutil.TempDir(t)
	desired := map[string]plugin.Instance{
		"stuck": {Path: filepath.Join(dir, "stuck.sock"), Inode: 1},
		"fine":  {Path: filepath.Join(dir, "fine.sock"), Inode: 2},
	}
	r.reconcile(ctx, desired, time.Now())
	for id := range desired {
		testutil.WaitFor(t, 10*time.Second, id+" registered", func() bool { _, ok := reg.Get(id); return ok })
	}
	stuck, release := hangStop(t, r, "stuck")
	fine := supervisorOf(r, "fine")

	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.stopAll()
	}()
	select {
	case <-done:
	case <-time.After(stopTimeout + slack):
		release() // lets stopAll, and the test, end
		t.Fatalf("stopAll did not return within %s while a supervisor hangs", stopTimeout+slack)
	}
	took := time.Since(start)
	t.Logf("stopAll took %s with a hanging supervisor (StopTimeout %s)", took, stopTimeout)
	if took < stopTimeout {
		t.Errorf("stopAll returned after %s, before the stop timeout: it did not wait for the hanging supervisor", took)
	}
	if got := r.abandonedCount(); got != 1 {
		t.Errorf("abandoned = %d, want 1 (the hanging one)", got)
	}
	if !isClosed(fine.done) || !isClosed(fine.closed) {
		t.Error("the well-behaved supervisor had not stopped when stopAll returned")
	}
	// Cancelled at once, though its connection does not close.
	testutil.WaitFor(t, 10*time.Second, "the hanging supervisor's goroutine returned", func() bool { return isClosed(stuck.done) })
}
