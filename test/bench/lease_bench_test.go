package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/server/fsm"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// The lease renewal benchmark's sizes and windows.
const (
	leaseNodes         = 1000
	leaseClaimsPerNode = 10
	leasePlugin        = "plugin-0" // the simulated agents' first plugin
	// leaseTTL is the claims' lease: longer than the windows without
	// renewals (the first one starts before any renewal), so that no
	// lease expires there. What a renewal costs the leader does not
	// depend on the TTL it restarts; the renewal interval is set apart,
	// as the TTL measured would set it (leaseRenewTTLs).
	leaseTTL          = 5 * time.Minute
	leaseWindow       = 30 * time.Second
	leaseSeedInFlight = 128
)

// leaseRenewTTLs are the lease TTLs whose renewals are measured, each
// renewed every TTL/3 as a holder renews: 100 calls/s at 30 s (the
// figures without a suffix), 300 calls/s at 10 s.
var leaseRenewTTLs = []time.Duration{30 * time.Second, 10 * time.Second}

// BenchmarkLeaseRenewals1000 runs three real servers in this process and
// 1,000 simulated agents in a child process, each heartbeating and
// holding 10 leased claims, and measures what renewing the 10,000 leases
// (one NodeRenewClaims per node per interval) costs the leader, beside
// heartbeats alone. See the package documentation for its figures.
func BenchmarkLeaseRenewals1000(b *testing.B) {
	if testing.Short() {
		b.Skip("seeds 10,000 claims and measures for minutes")
	}
	for range b.N {
		runLeaseRenewals(b)
	}
}

// leaseFigures are the figures of one window of the lease benchmark.
type leaseFigures struct {
	cpu        float64 // this process's, percent of one core
	heartbeats float64 // successful heartbeats per second
	calls      float64 // successful NodeRenewClaims per second
	claims     float64 // claims renewed per second
	lost       int64   // workloads answered lost
	missed     int64   // workloads answered neither renewed nor lost
	failures   int64   // failed NodeRenewClaims
	elapsed    time.Duration
}

// measureLeases measures this process's CPU, the agents' heartbeats and
// their renewals over leaseWindow.
func measureLeases(b *testing.B, self int, sim *simProcess) leaseFigures {
	b.Helper()
	var f leaseFigures
	hb0 := sim.heartbeatCount(b)
	r0 := sim.renewalCounts(b)
	f.cpu, f.elapsed = cpuPercent(b, self, func() { time.Sleep(leaseWindow) }) // a measurement window
	hb1 := sim.heartbeatCount(b)
	r1 := sim.renewalCounts(b)
	secs := f.elapsed.Seconds()
	f.heartbeats = float64(hb1-hb0) / secs
	f.calls = float64(r1[0]-r0[0]) / secs
	f.claims = float64(r1[1]-r0[1]) / secs
	f.lost, f.missed, f.failures = r1[2]-r0[2], r1[3]-r0[3], r1[4]-r0[4]
	return f
}

// renewalCounts asks the agents for their renewal counters: calls,
// claims renewed, workloads lost, workloads missed, failed calls.
func (p *simProcess) renewalCounts(b *testing.B) [5]int64 {
	b.Helper()
	p.send(b, "renewals")
	f := p.await(b, "renewals", 10*time.Second)
	var out [5]int64
	if len(f) != len(out) {
		b.Fatalf("simulated agents: renewals %v", f)
	}
	for i := range out {
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			b.Fatalf("simulated agents: renewals %v", f)
		}
		out[i] = n
	}
	return out
}

