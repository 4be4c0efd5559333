package bench

import (
	"context"
	"math/rand/v2"
	"net"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/rpc"
	"github.com/csisupd/csisupd/internal/testutil"
)

// floorCluster is the floor under a leader's heartbeat: a Cluster service
// that keeps no state and checks nothing, answering NodeRegister and
// NodeHeartbeat with a TTL drawn as the leader draws it (the rate-scaled
// TTL plus up to as much again), so that the same agents call it at the
// leader's rate.
type floorCluster struct {
	csisupdv1.UnimplementedClusterServer
	ttl time.Duration // the rate-scaled TTL
}

func (f floorCluster) ttlMs() int64 { return (f.ttl + rand.N(f.ttl)).Milliseconds() }

func (f floorCluster) NodeRegister(context.Context, *csisupdv1.NodeRegisterRequest) (*csisupdv1.NodeRegisterResponse, error) {
	return &csisupdv1.NodeRegisterResponse{HeartbeatTtlMs: f.ttlMs()}, nil
}

func (f floorCluster) NodeHeartbeat(context.Context, *csisupdv1.NodeHeartbeatRequest) (*csisupdv1.NodeHeartbeatResponse, error) {
	return &csisupdv1.NodeHeartbeatResponse{HeartbeatTtlMs: f.ttlMs()}, nil
}

// measureHeartbeatFloor runs the 10,000 simulated agents against a bare
// gRPC server in this process, before any server of the benchmark runs:
// the agent's transport options (rpc.TransportOptions) and floorCluster,
// with no metrics, no authorizer and no state. It returns this process's
// CPU per heartbeat over its idle floor, in µs: what any gRPC server
// answering the same calls from the same connections spends, so the
// floor under the leader's figure.
func measureHeartbeatFloor(b *testing.B) float64 {
	b.Helper()
	self := os.Getpid()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer(rpc.TransportOptions()...)
	csisupdv1.RegisterClusterServer(srv, floorCluster{ttl: clusterNodes * time.Second / clusterMaxHeartbeatsS})
	testutil.ServeGRPC(b, ln, srv)
	defer srv.Stop() // before the benchmark's servers start

	idle, _ := cpuPercent(b, self, func() { time.Sleep(clusterIdleWindow) }) // a measurement window
	sim := startSimAgents(b, []string{ln.Addr().String()}, clusterNodes, clusterNodePlugins)
	defer sim.stop()
	sim.await(b, "registered", 5*time.Minute)
	// The first heartbeats come a TTL after registration, all together;
	// measure once every agent has heartbeated about once.
	testutil.WaitFor(b, time.Minute, "a round of heartbeats to the floor server", func() bool {
		return sim.heartbeatCount(b) >= clusterNodes
	})
	steady := measureSteady(b, self, sim)
	b.ReportMetric(steady.heartbeats, "floor_heartbeats/s")
	return (steady.serversCPU - idle) / 100 * 1e6 / steady.heartbeats
}
