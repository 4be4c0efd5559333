//go:build nemesis

package nemesis

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/testplugin/journal"
)

// Flags of the soak (make nemesis SEED=N NEMESIS_TIME=D SEEDS=K).
var (
	nemesisTime    = flag.Duration("nemesis-time", 3*time.Minute, "how long each seed's faults and workload run")
	nemesisSeeds   = flag.Int("nemesis-seeds", 1, "how many seeds to run, from -seed on (each a fresh cluster)")
	nemesisServers = flag.Int("nemesis-servers", 0, "servers of each seed's cluster (0: 3 or 5, drawn from the seed)")
	nemesisAgents  = flag.Int("nemesis-agents", 0, "agents of each seed's cluster (0: 3 to 5, drawn from the seed)")
	nemesisFaults  = flag.String("nemesis-faults", "", "comma-separated fault kinds to draw from (default: every kind)")
	nemesisKeep    = flag.String("nemesis-keep", "", "copy each seed's journals and claim history into this directory (seed-N/)")
	// Each seed's cluster is on a lab of its own, so seeds can run side
	// by side; go test's -parallel must allow as many.
	nemesisParallel = flag.Int("nemesis-parallel", 1, "how many seeds (or defect soaks) run at once, each on a cluster of its own")
)

// Settings of the soak's servers and of its quiet period.
const (
	// gcGrace is the servers' claim_gc_grace: longer than any fault
	// (maxFault), so the servers never free a node's claims because it
	// was down.
	gcGrace = 2 * time.Minute
	// quietBound is how long after the faults end the cluster has to
	// converge: claim_gc_grace plus the volume watcher's backoff cap,
	// plus a minute for elections, heartbeats and the agents' restarts.
	quietBound = gcGrace + config.MaxVolumeWatchBackoff + time.Minute
	// schedulers are the concurrent claiming clients.
	schedulers = 4
	// burstClaims are the concurrent claims of a leader burst.
	burstClaims = 4
)

// Usage bounds after the quiet period, against the usage measured once
// the cluster formed: generous, to catch leaks (a goroutine or a buffer
// per call or per fault), not growth to a working set.
const (
	goroutineSlack = 100
	rssFactor      = 3
	rssSlack       = 128 << 20
)

// Report is what one seed's run saw.
type Report struct {
	Seed          int64
	Schedule      []Fault
	Ops           map[string]int
	Faults        map[string]int
	LeaderChanges int
	// Converged is how long after the faults ended the servers' claims
	// and the plugins' journals agreed with nothing left over.
	Converged time.Duration
	// Violations are the broken invariants, each starting with its
	// check's name.
	Violations []string
}

// Violated reports whether one of the violations is of check.
func (r *Report) Violated(check string) bool {
	for _, v := range r.Violations {
		if strings.HasPrefix(v, check+":") {
			return true
		}
	}
	return false
}

func (r *Report) violate(check, format string, args ...any) {
	r.Violations = append(r.Violations, check+": "+fmt.Sprintf(format, args...))
}

// Names of the checks beside the journal's.
const (
	checkHistory = "History"
	checkExit    = "Exit"
	checkUsage   = "Usage"
	checkDrain   = "Drain"
)

// RunConfig is one seed's run.
type RunConfig struct {
	Seed     int64
	Duration time.Duration
	// Kinds limits the faults (nil: every kind).
	Kinds []string
	// Servers and Agents size the cluster (default 3 each).
	Servers, Agents int
	// Bin is the csisupd binary (default the one TestMain built).
	Bin string
	// SharedWithoutPublish is Options.SharedWithoutPublish.
	SharedWithoutPublish bool
	// QuietBound bounds the quiet period and the drain (default
	// quietBound). Only the defect tests shorten it: their leftovers
	// never heal, and waiting longer shows nothing more.
	QuietBound time.Duration
	// Until, a check's name, ends the run as soon as that check has
	// reported a violation: the defect tests ask only whether their check
	// catches their defect. The checks that see the whole run (single
	// writer, single node, unexpected exits) are asked every few seconds
	// while the workload runs; the others after their phase.
	Until string
}

