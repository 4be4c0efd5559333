package nemesis

import (
	"fmt"
	"slices"
	"time"
)

// The lease invariant: no leased claim outlives its lease by more than
// its TTL plus one release bound while its node is up. A leader change
// legitimately extends a lease (the new leader gives every lease a full
// TTL from its takeover), and a node that is down or cut off delays its
// release (it is handled as a down node's claim), so the check is made
// only where it is exact: during the run, in windows in which no fault
// happened at all, and after the final heal, one election bound later.
// It lives outside the nemesis build tag so that its own tests run with
// every `go test`, like the claim model.

// checkLease names the lease invariant's violations.
const checkLease = "Lease"

// Bounds of the lease invariant.
const (
	// releaseBound is how long after a lease's deadline the leader may
	// take to start its release (the claim no longer taken): its lease
	// timer's pass and one raft write on a loaded machine (race-built
	// processes on two cores), the volume's lock held by a step of
	// another claim, and after the heal an agent restarted then that
	// registers again before its node counts as up.
	releaseBound = 10 * time.Second
	// electionBound is how long after the final heal the leadership may
	// still change hands (a continued or reconnected leader steps down,
	// and elections may take a few rounds under load); a new leader
	// gives every lease a full TTL from its takeover.
	electionBound = 10 * time.Second
)

// Lease is one leased claim of the lease workload, as its client saw it.
type Lease struct {
	Volume   string
	Node     string // the plugin's node id: the agent's host name
	Workload string // unique to the claim
	TTL      time.Duration
	// Claimed is when its ClaimVolume returned, with ClaimOutcome; a
	// claim whose outcome is unknown may exist or not.
	Claimed      time.Time
	ClaimOutcome string
	// LastRenewal is when the last renewal attempt of it returned, ok or
	// not (a failed attempt may have renewed it), or Claimed when none
	// was made: the latest the leader can have given it a full TTL from.
	LastRenewal time.Time
	// LastRenewed is when the last acknowledged renewal returned (zero:
	// none), for the report.
	LastRenewed time.Time
	// Abandoned tells that the client stopped renewing it without an
	// acknowledged release: by choice, because a renewal said it was
	// lost, because its release failed, or because the workload ended.
	Abandoned bool
	// Released tells that its release was acknowledged.
	Released bool
}

// deadline is the latest time its lease can expire when no leader
// changed since its last renewal.
func (l Lease) deadline() time.Time { return l.LastRenewal.Add(l.TTL) }

func (l Lease) String() string {
	s := fmt.Sprintf("claim of %s on %s by %s (lease %s; claim %s at %s", l.Volume, l.Node, l.Workload, l.TTL,
		l.ClaimOutcome, l.Claimed.Format(timeFormat))
	if !l.LastRenewed.IsZero() {
		s += ", last renewed " + l.LastRenewed.Format(timeFormat)
	}
	return s + ", last renewal attempt " + l.LastRenewal.Format(timeFormat) + ")"
}

const timeFormat = "15:04:05.000"

// LeaseRead is one read of a lease volume's claims.
type LeaseRead struct {
	Volume       string
	Call, Return time.Time
	// States are the claims' states by workload.
	States map[string]string
}

// Span is a time in which a fault was applied, in effect or undone.
type Span struct {
	From, To time.Time
	What     string
}

// faultAt returns the first fault of spans that overlaps [from, to].
func faultAt(spans []Span, from, to time.Time) (Span, bool) {
	for _, s := range spans {
		if !s.From.After(to) && !s.To.Before(from) {
			return s, true
		}
	}
	return Span{}, false
}

// CheckLeasesDuringRun returns a violation for each abandoned lease that
// a read saw still taken although it began later than the lease's
// deadline plus releaseBound, when no fault overlaps the window from the
// lease's last renewal minus its TTL to that read's return: a leader
// change or a node's absence in that window could have delayed its
// expiry legitimately. quiet is how many reads after a deadline fell in
// such windows: how often the check could look at all.
func CheckLeasesDuringRun(leases []Lease, reads []LeaseRead, faults []Span) (violations []string, quiet int) {
	reads = slices.Clone(reads)
	slices.SortFunc(reads, func(a, b LeaseRead) int { return a.Call.Compare(b.Call) })
	for _, l := range leases {
		if !l.Abandoned {
			continue
		}
		late := l.deadline().Add(releaseBound)
		from := l.LastRenewal.Add(-l.TTL)
		for _, r := range reads {
			if r.Volume != l.Volume || !r.Call.After(late) {
				continue
			}
			if _, ok := faultAt(faults, from, r.Return); ok {
				break // every later window holds that fault too
			}
			quiet++
			if st := r.States[l.Workload]; st == claimTaken {
				violations = append(violations, fmt.Sprintf("%s: %s still %s in a read at [%s .. %s], %s after its deadline %s, with no fault from %s on",
					checkLease, l, st, r.Call.Format(timeFormat), r.Return.Format(timeFormat), r.Call.Sub(l.deadline()).Round(time.Millisecond),
					l.deadline().Format(timeFormat), from.Format(timeFormat)))
				break
			}
		}
	}
	return violations, quiet
}

// CheckLeasesAfterHeal returns a violation for each lease not released
// that no read after heal saw gone or releasing, when a read saw it still
// taken although it began later than heal plus electionBound, the lease's
// TTL and releaseBound: after the final heal no fault delays an expiry,
// and a leader change that the heal itself causes extends a lease by at
// most one full TTL from its takeover. A lease that no read after heal
// saw gone and whose volume was never read after that bound is a
// violation too: the check could not be made. (A claim seen gone or
// releasing is never taken again: its workload claims nothing else.)
func CheckLeasesAfterHeal(leases []Lease, reads []LeaseRead, heal time.Time) []string {
	var out []string
	for _, l := range leases {
		if l.Released {
			continue
		}
		late := heal.Add(electionBound + l.TTL + releaseBound)
		var taken *LeaseRead
		gone := false
		for _, r := range reads {
			if r.Volume != l.Volume || !r.Call.After(heal) {
				continue
			}
			if r.States[l.Workload] != claimTaken {
				gone = true
				break
			}
			if taken == nil && r.Call.After(late) {
				taken = &r
			}
		}
		switch {
		case gone:
		case taken != nil:
			out = append(out, fmt.Sprintf("%s: %s still %s in a read at [%s .. %s], %s after the final heal at %s",
				checkLease, l, claimTaken, taken.Call.Format(timeFormat), taken.Return.Format(timeFormat),
				taken.Call.Sub(heal).Round(time.Millisecond), heal.Format(timeFormat)))
		default:
			out = append(out, fmt.Sprintf("%s: %s: no read of %s after the final heal at %s saw it gone, and none began after %s",
				checkLease, l, l.Volume, heal.Format(timeFormat), late.Format(timeFormat)))
		}
	}
	return out
}

// claimTaken is the state of a claim that is held and not being released.
const claimTaken = "taken"
