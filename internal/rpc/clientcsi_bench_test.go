package rpc

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testplugin"
)

// benchCallers is the number of concurrent callers in the benchmarks.
const benchCallers = 16

// latencies are the results of one benchmark run.
type latencies struct {
	p50, p99 time.Duration
	perSec   float64
}

// runCallers makes b.N calls from benchCallers goroutines and measures each.
func runCallers(b *testing.B, call func(context.Context) error) latencies {
	b.Helper()
	ctx := context.Background()
	var next atomic.Int64
	per := make([][]time.Duration, benchCallers)
	var failed atomic.Value
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for g := range benchCallers {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				t0 := time.Now()
				if err := call(ctx); err != nil {
					failed.CompareAndSwap(nil, err)
					return
				}
				per[g] = append(per[g], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	all := slices.Concat(per...)
	slices.Sort(all)
	return latencies{
		p50:    all[len(all)*50/100],
		p99:    all[len(all)*99/100],
		perSec: float64(len(all)) / elapsed.Seconds(),
	}
}

func (l latencies) report(b *testing.B) {
	b.ReportMetric(float64(l.p50.Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(l.p99.Nanoseconds()), "p99-ns")
	b.ReportMetric(l.perSec, "calls/s")
}

// BenchmarkClientCSIValidateVolume measures ValidateVolumeCapabilities on
// testplugin with 16 concurrent callers, directly and through ClientCSI,
// both over unix sockets in the same run. The clientcsi run also reports its
// p50 and p99 as multiples of the direct run's.
func BenchmarkClientCSIValidateVolume(b *testing.B) {
	env := newManagedEnv(b, "bench", testplugin.Config{}, ClientCSIConfig{}, hclog.NewNullLogger())
	vol := createVolume(b, env.client, "bench", "bench-vol")
	req := &csi.ValidateVolumeCapabilitiesRequest{VolumeId: vol, VolumeCapabilities: []*csi.VolumeCapability{mountCap}}

	conn, err := grpc.NewClient("unix://"+env.plugin.Socket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	direct := csi.NewControllerClient(conn)
	viaReq := &csisupdv1.ControllerValidateVolumeRequest{PluginId: "bench", Request: req}

	var base latencies
	b.Run("direct", func(b *testing.B) {
		base = runCallers(b, func(ctx context.Context) error {
			_, err := direct.ValidateVolumeCapabilities(ctx, req)
			return err
		})
		base.report(b)
	})
	b.Run("clientcsi", func(b *testing.B) {
		l := runCallers(b, func(ctx context.Context) error {
			_, err := env.client.ControllerValidateVolume(ctx, viaReq)
			return err
		})
		l.report(b)
		if base.p50 > 0 {
			b.ReportMetric(float64(l.p50)/float64(base.p50), "p50-x-direct")
			b.ReportMetric(float64(l.p99)/float64(base.p99), "p99-x-direct")
		}
	})
}
