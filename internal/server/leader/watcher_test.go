package leader

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/csisupd/csisupd/internal/keylock"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
	"github.com/csisupd/csisupd/internal/testutil"
)

// sentinel is a snapshot that always needs work and whose step always
// succeeds; its id sorts after every other, and snapshots come after
// expansions in a pass, so its calls count the passes that are through.
const sentinel = "~sentinel"

const waitTimeout = 10 * time.Second

// lifecycleEnv runs a watcher over a state store with fake lifecycle
// hooks that count their calls.
type lifecycleEnv struct {
	t     *testing.T
	st    *state.Store
	locks *keylock.Set
	w     *Watcher

	mu     sync.Mutex
	calls  map[string]int // "expand/<id>" or "follow/<id>"
	errors []string       // what the hooks found wrong
}

// hook is the behaviour of a fake hook on its call-th call (from 1).
type hook func(env *lifecycleEnv, id string, call int) error

// finishes completes the work in the state and succeeds.
func finishes(env *lifecycleEnv, id string, _ int) error {
	env.complete(id)
	return nil
}

// fails always fails.
func fails(*lifecycleEnv, string, int) error { return errors.New("plugin unavailable") }

// noProgress succeeds without finishing: the work stays.
func noProgress(*lifecycleEnv, string, int) error { return nil }

func newLifecycleEnv(t *testing.T, interval time.Duration, vols []*statepb.Volume, snaps []*statepb.VolumeSnapshot, expand, follow hook) *lifecycleEnv {
	st, err := state.New()
	if err != nil {
		t.Fatal(err)
	}
	env := &lifecycleEnv{t: t, st: st, locks: &keylock.Set{}, calls: map[string]int{}}
	env.write(func(txn *state.Txn) error {
		for _, v := range vols {
			if err := txn.PutVolume(proto.Clone(v).(*statepb.Volume)); err != nil {
				return err
			}
		}
		for _, s := range append(slices.Clone(snaps), &statepb.VolumeSnapshot{Id: sentinel, State: rules.SnapshotCreating}) {
			if err := txn.PutVolumeSnapshot(proto.Clone(s).(*statepb.VolumeSnapshot)); err != nil {
				return err
			}
		}
		return nil
	})
	env.w = NewWatcher(WatcherConfig{
		Interval:           interval,
		MaxBackoff:         4 * interval,
		ClaimGCGrace:       time.Hour,
		ClaimResumeTimeout: time.Hour,
		State:              func() *state.Store { return st },
		Locks:              env.locks,
		Work:               &lifecycleWork{env: env, expand: expand, follow: follow},
	}, nil)
	return env
}

// lifecycleWork is the watcher's volume work in a lifecycleEnv: its
// claim steps are never due (the env holds no claims), and its lifecycle
// steps count their calls and act as their hooks say.
type lifecycleWork struct {
	env            *lifecycleEnv
	expand, follow hook
}

func (w *lifecycleWork) noClaims(what string) {
	w.env.mu.Lock()
	w.env.errors = append(w.env.errors, what+" called without claims")
	w.env.mu.Unlock()
}

func (w *lifecycleWork) ReleaseWithoutNode(rules.Ref) (*statepb.VolumeClaim, error) {
	w.noClaims("ReleaseWithoutNode")
	return nil, errors.New("no claims")
}

func (w *lifecycleWork) StartRelease(rules.Ref) (*statepb.VolumeClaim, error) {
	w.noClaims("StartRelease")
	return nil, errors.New("no claims")
}

func (w *lifecycleWork) Release(context.Context, rules.Ref) error { w.noClaims("Release"); return nil }

func (w *lifecycleWork) Finish(context.Context, rules.Ref) error { w.noClaims("Finish"); return nil }

func (w *lifecycleWork) ResumeExpansion(ctx context.Context, id string) error {
	env := w.env
	// The watcher holds the volume's lock for the call.
	if unlock, ok := env.locks.TryLock(id); ok {
		unlock()
		env.mu.Lock()
		env.errors = append(env.errors, "ResumeExpansion of "+id+" called without the volume's lock")
		env.mu.Unlock()
	}
	return w.expand(env, id, env.count("expand/"+id))
}

func (w *lifecycleWork) FollowSnapshot(ctx context.Context, id string) error {
	n := w.env.count("follow/" + id)
	if id == sentinel {
		return nil
	}
	return w.follow(w.env, id, n)
}

// DeleteEphemeral counts its calls and deletes the volume from the
// state, as the volume operations do once the plugin deleted it.
func (w *lifecycleWork) DeleteEphemeral(ctx context.Context, id string) error {
	env := w.env
	env.count("ephemeral/" + id)
	env.write(func(txn *state.Txn) error {
		if v := txn.Volume(id); v != nil {
			return txn.DeleteVolume(v)
		}
		return nil
	})
	return nil
}

