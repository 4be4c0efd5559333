//go:build nemesis

package nemesis

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Settings of the lease workload.
const (
	// leaseVolumes are the volumes only the lease client claims: its
	// claims vanish without a release when their leases expire, which
	// the claim model of the schedulers' volumes would take for lost.
	leaseVolumes = 2
	// leasesHeld is how many leased claims the client holds at once.
	leasesHeld = 4
	// leaseOwner is the owner of its claims.
	leaseOwner = "nemesis"
	// Leases last 5 to 10 s: long enough to be renewed a few times
	// through faults, short enough to expire many times in a run.
	minLeaseTTL, maxLeaseTTL = 5 * time.Second, 10 * time.Second
	// renewTimeout bounds one RenewClaims: well under a third of a TTL,
	// so that a server that does not answer costs a renewal, not the
	// lease (the next attempt goes to another server).
	renewTimeout = 2 * time.Second
	// leaseCallTimeout bounds a leased claim or release, so that one
	// stuck call does not stop the renewals of the other leases for
	// longer than a TTL.
	leaseCallTimeout = 5 * time.Second
	// leaseReadEvery is how often the lease volumes' claims are read.
	leaseReadEvery = time.Second
)

// leaseModes are the lease volumes' access modes: every claim of any
// node may hold them at once, so that the lease client is never refused
// by the access rules.
var leaseModes = []string{"MULTI_NODE_MULTI_WRITER"}

// held is a lease the client still renews.
type held struct {
	*Lease
	until   time.Time // when the client stops renewing it
	release bool      // then release it, else abandon it
}

// Leases is the lease workload: one client that claims the lease
// volumes with leases and an owner, renews them through RenewClaims on
// random servers for a while, then releases or abandons them; and a
// reader of the lease volumes' claims, for the lease check.
type Leases struct {
	w       *Workload
	volumes []string

	mu     sync.Mutex
	leases []*Lease
	reads  []LeaseRead
}

// newLeases creates the lease volumes on the shared plugin.
func newLeases(ctx context.Context, w *Workload) (*Leases, error) {
	l := &Leases{w: w}
	rng := rand.New(rand.NewPCG(uint64(w.seed), 11))
	for i := 1; i <= leaseVolumes; i++ {
		id := fmt.Sprintf("lease-%d", i)
		req := &csisupdv1.VolumeCreateRequest{Id: id, PluginId: sharedPlugin, CapacityMinBytes: volumeBytes}
		for _, m := range leaseModes {
			req.Capabilities = append(req.Capabilities, &csisupdv1.VolumeCapability{AccessType: "mount", AccessMode: m})
		}
		err := w.c.waitFor(formTimeout, "volume "+id+" created", func() (bool, error) {
			_, err := w.call(ctx, rng, func(ctx context.Context, cl csisupdv1.ControlClient) error {
				_, err := cl.CreateVolume(ctx, req)
				return err
			})
			return err == nil || status.Code(err) == codes.AlreadyExists, err
		})
		if err != nil {
			return nil, err
		}
		l.volumes = append(l.volumes, id)
	}
	return l, nil
}

// Leases returns every leased claim the client made, as it stands.
func (l *Leases) Leases() []Lease {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Lease, len(l.leases))
	for i, e := range l.leases {
		out[i] = *e
	}
	return out
}

// Reads returns the reads of the lease volumes so far.
func (l *Leases) Reads() []LeaseRead {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.reads)
}

// call runs f against a random server within timeout.
func (l *Leases) call(ctx context.Context, rng *rand.Rand, timeout time.Duration, f func(context.Context, csisupdv1.ControlClient) error) error {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := l.w.call(cctx, rng, f)
	return err
}

