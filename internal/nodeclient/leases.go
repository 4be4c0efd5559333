package nodeclient

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/ids"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// The lease a Hold may name: the bounds within which the servers admit a
// claim's lease_ttl. A claim with another lease cannot exist, so a Hold
// outside them is a mistake of the caller's.
const (
	MinHoldLease = 5 * time.Second
	MaxHoldLease = 24 * time.Hour
)

// MaxHeldWorkloads caps the workloads held at a time. Every renewal
// carries all of them in one request, which must stay far below gRPC's
// message limit (4 MiB): 4096 ids of up to 128 bytes are 0.5 MiB.
const MaxHeldWorkloads = 4096

// renewalsPerLease is how many renewals fit in the smallest lease held:
// a renewal every third of it leaves two more chances, and the retries
// between them, before a lease runs out.
const renewalsPerLease = 3

// LeasesConfig configures Leases.
type LeasesConfig struct {
	// Client is the node client whose servers, node secret, retry policy
	// and failover the renewals use. Required.
	Client *Client
	// DataDir is where the held leases are kept (LeaseFileName), so
	// that a restarted agent renews them again. Required.
	DataDir string
	// Lost, when set, is told of each workload the servers say holds no
	// claim on this node any more, once it is dropped. It is called from
	// the renewal loop, one call at a time, and must not block.
	Lost func(LostWorkload)
	// Watchdog, when set, watches the renewal loop ("lease renewal").
	Watchdog *watchdog.Monitor
}

// Hold is one leased claim the agent renews: a volume's claim for a
// workload on this node, and the claim's lease.
type Hold struct {
	VolumeID   string
	WorkloadID string
	Lease      time.Duration
}

// LostWorkload is a held workload the servers hold no claim of on this
// node any more (its lease ran out, or its claims were released), with
// the volumes it was held for.
type LostWorkload struct {
	WorkloadID string
	VolumeIDs  []string
}

// Leases renews the leased claims of the workloads it was told to hold,
// for this node, with one Cluster.NodeRenewClaims call per interval that
// carries every held workload. The interval is a third of the smallest
// lease held (or of the lease the servers report, when that is smaller).
// A failed renewal is retried with the node client's backoff, and at
// least once more before the next interval; the calls fail over between
// servers as the node client's own do. What it holds is kept in DataDir,
// so that a restarted agent renews it again at once. It renews while Run
// runs: an agent that stops, gracefully or not, lets the leases run out
// on the servers unless it starts again in time.
type Leases struct {
	cfg    LeasesConfig
	path   string
	logger hclog.Logger
	// wake receives, without blocking the sender, when the holds changed:
	// a shorter lease may bring the next renewal forward. Buffered, size 1.
	wake chan struct{}

	mu sync.Mutex
	// holds maps a workload to its volumes and their leases, as Hold
	// named them and the lease file keeps them.
	holds map[string]map[string]time.Duration
	// reported is the smallest lease_ttl the servers reported for a
	// workload's claims in the last renewal; not persisted.
	reported map[string]time.Duration
}

