package consulsync

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/consulsync/consultest"
	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/registry"
)

const benchPlugins = 1000

// benchSetup returns a test agent and a Syncer for a registry of n healthy
// plugins.
func benchSetup(b *testing.B, n int) (*consultest.Agent, *Syncer, *registry.Registry) {
	b.Helper()
	a := newAgent(b, consultest.Config{})
	reg := registry.New(registry.Config{})
	for i := range n {
		addPlugin(reg, fmt.Sprintf("plugin-%04d", i), "1.0", plugin.TypeNode, heartbeat.Healthy, "ok")
	}
	cfg := testConfig(reg, a.Addr(), &logBuffer{})
	s, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.client.close)
	return a, s, reg
}

// BenchmarkInitialSync1000 registers 1,000 plugin services (and the agent
// service) in an empty Consul agent in one pass.
func BenchmarkInitialSync1000(b *testing.B) {
	ctx := context.Background()
	var requests, writes int
	var elapsed time.Duration
	for b.Loop() {
		b.StopTimer()
		a, s, _ := benchSetup(b, benchPlugins)
		b.StartTimer()
		t0 := time.Now()
		if err := s.pass(ctx); err != nil {
			b.Fatal(err)
		}
		elapsed += time.Since(t0)
		b.StopTimer()
		requests += a.Reads() + a.Writes()
		writes += a.Writes()
		s.client.close()
		a.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(requests)/float64(b.N), "requests/sync")
	b.ReportMetric(float64(writes)/float64(b.N), "writes/sync")
	b.ReportMetric(elapsed.Seconds()/float64(b.N), "s/sync")
}

// BenchmarkSteadyStatePass1000 runs passes with nothing changed against
// 1,000 registered plugin services. The target is 2 GETs and 0 writes per
// pass, whatever the number of services.
func BenchmarkSteadyStatePass1000(b *testing.B) {
	ctx := context.Background()
	a, s, _ := benchSetup(b, benchPlugins)
	if err := s.pass(ctx); err != nil {
		b.Fatal(err)
	}
	a.ResetCounts()
	for b.Loop() {
		if err := s.pass(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(a.Reads())/float64(b.N), "GETs/pass")
	b.ReportMetric(float64(a.Writes())/float64(b.N), "writes/pass")
}