// run runs the watcher until the test ends.
func (env *lifecycleEnv) run() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		env.w.Run(ctx)
	}()
	env.t.Cleanup(func() {
		cancel()
		<-done
	})
}

func (env *lifecycleEnv) count(key string) int {
	env.mu.Lock()
	defer env.mu.Unlock()
	env.calls[key]++
	return env.calls[key]
}

func (env *lifecycleEnv) callsOf(key string) int {
	env.mu.Lock()
	defer env.mu.Unlock()
	return env.calls[key]
}

func (env *lifecycleEnv) write(fn func(txn *state.Txn) error) {
	txn := env.st.Write()
	defer txn.Abort()
	if err := fn(txn); err != nil {
		env.t.Error(err)
		return
	}
	txn.Commit()
}

// complete finishes the work on id: a volume's expansion ends, a
// snapshot becomes created and ready to use.
func (env *lifecycleEnv) complete(id string) {
	env.write(func(txn *state.Txn) error {
		if v := txn.Volume(id); v != nil {
			nv := proto.Clone(v).(*statepb.Volume)
			nv.CapacityBytes, nv.Expansion = v.GetExpansion().GetCapacityBytes(), nil
			return txn.PutVolume(nv)
		}
		if s := txn.VolumeSnapshot(id); s != nil {
			ns := proto.Clone(s).(*statepb.VolumeSnapshot)
			ns.State, ns.ReadyToUse = rules.SnapshotCreated, true
			return txn.PutVolumeSnapshot(ns)
		}
		return fmt.Errorf("nothing named %q", id)
	})
}

// waitPass waits until pass number n (from 1) is through its lifecycle
// work.
func (env *lifecycleEnv) waitPass(n int) {
	env.t.Helper()
	testutil.WaitFor(env.t, waitTimeout, fmt.Sprintf("watcher pass %d", n), func() bool {
		return env.callsOf("follow/"+sentinel) >= n
	})
}

// nextPass kicks the watcher after pass n and waits for pass n+1. A kick
// given once pass n reached the sentinel is taken by the loop's wait
// after that pass: it starts exactly one more.
func (env *lifecycleEnv) nextPass(n int) {
	env.t.Helper()
	env.w.Kick()
	env.waitPass(n + 1)
}

func (env *lifecycleEnv) checkErrors() {
	env.t.Helper()
	env.mu.Lock()
	defer env.mu.Unlock()
	for _, e := range env.errors {
		env.t.Error(e)
	}
}

func expandingVolume(id string) *statepb.Volume {
	return &statepb.Volume{Id: id, PluginId: "p", CapacityBytes: 10, CreateIndex: 1, ModifyIndex: 2,
		Expansion: &statepb.VolumeExpansion{CapacityBytes: 40, State: rules.ExpansionController}}
}

func snapshotIn(id, st string, ready bool) *statepb.VolumeSnapshot {
	return &statepb.VolumeSnapshot{Id: id, PluginId: "p", SourceVolumeId: "v", State: st, ReadyToUse: ready, CreateIndex: 3, ModifyIndex: 3}
}

