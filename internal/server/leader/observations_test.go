package leader

import (
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// TestObservationsOutliveATerm checks what a watcher that lost its term
// and won it again keeps counting: the same unfinished claim, and the
// same down spell of a node; not a node that came back and went down
// again meanwhile, nor what is no longer there.
func TestObservationsOutliveATerm(t *testing.T) {
	t0 := time.Now()
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	spell1 := timestamppb.New(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	spell2 := timestamppb.New(time.Date(2026, 1, 1, 0, 5, 0, 0, time.UTC))
	down := func(ts *timestamppb.Timestamp) *statepb.ClusterNode {
		return &statepb.ClusterNode{Id: "n1", Status: state.NodeStatusDown, StatusUpdatedAt: ts}
	}
	ready := &statepb.ClusterNode{Id: "n1", Status: state.NodeStatusReady, StatusUpdatedAt: spell2}

	o := newObservations()
	// First term: n1 down, claim c unfinished.
	o.nodes([]*statepb.ClusterNode{down(spell1)}, at(0))
	o.claim("c", true, at(0))
	o.claim("finished", false, at(0))
	// The term ends; a minute later the same server leads again and sees
	// both unchanged.
	o.nodes([]*statepb.ClusterNode{down(spell1)}, at(time.Minute))
	o.claim("c", true, at(time.Minute))
	if got := o.downFor(down(spell1), at(90*time.Second)); got != 90*time.Second {
		t.Errorf("down spell counted %s, want 1m30s from the first term", got)
	}
	if got, ok := o.unfinishedFor("c", at(90*time.Second)); !ok || got != 90*time.Second {
		t.Errorf("unfinished claim counted %s (%v), want 1m30s from the first term", got, ok)
	}
	if _, ok := o.unfinishedFor("finished", at(90*time.Second)); ok {
		t.Error("a finished claim was counted as unfinished")
	}

	// The node came back and went down again: a new spell, counted anew.
	o.nodes([]*statepb.ClusterNode{down(spell2)}, at(2*time.Minute))
	if got := o.downFor(down(spell2), at(2*time.Minute+time.Second)); got != time.Second {
		t.Errorf("a new down spell counted %s, want 1s", got)
	}
	if got := o.downFor(down(spell1), at(2*time.Minute)); got != 0 {
		t.Errorf("the ended spell still counts %s", got)
	}
	// Up: nothing counts.
	o.nodes([]*statepb.ClusterNode{ready}, at(3*time.Minute))
	if got := o.downFor(ready, at(3*time.Minute)); got != 0 {
		t.Errorf("a ready node counted down for %s", got)
	}
	if got := o.downFor(nil, at(3*time.Minute)); got != 0 {
		t.Errorf("an unknown node counted down for %s", got)
	}
	// A claim gone from the state is forgotten.
	o.keepClaims(map[string]bool{})
	if _, ok := o.unfinishedFor("c", at(3*time.Minute)); ok {
		t.Error("a claim no longer in the state is still counted")
	}
}

// TestFollowerObservationsCount checks that what a server saw as a
// follower counts when it takes over: an unfinished claim and a down node
// it observed an hour ago are due at its first passes as leader, with
// an hour's grace; without those observations they are not.
func TestFollowerObservationsCount(t *testing.T) {
	for _, tc := range []struct {
		name     string
		observed bool
	}{
		{"observed as a follower an hour ago", true},
		{"never observed before", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := newGraceEnv(t, timestamppb.Now(), 30*time.Minute)
			if tc.observed {
				env.w.Observe(time.Now().Add(-time.Hour))
			}
			env.run()
			gone, finished := env.afterPasses()
			if gone != tc.observed || finished != tc.observed {
				t.Errorf("after 3 passes: released without its node %v, unfinished claim finished %v; want %v for both", gone, finished, tc.observed)
			}
		})
	}
}
