package leader

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// watcherTerm is the raft term the watcher of these tests runs for.
const watcherTerm = 5

// newOrphanEnv is a watcher of term watcherTerm (none when term is nil)
// over one volume "v" with three claims taken but not mounted, each on
// its own ready node: on "old" taken in term 4, on "own" taken in the
// watcher's term, and on "legacy" stored before terms were recorded
// (leader_term 0). Finishing a claim is counted by node.
func newOrphanEnv(t *testing.T, term func() uint64, resumeTimeout time.Duration) graceEnv {
	now := timestamppb.Now()
	vol := &statepb.Volume{Id: "v", PluginId: "p", CreateIndex: 1, ModifyIndex: 4, Claims: []*statepb.VolumeClaim{
		{NodeId: "old", WorkloadId: "w1", State: rules.StateTaken, ClaimIndex: 2, LeaderTerm: watcherTerm - 1, StateUpdatedAt: now},
		{NodeId: "own", WorkloadId: "w2", State: rules.StateTaken, ClaimIndex: 3, LeaderTerm: watcherTerm, StateUpdatedAt: now},
		{NodeId: "legacy", WorkloadId: "w3", State: rules.StateTaken, ClaimIndex: 4, StateUpdatedAt: now},
	}}
	env := newLifecycleEnv(t, time.Hour, []*statepb.Volume{vol}, nil, noProgress, noProgress)
	env.write(func(txn *state.Txn) error {
		for _, id := range []string{"old", "own", "legacy"} {
			if err := txn.PutNode(&statepb.ClusterNode{Id: id, Status: state.NodeStatusReady, StatusUpdatedAt: now}); err != nil {
				return err
			}
		}
		return nil
	})
	env.w.cfg.ClaimResumeTimeout, env.w.cfg.Term = resumeTimeout, term
	env.w.cfg.Work = graceWork{env.w.cfg.Work.(*lifecycleWork)}
	return graceEnv{env}
}

// TestOrphanedClaimsAreFinishedAtOnce runs three passes of a watcher
// whose ClaimResumeTimeout is an hour or none, and checks which of the
// unfinished claims it finished: those taken in an earlier term at once,
// the one of its own term only once ClaimResumeTimeout has passed, and
// none early when the watcher knows no term.
func TestOrphanedClaimsAreFinishedAtOnce(t *testing.T) {
	term := func() uint64 { return watcherTerm }
	for _, tc := range []struct {
		name          string
		term          func() uint64
		resumeTimeout time.Duration
		want          map[string]bool // node -> its claim finished
	}{
		{"earlier terms within the resume timeout", term, time.Hour, map[string]bool{"old": true, "own": false, "legacy": true}},
		{"past the resume timeout", term, 0, map[string]bool{"old": true, "own": true, "legacy": true}},
		{"no term known", nil, time.Hour, map[string]bool{"old": false, "own": false, "legacy": false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := newOrphanEnv(t, tc.term, tc.resumeTimeout)
			env.run()
			env.waitPass(1)
			env.nextPass(1)
			env.nextPass(2)
			for node, want := range tc.want {
				if got := env.callsOf("finish/"+node) > 0; got != want {
					t.Errorf("after 3 passes: claim on node %s finished %v, want %v", node, got, want)
				}
			}
			env.checkErrors()
		})
	}
}

// TestOrphanedClaimWaitsForTheVolumeLock checks that the watcher leaves
// an orphaned claim alone while someone holds its volume's lock (a caller
// that claims again finishes it under that lock), and finishes it at the
// first pass after the lock is free.
func TestOrphanedClaimWaitsForTheVolumeLock(t *testing.T) {
	env := newOrphanEnv(t, func() uint64 { return watcherTerm }, time.Hour)
	unlock, ok := env.locks.TryLock("v")
	if !ok {
		t.Fatal("volume lock taken before the watcher runs")
	}
	env.run()
	env.waitPass(1)
	env.nextPass(1)
	if n := env.callsOf("finish/old"); n != 0 {
		t.Fatalf("orphaned claim finished %d times while its volume's lock was held", n)
	}
	unlock()
	env.nextPass(2)
	if n := env.callsOf("finish/old"); n == 0 {
		t.Fatal("orphaned claim not finished at the first pass after its volume's lock was freed")
	}
	env.checkErrors()
}