// TestWatcherLifecycle runs passes of the watcher, each started by a kick
// (the interval is too long to start one), and counts the hooks' calls
// after each pass.
func TestWatcherLifecycle(t *testing.T) {
	tests := []struct {
		name   string
		vols   []*statepb.Volume
		snaps  []*statepb.VolumeSnapshot
		expand hook
		follow hook
		// lockedPasses are the passes during which someone else holds
		// volume v's lock.
		lockedPasses int
		// want are the calls of each hook after each pass: key ->
		// cumulative calls after pass 1, 2, ...
		want map[string][]int
	}{
		{
			name:   "an expansion under way is resumed until it is done",
			vols:   []*statepb.Volume{expandingVolume("v"), {Id: "idle", PluginId: "p", CapacityBytes: 10}},
			expand: finishes, follow: noProgress,
			want: map[string][]int{"expand/v": {1, 1, 1}, "expand/idle": {0, 0, 0}},
		},
		{
			name:   "an expansion that makes no progress is resumed every pass",
			vols:   []*statepb.Volume{expandingVolume("v")},
			expand: noProgress, follow: noProgress,
			want: map[string][]int{"expand/v": {1, 2, 3}},
		},
		{
			name: "a failed expansion backs off",
			vols: []*statepb.Volume{expandingVolume("v"), expandingVolume("w")},
			expand: func(env *lifecycleEnv, id string, call int) error {
				if id == "v" {
					return fails(env, id, call)
				}
				return noProgress(env, id, call)
			},
			follow: noProgress,
			want:   map[string][]int{"expand/v": {1, 1, 1}, "expand/w": {1, 2, 3}},
		},
		{
			name:   "a volume locked by someone else is skipped until it is free",
			vols:   []*statepb.Volume{expandingVolume("v"), expandingVolume("w")},
			expand: finishes, follow: noProgress,
			lockedPasses: 2,
			want:         map[string][]int{"expand/v": {0, 0, 1, 1}, "expand/w": {1, 1, 1, 1}},
		},
		{
			name: "snapshots that need work are followed until done",
			snaps: []*statepb.VolumeSnapshot{
				snapshotIn("creating", rules.SnapshotCreating, false),
				snapshotIn("not-ready", rules.SnapshotCreated, false),
				snapshotIn("deleting", rules.SnapshotDeleting, false),
				snapshotIn("ready", rules.SnapshotCreated, true),
			},
			expand: noProgress,
			follow: func(env *lifecycleEnv, id string, call int) error {
				if id == "deleting" {
					return noProgress(env, id, call)
				}
				if call < 2 {
					return nil // not ready yet
				}
				return finishes(env, id, call)
			},
			want: map[string][]int{
				"follow/creating":  {1, 2, 2},
				"follow/not-ready": {1, 2, 2},
				"follow/deleting":  {1, 2, 3},
				"follow/ready":     {0, 0, 0},
			},
		},
		{
			name:   "a failed snapshot step backs off, the others go on",
			snaps:  []*statepb.VolumeSnapshot{snapshotIn("bad", rules.SnapshotCreating, false), snapshotIn("good", rules.SnapshotCreating, false)},
			expand: noProgress,
			follow: func(env *lifecycleEnv, id string, call int) error {
				if id == "bad" {
					return fails(env, id, call)
				}
				return noProgress(env, id, call)
			},
			want: map[string][]int{"follow/bad": {1, 1, 1}, "follow/good": {1, 2, 3}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newLifecycleEnv(t, time.Hour, tt.vols, tt.snaps, tt.expand, tt.follow)
			var unlock func()
			if tt.lockedPasses > 0 {
				var ok bool
				if unlock, ok = env.locks.TryLock("v"); !ok {
					t.Fatal("lock of v taken")
				}
				defer func() {
					if unlock != nil {
						unlock()
					}
				}()
			}
			passes := 0
			for _, counts := range tt.want {
				passes = max(passes, len(counts))
			}
			env.run()
			for pass := 1; pass <= passes; pass++ {
				if pass == 1 {
					env.waitPass(1)
				} else {
					if pass == tt.lockedPasses+1 && unlock != nil {
						unlock()
						unlock = nil
					}
					env.nextPass(pass - 1)
				}
				for key, counts := range tt.want {
					if got := env.callsOf(key); got != counts[pass-1] {
						t.Errorf("after pass %d: %s called %d times, want %d", pass, key, got, counts[pass-1])
					}
				}
			}
			env.checkErrors()
		})
	}
}

// TestWatcherLifecycleRetriesAfterBackoff: with a short interval, a
// failed step is tried again once its backoff has passed, and the work
// is finished.
func TestWatcherLifecycleRetriesAfterBackoff(t *testing.T) {
	tests := []struct {
		name  string
		vols  []*statepb.Volume
		snaps []*statepb.VolumeSnapshot
		key   string
		done  func(st *state.Store) bool
	}{
		{"expansion", []*statepb.Volume{expandingVolume("v")}, nil, "expand/v",
			func(st *state.Store) bool { return st.Volume("v").GetExpansion() == nil }},
		{"snapshot", nil, []*statepb.VolumeSnapshot{snapshotIn("s", rules.SnapshotCreating, false)}, "follow/s",
			func(st *state.Store) bool { return !rules.SnapshotNeedsWork(st.VolumeSnapshot("s")) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			failTwice := func(env *lifecycleEnv, id string, call int) error {
				if call <= 2 {
					return fails(env, id, call)
				}
				return finishes(env, id, call)
			}
			env := newLifecycleEnv(t, 20*time.Millisecond, tt.vols, tt.snaps, failTwice, failTwice)
			env.run()
			testutil.WaitFor(t, waitTimeout, "the work done after two failures", func() bool {
				return env.callsOf(tt.key) >= 3 && tt.done(env.st)
			})
			// Done: later passes leave it alone.
			n := env.callsOf("follow/" + sentinel)
			env.waitPass(n + 2)
			if got := env.callsOf(tt.key); got != 3 {
				t.Fatalf("%s called %d times, want 3", tt.key, got)
			}
			env.checkErrors()
		})
	}
}