// NewLeases validates cfg, reads the held leases from DataDir and returns
// Leases; Run renews them. A lease file that cannot be read is an error
// naming the file and what is wrong with it: its leases are not silently
// forgotten, and the agent starts only once it is fixed or removed.
func NewLeases(cfg LeasesConfig, logger hclog.Logger) (*Leases, error) {
	var errs []error
	if cfg.Client == nil {
		errs = append(errs, errors.New("node leases: Client is required"))
	}
	if cfg.DataDir == "" {
		errs = append(errs, errors.New("node leases: DataDir is required"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	l := &Leases{
		cfg:      cfg,
		path:     leaseFilePath(cfg.DataDir),
		logger:   logger.Named("leases"),
		wake:     make(chan struct{}, 1),
		reported: map[string]time.Duration{},
	}
	holds, err := readLeaseFile(context.Background(), l.path)
	if err != nil {
		return nil, err
	}
	l.holds = holds
	if len(holds) > 0 {
		l.logger.Info("held leases read; renewing them at start", "file", l.path, "workloads", len(holds))
	}
	return l, nil
}

// Hold makes the agent renew the lease of volumeID's claim for
// workloadID on this node, lease being the claim's lease_ttl. It is kept
// in the lease file before Hold returns. Holding a held volume again
// changes its lease. Errors of the arguments are InvalidArgument gRPC
// statuses naming the field, which the Agent API passes on.
func (l *Leases) Hold(volumeID, workloadID string, lease time.Duration) error {
	if err := checkHold(volumeID, workloadID, lease); err != nil {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	vols, ok := l.holds[workloadID]
	if !ok && len(l.holds) >= MaxHeldWorkloads {
		return status.Errorf(codes.ResourceExhausted, "hold lease: %d workloads are held already, the most one agent holds", MaxHeldWorkloads)
	}
	if old, held := vols[volumeID]; held && old == lease {
		return nil
	}
	next := cloneHolds(l.holds)
	if next[workloadID] == nil {
		next[workloadID] = map[string]time.Duration{}
	}
	next[workloadID][volumeID] = lease
	if err := writeLeaseFile(l.path, next); err != nil {
		return fmt.Errorf("hold lease of workload %s: %w", workloadID, err)
	}
	l.holds = next
	l.logger.Debug("holding lease", "volume_id", volumeID, "workload_id", workloadID, "lease", lease)
	l.signal()
	return nil
}

// Drop stops renewing the leases of workloadID: its claims then run out
// on the servers unless someone else renews or releases them. Dropping a
// workload that is not held does nothing.
func (l *Leases) Drop(workloadID string) error {
	return l.drop("", workloadID)
}

// DropVolume stops renewing the lease of volumeID's claim for workloadID
// alone: the workload's other volumes stay held (a container that
// mounted several volumes unmounts each on its own). Dropping the last
// volume of a workload drops the workload. It is kept in the lease file
// before DropVolume returns, as Drop is. Dropping a volume that is not
// held does nothing.
func (l *Leases) DropVolume(volumeID, workloadID string) error {
	if volumeID == "" {
		return status.Error(codes.InvalidArgument, "drop lease: volume_id is required")
	}
	return l.drop(volumeID, workloadID)
}

// drop stops renewing the lease of volumeID's claim for workloadID, or
// every lease of workloadID when volumeID is empty.
func (l *Leases) drop(volumeID, workloadID string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	vols, ok := l.holds[workloadID]
	if _, held := vols[volumeID]; !ok || volumeID != "" && !held {
		return nil
	}
	next := cloneHolds(l.holds)
	if volumeID != "" {
		delete(next[workloadID], volumeID)
	}
	if volumeID == "" || len(next[workloadID]) == 0 {
		delete(next, workloadID)
	}
	if err := writeLeaseFile(l.path, next); err != nil {
		if volumeID != "" {
			return fmt.Errorf("drop lease of volume %s of workload %s: %w", volumeID, workloadID, err)
		}
		return fmt.Errorf("drop leases of workload %s: %w", workloadID, err)
	}
	l.holds = next
	if _, held := next[workloadID]; !held {
		delete(l.reported, workloadID)
	}
	l.logger.Debug("dropped leases", "workload_id", workloadID, "volume_id", volumeID)
	l.signal()
	return nil
}

// Held returns what is held, sorted by workload and volume.
func (l *Leases) Held() []Hold {
	l.mu.Lock()
	defer l.mu.Unlock()
	return flatten(l.holds)
}

// signal wakes Run without blocking.
func (l *Leases) signal() {
	select {
	case l.wake <- struct{}{}:
	default: // one wake pending is enough
	}
}

// interval is the time between two renewals: a third of the smallest
// lease held, or reported by the servers; false when nothing is held.
func (l *Leases) interval() (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var least time.Duration
	for w, vols := range l.holds {
		for _, lease := range vols {
			if least == 0 || lease < least {
				least = lease
			}
		}
		if r := l.reported[w]; r > 0 && r < least {
			least = r
		}
	}
	return least / renewalsPerLease, least > 0
}

// snapshot returns a copy of what is held now, which a renewal asks for.
func (l *Leases) snapshot() map[string]map[string]time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return cloneHolds(l.holds)
}

// Run renews the held leases until ctx ends; it returns nil then. It
// renews at once when it starts, so that a restarted agent's leases,
// which may be close to running out, are renewed first thing.
func (l *Leases) Run(ctx context.Context) error {
	loop := l.cfg.Watchdog.Loop("lease renewal")
	defer loop.Done()
	backoff := l.cfg.Client.cfg.Retry.NewBackOff()
	timer := time.NewTimer(0)
	defer timer.Stop()
	// due is when timer fires; zero while nothing is held and timer is
	// stopped.
	due := time.Now()
	schedule := func(at time.Time) {
		timer.Stop()
		select { // a fired timer's value not yet read
		case <-timer.C:
		default:
		}
		due = at
		timer.Reset(time.Until(at))
	}
	for {
		loop.Beat()
		select {
		case <-ctx.Done():
			return nil
		case <-loop.C():
			continue
		case <-l.wake:
			// A hold came or went. A new claim's lease was taken just
			// now, so it is renewed an interval from now; a shorter
			// lease than those held brings the next renewal forward.
			interval, held := l.interval()
			switch {
			case !held:
				timer.Stop()
				due = time.Time{}
			case due.IsZero() || time.Now().Add(interval).Before(due):
				schedule(time.Now().Add(interval))
			}
			continue
		case <-timer.C:
			due = time.Time{}
		}
		sent := l.snapshot()
		if len(sent) == 0 {
			continue
		}
		// A renewal is at most two calls (failover), each bounded.
		loop.Busy(time.Now().Add(2 * l.cfg.Client.cfg.RPCTimeout))
		err := l.renew(ctx, sent)
		if ctx.Err() != nil {
			return nil
		}
		interval, held := l.interval()
		switch {
		case !held:
			// The answer dropped every workload: nothing to renew.
		case err != nil:
			// Retry soon, and never later than an interval from now:
			// the leases were renewed an interval ago at least, so two
			// more tries remain before the smallest one runs out.
			wait := min(backoff.NextBackOff(), interval)
			l.logger.Warn("lease renewal failed; retrying", "workloads", len(sent), "in", wait, "error", err)
			schedule(time.Now().Add(wait))
		default:
			backoff.Reset()
			schedule(time.Now().Add(interval))
		}
	}
}

// renew renews the leases of the workloads of sent, what was held when
// it was called, in one call, and drops those the servers say hold no
// claim on this node any more.
func (l *Leases) renew(ctx context.Context, sent map[string]map[string]time.Duration) error {
	c := l.cfg.Client
	workloads := slices.Sorted(maps.Keys(sent))
	resp, err := callCluster(ctx, c, "renew leases", func(ctx context.Context, cl csisupdv1.ClusterClient) (*csisupdv1.RenewClaimsResponse, error) {
		return cl.NodeRenewClaims(ctx, &csisupdv1.RenewClaimsRequest{NodeId: c.cfg.Node.ID, WorkloadIds: workloads})
	})
	if err != nil {
		return fmt.Errorf("renew leases of node %s: %w", c.cfg.Node.ID, err)
	}
	reported := map[string]time.Duration{}
	for _, r := range resp.GetRenewed() {
		ttl := r.GetLeaseTtl().AsDuration()
		if old, ok := reported[r.GetWorkloadId()]; ttl > 0 && (!ok || ttl < old) {
			reported[r.GetWorkloadId()] = ttl
		}
	}
	l.mu.Lock()
	l.reported = reported
	l.mu.Unlock()
	for _, w := range resp.GetLostWorkloadIds() {
		if vols, asked := sent[w]; asked { // a server's answer names no other
			l.lose(w, vols)
		}
	}
	return nil
}

// lose drops the volumes sent of a workload the servers hold no claim
// of, and reports them. A volume held for it after the renewal was sent
// stays held: its claim may be newer than the answer. A failed write
// keeps them held in memory too, so that the next renewal, which the
// servers answer the same way, tries again: they are never kept in the
// file alone, to be renewed again after a restart.
func (l *Leases) lose(workloadID string, sent map[string]time.Duration) {
	l.mu.Lock()
	next := cloneHolds(l.holds)
	var lost []string
	for v := range next[workloadID] {
		if _, ok := sent[v]; ok {
			delete(next[workloadID], v)
			lost = append(lost, v)
		}
	}
	if len(lost) == 0 {
		l.mu.Unlock()
		return
	}
	if len(next[workloadID]) == 0 {
		delete(next, workloadID)
	}
	if err := writeLeaseFile(l.path, next); err != nil {
		l.mu.Unlock()
		l.logger.Error("cannot drop a lost workload's leases", "workload_id", workloadID, "error", err)
		return
	}
	l.holds = next
	delete(l.reported, workloadID)
	l.mu.Unlock()
	slices.Sort(lost)
	l.logger.Warn("workload holds no claim on this node any more; stopped renewing its leases",
		"workload_id", workloadID, "volume_ids", lost)
	if l.cfg.Lost != nil {
		l.cfg.Lost(LostWorkload{WorkloadID: workloadID, VolumeIDs: lost})
	}
}

// checkHold checks the arguments of Hold.
func checkHold(volumeID, workloadID string, lease time.Duration) error {
	switch {
	case !ids.ValidPathID(volumeID):
		return fmt.Errorf("hold lease: volume_id %q must not be . or .. and must match %s", volumeID, ids.PluginIDPattern)
	case !ids.ValidPathID(workloadID):
		return fmt.Errorf("hold lease: workload_id %q must not be . or .. and must match %s", workloadID, ids.PluginIDPattern)
	case lease < MinHoldLease || lease > MaxHoldLease:
		return fmt.Errorf("hold lease: lease %s is out of range: give the claim's lease_ttl, %s to %s", lease, MinHoldLease, MaxHoldLease)
	}
	return nil
}

// cloneHolds copies holds two levels deep, so that a change is made on
// the copy and kept only once the lease file holds it.
func cloneHolds(holds map[string]map[string]time.Duration) map[string]map[string]time.Duration {
	out := make(map[string]map[string]time.Duration, len(holds))
	for w, vols := range holds {
		out[w] = maps.Clone(vols)
	}
	return out
}

// flatten lists holds sorted by workload, then volume.
func flatten(holds map[string]map[string]time.Duration) []Hold {
	var out []Hold
	for _, w := range slices.Sorted(maps.Keys(holds)) {
		for _, v := range slices.Sorted(maps.Keys(holds[w])) {
			out = append(out, Hold{VolumeID: v, WorkloadID: w, Lease: holds[w][v]})
		}
	}
	return out
}
