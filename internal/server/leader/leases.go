package leader

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/state"
)

// ErrNotLeading is returned by Leases.Renew on a server that does not
// lead (any more): its lease table is empty, and the caller must ask the
// new leader.
var ErrNotLeading = errors.New("this server does not lead: its lease table is empty")

// LeaseConfig configures the lease table.
type LeaseConfig struct {
	// State returns the current replicated state. Required.
	State func() *state.Store
	// Work expires a lease through the volume operations. Required.
	Work LeaseWork
	// RetryInterval is the delay before an expiry is tried again after
	// it failed, or while it waits for the claim's node to come back.
	// Required.
	RetryInterval time.Duration
	// ExpireTimeout bounds one expiry: the wait for the volume's lock and
	// its raft write. Required.
	ExpireTimeout time.Duration
}

// LeaseWork is the volume work a lease expiry needs; the servers' volume
// operations implement it.
type LeaseWork interface {
	// ExpireLease starts the release of the claim of ref taken at
	// claimIndex, whose lease expired, with release_reason lease_expired,
	// and wakes the volume watcher to run its steps. It takes the volume's
	// lock itself. done is false when the expiry must be tried again later
	// (the claim's node is down: the claim is left to the claim gc grace
	// meanwhile); it is true once the claim is released, or is not taken
	// (any more), or is gone.
	ExpireLease(ctx context.Context, ref rules.Ref, claimIndex uint64) (done bool, err error)
}

// Renewal is one lease a renewal renewed.
type Renewal struct {
	Ref        rules.Ref
	ClaimIndex uint64
	TTL        time.Duration
	Deadline   time.Time
}

// Leases is the leader's table of claim leases: one in-memory timer per
// taken claim with a lease_ttl, in the style of the node heartbeats.
// Renewals reset timers and are never written to raft; only an expiry
// is, by LeaseWork.ExpireLease.
//
// At the start of each term (Initialize), and after a snapshot restore on
// the leader (Restored), the table is seeded from the replicated state:
// every taken claim with a lease gets a full TTL from that moment, since
// the renewals a previous leader saw were never replicated. A claim is
// added when the leader takes it (Add), and leaves the table when its
// lease expires, or when a renewal or the expiry finds it released or
// gone.
//
// A lease whose deadline has passed is expired, even before its timer
// ran: a renewal does not revive it, and its workload is reported lost.
//
// The table is indexed by node, then workload, so that a renewal, one
// call per node, touches only that node's leases; a renewal resets the
// timers in place and allocates only its answer.
type Leases struct {
	cfg    LeaseConfig
	logger hclog.Logger

	mu      sync.Mutex
	enabled bool
	// ctx is the current term's: an expiry under way ends with it.
	ctx context.Context
	// nodes holds the leases by node id, then by workload id.
	nodes map[string]map[string][]*lease
	count int
	// wg counts the expiries under way.
	wg sync.WaitGroup
}

// lease is one claim's lease. Its fields are guarded by Leases.mu.
type lease struct {
	ref        rules.Ref
	claimIndex uint64
	ttl        time.Duration
	renewed    time.Time
	deadline   time.Time
	// expiring is set while LeaseWork.ExpireLease runs for it.
	expiring bool
	t        *time.Timer
}

// NewLeases returns the lease table, disabled until Initialize.
func NewLeases(cfg LeaseConfig, logger hclog.Logger) *Leases {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Leases{cfg: cfg, logger: logger, nodes: map[string]map[string][]*lease{}}
}

// Initialize enables the table for the term ctx belongs to and seeds it
// from the replicated state: every taken claim with a lease gets a full
// TTL from now.
func (l *Leases) Initialize(ctx context.Context) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.enabled, l.ctx = true, ctx
	l.seedLocked("it became leader")
}

// Restored is called after the state was replaced by a snapshot. On the
// leader it seeds the table again from the restored state, with a full
// TTL for every lease; elsewhere it does nothing.
func (l *Leases) Restored() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.enabled {
		l.seedLocked("the snapshot restore")
	}
}

func (l *Leases) seedLocked(why string) {
	l.stopAllLocked()
	now := time.Now()
	for _, v := range l.cfg.State().Volumes("") {
		for _, c := range v.GetClaims() {
			if ttl := c.GetLeaseTtl().AsDuration(); c.GetState() == rules.StateTaken && ttl > 0 {
				l.addLocked(rules.RefOf(v.GetId(), c), c.GetClaimIndex(), ttl, now)
			}
		}
	}
	l.logger.Debug("claim leases initialized", "after", why, "leases", l.count)
}