// Hold runs the lease client until ctx ends: it keeps leasesHeld leases,
// renews each node's every third of the shortest TTL on it, and at the
// end of a lease's time releases or abandons it. When ctx ends it stops
// renewing: every lease not released is abandoned then.
func (l *Leases) Hold(ctx context.Context) {
	rng := rand.New(rand.NewPCG(uint64(l.w.seed), 12))
	agents := l.w.c.Agents()
	var live []held
	n := 0
	for ctx.Err() == nil {
		if len(live) < leasesHeld {
			n++
			if h, ok := l.claim(ctx, rng, agents[rng.IntN(len(agents))], fmt.Sprintf("lease%d", n)); ok {
				live = append(live, h)
			}
		}
		live = l.renew(ctx, rng, live)
		// Leases whose time is up: released or abandoned.
		var keep []held
		for _, h := range live {
			switch {
			case time.Now().Before(h.until):
				keep = append(keep, h)
			case h.release:
				l.releaseLease(ctx, rng, h.Lease)
			default:
				l.abandon(h.Lease, "abandoned")
			}
		}
		live = keep
		pause(ctx, time.Duration(100+rng.IntN(200))*time.Millisecond)
	}
	for _, h := range live {
		l.abandon(h.Lease, "abandoned at the end")
	}
}

// claim makes a leased claim of a random lease volume on node.
func (l *Leases) claim(ctx context.Context, rng *rand.Rand, node, workload string) (held, bool) {
	ttl := minLeaseTTL + time.Duration(rng.IntN(int((maxLeaseTTL-minLeaseTTL)/time.Second)+1))*time.Second
	e := &Lease{Volume: l.volumes[rng.IntN(len(l.volumes))], Node: node, Workload: workload, TTL: ttl}
	err := l.call(ctx, rng, leaseCallTimeout, func(ctx context.Context, cl csisupdv1.ControlClient) error {
		_, err := cl.ClaimVolume(ctx, &csisupdv1.VolumeClaimRequest{Id: e.Volume, NodeId: l.w.nodeIDs[node], WorkloadId: workload,
			Usage:    &csisupdv1.VolumeUsage{AccessMode: leaseModes[0], AccessType: "mount"},
			LeaseTtl: durationpb.New(ttl), Owner: leaseOwner})
		return err
	})
	e.Claimed, e.ClaimOutcome = time.Now(), outcome(err)
	e.LastRenewal = e.Claimed
	l.w.count("lease-claim " + e.ClaimOutcome)
	if e.ClaimOutcome == outRefused {
		return held{}, false
	}
	l.mu.Lock()
	l.leases = append(l.leases, e)
	l.mu.Unlock()
	// Renewed for one to four TTLs; released or abandoned then.
	return held{Lease: e, until: e.Claimed.Add(ttl + time.Duration(rng.Int64N(int64(3*ttl)))), release: rng.IntN(2) == 0}, true
}

// renew sends one RenewClaims per node whose leases are due (a third of
// a TTL since their last renewal attempt) with every live lease of the
// node, and returns the leases still live: a lease the answer says lost
// is abandoned.
func (l *Leases) renew(ctx context.Context, rng *rand.Rand, live []held) []held {
	due := map[string]bool{}
	for _, h := range live {
		l.mu.Lock()
		last := h.LastRenewal
		l.mu.Unlock()
		if time.Since(last) >= h.TTL/3 {
			due[h.Node] = true
		}
	}
	lost := map[string]bool{}
	for _, node := range slices.Sorted(maps.Keys(due)) {
		var workloads []string
		for _, h := range live {
			if h.Node == node {
				workloads = append(workloads, h.Workload)
			}
		}
		var resp *csisupdv1.RenewClaimsResponse
		err := l.call(ctx, rng, renewTimeout, func(ctx context.Context, cl csisupdv1.ControlClient) error {
			var err error
			resp, err = cl.RenewClaims(ctx, &csisupdv1.RenewClaimsRequest{NodeId: l.w.nodeIDs[node], WorkloadIds: workloads})
			return err
		})
		now := time.Now()
		renewed := map[string]bool{}
		for _, r := range resp.GetRenewed() {
			renewed[r.GetWorkloadId()] = true
		}
		for _, w := range resp.GetLostWorkloadIds() {
			lost[w] = true
		}
		l.mu.Lock()
		for _, h := range live {
			if h.Node != node {
				continue
			}
			// Even a failed attempt may have renewed it.
			h.LastRenewal = now
			if err == nil && renewed[h.Workload] {
				h.LastRenewed = now
			}
		}
		l.mu.Unlock()
		if err != nil {
			l.w.count("lease-renew failed")
		} else {
			l.w.count("lease-renew ok")
		}
	}
	var keep []held
	for _, h := range live {
		if lost[h.Workload] {
			l.abandon(h.Lease, "lost")
			continue
		}
		keep = append(keep, h)
	}
	return keep
}

