package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testutil"
)

// The 10,000-node cluster benchmark's sizes and windows.
const (
	clusterNodes          = 10000
	clusterNodePlugins    = 5
	clusterIdleWindow     = 5 * time.Second
	clusterSteadyWindow   = 30 * time.Second
	clusterListPageSize   = 100
	clusterListCalls      = 1000
	clusterLeaderKills    = 5
	clusterMaxHeartbeatsS = 1000 // TTLs of 10-20 s at 10,000 nodes
)

// clusterTuning is the servers' tuning for the benchmark: production
// timeouts, but MaxHeartbeatsPerSecond 1000 instead of 50, so that TTLs
// at 10,000 nodes are 10-20 s instead of 200-400 s and a failover is
// measured in seconds; and a failover TTL of 60 s instead of 5 min, which
// still leaves the agents 3 TTLs to find the new leader.
func clusterTuning(_ int, cfg *server.Config) {
	def := config.DefaultServerSettings()
	cfg.RPCTimeout, cfg.ApplyTimeout = def.RPCTimeout, def.ApplyTimeout
	cfg.DeadServerTimeout = def.DeadServerTimeout
	cfg.MinHeartbeatTTL, cfg.HeartbeatGrace = def.MinHeartbeatTTL, def.HeartbeatGrace
	cfg.MaxHeartbeatsPerSecond = clusterMaxHeartbeatsS
	cfg.FailoverHeartbeatTTL = time.Minute
}

// BenchmarkCluster10000 runs three real servers (raft and gRPC on
// loopback, on-disk raft stores) in this process and 10,000 simulated
// agents in a child process, each registering its node with five plugins
// through the Cluster API and then heartbeating at the TTL the leader
// returns. See the package documentation for what it reports and how the
// servers' CPU is told apart from the agents'.
func BenchmarkCluster10000(b *testing.B) {
	if testing.Short() {
		b.Skip("runs 10,000 simulated nodes for minutes")
	}
	for range b.N {
		runCluster10000(b)
	}
}

// simProcess is the child process of simulated agents and its output.
type simProcess struct {
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	lines    chan string
	stopOnce sync.Once
}

// startSimAgents starts nodes simulated agents with plugins plugins each
// in a child process, calling servers.
func startSimAgents(b *testing.B, servers []string, nodes, plugins int) *simProcess {
	b.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), simServersEnv+"="+strings.Join(servers, ","),
		simNodesEnv+"="+strconv.Itoa(nodes), simPluginsEnv+"="+strconv.Itoa(plugins))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	p := &simProcess{cmd: cmd, stdin: stdin, lines: make(chan string, 16)}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	b.Cleanup(p.stop)
	return p
}

// stop stops the agents and waits for their process to exit.
func (p *simProcess) stop() {
	p.stopOnce.Do(func() {
		p.stdin.Close() // the agents stop at the end of their input
		waitOrKill(p.cmd, 20*time.Second)
	})
}

// send writes one command line to the agents.
func (p *simProcess) send(b *testing.B, line string) {
	b.Helper()
	if _, err := fmt.Fprintln(p.stdin, line); err != nil {
		b.Fatalf("simulated agents: %v", err)
	}
}

// await returns the fields of the next output line starting with word;
// it fails the benchmark after timeout or when the agents exit.
func (p *simProcess) await(b *testing.B, word string, timeout time.Duration) []string {
	b.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				b.Fatalf("simulated agents exited before printing %q", word)
			}
			if f := strings.Fields(line); len(f) > 0 && f[0] == word {
				return f[1:]
			}
		case <-deadline:
			b.Fatalf("simulated agents did not print %q within %v", word, timeout)
		}
	}
}

// heartbeatCount asks the agents for their successful heartbeats so far.
func (p *simProcess) heartbeatCount(b *testing.B) int64 {
	b.Helper()
	p.send(b, "count")
	f := p.await(b, "count", 10*time.Second)
	n, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		b.Fatalf("simulated agents: count %v", f)
	}
	return n
}

