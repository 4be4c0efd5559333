//go:build fault

// The long fault tests: 20 formations, linearizability under repeated
// leader kills, and 2,000 heartbeating agents. Run them with
//
//	go test -race -tags fault -run 'TestFormationRepeated|TestLinearizable|TestTwoThousand' ./internal/server/
package server_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testutil"
)

func TestFormationRepeated(t *testing.T) {
	const rounds = 20
	var total time.Duration
	for i := range rounds {
		t.Run(fmt.Sprintf("round-%02d", i), func(t *testing.T) {
			start := time.Now()
			c := testcluster.New(t, testcluster.Config{Servers: 3})
			leader := checkFormed(t, c, 3)
			total += time.Since(start)
			for _, m := range c.Members() {
				if got := m.Server().Leader(); got != leader.ID {
					t.Fatalf("%s follows %q, want %s", m.ID, got, leader.ID)
				}
			}
		})
	}
	t.Logf("%d formations, mean time to a single leader %v", rounds, total/rounds)
}

// volOp is one operation of the linearizability history.
type volOp struct {
	kind string // create, delete, get
	id   string
}

// Outputs of volume operations; unknown means the call failed in a way
// that leaves its effect open.
const (
	outOK       = "ok"
	outNotFound = "notfound"
	outFound    = "found"
	outUnknown  = "unknown"
)

var volumeModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byID := map[string][]porcupine.Operation{}
		for _, op := range history {
			id := op.Input.(volOp).id
			byID[id] = append(byID[id], op)
		}
		var out [][]porcupine.Operation
		for _, ops := range byID {
			out = append(out, ops)
		}
		return out
	},
	Init: func() interface{} { return false },
	Step: func(state, input, output interface{}) (bool, interface{}) {
		exists, in, out := state.(bool), input.(volOp), output.(string)
		switch in.kind {
		case "create":
			return out == outOK || out == outUnknown, true
		case "delete":
			switch out {
			case outOK:
				return exists, false
			case outNotFound:
				return !exists, false
			default:
				return true, false
			}
		default: // get
			return (out == outFound) == exists, exists
		}
	},
	DescribeOperation: func(input, output interface{}) string {
		in := input.(volOp)
		return fmt.Sprintf("%s(%s) -> %s", in.kind, in.id, output)
	},
}

func TestLinearizableVolumesUnderLeaderKills(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 3})
	checkFormed(t, c, 3)
	agent := startFakeAgent(t, "node-a")
	startNode(t, "node-a", agent.addr, c.RPCAddrs(), monolith("p1", "node-a"))
	ctl := []csisupdv1.ControlClient{c.Control(0), c.Control(1), c.Control(2)}
	testutil.WaitFor(t, 10*time.Second, "healthy controller", func() bool {
		p := pluginOf(t, ctl[0], "p1")
		return p != nil && p.GetControllersHealthy() == 1
	})

	var (
		mu      sync.Mutex
		history []porcupine.Operation
		base    = time.Now()
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		acked   atomic.Int64
	)
	const clients = 4
	ids := []string{"v0", "v1", "v2", "v3"}
	for cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(cl), 7))
			for {
				select {
				case <-stop:
					return
				default:
				}
				in := volOp{kind: []string{"create", "delete", "get", "get"}[rng.IntN(4)], id: ids[rng.IntN(len(ids))]}
				target := ctl[rng.IntN(len(ctl))]
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				call := time.Since(base).Nanoseconds()
				out := runVolOp(ctx, target, in)
				ret := time.Since(base).Nanoseconds()
				cancel()
				if out == outUnknown {
					time.Sleep(20 * time.Millisecond) // client backoff, not synchronisation
					if in.kind == "get" {
						continue // a failed read has no effect
					}
					ret = 1 << 62 // it may take effect at any later time
				} else if in.kind != "get" {
					acked.Add(1)
				}
				mu.Lock()
				history = append(history, porcupine.Operation{ClientId: cl, Input: in, Call: call, Output: out, Return: ret})
				mu.Unlock()
			}
		}()
	}

	const kills = 8
	for k := range kills {
		// Let the clients make progress between kills.
		want := acked.Load() + 15
		testutil.WaitFor(t, 30*time.Second, "acknowledged writes before the next kill", func() bool { return acked.Load() >= want })
		old := c.WaitForLeader(t, 30*time.Second)
		start := time.Now()
		c.Kill(old.Index)
		next := c.WaitForLeader(t, 30*time.Second)
		t.Logf("kill %d: leader %s -> %s in %v", k+1, old.ID, next.ID, time.Since(start))
		c.Restart(old.Index)
		testutil.WaitFor(t, 30*time.Second, "killed server to rejoin", func() bool {
			s := c.Member(old.Index).Server()
			return s != nil && s.Leader() == next.ID && s.AppliedIndex() >= next.Server().AppliedIndex()-1
		})
	}
	close(stop)
	wg.Wait()

	// Final consistent reads: every acknowledged write must be visible.
	c.WaitForLeader(t, 30*time.Second)
	for _, id := range ids {
		var out string
		testutil.WaitFor(t, 20*time.Second, "final read of "+id, func() bool {
			call := time.Since(base).Nanoseconds()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			out = runVolOp(ctx, ctl[0], volOp{kind: "get", id: id})
			if out == outUnknown {
				return false
			}
			history = append(history, porcupine.Operation{ClientId: clients, Input: volOp{kind: "get", id: id}, Call: call, Output: out, Return: time.Since(base).Nanoseconds()})
			return true
		})
	}
	t.Logf("failed calls with unknown outcome: %v", errCodes.m)
	t.Logf("history: %d operations, %d acknowledged writes, %d leader kills", len(history), acked.Load(), kills)
	if acked.Load() < 100 {
		t.Fatalf("only %d acknowledged writes: the history is too thin to mean anything", acked.Load())
	}
	res := porcupine.CheckOperationsTimeout(volumeModel, history, time.Minute)
	if res != porcupine.Ok {
		t.Fatalf("history is not linearizable: %v", res)
	}
}

