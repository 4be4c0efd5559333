package nemesis

import (
	"slices"
	"testing"
	"time"
)

// TestSchedule checks that a seed gives one schedule, that another seed
// gives another, and the schedule's own rules: every kind drawn over a
// long run, no two faults on one target at once, bounded durations.
func TestSchedule(t *testing.T) {
	servers, agents := []string{"s1", "s2", "s3"}, []string{"a1", "a2", "a3"}
	a := Schedule(42, 10*time.Minute, servers, agents, nil)
	b := Schedule(42, 10*time.Minute, servers, agents, nil)
	if !slices.Equal(a, b) {
		t.Fatal("one seed gave two schedules")
	}
	if c := Schedule(43, 10*time.Minute, servers, agents, nil); slices.Equal(a, c) {
		t.Fatal("two seeds gave one schedule")
	}
	kinds := map[string]bool{}
	busy := map[string]time.Duration{}
	for _, f := range a {
		kinds[f.Kind] = true
		if f.For < 0 || f.For > maxFault {
			t.Errorf("%s: duration out of [0, %s]", f, maxFault)
		}
		for _, k := range targetsOf(f, servers) {
			if busy[k] > f.At {
				t.Errorf("%s: %s is busy until +%s", f, k, busy[k])
			}
			busy[k] = f.At + f.For
		}
	}
	for _, k := range faultKinds {
		if !kinds[k] {
			t.Errorf("10 minutes drew no %s", k)
		}
	}
	only := Schedule(42, 10*time.Minute, servers, agents, []string{faultKillAgent})
	for _, f := range only {
		if f.Kind != faultKillAgent || !slices.Contains(agents, f.Target) {
			t.Errorf("kill-agent only: %s", f)
		}
	}
	if len(only) == 0 {
		t.Error("kill-agent only: no fault")
	}

	sizes := map[[2]int]bool{}
	for seed := range int64(100) {
		s, a := ClusterSize(seed)
		if (s != 3 && s != 5) || a < 3 || a > 5 {
			t.Fatalf("seed %d: %d servers and %d agents", seed, s, a)
		}
		sizes[[2]int{s, a}] = true
	}
	if len(sizes) != 6 {
		t.Errorf("100 seeds drew %d of the 6 cluster sizes", len(sizes))
	}
}