// TestNemesis runs the soak for -nemesis-seeds seeds from -seed (a seed
// from the clock when 0), each -nemesis-time long on a fresh cluster of
// three or five servers and three to five agents (ClusterSize, unless
// -nemesis-servers and -nemesis-agents say), and fails on any invariant
// violation.
func TestNemesis(t *testing.T) {
	first := *seedFlag
	if first == 0 {
		first = time.Now().UnixNano() % 1_000_000
	}
	var (
		mu      sync.Mutex
		reports []*Report
	)
	slots := make(chan struct{}, max(1, *nemesisParallel))
	// The group returns when every seed's run has, parallel or not.
	t.Run("seeds", func(t *testing.T) {
		for i := range *nemesisSeeds {
			seed := first + int64(i)
			t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
				if *nemesisParallel > 1 {
					t.Parallel()
				}
				slots <- struct{}{}
				defer func() { <-slots }()
				r := runSeed(t, seed)
				mu.Lock()
				reports = append(reports, r)
				mu.Unlock()
			})
		}
	})
	summarise(t, reports)
}

// runSeed runs TestNemesis's soak for one seed and fails t on any
// invariant violation.
func runSeed(t *testing.T, seed int64) *Report {
	var kinds []string
	if *nemesisFaults != "" {
		kinds = strings.Split(*nemesisFaults, ",")
		for _, k := range kinds {
			if !slices.Contains(faultKinds, k) {
				t.Fatalf("-nemesis-faults: unknown fault kind %q (kinds: %s)", k, strings.Join(faultKinds, ", "))
			}
		}
	}
	servers, agents := ClusterSize(seed)
	if *nemesisServers > 0 {
		servers = *nemesisServers
	}
	if *nemesisAgents > 0 {
		agents = *nemesisAgents
	}
	r := Run(t, RunConfig{Seed: seed, Duration: *nemesisTime, Kinds: kinds, Servers: servers, Agents: agents})
	if len(r.Violations) > 0 {
		t.Errorf("seed %d: %d invariant violations (replay: make nemesis SEED=%d NEMESIS_TIME=%s):\n%s",
			seed, len(r.Violations), seed, *nemesisTime, strings.Join(r.Violations, "\n"))
	}
	return r
}

// summarise logs the totals of the runs.
func summarise(t *testing.T, reports []*Report) {
	ops, faults := map[string]int{}, map[string]int{}
	leaders, violations := 0, 0
	var longest time.Duration
	for _, r := range reports {
		for k, v := range r.Ops {
			ops[k] += v
		}
		for k, v := range r.Faults {
			faults[k] += v
		}
		leaders += r.LeaderChanges
		violations += len(r.Violations)
		longest = max(longest, r.Converged)
	}
	t.Logf("nemesis: %d seeds, %d violations, %d leader changes, longest convergence %s", len(reports), violations, leaders, longest.Round(time.Millisecond))
	for _, k := range slices.Sorted(maps.Keys(ops)) {
		t.Logf("nemesis: operations %-24s %d", k, ops[k])
	}
	for _, k := range slices.Sorted(maps.Keys(faults)) {
		t.Logf("nemesis: faults %-24s %d", k, faults[k])
	}
}