// releaseLease releases a lease's claim; one whose release is not
// acknowledged is abandoned.
func (l *Leases) releaseLease(ctx context.Context, rng *rand.Rand, e *Lease) {
	err := l.call(ctx, rng, leaseCallTimeout, func(ctx context.Context, cl csisupdv1.ControlClient) error {
		_, err := cl.ReleaseVolume(ctx, &csisupdv1.VolumeReleaseRequest{Id: e.Volume, NodeId: l.w.nodeIDs[e.Node], WorkloadId: e.Workload})
		return err
	})
	if err != nil {
		l.abandon(e, "release failed")
		return
	}
	l.mu.Lock()
	e.Released = true
	l.mu.Unlock()
	l.w.count("lease released")
}

// abandon marks e abandoned: no more renewals, no release.
func (l *Leases) abandon(e *Lease, why string) {
	l.mu.Lock()
	e.Abandoned = true
	l.mu.Unlock()
	l.w.count("lease " + why)
}

// Read reads every lease volume's claims each leaseReadEvery until ctx
// ends; a failed read is not kept.
func (l *Leases) Read(ctx context.Context) {
	rng := rand.New(rand.NewPCG(uint64(l.w.seed), 13))
	for ctx.Err() == nil {
		for _, id := range l.volumes {
			l.readOnce(ctx, rng, id)
		}
		pause(ctx, leaseReadEvery)
	}
}

// readOnce reads volume's claims once and keeps what it saw.
func (l *Leases) readOnce(ctx context.Context, rng *rand.Rand, volume string) bool {
	r := LeaseRead{Volume: volume, Call: time.Now(), States: map[string]string{}}
	err := l.call(ctx, rng, renewTimeout, func(ctx context.Context, cl csisupdv1.ControlClient) error {
		resp, err := cl.GetVolume(ctx, &csisupdv1.VolumeGetRequest{Id: volume})
		for _, c := range resp.GetVolume().GetClaims() {
			r.States[c.GetWorkloadId()] = c.GetState()
		}
		return err
	})
	r.Return = time.Now()
	if err != nil {
		return false
	}
	l.mu.Lock()
	l.reads = append(l.reads, r)
	l.mu.Unlock()
	return true
}

// AwaitExpiry reads the lease volumes after the final heal until every
// lease not released was seen not taken, or one read of each volume
// began after the last of their bounds (CheckLeasesAfterHeal), or ctx
// ends.
func (l *Leases) AwaitExpiry(ctx context.Context, heal time.Time) {
	rng := rand.New(rand.NewPCG(uint64(l.w.seed), 14))
	leases := l.Leases()
	last := heal
	for _, e := range leases {
		last = later(last, heal.Add(electionBound+e.TTL+releaseBound))
	}
	for ctx.Err() == nil {
		after := true // a read of each volume began after the last bound
		for _, id := range l.volumes {
			call := time.Now()
			after = l.readOnce(ctx, rng, id) && call.After(last) && after
		}
		if after || l.settled(leases, heal) {
			return
		}
		pause(ctx, leaseReadEvery)
	}
}

// settled reports whether every lease not released was seen gone or
// releasing in a read after heal.
func (l *Leases) settled(leases []Lease, heal time.Time) bool {
	reads := l.Reads()
	for _, e := range leases {
		if e.Released {
			continue
		}
		gone := false
		for _, r := range reads {
			if r.Volume == e.Volume && r.Call.After(heal) && r.States[e.Workload] != claimTaken {
				gone = true
			}
		}
		if !gone {
			return false
		}
	}
	return true
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// Survivors returns a violation for each claim of a lease not released
// that the servers still hold: once the cluster converged after the
// heal, every one has expired and finished its release.
func (l *Leases) Survivors(ctx context.Context) []string {
	claims, err := l.w.c.Claims(ctx)
	if err != nil {
		return nil // the convergence reports that the servers did not answer
	}
	var out []string
	for _, e := range l.Leases() {
		if e.Released {
			continue
		}
		for _, c := range claims {
			if c.Volume == e.Volume && c.Workload == e.Workload {
				out = append(out, fmt.Sprintf("%s: %s survives the convergence after the heal: %s (mounted %v)",
					checkLease, e, c.State, c.Mounted))
			}
		}
	}
	return out
}