// cpuPercent returns pid's CPU over fn, in percent of one core, and how
// long fn ran.
func cpuPercent(b *testing.B, pid int, fn func()) (float64, time.Duration) {
	b.Helper()
	c0, t0 := testutil.ProcessCPU(b, pid), time.Now()
	fn()
	c1, elapsed := testutil.ProcessCPU(b, pid), time.Since(t0)
	return 100 * (c1 - c0).Seconds() / elapsed.Seconds(), elapsed
}

func runCluster10000(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	floor := measureHeartbeatFloor(b)
	b.ReportMetric(floor, "floor_cpu_us/heartbeat")
	c := startBenchServers(b)
	self := os.Getpid()

	// The three servers idle: raft's own heartbeats and the leader's
	// loops, the floor under every figure below.
	idleCPU, _ := cpuPercent(b, self, func() { time.Sleep(clusterIdleWindow) }) // a measurement window
	b.ReportMetric(idleCPU, "servers_idle_cpu_%core")

	// Registration: from the agents' start to the last node registered.
	sim := startSimAgents(b, c.RPCAddrs(), clusterNodes, clusterNodePlugins)
	var regSeconds float64
	regCPU, _ := cpuPercent(b, self, func() {
		f := sim.await(b, "registered", 5*time.Minute)
		regSeconds, _ = strconv.ParseFloat(f[0], 64)
	})
	b.ReportMetric(regSeconds, "registration_s")
	b.ReportMetric(float64(clusterNodes)/regSeconds, "registrations/s")
	b.ReportMetric(regCPU, "servers_registration_cpu_%core")
	leader := c.WaitForLeader(b, time.Minute)
	nodes := listAllNodes(ctx, b, c.Control(leader.Index))
	if len(nodes) != clusterNodes {
		b.Fatalf("%d nodes registered, want %d", len(nodes), clusterNodes)
	}

	// Steady state: heartbeats only. Raft must apply nothing: heartbeats
	// are held in the leader's memory. First with the agents spread over
	// the three servers, as they are in production (a follower forwards
	// its agents' heartbeats to the leader), then with every agent calling
	// the leader, so that the process's CPU over its idle floor is the
	// leader's own.
	r := leader.Server().Raft()
	idx0 := r.AppliedIndex()
	spread := measureSteady(b, self, sim)
	b.ReportMetric(spread.serversCPU, "servers_steady_cpu_%core")
	b.ReportMetric(spread.agentsCPU, "agents_steady_cpu_%core")
	b.ReportMetric(spread.heartbeats, "heartbeats/s")
	b.ReportMetric((spread.serversCPU-idleCPU)/100*1e6/spread.heartbeats, "servers_cpu_us/heartbeat")
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(testutil.ProcessRSS(b, self))/(1<<20), "servers_rss_MiB")
	b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "servers_heap_inuse_MiB")

	// ListNodes, one page of 100, from the leader: a page at every
	// position of the list in turn.
	ctl := c.Control(leader.Index)
	tokens := []string{""}
	for {
		resp, err := ctl.ListNodes(ctx, &csisupdv1.NodeListRequest{PageSize: clusterListPageSize, NextToken: tokens[len(tokens)-1]})
		if err != nil {
			b.Fatal(err)
		}
		if resp.GetNextToken() == "" {
			break
		}
		tokens = append(tokens, resp.GetNextToken())
	}
	if len(tokens) != clusterNodes/clusterListPageSize {
		b.Fatalf("%d pages of %d, want %d", len(tokens), clusterListPageSize, clusterNodes/clusterListPageSize)
	}
	lat := make([]time.Duration, 0, clusterListCalls)
	for i := range clusterListCalls {
		t0 := time.Now()
		resp, err := ctl.ListNodes(ctx, &csisupdv1.NodeListRequest{PageSize: clusterListPageSize, NextToken: tokens[i%len(tokens)]})
		lat = append(lat, time.Since(t0))
		if err != nil || len(resp.GetNodes()) != clusterListPageSize {
			b.Fatalf("ListNodes page %d: %d nodes, %v", i%len(tokens), len(resp.GetNodes()), err)
		}
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "listnodes_page100_p50_ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "listnodes_page100_p99_ms")

	// Every agent on the leader; the move takes one TTL.
	sim.send(b, fmt.Sprintf("assign 1 %d", leader.Index))
	sim.await(b, "assigned", 2*time.Minute)
	stopProfile := startLeaderProfile(b)
	pinned := measureSteady(b, self, sim)
	stopProfile()
	b.ReportMetric(pinned.serversCPU, "leader_steady_cpu_%core")
	b.ReportMetric(pinned.serversCPU-idleCPU, "leader_steady_cpu_over_idle_%core")
	leaderUs := (pinned.serversCPU - idleCPU) / 100 * 1e6 / pinned.heartbeats
	b.ReportMetric(leaderUs, "leader_cpu_us/heartbeat")
	b.ReportMetric(leaderUs/floor, "leader_cpu_x_floor")
	b.ReportMetric(floor*pinned.heartbeats/1e4, "floor_cpu_%core_at_leader_rate")
	b.ReportMetric(pinned.heartbeats, "leader_heartbeats/s")
	applies := float64(r.AppliedIndex()-idx0) / (spread.elapsed + pinned.elapsed).Seconds()
	b.ReportMetric(applies, "steady_raft_applies/s")
	if idx1 := r.AppliedIndex(); idx1 != idx0 {
		b.Errorf("raft applied %d entries at steady state (index %d to %d), want none; %s", idx1-idx0, idx0, idx1,
			writtenSince(ctx, b, ctl, leader.Server().State(), idx0))
	}
	sim.send(b, "assign 2 -1")
	sim.await(b, "assigned", 2*time.Minute)

	// Leader kills: the time to a new leader, the time until every node
	// heartbeated to it, and the nodes marked down (none may be).
	var elections, heals []float64
	down := 0
	for k := range clusterLeaderKills {
		old := c.WaitForLeader(b, time.Minute)
		killed := time.Now()
		c.Kill(old.Index)
		sim.send(b, fmt.Sprintf("mark %d", k))
		leader = c.WaitForLeader(b, time.Minute)
		elections = append(elections, time.Since(killed).Seconds())
		// Every node's first heartbeat started after the mark, which
		// follows the kill, was answered by the new leader.
		if f := sim.await(b, "healed", 3*time.Minute); f[0] != strconv.Itoa(k) {
			b.Fatalf("healed %v after mark %d", f, k)
		}
		heals = append(heals, time.Since(killed).Seconds())
		// A node marked down and back up since the kill has a status
		// change newer than the kill.
		for _, n := range listAllNodes(ctx, b, c.Control(leader.Index)) {
			if n.GetStatus() != state.NodeStatusReady || n.GetStatusUpdatedAt().AsTime().After(killed) {
				down++
			}
		}
		c.Restart(old.Index)
		want := leader.Server().Raft().AppliedIndex()
		testutil.WaitFor(b, time.Minute, "the restarted server to catch up", func() bool {
			s := old.Server()
			return s != nil && s.Raft().AppliedIndex() >= want && c.Leader() != nil
		})
	}
	b.ReportMetric(mean(elections), "failover_election_mean_s")
	b.ReportMetric(slices.Max(elections), "failover_election_max_s")
	b.ReportMetric(mean(heals), "failover_all_heartbeated_mean_s")
	b.ReportMetric(slices.Max(heals), "failover_all_heartbeated_max_s")
	b.ReportMetric(float64(down), "failover_nodes_marked_down")
	if down > 0 {
		b.Errorf("%d nodes were marked down over %d leader kills, want none", down, clusterLeaderKills)
	}
}

