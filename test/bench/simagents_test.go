package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// Environment of the simulated agents' process (see runSimAgents): the
// benchmark re-runs its own test binary with these set, so the agents'
// CPU is not counted in the servers' process.
const (
	simServersEnv = "CSISUPD_BENCH_SIM_SERVERS" // comma-separated gRPC addresses
	simNodesEnv   = "CSISUPD_BENCH_SIM_NODES"
	simPluginsEnv = "CSISUPD_BENCH_SIM_PLUGINS"
)

// Simulated agents' settings.
const (
	// simConnsPerServer connections to each server are shared by every
	// simulated agent, as a few real connections would carry many.
	simConnsPerServer = 4
	// simRegisterInFlight bounds concurrent registrations: 10,000 agents
	// do not boot in the same millisecond.
	simRegisterInFlight = 256
	// simRPCTimeout bounds one call, as the agent's RPC timeout does.
	simRPCTimeout = 10 * time.Second
)

// TestMain runs the simulated agents instead of the tests when the
// benchmark started this binary as its agents' process.
func TestMain(m *testing.M) {
	if servers := os.Getenv(simServersEnv); servers != "" {
		nodes, err1 := strconv.Atoi(os.Getenv(simNodesEnv))
		plugins, err2 := strconv.Atoi(os.Getenv(simPluginsEnv))
		if err1 != nil || err2 != nil {
			fmt.Fprintf(os.Stderr, "simulated agents: bad %s or %s\n", simNodesEnv, simPluginsEnv)
			os.Exit(2)
		}
		os.Exit(runSimAgents(strings.Split(servers, ","), nodes, plugins, os.Stdin, os.Stdout))
	}
	os.Exit(m.Run())
}

// simMark is one failover measurement: every agent's first successful
// heartbeat (or registration) started after at is counted once.
type simMark struct {
	seq    int64
	at     time.Time
	healed atomic.Int64
}

// simAssign is where the agents send their calls: every agent to one
// server, or (server -1) agent i to server i mod the server count, as
// agents given the servers in different orders spread over them.
type simAssign struct {
	epoch   int64
	server  int
	applied atomic.Int64
}

// simAgents is the shared state of the simulated agents.
type simAgents struct {
	servers [][]csisupdv1.ClusterClient // per server, simConnsPerServer clients
	nodes   int
	plugins int
	regSem  chan struct{}

	outMu sync.Mutex
	out   io.Writer

	started    time.Time
	registered atomic.Int64
	heartbeats atomic.Int64
	failures   atomic.Int64
	mark       atomic.Pointer[simMark]
	assign     atomic.Pointer[simAssign]
	renew      atomic.Pointer[simRenew]
	// Renewal figures: successful NodeRenewClaims calls, the claims they
	// renewed, the workloads they answered lost, the workloads they
	// answered neither renewed nor lost, and failed calls.
	renewals, renewed, lost, missed, renewFailures atomic.Int64
}

// simRenew is the agents' renewal mode: every agent renews the leases of
// its workloads (simWorkloadID 0 to workloads-1) in one NodeRenewClaims
// every interval; interval 0 stops the renewals. Storing the next mode
// closes changed, which wakes every agent's renewal loop.
type simRenew struct {
	epoch     int64
	workloads int
	interval  time.Duration
	changed   chan struct{}
	// started counts the agents that took the mode on: made their first
	// successful renewal under it, or stopped.
	started atomic.Int64
}

// simNodeID is the node id of simulated agent i.
func simNodeID(i int) string { return fmt.Sprintf("node-%05d", i) }

// simWorkloadID is the id of a node's k-th workload.
func simWorkloadID(k int) string { return fmt.Sprintf("w%d", k) }

func (s *simAgents) printf(format string, args ...any) {
	s.outMu.Lock()
	defer s.outMu.Unlock()
	fmt.Fprintf(s.out, format+"\n", args...)
}