func runLeaseRenewals(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c := startBenchServers(b)
	self := os.Getpid()
	idleCPU, _ := cpuPercent(b, self, func() { time.Sleep(clusterIdleWindow) }) // a measurement window
	b.ReportMetric(idleCPU, "servers_idle_cpu_%core")

	sim := startSimAgents(b, c.RPCAddrs(), leaseNodes, clusterNodePlugins)
	sim.await(b, "registered", 5*time.Minute)
	leader := c.WaitForLeader(b, time.Minute)
	if n := len(listAllNodes(ctx, b, c.Control(leader.Index))); n != leaseNodes {
		b.Fatalf("%d nodes registered, want %d", n, leaseNodes)
	}
	// Every agent on the leader, so that the process's CPU over the idle
	// floor is the leader's (the followers only take raft's heartbeats,
	// which the floor holds). The move takes one heartbeat TTL.
	sim.send(b, fmt.Sprintf("assign 1 %d", leader.Index))
	sim.await(b, "assigned", 2*time.Minute)

	t0 := time.Now()
	seedLeasedClaims(ctx, b, leader.Server(), c.Control(leader.Index))
	b.ReportMetric(time.Since(t0).Seconds(), "seed_10000_claims_s")
	srv := leader.Server()
	if n := settledLeasedClaims(srv); n != leaseNodes*leaseClaimsPerNode {
		b.Fatalf("%d leased claims taken and mounted after seeding, want %d", n, leaseNodes*leaseClaimsPerNode)
	}

	// Heartbeats only, then renewals at each TTL's interval, then
	// heartbeats only again: the figure of heartbeats alone is the mean
	// of the first and the last window, so that what drifts during the
	// run weighs on both sides alike. Raft must apply nothing in any of
	// them: renewals and heartbeats are held in the leader's memory.
	r := srv.Raft()
	idx0 := r.AppliedIndex()
	var elapsed time.Duration
	before := measureLeases(b, self, sim)
	elapsed += before.elapsed
	epoch := int64(0)
	var renewing []leaseFigures
	for _, ttl := range leaseRenewTTLs {
		epoch++
		sim.send(b, fmt.Sprintf("renew %d %d %s", epoch, leaseClaimsPerNode, ttl/3))
		// Every agent renewed once: the renewals run at their rate.
		sim.await(b, "renewing", ttl/3+time.Minute)
		f := measureLeases(b, self, sim)
		elapsed += f.elapsed
		renewing = append(renewing, f)
	}
	epoch++
	sim.send(b, fmt.Sprintf("renew %d 0 0s", epoch))
	sim.await(b, "renewing", time.Minute)
	after := measureLeases(b, self, sim)
	elapsed += after.elapsed
	idx1 := r.AppliedIndex()

	hbCPU := (before.cpu + after.cpu) / 2
	b.ReportMetric(hbCPU, "leader_heartbeats_cpu_%core")
	b.ReportMetric(hbCPU-idleCPU, "leader_heartbeats_cpu_over_idle_%core")
	b.ReportMetric((before.heartbeats+after.heartbeats)/2, "heartbeats/s")
	for i, f := range renewing {
		suffix := ""
		if i > 0 {
			suffix = fmt.Sprintf("_ttl%s", leaseRenewTTLs[i])
		}
		b.ReportMetric(f.cpu-hbCPU, "lease_renewal_cpu_%core"+suffix)
		b.ReportMetric(f.calls, "renewals/s"+suffix)
		b.ReportMetric(f.claims, "claims_renewed/s"+suffix)
		b.ReportMetric((f.cpu-hbCPU)/100*1e6/f.calls, "leader_cpu_us/renewal"+suffix)
		// Every call renews each of the node's workloads: a lost one is
		// an expired (or released) claim.
		if f.lost > 0 || f.missed > 0 || f.failures > 0 {
			b.Errorf("renewals every %s: %d workloads lost, %d neither renewed nor lost, %d calls failed; want every workload renewed",
				leaseRenewTTLs[i]/3, f.lost, f.missed, f.failures)
		}
	}
	b.ReportMetric(float64(idx1-idx0)/elapsed.Seconds(), "steady_raft_applies/s")
	if idx1 != idx0 {
		b.Errorf("raft applied %d entries at steady state (index %d to %d), want none; %s", idx1-idx0, idx0, idx1,
			writtenSince(ctx, b, c.Control(leader.Index), srv.State(), idx0))
	}
	if n := settledLeasedClaims(srv); n != leaseNodes*leaseClaimsPerNode {
		b.Errorf("%d leased claims taken and mounted after the renewals, want %d", n, leaseNodes*leaseClaimsPerNode)
	}
}

// leaseVolumeID is the id of the volume node i's workload k claims.
func leaseVolumeID(i, k int) string { return fmt.Sprintf("vol-%05d-%d", i, k) }