// Run starts a cluster, runs the workload and the seed's schedule for the
// duration, heals everything, waits for convergence, drains, and checks
// every invariant. Violations are returned, not failed, so that the
// defect tests can ask which check caught what.
func Run(t *testing.T, cfg RunConfig) *Report {
	c := StartCluster(t, Options{Seed: cfg.Seed, Bin: cfg.Bin, GCGrace: gcGrace, Servers: cfg.Servers, Agents: cfg.Agents,
		SharedWithoutPublish: cfg.SharedWithoutPublish})
	r := &Report{Seed: cfg.Seed, Faults: map[string]int{}}
	r.Schedule = Schedule(cfg.Seed, cfg.Duration, c.Servers(), c.Agents(), cfg.Kinds)
	for _, f := range r.Schedule {
		t.Logf("schedule: %s", f)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := newWorkload(ctx, c, cfg.Seed)
	if err != nil {
		t.Fatal(err)
	}
	leases, err := newLeases(ctx, w)
	if err != nil {
		t.Fatal(err)
	}
	baseline := map[string]Usage{}
	for _, h := range append(c.Servers(), c.Agents()...) {
		if u, err := c.Usage(h); err == nil {
			baseline[h] = u
		}
	}

	// The workload and the nemesis, for the run's duration.
	wctx, stopWork := context.WithTimeout(ctx, cfg.Duration)
	defer stopWork()
	var wg sync.WaitGroup
	for i := range schedulers {
		wg.Add(1)
		go func() { defer wg.Done(); w.Scheduler(wctx, i) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); w.Lifecycle(wctx) }()
	wg.Add(2)
	go func() { defer wg.Done(); leases.Hold(wctx) }()
	go func() { defer wg.Done(); leases.Read(wctx) }()
	leaders := newLeaderWatch(c)
	wg.Add(1)
	go func() { defer wg.Done(); leaders.run(wctx) }()
	n := &nemesis{c: c, w: w, t: t, report: r, seed: cfg.Seed}
	caught := make(chan []string, 1)
	if wholeRunChecks[cfg.Until] {
		wg.Add(1)
		go func() { defer wg.Done(); watchFor(wctx, t, c, n, leases, cfg.Until, stopWork, caught) }()
	}
	// A plugin armed to crash may crash late, in a release of the quiet
	// period: its orchestrator restarts it until the checks.
	rctx, stopRestarts := context.WithCancel(ctx)
	restarts := make(chan struct{})
	go func() { defer close(restarts); n.restartCrashedPlugins(rctx) }()
	defer func() { stopRestarts(); <-restarts }()
	n.run(wctx, r.Schedule)
	wg.Wait()
	select {
	case v := <-caught:
		r.Violations = append(r.Violations, v...)
		t.Logf("nemesis: %s caught while the workload ran; the run ends here", cfg.Until)
		return r
	default:
	}
	n.heal()
	faultsEnd := time.Now()
	r.LeaderChanges = leaders.changes()
	t.Logf("nemesis: faults over; %d leader changes", r.LeaderChanges)

	// Leases: none outlived its TTL by more than the release bound in a
	// window without faults, and after the heal every lease not released
	// expires within an election, its TTL and the release bound.
	lctx, stopLeases := context.WithTimeout(ctx, electionBound+maxLeaseTTL+releaseBound+time.Minute)
	defer stopLeases()
	leases.AwaitExpiry(lctx, faultsEnd)
	during, quiet := CheckLeasesDuringRun(leases.Leases(), leases.Reads(), n.faults())
	w.countN("lease-reads in quiet windows", quiet)
	r.Violations = append(r.Violations, during...)
	r.Violations = append(r.Violations, CheckLeasesAfterHeal(leases.Leases(), leases.Reads(), faultsEnd)...)
	if cfg.Until != "" && r.Violated(cfg.Until) {
		return r
	}

	// Quiet period: the servers' claims and the journals agree.
	bound := quietBound
	if cfg.QuietBound > 0 {
		bound = cfg.QuietBound
	}
	qctx, stopQuiet := context.WithTimeout(ctx, bound)
	defer stopQuiet()
	last := converge(qctx, c)
	if last != nil {
		r.Violations = append(r.Violations, last...)
	} else {
		r.Converged = time.Since(faultsEnd)
		t.Logf("nemesis: converged %s after the faults", r.Converged.Round(time.Millisecond))
	}
	if cfg.Until != "" && r.Violated(cfg.Until) {
		return r
	}
	// No claim of an abandoned lease survives the convergence.
	r.Violations = append(r.Violations, leases.Survivors(ctx)...)

	// Every claim released: every release finishes, nothing is left.
	dctx, stopDrain := context.WithTimeout(ctx, bound)
	defer stopDrain()
	if err := w.Drain(dctx, w.newClient()); err != nil {
		r.violate(checkDrain, "%v", err)
	} else if left := converge(dctx, c); left != nil {
		r.Violations = append(r.Violations, left...)
	}
	if cfg.Until != "" && r.Violated(cfg.Until) {
		return r
	}

	stopRestarts()
	<-restarts
	if *nemesisKeep != "" {
		keep(t, c, w, filepath.Join(*nemesisKeep, fmt.Sprintf("seed-%d", cfg.Seed)))
	}
	// The journals over the whole run.
	v, err := journalViolations(c)
	if err != nil {
		t.Fatal(err)
	}
	r.Violations = append(r.Violations, v...)
	// The history.
	if bad := CheckHistory(w.History(), 2*time.Minute); bad != "" {
		r.violate(checkHistory, "%s", bad)
	}
	// Processes: nothing died by itself, no panic, no race.
	for _, e := range c.UnexpectedExits() {
		r.violate(checkExit, "%s", e)
	}
	// Usage back within bounds of the start's.
	for h, b := range baseline {
		u, err := c.Usage(h)
		if err != nil {
			r.violate(checkUsage, "%s: %v", h, err)
			continue
		}
		if u.Goroutines > 2*b.Goroutines+goroutineSlack {
			r.violate(checkUsage, "%s has %d goroutines after the quiet period, %d at the start", h, u.Goroutines, b.Goroutines)
		}
		if u.RSSBytes > rssFactor*b.RSSBytes+rssSlack {
			r.violate(checkUsage, "%s uses %d MiB after the quiet period, %d MiB at the start", h, u.RSSBytes>>20, b.RSSBytes>>20)
		}
	}
	r.Ops = w.Counts()
	if t.Failed() || len(r.Violations) > 0 {
		for _, e := range c.Events() {
			t.Logf("applied: %s", e)
		}
	}
	return r
}

// journalViolations returns the violations of the single-writer and
// single-node checks in both plugins' journals so far.
func journalViolations(c *Cluster) ([]string, error) {
	var out []string
	for _, id := range plugins {
		recs, err := journal.Merge(c.Journals(id)...)
		if err != nil && !errors.Is(err, journal.ErrTornLine) {
			return nil, fmt.Errorf("journals of %s: %w", id, err)
		}
		for _, v := range append(journal.SingleWriter(recs), journal.SingleNode(recs)...) {
			out = append(out, v.String())
		}
	}
	return out, nil
}

// wholeRunChecks are the checks whose violations stand once seen, whatever
// happens after: RunConfig.Until asks them while the workload runs.
var wholeRunChecks = map[string]bool{journal.CheckSingleWriter: true, journal.CheckSingleNode: true, checkExit: true, checkLease: true}

// watchFor asks check every few seconds until ctx ends; at its first
// violation it sends the violations seen to caught and calls stop, which
// ends the workload and the faults.
func watchFor(ctx context.Context, t *testing.T, c *Cluster, n *nemesis, leases *Leases, check string, stop func(), caught chan<- []string) {
	every(ctx, 2*time.Second, func() bool {
		var seen []string
		switch check {
		case checkExit:
			for _, e := range c.UnexpectedExits() {
				seen = append(seen, checkExit+": "+e)
			}
		case checkLease:
			seen, _ = CheckLeasesDuringRun(leases.Leases(), leases.Reads(), n.faults())
		default:
			v, err := journalViolations(c)
			if err != nil {
				t.Logf("nemesis: %v", err)
				return false
			}
			seen = v
		}
		if r := (&Report{Violations: seen}); !r.Violated(check) {
			return false
		}
		caught <- seen
		stop()
		return true
	})
}

// every calls f every d until ctx ends or f returns true.
func every(ctx context.Context, d time.Duration, f func() (done bool)) {
	tick := time.NewTicker(d)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if f() {
			return
		}
	}
}