// runSimAgents runs nodes lightweight agents against servers until in is
// closed. Each registers its node with plugins plugins through the Cluster
// API, as the node client does, then heartbeats at the TTL the server
// returns, moving to the next server on a failure. On stdout it prints
// "registered SECONDS" once every node registered, "count HEARTBEATS
// FAILURES" for each "count" line read, "healed SEQ SECONDS" once every
// node heartbeated after a "mark SEQ" line read, and "assigned EPOCH"
// once every agent made a call under an "assign EPOCH SERVER" line read
// (SERVER an index into servers, or -1 to spread them again). Under a
// "renew EPOCH WORKLOADS INTERVAL" line read, every agent calls
// NodeRenewClaims for its workloads every INTERVAL (a Go duration; 0
// stops), each at its own phase, and "renewing EPOCH" is printed once
// every agent renewed under it (or stopped); "renewals CALLS CLAIMS LOST
// MISSED FAILURES" answers each "renewals" line read.
func runSimAgents(servers []string, nodes, plugins int, in io.Reader, out io.Writer) int {
	s := &simAgents{nodes: nodes, plugins: plugins, out: out, regSem: make(chan struct{}, simRegisterInFlight), started: time.Now()}
	var conns []*grpc.ClientConn
	for _, addr := range servers {
		var clients []csisupdv1.ClusterClient
		for range simConnsPerServer {
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithConnectParams(grpc.ConnectParams{
					Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
					MinConnectTimeout: time.Second,
				}))
			if err != nil {
				fmt.Fprintf(os.Stderr, "simulated agents: dial %s: %v\n", addr, err)
				return 1
			}
			conns = append(conns, conn)
			clients = append(clients, csisupdv1.NewClusterClient(conn))
		}
		s.servers = append(s.servers, clients)
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	s.mark.Store(&simMark{seq: -1, at: time.Now().Add(time.Hour)})
	s.assign.Store(&simAssign{server: -1})
	s.renew.Store(&simRenew{changed: make(chan struct{})})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Add(2)
		go func() {
			defer wg.Done()
			s.runAgent(ctx, i)
		}()
		go func() {
			defer wg.Done()
			s.runRenewals(ctx, i)
		}()
	}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 1 && f[0] == "count":
			s.printf("count %d %d", s.heartbeats.Load(), s.failures.Load())
		case len(f) == 2 && f[0] == "mark":
			seq, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				fmt.Fprintf(os.Stderr, "simulated agents: bad mark %q\n", sc.Text())
				continue
			}
			s.mark.Store(&simMark{seq: seq, at: time.Now()})
		case len(f) == 3 && f[0] == "assign":
			epoch, err1 := strconv.ParseInt(f[1], 10, 64)
			server, err2 := strconv.Atoi(f[2])
			if err1 != nil || err2 != nil || server >= len(servers) {
				fmt.Fprintf(os.Stderr, "simulated agents: bad assign %q\n", sc.Text())
				continue
			}
			s.assign.Store(&simAssign{epoch: epoch, server: server})
		case len(f) == 4 && f[0] == "renew":
			epoch, err1 := strconv.ParseInt(f[1], 10, 64)
			workloads, err2 := strconv.Atoi(f[2])
			interval, err3 := time.ParseDuration(f[3])
			if err1 != nil || err2 != nil || err3 != nil || workloads < 0 || interval < 0 {
				fmt.Fprintf(os.Stderr, "simulated agents: bad renew %q\n", sc.Text())
				continue
			}
			old := s.renew.Swap(&simRenew{epoch: epoch, workloads: workloads, interval: interval, changed: make(chan struct{})})
			close(old.changed)
		case len(f) == 1 && f[0] == "renewals":
			s.printf("renewals %d %d %d %d %d", s.renewals.Load(), s.renewed.Load(), s.lost.Load(), s.missed.Load(), s.renewFailures.Load())
		}
	}
	cancel()
	wg.Wait()
	return 0
}