func runVolOp(ctx context.Context, cl csisupdv1.ControlClient, in volOp) string {
	var err error
	switch in.kind {
	case "create":
		_, err = cl.CreateVolume(ctx, &csisupdv1.VolumeCreateRequest{Id: in.id, PluginId: "p1"})
		if err == nil {
			return outOK
		}
	case "delete":
		_, err = cl.DeleteVolume(ctx, &csisupdv1.VolumeDeleteRequest{Id: in.id})
		if err == nil {
			return outOK
		}
		if status.Code(err) == codes.NotFound {
			return outNotFound
		}
	default:
		_, err = cl.GetVolume(ctx, &csisupdv1.VolumeGetRequest{Id: in.id})
		if err == nil {
			return outFound
		}
		if status.Code(err) == codes.NotFound {
			return outNotFound
		}
	}
	errCodes.Add(in.kind+": "+status.Code(err).String(), 1)
	return outUnknown
}

// errCodes counts failed calls by operation and code, for the log.
var errCodes = newCounter()

type counter struct {
	mu sync.Mutex
	m  map[string]int
}

func newCounter() *counter { return &counter{m: map[string]int{}} }

func (c *counter) Add(k string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[k] += n
}

func TestTwoThousandAgentsHeartbeat(t *testing.T) {
	const agents = 2000
	c := testcluster.New(t, testcluster.Config{Servers: 3, Configure: func(_ int, cfg *server.Config) {
		cfg.MinHeartbeatTTL = 3 * time.Second
		cfg.HeartbeatGrace = 2 * time.Second
		cfg.MaxHeartbeatsPerSecond = 300 // TTL 6.7 s plus stagger for 2,000 nodes
		cfg.FailoverHeartbeatTTL = 30 * time.Second
	}})
	leader := checkFormed(t, c, 3)
	clients := []csisupdv1.ClusterClient{
		csisupdv1.NewClusterClient(c.Conn(0)), csisupdv1.NewClusterClient(c.Conn(1)), csisupdv1.NewClusterClient(c.Conn(2)),
	}
	ctl := c.Control(leader.Index)

	// Every simulated agent registers (32 at a time, through all servers),
	// then heartbeats at half the TTL it is given, as an agent would.
	beats := make([]atomic.Int64, agents)
	registered := make([]atomic.Bool, agents)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stopOne := make(chan struct{})
	sem := make(chan struct{}, 32)
	var hbWG sync.WaitGroup
	for i := range agents {
		hbWG.Add(1)
		go func() {
			defer hbWG.Done()
			id := fmt.Sprintf("sim-%04d", i)
			ttl := time.Second
			sem <- struct{}{}
			for {
				resp, err := clients[i%3].NodeRegister(asNode(ctx, id), &csisupdv1.NodeRegisterRequest{
					NodeId: id, Name: id, Address: "127.0.0.1:1",
					Plugins: []*csisupdv1.Plugin{{Id: "sim", Type: "node", Healthy: true, NodeId: id}},
				})
				if err == nil {
					ttl = time.Duration(resp.GetHeartbeatTtlMs()) * time.Millisecond / 2
					break
				}
				if ctx.Err() != nil {
					<-sem
					return
				}
			}
			<-sem
			registered[i].Store(true)
			for {
				t := time.NewTimer(ttl)
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-stopOne:
					if i == 0 {
						t.Stop()
						return
					}
					<-t.C
				case <-t.C:
				}
				resp, err := clients[i%3].NodeHeartbeat(asNode(ctx, id), &csisupdv1.NodeHeartbeatRequest{NodeId: id})
				ttl = time.Second
				if err == nil {
					beats[i].Add(1)
					ttl = time.Duration(resp.GetHeartbeatTtlMs()) * time.Millisecond / 2
				}
			}
		}()
	}
	defer hbWG.Wait()
	defer cancel()
	testutil.WaitFor(t, 2*time.Minute, "every agent registered", func() bool {
		for i := range registered {
			if !registered[i].Load() {
				return false
			}
		}
		return true
	})

	allBeat := func(n int64) func() bool {
		return func() bool {
			for i := range beats {
				if beats[i].Load() < n {
					return false
				}
			}
			return true
		}
	}
	testutil.WaitFor(t, time.Minute, "first heartbeat of every agent", allBeat(1))
	before := leader.Server().AppliedIndex()
	testutil.WaitFor(t, 2*time.Minute, "two more heartbeats of every agent", allBeat(3))
	if after := leader.Server().AppliedIndex(); after != before {
		// Not every raft entry is an event (a new leader's no-op is
		// not): the listing of the writes ends with a deadline.
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		defer wcancel()
		ev, err := ctl.WatchEvents(wctx, &csisupdv1.ClusterEventWatchRequest{FromIndex: before})
		if err == nil {
			kinds := map[string]int{}
			for range after - before {
				e, err := ev.Recv()
				if err != nil {
					break
				}
				kinds[e.GetType()+" "+e.GetDescription()]++
			}
			t.Logf("writes during heartbeats: %v", kinds)
		}
		t.Fatalf("raft applied index grew from %d to %d during steady-state heartbeats of %d agents", before, after, agents)
	}
	t.Logf("%d agents: applied index stayed at %d over %d heartbeats", agents, before, sumBeats(beats))

	p := pluginOf(t, ctl, "sim")
	if p.GetNodesHealthy() != agents {
		t.Fatalf("%d of %d node instances healthy before stopping one agent", p.GetNodesHealthy(), agents)
	}
	close(stopOne)
	stopped := time.Now()
	testutil.WaitFor(t, time.Minute, "stopped agent's node down", func() bool {
		resp, err := ctl.GetNode(context.Background(), &csisupdv1.NodeGetRequest{Id: "sim-0000"})
		return err == nil && resp.GetNode().GetStatus() == state.NodeStatusDown
	})
	t.Logf("stopped agent marked down after %v", time.Since(stopped))
	p = pluginOf(t, ctl, "sim")
	if p.GetNodesHealthy() != agents-1 || p.GetNodesExpected() != agents {
		t.Fatalf("after one agent stopped: %d/%d healthy, want %d/%d", p.GetNodesHealthy(), p.GetNodesExpected(), agents-1, agents)
	}
}

func sumBeats(b []atomic.Int64) int64 {
	var n int64
	for i := range b {
		n += b[i].Load()
	}
	return n
}

// TestVolumeModelRejectsLostWrite checks the checker itself: a history
// that loses an acknowledged create must be rejected.
func TestVolumeModelRejectsLostWrite(t *testing.T) {
	op := func(kind, out string, call, ret int64) porcupine.Operation {
		return porcupine.Operation{Input: volOp{kind: kind, id: "v"}, Output: out, Call: call, Return: ret}
	}
	lost := []porcupine.Operation{op("create", outOK, 0, 1), op("get", outNotFound, 2, 3)}
	if porcupine.CheckOperations(volumeModel, lost) {
		t.Fatal("a lost acknowledged create was accepted")
	}
	ambiguous := []porcupine.Operation{op("create", outOK, 0, 1), op("delete", outUnknown, 2, 1<<62), op("get", outNotFound, 3, 4)}
	if !porcupine.CheckOperations(volumeModel, ambiguous) {
		t.Fatal("a delete of unknown outcome may have happened, but the history was rejected")
	}
}