// startBenchServers starts the three servers of the cluster benchmarks,
// tuned by clusterTuning, serving with an agent's gRPC server options
// (its metrics, authorizer, stream workers and windows), as a
// real server does, and waits until they have formed: every server joined
// and recorded (writes that would otherwise land in a measurement
// window). Their errors are shown only when the run fails: each leader
// kill makes raft log its failed heartbeats to the dead server.
func startBenchServers(b *testing.B) *testcluster.Cluster {
	logs := &testutil.SyncBuffer{}
	b.Cleanup(func() {
		if b.Failed() {
			b.Logf("server logs:\n%s", logs)
		}
	})
	c := testcluster.New(b, testcluster.Config{
		Servers:       3,
		Configure:     clusterTuning,
		ServerOptions: testcluster.AgentServerOptions(b),
		Logger:        hclog.New(&hclog.LoggerOptions{Level: hclog.Error, Output: logs}),
	})
	c.WaitForLeader(b, time.Minute)
	testutil.WaitFor(b, time.Minute, "every server recorded", func() bool {
		l := c.Leader()
		return l != nil && len(l.Server().State().Servers()) == 3
	})
	return c
}

// listAllNodes follows ListNodes' pages of 1000 to the end.
func listAllNodes(ctx context.Context, b *testing.B, ctl csisupdv1.ControlClient) []*csisupdv1.ClusterNode {
	b.Helper()
	var out []*csisupdv1.ClusterNode
	token := ""
	for {
		resp, err := ctl.ListNodes(ctx, &csisupdv1.NodeListRequest{PageSize: 1000, NextToken: token})
		if err != nil {
			b.Fatal(err)
		}
		out = append(out, resp.GetNodes()...)
		if token = resp.GetNextToken(); token == "" {
			return out
		}
	}
}