// TestGracePeriodsCountFromWhatTheWatcherSaw: a node whose replicated
// status time says it went down two hours ago, and a claim left
// unfinished two hours ago by the same times (as a leader whose clock ran
// ahead would write them), are left alone for the whole grace and resume
// timeout of an hour, counted from when this watcher first saw them so;
// with no grace, they are released and finished within a few passes.
func TestGracePeriodsCountFromWhatTheWatcherSaw(t *testing.T) {
	longAgo := timestamppb.New(time.Now().Add(-2 * time.Hour))
	for _, tc := range []struct {
		name  string
		grace time.Duration
		want  bool
	}{
		{"within an hour's grace", time.Hour, false},
		{"without grace", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := newGraceEnv(t, longAgo, tc.grace)
			env.run()
			gone, finished := env.afterPasses()
			if gone != tc.want || finished != tc.want {
				t.Errorf("after 3 passes: claim released without its node %v, unfinished claim finished %v; want %v for both", gone, finished, tc.want)
			}
		})
	}
}

// graceEnv is a watcher with two claims: one mounted on node "gone",
// which is down, and one unfinished on node "up"; the claim and status
// times are at. Releasing without the node and finishing are counted.
type graceEnv struct{ *lifecycleEnv }

func newGraceEnv(t *testing.T, at *timestamppb.Timestamp, grace time.Duration) graceEnv {
	vol := &statepb.Volume{Id: "v", PluginId: "p", CreateIndex: 1, ModifyIndex: 2, Claims: []*statepb.VolumeClaim{
		{NodeId: "gone", WorkloadId: "w1", State: rules.StateTaken, Mounted: true, ClaimIndex: 1, StateUpdatedAt: at},
		{NodeId: "up", WorkloadId: "w2", State: rules.StateTaken, ClaimIndex: 2, StateUpdatedAt: at},
	}}
	env := newLifecycleEnv(t, time.Hour, []*statepb.Volume{vol}, nil, noProgress, noProgress)
	env.write(func(txn *state.Txn) error {
		for _, n := range []*statepb.ClusterNode{
			{Id: "gone", Status: state.NodeStatusDown, StatusUpdatedAt: at},
			{Id: "up", Status: state.NodeStatusReady, StatusUpdatedAt: at},
		} {
			if err := txn.PutNode(n); err != nil {
				return err
			}
		}
		return nil
	})
	env.w.cfg.ClaimGCGrace, env.w.cfg.ClaimResumeTimeout = grace, grace
	env.w.cfg.Work = graceWork{env.w.cfg.Work.(*lifecycleWork)}
	return graceEnv{env}
}

// graceWork counts the releases without a node and the finished claims.
type graceWork struct{ *lifecycleWork }

func (w graceWork) ReleaseWithoutNode(ref rules.Ref) (*statepb.VolumeClaim, error) {
	w.env.count("gone/" + ref.NodeID)
	return &statepb.VolumeClaim{NodeId: ref.NodeID, WorkloadId: ref.WorkloadID, State: rules.StateTaken}, nil
}

func (w graceWork) Finish(_ context.Context, ref rules.Ref) error {
	w.env.count("finish/" + ref.NodeID)
	return nil
}

// afterPasses waits for three passes and reports whether the claim on
// the down node was released without it and the unfinished one finished.
func (env graceEnv) afterPasses() (gone, finished bool) {
	env.waitPass(1)
	env.nextPass(1)
	env.nextPass(2)
	return env.callsOf("gone/gone") > 0, env.callsOf("finish/up") > 0
}

// TestWatcherDeletesEphemeralVolumes checks that a pass deletes an
// ephemeral volume left without claims, once, and leaves a volume that is
// not ephemeral alone. A pass deletes after its snapshot work, so the
// calls of pass n are counted once pass n+1 has run.
func TestWatcherDeletesEphemeralVolumes(t *testing.T) {
	env := newLifecycleEnv(t, time.Hour, []*statepb.Volume{
		{Id: "scratch", PluginId: "p", Ephemeral: true, CreateIndex: 1, ModifyIndex: 5},
		{Id: "kept", PluginId: "p", CreateIndex: 2, ModifyIndex: 2},
	}, nil, noProgress, noProgress)
	env.run()
	env.waitPass(1)
	env.nextPass(1)
	env.nextPass(2)
	if got := env.callsOf("ephemeral/scratch"); got != 1 {
		t.Errorf("DeleteEphemeral of the ephemeral volume called %d times in 3 passes, want 1 (it is gone after the first)", got)
	}
	if got := env.callsOf("ephemeral/kept"); got != 0 {
		t.Errorf("DeleteEphemeral of a volume that is not ephemeral called %d times, want 0", got)
	}
	if env.st.Volume("kept") == nil {
		t.Error("the volume that is not ephemeral is gone")
	}
	env.checkErrors()
}