// Clear stops every timer and empties the table; called when leadership
// is lost.
func (l *Leases) Clear() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.enabled = false
	l.stopAllLocked()
}

// Stop clears the table and waits for the expiries under way.
func (l *Leases) Stop() {
	l.Clear()
	l.wg.Wait()
}

func (l *Leases) stopAllLocked() {
	for _, byWorkload := range l.nodes {
		for _, ls := range byWorkload {
			for _, e := range ls {
				e.t.Stop()
			}
		}
	}
	clear(l.nodes)
	l.count = 0
}

// Count returns the number of leases held.
func (l *Leases) Count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.count
}

// Add gives the claim of ref taken at claimIndex a lease of ttl from
// now, or renews it when the table holds it already: the leader calls it
// once it took the claim, and when a caller claims it again. It does
// nothing on a server that does not lead, or for a ttl of 0 (no lease).
func (l *Leases) Add(ref rules.Ref, claimIndex uint64, ttl time.Duration) {
	if ttl <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.enabled {
		return
	}
	now := time.Now()
	if e := l.findLocked(ref, claimIndex); e != nil {
		if !e.expiring && now.Before(e.deadline) {
			e.renewLocked(now)
		}
		return
	}
	l.addLocked(ref, claimIndex, ttl, now)
}

func (l *Leases) addLocked(ref rules.Ref, claimIndex uint64, ttl time.Duration, now time.Time) {
	e := &lease{ref: ref, claimIndex: claimIndex, ttl: ttl, renewed: now, deadline: now.Add(ttl)}
	e.t = time.AfterFunc(ttl, func() { l.fire(e) })
	byWorkload := l.nodes[ref.NodeID]
	if byWorkload == nil {
		byWorkload = map[string][]*lease{}
		l.nodes[ref.NodeID] = byWorkload
	}
	byWorkload[ref.WorkloadID] = append(byWorkload[ref.WorkloadID], e)
	l.count++
}

func (l *Leases) findLocked(ref rules.Ref, claimIndex uint64) *lease {
	for _, e := range l.nodes[ref.NodeID][ref.WorkloadID] {
		if e.ref == ref && e.claimIndex == claimIndex {
			return e
		}
	}
	return nil
}

func (l *Leases) removeLocked(e *lease) {
	e.t.Stop()
	byWorkload := l.nodes[e.ref.NodeID]
	ls := slices.DeleteFunc(byWorkload[e.ref.WorkloadID], func(x *lease) bool { return x == e })
	switch {
	case len(ls) > 0:
		byWorkload[e.ref.WorkloadID] = ls
	case len(byWorkload) > 1:
		delete(byWorkload, e.ref.WorkloadID)
	default:
		delete(l.nodes, e.ref.NodeID)
	}
	l.count--
}

// renewLocked gives the lease a full TTL from now. The timer is reset in
// place: a renewal allocates nothing.
func (e *lease) renewLocked(now time.Time) {
	e.renewed, e.deadline = now, now.Add(e.ttl)
	e.t.Reset(e.ttl)
}

// Times returns when the lease of the claim of ref taken at claimIndex
// was last renewed and when it expires, for the claims the leader
// answers with; ok is false when this server does not lead or holds no
// lease of the claim.
func (l *Leases) Times(ref rules.Ref, claimIndex uint64) (renewed, deadline time.Time, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.enabled {
		return time.Time{}, time.Time{}, false
	}
	e := l.findLocked(ref, claimIndex)
	if e == nil {
		return time.Time{}, time.Time{}, false
	}
	return e.renewed, e.deadline, true
}

