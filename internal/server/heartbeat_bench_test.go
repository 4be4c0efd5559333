package server_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/statepb"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testutil"
)

// BenchmarkNodeHeartbeatAt10000Nodes measures what one NodeHeartbeat
// costs a leader that tracks 10,000 nodes: the calls go over gRPC on
// loopback to a one-server cluster whose gRPC server has the interceptors
// an agent installs (metrics, authorization) and its transport settings. It
// reports the process's CPU per heartbeat, the caller's side included,
// and fails when a heartbeat of a ready node wrote to raft.
func BenchmarkNodeHeartbeatAt10000Nodes(b *testing.B) {
	const (
		nodes   = 10000
		workers = 8
		batch   = 500
	)
	c := testcluster.New(b, testcluster.Config{
		Servers:       1,
		Configure:     func(_ int, cfg *server.Config) { cfg.MinHeartbeatTTL, cfg.FailoverHeartbeatTTL = time.Hour, time.Hour },
		ServerOptions: testcluster.AgentServerOptions(b),
	})
	leader := c.WaitForLeader(b, 30*time.Second)
	r := leader.Server().Raft()
	for first := 0; first < nodes; first += batch {
		var entries []*statepb.LogEntry
		for i := first; i < first+batch; i++ {
			id := benchNodeID(i)
			entries = append(entries, &statepb.LogEntry{Command: &statepb.LogEntry_NodeUpsert{NodeUpsert: &statepb.ClusterNode{
				Id: id, Name: id, Address: "127.0.0.1:1", SecretHash: rules.SecretHash(testNodeSecret(id)),
			}}})
		}
		data, err := proto.Marshal(&statepb.LogEntry{Command: &statepb.LogEntry_Batch{Batch: &statepb.LogBatch{Entries: entries}}})
		if err != nil {
			b.Fatal(err)
		}
		if err := r.Apply(data, 30*time.Second).Error(); err != nil {
			b.Fatal(err)
		}
	}
	cl := csisupdv1.NewClusterClient(c.Conn(leader.Index))
	// The callers' contexts and requests are made up front, so that the
	// figures are as much the server's as they can be.
	ctxs := make([]context.Context, nodes)
	reqs := make([]*csisupdv1.NodeHeartbeatRequest, nodes)
	for i := range nodes {
		ctxs[i] = asNode(context.Background(), benchNodeID(i))
		reqs[i] = &csisupdv1.NodeHeartbeatRequest{NodeId: benchNodeID(i)}
	}
	beat := func(_, i int) error {
		_, err := cl.NodeHeartbeat(ctxs[i%nodes], reqs[i%nodes])
		return err
	}
	testutil.WaitFor(b, 30*time.Second, "the leader to be ready", func() bool { return beat(0, 0) == nil })
	// Every node heartbeats once, so that the leader holds a timer for
	// each, as it does at steady state.
	throughput(b, nodes, workers, beat)

	idx0 := r.AppliedIndex()
	cpu0 := processCPU(b)
	b.ReportAllocs()
	b.ResetTimer()
	throughput(b, b.N, workers, beat)
	b.StopTimer()
	cpu := processCPU(b) - cpu0
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu_us/heartbeat")
	if idx1 := r.AppliedIndex(); idx1 != idx0 {
		b.Errorf("raft applied %d entries during heartbeats of ready nodes, want none", idx1-idx0)
	}
}

// benchNodeID is the id (and name) of the i-th node of a benchmark.
func benchNodeID(i int) string { return fmt.Sprintf("node-%05d", i) }

// processCPU returns the user plus system CPU time this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