// runAgent is one simulated agent: register, then heartbeat at the TTL.
func (s *simAgents) runAgent(ctx context.Context, i int) {
	id := simNodeID(i)
	var plugins []*csisupdv1.Plugin
	for p := range s.plugins {
		plugins = append(plugins, &csisupdv1.Plugin{
			Id: fmt.Sprintf("plugin-%d", p), Type: "node", Healthy: true, HealthState: "healthy",
			HealthDescription: "probe ok", VendorName: "csi.bench", VendorVersion: "1.0.0", NodeId: id,
			NodeCapabilities: []string{"STAGE_UNSTAGE_VOLUME"},
		})
	}
	server := i % len(s.servers) // agents spread over the servers they are given
	conn := i % simConnsPerServer
	var lastMark int64 = -1
	everRegistered, registered := false, false
	var ttl time.Duration
	failed := 0
	call := func(fn func(context.Context, csisupdv1.ClusterClient) (int64, error)) (time.Duration, error) {
		cctx, cancel := context.WithTimeout(ctx, simRPCTimeout)
		defer cancel()
		ms, err := fn(cctx, s.servers[server][conn])
		return time.Duration(ms) * time.Millisecond, err
	}
	var epoch int64
	for ctx.Err() == nil {
		if a := s.assign.Load(); a.epoch != epoch {
			epoch, server = a.epoch, a.server
			if server < 0 {
				server = i % len(s.servers)
			}
			if a.applied.Add(1) == int64(s.nodes) {
				s.printf("assigned %d", a.epoch)
			}
		}
		started := time.Now()
		var err error
		if !registered {
			select {
			case s.regSem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			ttl, err = call(func(ctx context.Context, cl csisupdv1.ClusterClient) (int64, error) {
				resp, err := cl.NodeRegister(asNode(ctx, id), &csisupdv1.NodeRegisterRequest{NodeId: id, Name: id, Address: "127.0.0.1:1", Plugins: plugins})
				return resp.GetHeartbeatTtlMs(), err
			})
			<-s.regSem
			if err == nil {
				registered = true
				if !everRegistered {
					everRegistered = true
					if s.registered.Add(1) == int64(s.nodes) {
						s.printf("registered %.3f", time.Since(s.started).Seconds())
					}
				}
			}
		} else {
			ttl, err = call(func(ctx context.Context, cl csisupdv1.ClusterClient) (int64, error) {
				resp, err := cl.NodeHeartbeat(asNode(ctx, id), &csisupdv1.NodeHeartbeatRequest{NodeId: id})
				return resp.GetHeartbeatTtlMs(), err
			})
			if err == nil {
				s.heartbeats.Add(1)
			}
			if status.Code(err) == codes.NotFound {
				registered = false
				continue
			}
		}
		wait := ttl
		if err != nil {
			// The node client's rule: move on to the next server and back
			// off, with jitter, before calling again.
			s.failures.Add(1)
			server = (server + 1) % len(s.servers)
			failed++
			wait = min(time.Duration(failed)*250*time.Millisecond, 2*time.Second)
			wait += time.Duration(rand.Int64N(int64(wait)))
		} else {
			failed = 0
			if m := s.mark.Load(); m.seq != lastMark && started.After(m.at) {
				lastMark = m.seq
				if m.healed.Add(1) == int64(s.nodes) {
					s.printf("healed %d %.3f", m.seq, time.Since(m.at).Seconds())
				}
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// runRenewals is one simulated agent's lease renewals, as the node
// client's Hold renews them: one NodeRenewClaims for all of the node's
// workloads per interval, to the server its heartbeats go to; on a
// failure it moves to the next server and tries again at the next
// interval. An agent's first call under a mode comes at a random point of
// the first interval, so that the calls of all agents spread evenly.
func (s *simAgents) runRenewals(ctx context.Context, i int) {
	id := simNodeID(i)
	var epoch int64
	server := i % len(s.servers)
	conn := i % simConnsPerServer
	for {
		r := s.renew.Load()
		if r.interval == 0 {
			if r.started.Add(1) == int64(s.nodes) && r.epoch != 0 {
				s.printf("renewing %d", r.epoch)
			}
			select {
			case <-ctx.Done():
				return
			case <-r.changed:
				continue
			}
		}
		req := &csisupdv1.RenewClaimsRequest{NodeId: id}
		for k := range r.workloads {
			req.WorkloadIds = append(req.WorkloadIds, simWorkloadID(k))
		}
		wait := rand.N(r.interval)
		first := true
		for {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-r.changed:
				t.Stop()
			case <-t.C:
			}
			if ctx.Err() != nil {
				return
			}
			if s.renew.Load() != r {
				break
			}
			if a := s.assign.Load(); a.epoch != epoch {
				epoch, server = a.epoch, a.server
				if server < 0 {
					server = i % len(s.servers)
				}
			}
			wait = r.interval
			cctx, cancel := context.WithTimeout(ctx, simRPCTimeout)
			resp, err := s.servers[server][conn].NodeRenewClaims(asNode(cctx, id), req)
			cancel()
			if err != nil {
				s.renewFailures.Add(1)
				server = (server + 1) % len(s.servers)
				continue
			}
			s.renewals.Add(1)
			s.renewed.Add(int64(len(resp.GetRenewed())))
			s.lost.Add(int64(len(resp.GetLostWorkloadIds())))
			s.missed.Add(int64(missedWorkloads(req.GetWorkloadIds(), resp)))
			if first {
				first = false
				if r.started.Add(1) == int64(s.nodes) {
					s.printf("renewing %d", r.epoch)
				}
			}
		}
	}
}

// missedWorkloads counts the workloads a renewal asked for that its
// answer neither renewed nor reported lost.
func missedWorkloads(asked []string, resp *csisupdv1.RenewClaimsResponse) int {
	seen := map[string]bool{}
	for _, r := range resp.GetRenewed() {
		seen[r.GetWorkloadId()] = true
	}
	for _, w := range resp.GetLostWorkloadIds() {
		seen[w] = true
	}
	n := 0
	for _, w := range asked {
		if !seen[w] {
			n++
		}
	}
	return n
}

// testNodeSecret is the node secret a test gives node id.
func testNodeSecret(id string) string { return "test-node-secret-of-" + id }

// asNode returns ctx with the outgoing metadata of a call node id makes:
// its node secret, as its agent presents it.
func asNode(ctx context.Context, id string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, csisupdv1.NodeSecretMetadataKey, testNodeSecret(id))
}