// keep copies the run's journals and its claim history (JSON lines) into
// dir, for a look after the run.
func keep(t *testing.T, c *Cluster, w *Workload, dir string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Errorf("keep: %v", err)
		return
	}
	for _, id := range plugins {
		for _, j := range c.Journals(id) {
			if b, err := os.ReadFile(j); err == nil {
				_ = os.WriteFile(filepath.Join(dir, filepath.Base(j)), b, 0o644)
			}
		}
	}
	var b strings.Builder
	enc := json.NewEncoder(&b)
	for _, o := range w.History() {
		_ = enc.Encode(o)
	}
	if err := os.WriteFile(filepath.Join(dir, "history.jsonl"), []byte(b.String()), 0o644); err != nil {
		t.Errorf("keep: %v", err)
	}
	t.Logf("nemesis: journals and history kept in %s", dir)
}

// HeldClaim is one claim the servers hold.
type HeldClaim struct {
	Volume, ExternalID string
	Node               string // the plugin's node id: the agent's host name
	Workload, State    string
	Mounted            bool
}

// Claims returns every claim the servers hold, read from the leader by
// the first server that answers.
func (c *Cluster) Claims(ctx context.Context) ([]HeldClaim, error) {
	var last error = errors.New("nemesis: no server answered")
	for _, s := range c.Servers() {
		cl, err := c.Control(s)
		if err != nil {
			return nil, err
		}
		var out []HeldClaim
		token := ""
		for {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			resp, err := cl.ListVolumes(cctx, &csisupdv1.VolumeListRequest{PageSize: 1000, NextToken: token})
			cancel()
			if err != nil {
				last = err
				break
			}
			for _, v := range resp.GetVolumes() {
				for _, cl := range v.GetClaims() {
					out = append(out, HeldClaim{Volume: v.GetId(), ExternalID: v.GetExternalId(), Node: cl.GetCsiNodeId(),
						Workload: cl.GetWorkloadId(), State: cl.GetState(), Mounted: cl.GetMounted()})
				}
			}
			if resp.NextToken == nil {
				return out, nil
			}
			token = resp.GetNextToken()
		}
	}
	return nil, last
}