func mean(xs []float64) float64 {
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}

// leaderProfileEnv names a file that receives a CPU profile of the
// window in which every agent calls the leader: the leader's own work,
// over the idle floor of the three servers.
const leaderProfileEnv = "CSISUPD_BENCH_LEADER_PROFILE"

// startLeaderProfile starts the CPU profile of leaderProfileEnv, when it
// is set, and returns what stops it.
func startLeaderProfile(b *testing.B) (stop func()) {
	b.Helper()
	name := os.Getenv(leaderProfileEnv)
	if name == "" {
		return func() {}
	}
	f, err := os.Create(name)
	if err != nil {
		b.Fatalf("leader profile: %v", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		b.Fatalf("leader profile: %v", err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Errorf("leader profile: %v", err)
		}
	}
}

// steadyFigures are the figures of one steady-state window.
type steadyFigures struct {
	serversCPU, agentsCPU float64 // percent of one core
	heartbeats            float64 // successful heartbeats per second
	elapsed               time.Duration
}

// measureSteady measures this process's (the servers') and the agents'
// CPU and the agents' heartbeat rate over clusterSteadyWindow.
func measureSteady(b *testing.B, self int, sim *simProcess) steadyFigures {
	b.Helper()
	var f steadyFigures
	hb0 := sim.heartbeatCount(b)
	f.serversCPU, f.elapsed = cpuPercent(b, self, func() {
		f.agentsCPU, _ = cpuPercent(b, sim.cmd.Process.Pid, func() { time.Sleep(clusterSteadyWindow) }) // a measurement window
	})
	f.heartbeats = float64(sim.heartbeatCount(b)-hb0) / f.elapsed.Seconds()
	return f
}

// writtenSince describes what the state shows written after index: the
// nodes and servers records modified, to explain unexpected raft writes.
func writtenSince(ctx context.Context, b *testing.B, ctl csisupdv1.ControlClient, st *state.Store, index uint64) string {
	b.Helper()
	var parts []string
	for _, n := range listAllNodes(ctx, b, ctl) {
		if n.GetModifyIndex() > index {
			parts = append(parts, fmt.Sprintf("node %s at %d: %s (%s)", n.GetId(), n.GetModifyIndex(), n.GetStatus(), n.GetStatusDescription()))
		}
	}
	if len(parts) > 10 {
		parts = append(parts[:10], fmt.Sprintf("and %d more nodes", len(parts)-10))
	}
	return fmt.Sprintf("%d servers recorded; latest state index %d; %s", len(st.Servers()), st.LatestIndex(), strings.Join(parts, "; "))
}