// Renew renews, on node nodeID, every live lease of the listed
// workloads: each gets a full TTL from now. It returns the leases
// renewed, and the workloads that hold no claim on the node any more:
// none is taken, or each taken one has a lease that expired. A workload
// whose claims on the node are all without a lease is neither renewed
// nor lost. A lease the table holds for a claim that was released or is
// gone meanwhile leaves the table. It never writes to raft.
func (l *Leases) Renew(nodeID string, workloads []string) ([]Renewal, []string, error) {
	st := l.cfg.State()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.enabled {
		return nil, nil, ErrNotLeading
	}
	now := time.Now()
	var renewed []Renewal
	// unknown holds the workloads the table cannot answer for alone.
	var unknown []string
	byWorkload := l.nodes[nodeID]
	for _, w := range workloads {
		n := len(renewed)
		var stale []*lease
		for _, e := range byWorkload[w] {
			if !stillTaken(st, e.ref, e.claimIndex) {
				stale = append(stale, e)
				continue
			}
			if e.expiring || !now.Before(e.deadline) {
				continue
			}
			e.renewLocked(now)
			renewed = append(renewed, Renewal{Ref: e.ref, ClaimIndex: e.claimIndex, TTL: e.ttl, Deadline: e.deadline})
		}
		// Removed after the loop: removeLocked changes the slice.
		for _, e := range stale {
			l.removeLocked(e)
		}
		if len(renewed) == n {
			unknown = append(unknown, w)
		}
	}
	if len(unknown) == 0 {
		return renewed, nil, nil
	}
	// Rare: a workload lost its claims, or holds only claims without a
	// lease. Only then are the node's claims read from the state.
	held := map[string]bool{}
	for _, v := range st.Volumes("") {
		for _, c := range v.GetClaims() {
			if c.GetNodeId() != nodeID || c.GetState() != rules.StateTaken || !slices.Contains(unknown, c.GetWorkloadId()) {
				continue
			}
			ttl := c.GetLeaseTtl().AsDuration()
			if ttl <= 0 {
				held[c.GetWorkloadId()] = true
				continue
			}
			ref := rules.RefOf(v.GetId(), c)
			if l.findLocked(ref, c.GetClaimIndex()) == nil {
				// A leased claim the table missed (taken while this
				// server took over): it gets a full TTL, as at a term's
				// start.
				l.addLocked(ref, c.GetClaimIndex(), ttl, now)
				e := l.findLocked(ref, c.GetClaimIndex())
				renewed = append(renewed, Renewal{Ref: ref, ClaimIndex: e.claimIndex, TTL: e.ttl, Deadline: e.deadline})
				held[c.GetWorkloadId()] = true
			}
		}
	}
	var lost []string
	for _, w := range unknown {
		if !held[w] {
			lost = append(lost, w)
		}
	}
	return renewed, lost, nil
}

// stillTaken reports whether the claim of ref taken at claimIndex is
// stored taken.
func stillTaken(st *state.Store, ref rules.Ref, claimIndex uint64) bool {
	v := st.Volume(ref.VolumeID)
	if v == nil {
		return false
	}
	_, c := rules.Find(v, ref.NodeID, ref.WorkloadID)
	return c != nil && c.GetClaimIndex() == claimIndex && c.GetState() == rules.StateTaken
}

// fire runs when a lease's timer ends. A lease renewed after its timer
// was due is armed again for the rest of its TTL; an expired one is
// expired through LeaseWork, outside the table's lock, and tried again
// after RetryInterval when that fails or must wait.
func (l *Leases) fire(e *lease) {
	l.mu.Lock()
	if !l.enabled || e.expiring || l.findLocked(e.ref, e.claimIndex) != e {
		l.mu.Unlock()
		return
	}
	if d := time.Until(e.deadline); d > 0 {
		e.t.Reset(d)
		l.mu.Unlock()
		return
	}
	e.expiring = true
	// Added under the lock while enabled, so that Stop, which disables
	// first, waits for it.
	l.wg.Add(1)
	ctx := l.ctx
	l.mu.Unlock()
	defer l.wg.Done()

	log := l.logger.With("volume", e.ref.VolumeID, "node", e.ref.NodeID, "workload", e.ref.WorkloadID, "claim_index", e.claimIndex)
	log.Info("volume claim lease expired; releasing the claim", "lease_ttl", e.ttl, "renewed_at", e.renewed)
	ectx, cancel := context.WithTimeout(ctx, l.cfg.ExpireTimeout)
	done, err := l.cfg.Work.ExpireLease(ectx, e.ref, e.claimIndex)
	cancel()

	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.enabled || l.findLocked(e.ref, e.claimIndex) != e {
		return
	}
	if done && err == nil {
		l.removeLocked(e)
		return
	}
	if err != nil {
		log.Warn("expire volume claim lease failed; retrying", "retry_in", l.cfg.RetryInterval, "error", err)
	}
	// Still expired: a renewal does not revive it.
	e.expiring = false
	e.t.Reset(l.cfg.RetryInterval)
}