// converge waits until every claim the servers hold is mounted (no
// release or claim under way) and the journals of both plugins show each
// published exactly where it is held and nothing else staged or
// published. It returns nil then, or at ctx's end the last differences.
func converge(ctx context.Context, c *Cluster) []string {
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	var last []string
	for {
		diffs := differences(ctx, c)
		if len(diffs) == 0 {
			return nil
		}
		// A look that ctx's end cut short shows nothing: report the
		// last whole one.
		if ctx.Err() == nil || last == nil {
			last = diffs
		}
		select {
		case <-ctx.Done():
			return last
		case <-tick.C:
		}
	}
}

func differences(ctx context.Context, c *Cluster) []string {
	claims, err := c.Claims(ctx)
	if err != nil {
		return []string{fmt.Sprintf("%s: the servers' claims: %v", journal.CheckLeftovers, err)}
	}
	var out []string
	held := map[[2]string]bool{}
	for _, cl := range claims {
		held[[2]string{cl.ExternalID, cl.Node}] = true
		if cl.State != "taken" || !cl.Mounted {
			out = append(out, fmt.Sprintf("%s: claim %s on %s by %s is %s (mounted %v), not settled", journal.CheckLeftovers,
				cl.Volume, cl.Node, cl.Workload, cl.State, cl.Mounted))
		}
	}
	for _, id := range plugins {
		recs, err := journal.Merge(c.Journals(id)...)
		if err != nil && !errors.Is(err, journal.ErrTornLine) {
			return append(out, fmt.Sprintf("%s: journals of %s: %v", journal.CheckLeftovers, id, err))
		}
		for _, v := range journal.Leftovers(recs, func(volumeID, nodeID string) bool { return held[[2]string{volumeID, nodeID}] }) {
			out = append(out, v.String())
		}
	}
	return out
}

// leaderWatch counts leader changes, asking every few seconds.
type leaderWatch struct {
	c    *Cluster
	mu   sync.Mutex
	last string
	n    int
}

func newLeaderWatch(c *Cluster) *leaderWatch { return &leaderWatch{c: c, last: c.Leader()} }

func (l *leaderWatch) run(ctx context.Context) {
	every(ctx, 2*time.Second, func() bool {
		if now := l.c.Leader(); now != "" {
			l.mu.Lock()
			if now != l.last {
				l.n++
				l.last = now
			}
			l.mu.Unlock()
		}
		return false
	})
}

func (l *leaderWatch) changes() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// nemesis applies a schedule to the cluster.
type nemesis struct {
	c      *Cluster
	w      *Workload
	t      *testing.T
	report *Report
	seed   int64
	mu     sync.Mutex
	wg     sync.WaitGroup
	spans  []Span // each fault from before it was applied to after it was undone
}

// faults returns the spans of the faults applied so far, and every
// event of the cluster's controls as a span of its own: a plugin's
// restart after its crash has no span, only an event.
func (n *nemesis) faults() []Span {
	n.mu.Lock()
	out := slices.Clone(n.spans)
	n.mu.Unlock()
	for _, e := range n.c.Events() {
		out = append(out, Span{From: e.Time, To: e.Time, What: e.String()})
	}
	return out
}

// run applies each fault at its time, each undone on a goroutine of its
// own after its duration. It returns when the schedule is applied and
// ctx ends; heal undoes the rest.
func (n *nemesis) run(ctx context.Context, schedule []Fault) {
	start := time.Now()
	for _, f := range schedule {
		select {
		case <-ctx.Done():
			n.wg.Wait()
			return
		case <-time.After(time.Until(start.Add(f.At))):
		}
		n.wg.Add(1)
		go func() { defer n.wg.Done(); n.apply(ctx, f) }()
	}
	<-ctx.Done()
	n.wg.Wait()
}

func (n *nemesis) count(kind string) {
	n.mu.Lock()
	n.report.Faults[kind]++
	n.mu.Unlock()
}

