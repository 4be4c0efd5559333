package nemesis

import (
	"strings"
	"testing"
	"time"
)

// TestLeaseCheckDuringRun checks that the lease check catches an
// abandoned lease still taken after its deadline in a window without
// faults, and only there: a fault in the window, a lease still renewed or
// released, a read before the bound, or a claim already releasing pass.
func TestLeaseCheckDuringRun(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	lease := func(mut ...func(*Lease)) Lease {
		l := Lease{Volume: "lease-1", Node: "a1", Workload: "l1", TTL: 5 * time.Second, ClaimOutcome: outOK,
			Claimed: at(10), LastRenewal: at(20), LastRenewed: at(20), Abandoned: true}
		for _, m := range mut {
			m(&l)
		}
		return l
	}
	read := func(s float64, state string) LeaseRead {
		r := LeaseRead{Volume: "lease-1", Call: at(s), Return: at(s + 0.1), States: map[string]string{}}
		if state != "" {
			r.States["l1"] = state
		}
		return r
	}
	// The deadline is 25 s, the bound 25 s + releaseBound.
	late := 25 + releaseBound.Seconds()
	tests := []struct {
		name      string
		lease     Lease
		reads     []LeaseRead
		faults    []Span
		violation bool
		quiet     int
	}{
		{"taken past the bound, no fault", lease(), []LeaseRead{read(late+1, claimTaken)}, nil, true, 1},
		{"released past the bound", lease(), []LeaseRead{read(late+1, "")}, nil, false, 1},
		{"releasing past the bound", lease(), []LeaseRead{read(late+1, "unpublishing")}, nil, false, 1},
		{"taken before the bound", lease(), []LeaseRead{read(late-1, claimTaken)}, nil, false, 0},
		{"a fault in the window", lease(), []LeaseRead{read(late+1, claimTaken)},
			[]Span{{From: at(22), To: at(24), What: "kill s1"}}, false, 0},
		{"a fault since before the renewal minus the TTL, undone in the window", lease(), []LeaseRead{read(late+1, claimTaken)},
			[]Span{{From: at(1), To: at(16), What: "stop s2"}}, false, 0},
		{"a fault before the renewal minus the TTL", lease(), []LeaseRead{read(late+1, claimTaken)},
			[]Span{{From: at(1), To: at(14), What: "stop s2"}}, true, 1},
		{"a fault after the read", lease(), []LeaseRead{read(late+1, claimTaken)},
			[]Span{{From: at(late + 2), To: at(late + 3), What: "cut a1"}}, true, 1},
		{"a later read after a fault", lease(), []LeaseRead{read(late+1, ""), read(late+5, claimTaken)},
			[]Span{{From: at(late + 2), To: at(late + 3), What: "cut a1"}}, false, 1},
		{"still renewed", lease(func(l *Lease) { l.Abandoned = false }), []LeaseRead{read(late+1, claimTaken)}, nil, false, 0},
		{"another volume", lease(func(l *Lease) { l.Volume = "lease-2" }), []LeaseRead{read(late+1, claimTaken)}, nil, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, quiet := CheckLeasesDuringRun([]Lease{tt.lease}, tt.reads, tt.faults)
			if (len(got) > 0) != tt.violation {
				t.Fatalf("violations %q, want one: %v", got, tt.violation)
			}
			if quiet != tt.quiet {
				t.Errorf("quiet reads = %d, want %d", quiet, tt.quiet)
			}
			for _, v := range got {
				if !strings.HasPrefix(v, checkLease+": ") || !strings.Contains(v, "lease-1 on a1 by l1") {
					t.Errorf("violation does not name its check and claim: %q", v)
				}
			}
		})
	}
}

// TestLeaseCheckAfterHeal checks the bound after the final heal: an
// election, a full TTL and the release bound, for every lease not
// released; and that no read after it is itself a violation.
func TestLeaseCheckAfterHeal(t *testing.T) {
	heal := time.Date(2026, 1, 1, 0, 1, 0, 0, time.UTC)
	l := Lease{Volume: "lease-1", Node: "a2", Workload: "l7", TTL: 8 * time.Second, ClaimOutcome: outUnknown,
		Claimed: heal.Add(-30 * time.Second), LastRenewal: heal.Add(-20 * time.Second), Abandoned: true}
	bound := heal.Add(electionBound + l.TTL + releaseBound)
	read := func(call time.Time, state string) LeaseRead {
		r := LeaseRead{Volume: "lease-1", Call: call, Return: call.Add(50 * time.Millisecond), States: map[string]string{}}
		if state != "" {
			r.States["l7"] = state
		}
		return r
	}
	released := l
	released.Released, released.Abandoned = true, false
	tests := []struct {
		name  string
		lease Lease
		reads []LeaseRead
		want  string // in the violation; "" none
	}{
		{"gone after the bound", l, []LeaseRead{read(bound.Add(-time.Second), claimTaken), read(bound.Add(time.Second), "")}, ""},
		{"releasing after the bound", l, []LeaseRead{read(bound.Add(time.Second), "node-unpublished")}, ""},
		{"taken after the bound", l, []LeaseRead{read(bound.Add(time.Second), claimTaken)}, "still taken"},
		{"gone before the bound", l, []LeaseRead{read(bound.Add(-time.Second), "")}, ""},
		{"gone before the heal only", l, []LeaseRead{read(heal.Add(-time.Second), "")}, "no read of lease-1"},
		{"taken, no read after the bound", l, []LeaseRead{read(bound.Add(-time.Second), claimTaken)}, "no read of lease-1"},
		{"released by its client", released, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := CheckLeasesAfterHeal([]Lease{tt.lease}, tt.reads, heal)
			if tt.want == "" {
				if len(got) > 0 {
					t.Fatalf("violations %q, want none", got)
				}
				return
			}
			if len(got) != 1 || !strings.Contains(got[0], tt.want) || !strings.Contains(got[0], "lease-1 on a2 by l7") {
				t.Fatalf("violations %q, want one naming the claim and %q", got, tt.want)
			}
		})
	}
}
