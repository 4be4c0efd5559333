package server_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/statepb"
	"github.com/csisupd/csisupd/internal/testcluster"
)

// BenchmarkPluginUpdates measures plugin-update writes per second through a
// three-server cluster on loopback with on-disk raft stores: agents'
// NodeUpdatePlugins calls to the leader, each a raft write. In the same run
// it measures raw raft.Apply throughput of entries of the same size with
// the same concurrency, and reports both and their ratio.
func BenchmarkPluginUpdates(b *testing.B) {
	const workers = 256
	c := testcluster.New(b, testcluster.Config{Servers: 3})
	leader := c.WaitForLeader(b, 30*time.Second)
	cl := csisupdv1.NewClusterClient(c.Conn(leader.Index))
	ctx := context.Background()
	plugins := func(node, version int) []*csisupdv1.Plugin {
		return []*csisupdv1.Plugin{{
			Id: "bench", Type: "monolith", Healthy: true, HealthState: "healthy",
			HealthDescription: fmt.Sprintf("probe %d ok", version), VendorName: "csi.bench", VendorVersion: "1.0.0",
			NodeId: fmt.Sprintf("csi-node-%03d", node), ControllerCapabilities: []string{"CREATE_DELETE_VOLUME"},
		}}
	}
	for i := range workers {
		if _, err := cl.NodeRegister(asNode(ctx, fmt.Sprintf("node-%03d", i)), &csisupdv1.NodeRegisterRequest{
			NodeId: fmt.Sprintf("node-%03d", i), Address: "127.0.0.1:1", Plugins: plugins(i, 0),
		}); err != nil {
			b.Fatal(err)
		}
	}
	entry, err := proto.Marshal(&statepb.LogEntry{Command: &statepb.LogEntry_NodePlugins{NodePlugins: &statepb.NodePluginsCommand{
		NodeId: "node-000", Plugins: statepb.PluginsFromAPI(plugins(0, 1)),
	}}})
	if err != nil {
		b.Fatal(err)
	}
	noop, err := proto.Marshal(&statepb.LogEntry{Command: &statepb.LogEntry_Noop{Noop: make([]byte, len(entry))}})
	if err != nil {
		b.Fatal(err)
	}
	r := leader.Server().Raft()

	raw := throughput(b, b.N, workers, func(_, _ int) error {
		return r.Apply(noop, 10*time.Second).Error()
	})
	b.ResetTimer()
	updates := throughput(b, b.N, workers, func(w, i int) error {
		_, err := cl.NodeUpdatePlugins(asNode(ctx, fmt.Sprintf("node-%03d", w)), &csisupdv1.NodeUpdatePluginsRequest{
			NodeId: fmt.Sprintf("node-%03d", w), Plugins: plugins(w, i+1),
		})
		return err
	})
	b.StopTimer()
	b.ReportMetric(updates, "updates/s")
	b.ReportMetric(raw, "raw-applies/s")
	b.ReportMetric(100*updates/raw, "%-of-raw")
}

// throughput runs n calls of fn over workers goroutines and returns calls
// per second.
func throughput(b *testing.B, n, workers int, fn func(worker, i int) error) float64 {
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := fn(w, i); err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	return float64(n) / elapsed.Seconds()
}