// apply applies f and undoes it after f.For. Errors of the controls are
// logged in the schedule (Cluster.record); a fault that could not be
// applied is not counted.
func (n *nemesis) apply(ctx context.Context, f Fault) {
	start := time.Now()
	defer func() {
		n.mu.Lock()
		n.spans = append(n.spans, Span{From: start, To: time.Now(), What: f.String()})
		n.mu.Unlock()
	}()
	c := n.c
	target := f.Target
	if target == "leader" {
		if target = c.Leader(); target == "" {
			return // no leader to hit right now
		}
	}
	switch f.Kind {
	case faultKillServer, faultKillAgent:
		if c.Kill(target) == nil {
			n.count(f.Kind)
			pause(ctx, f.For)
			_ = c.RestartWithClock(target, c.Clock(target))
		}
	case faultStopServer, faultStopAgent, faultStopLeader:
		if c.Stop(target) == nil {
			n.count(f.Kind)
			pause(ctx, f.For)
			_ = c.Cont(target)
		}
	case faultServerCut, faultLeaderCut:
		var cut []string
		for _, s := range c.Servers() {
			if s != target && c.lab.CutBoth(target, s) == nil {
				cut = append(cut, s)
			}
		}
		_ = c.record("cut-servers", target, nil)
		n.count(f.Kind)
		pause(ctx, f.For)
		for _, s := range cut {
			_ = c.lab.HealBoth(target, s)
		}
		_ = c.record("heal-servers", target, nil)
	case faultAgentCut:
		for _, s := range c.Servers() {
			_ = c.lab.CutBoth(target, s)
		}
		_ = c.record("cut-from-servers", target, nil)
		n.count(f.Kind)
		pause(ctx, f.For)
		for _, s := range c.Servers() {
			_ = c.lab.HealBoth(target, s)
		}
		_ = c.record("heal-from-servers", target, nil)
	case faultOneWay:
		from, to, _ := strings.Cut(target, "->")
		if c.Cut(from, to) == nil {
			n.count(f.Kind)
			pause(ctx, f.For)
			_ = c.record("heal", target, c.lab.Heal(from, to))
		}
	case faultSlowPlugin:
		if c.SlowPlugin(target, true) == nil {
			n.count(f.Kind)
			pause(ctx, f.For)
			if c.Slow(target) { // not restarted meanwhile
				_ = c.SlowPlugin(target, false)
			}
		}
	case faultCrashPlugin:
		if c.CrashPlugin(target) == nil {
			n.count(f.Kind)
		}
	case faultClockJump:
		old := c.Clock(target)
		if c.Kill(target) == nil {
			pause(ctx, f.For)
			if c.RestartWithClock(target, f.Clock) == nil {
				n.count(f.Kind)
			} else {
				// No time namespace here: back on the clock it had.
				_ = c.RestartWithClock(target, old)
			}
		}
	case faultLostRecord:
		if c.Kill(target) == nil {
			n.count(f.Kind)
			_ = c.WipeMountRecords(target)
			pause(ctx, f.For)
			_ = c.RestartWithClock(target, c.Clock(target))
		}
	case faultLeaderBurst:
		rng := rand.New(rand.NewPCG(uint64(n.seed), uint64(f.At)))
		// The claims reach the leader within a few hundred
		// milliseconds: hit it while they are under way.
		hit := time.Duration(100+rng.IntN(400)) * time.Millisecond
		done := make(chan struct{})
		go func() { defer close(done); n.w.Burst(ctx, rng, burstClaims) }()
		pause(ctx, hit)
		var err error
		if f.Kill {
			err = c.Kill(target)
		} else {
			err = c.Stop(target)
		}
		if err == nil {
			n.count(f.Kind)
			pause(ctx, f.For)
			if f.Kill {
				_ = c.RestartWithClock(target, c.Clock(target))
			} else {
				_ = c.Cont(target)
			}
		}
		<-done
	}
}

// restartCrashedPlugins restarts, a second after, every plugin process
// that exited (a crash the nemesis armed), as an orchestrator would.
func (n *nemesis) restartCrashedPlugins(ctx context.Context) {
	every(ctx, time.Second, func() bool {
		for _, a := range n.c.Agents() {
			for _, id := range plugins {
				if name := PluginName(a, id); !n.c.Running(name) {
					_ = n.c.Restart(name)
				}
			}
		}
		return false
	})
}

// heal undoes everything left: cuts healed, stopped processes continued,
// plugins fast, every process running.
func (n *nemesis) heal() {
	c := n.c
	_ = c.HealAll()
	for _, name := range c.names() {
		if c.Slow(name) {
			_ = c.SlowPlugin(name, false)
		}
		if c.Stopped(name) {
			_ = c.Cont(name)
		}
		if !c.Running(name) {
			_ = c.RestartWithClock(name, c.Clock(name))
		}
	}
}