// seedLeasedClaims registers leaseClaimsPerNode volumes for each node and
// records a leased claim of each by the node's workload, taken and
// mounted, as ClaimVolume records them: claim_take, then the claim_step of
// the mount, built by package rules and written through raft on the
// leader. The simulated agents mount nothing, so the claims skip the
// calls to them; the volume watcher finds the claims finished.
func seedLeasedClaims(ctx context.Context, b *testing.B, srv *server.Server, ctl csisupdv1.ControlClient) {
	b.Helper()
	jobs := make(chan [2]int)
	errs := make(chan error, leaseSeedInFlight)
	var wg sync.WaitGroup
	for range leaseSeedInFlight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				if err := seedLeasedClaim(ctx, srv, ctl, j[0], j[1]); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
feed:
	for i := range leaseNodes {
		for k := range leaseClaimsPerNode {
			select {
			case jobs <- [2]int{i, k}:
			case err := <-errs:
				errs <- err
				break feed
			}
		}
	}
	close(jobs)
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatalf("seed leased claims: %v", err)
	}
}

// seedLeasedClaim registers node i's k-th volume and writes its claim.
func seedLeasedClaim(ctx context.Context, srv *server.Server, ctl csisupdv1.ControlClient, i, k int) error {
	nodeID, workload, volID := simNodeID(i), simWorkloadID(k), leaseVolumeID(i, k)
	if _, err := ctl.RegisterVolume(ctx, &csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{
		Id: volID, PluginId: leasePlugin, ExternalId: volID,
	}}); err != nil {
		return fmt.Errorf("register volume %s: %w", volID, err)
	}
	v := srv.State().Volume(volID)
	if v == nil {
		return fmt.Errorf("volume %s: not on the leader after its registration", volID)
	}
	claim, err := rules.Admit(srv.State(), v, &csisupdv1.VolumeClaimRequest{
		Id: volID, NodeId: nodeID, WorkloadId: workload, LeaseTtl: durationpb.New(leaseTTL),
	}, timestamppb.Now())
	if err != nil {
		return fmt.Errorf("admit claim of volume %s: %w", volID, err)
	}
	if err := applyEntry(srv, &statepb.LogEntry{Command: &statepb.LogEntry_ClaimTake{ClaimTake: rules.Take(v, claim)}}); err != nil {
		return fmt.Errorf("take claim of volume %s: %w", volID, err)
	}
	v = srv.State().Volume(volID)
	if _, claim = rules.Find(v, nodeID, workload); claim == nil {
		return fmt.Errorf("claim of volume %s: not stored after it was taken", volID)
	}
	mount := rules.Mounted(v, claim, false, nil, "/bench/publish/"+volID+"/"+workload, "/bench/staging/"+volID)
	if err := applyEntry(srv, &statepb.LogEntry{Command: &statepb.LogEntry_ClaimStep{ClaimStep: mount}}); err != nil {
		return fmt.Errorf("record mount of volume %s: %w", volID, err)
	}
	return nil
}

// applyEntry writes e through srv's raft, as the leader's own writes go,
// and returns the error the FSM refused it with.
func applyEntry(srv *server.Server, e *statepb.LogEntry) error {
	e.Time = timestamppb.Now()
	data, err := fsm.Encode(e)
	if err != nil {
		return err
	}
	f := srv.Raft().Apply(data, 10*time.Second)
	if err := f.Error(); err != nil {
		return fmt.Errorf("raft apply: %w", err)
	}
	if res, ok := f.Response().(fsm.Result); ok && res.Err != nil {
		return res.Err
	}
	return nil
}

// settledLeasedClaims counts the seeded claims that srv's state holds
// taken, mounted, leased and not being released.
func settledLeasedClaims(srv *server.Server) int {
	n := 0
	for _, v := range srv.State().Volumes(leasePlugin) {
		for _, c := range v.GetClaims() {
			if c.GetState() == rules.StateTaken && c.GetMounted() && c.GetLeaseTtl().AsDuration() == leaseTTL && c.GetReleaseReason() == "" {
				n++
			}
		}
	}
	return n
}
