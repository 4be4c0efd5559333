package state

import (
	"fmt"
	"testing"

	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// putPluginNodes writes n ready nodes, each with the plugins plugins.
func putPluginNodes(tb testing.TB, s *Store, n int, plugins ...*statepb.Plugin) {
	tb.Helper()
	txn := s.Write()
	defer txn.Abort()
	for i := range n {
		if _, err := putNode(txn, &statepb.ClusterNode{Id: fmt.Sprintf("n-%04d", i), Status: NodeStatusReady, Plugins: plugins}); err != nil {
			tb.Fatal(err)
		}
	}
	txn.Commit()
}

func TestControllerAdvertises(t *testing.T) {
	publish := []string{plugin.CapPublishUnpublishVolume}
	tests := []struct {
		name    string
		plugins []*statepb.Plugin
		id, cap string
		want    bool
	}{
		{name: "controller with it", id: "p", cap: plugin.CapPublishUnpublishVolume, want: true,
			plugins: []*statepb.Plugin{{Id: "p", Type: string(plugin.TypeController), ControllerCapabilities: publish}}},
		{name: "unhealthy controller with it", id: "p", cap: plugin.CapPublishUnpublishVolume, want: true,
			plugins: []*statepb.Plugin{{Id: "p", Type: string(plugin.TypeMonolith), Healthy: false, ControllerCapabilities: publish}}},
		{name: "controller without it", id: "p", cap: "PUBLISH_READONLY",
			plugins: []*statepb.Plugin{{Id: "p", Type: string(plugin.TypeController), ControllerCapabilities: publish}}},
		{name: "node plugin only", id: "p", cap: plugin.CapPublishUnpublishVolume,
			plugins: []*statepb.Plugin{{Id: "p", Type: string(plugin.TypeNode), ControllerCapabilities: publish}}},
		{name: "a plugin whose id it prefixes", id: "p", cap: plugin.CapPublishUnpublishVolume,
			plugins: []*statepb.Plugin{{Id: "p2", Type: string(plugin.TypeController), ControllerCapabilities: publish}}},
		{name: "no plugin", id: "p", cap: plugin.CapPublishUnpublishVolume},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New()
			if err != nil {
				t.Fatal(err)
			}
			putPluginNodes(t, s, 2, tt.plugins...)
			if got := s.ControllerAdvertises(tt.id, tt.cap); got != tt.want {
				t.Errorf("Store.ControllerAdvertises(%q, %q) = %v, want %v", tt.id, tt.cap, got, tt.want)
			}
			txn := s.Write()
			defer txn.Abort()
			if got := txn.ControllerAdvertises(tt.id, tt.cap); got != tt.want {
				t.Errorf("Txn.ControllerAdvertises(%q, %q) = %v, want %v", tt.id, tt.cap, got, tt.want)
			}
		})
	}
}

// BenchmarkControllerAdvertises is the question claim admission asks of a
// node plugin that runs on 1,000 nodes, beside the whole plugin view it
// was answered from before.
func BenchmarkControllerAdvertises(b *testing.B) {
	s, err := New()
	if err != nil {
		b.Fatal(err)
	}
	putPluginNodes(b, s, 1000, &statepb.Plugin{Id: "p", Type: string(plugin.TypeMonolith), Healthy: true,
		ControllerCapabilities: []string{plugin.CapPublishUnpublishVolume}})
	b.Run("rows", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if s.ControllerAdvertises("p", "PUBLISH_READONLY") {
				b.Fatal("advertises PUBLISH_READONLY")
			}
		}
	})
	b.Run("view", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if s.Plugin("p") == nil {
				b.Fatal("no plugin p")
			}
		}
	})
}
