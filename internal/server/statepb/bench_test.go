package statepb_test

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// BenchmarkNodePageToAPI measures what converting a page of 100 stored
// nodes with 5 plugins each costs the ListNodes answer, beside encoding
// that answer (the direct path: what the server did before the storage
// format had messages of its own). It reports the conversion's share as
// convert-x-encode.
func BenchmarkNodePageToAPI(b *testing.B) {
	now := timestamppb.New(time.Unix(1_700_000_000, 0))
	nodes := make([]*statepb.ClusterNode, 100)
	for i := range nodes {
		n := &statepb.ClusterNode{Id: fmt.Sprintf("node-%04d", i), Name: "n", Address: "127.0.0.1:4780",
			Status: "ready", StatusUpdatedAt: now, RegisteredAt: now, CreateIndex: 10, ModifyIndex: 20}
		for j := range 5 {
			n.Plugins = append(n.Plugins, &statepb.Plugin{
				Id: fmt.Sprintf("plugin-%d", j), Type: "monolith", Healthy: true, VendorName: "csi.example.com",
				VendorVersion: "1.0.0", NodeId: n.Id, MaxVolumes: 64, Manifest: map[string]string{"k": "v"},
				AccessibleTopology:     map[string]string{"topology.example.com/node": n.Id},
				PluginCapabilities:     []string{"CONTROLLER_SERVICE", "VOLUME_ACCESSIBILITY_CONSTRAINTS"},
				ControllerCapabilities: []string{"CREATE_DELETE_VOLUME", "PUBLISH_UNPUBLISH_VOLUME"},
				NodeCapabilities:       []string{"STAGE_UNSTAGE_VOLUME"},
				LastProbe:              now, RegisteredAt: now, HealthSince: now,
			})
		}
		nodes[i] = n
	}
	var convert, encode time.Duration
	for b.Loop() {
		start := time.Now()
		resp := &csisupdv1.NodeListResponse{Nodes: statepb.ClusterNodesToAPI(nodes)}
		mid := time.Now()
		if _, err := proto.Marshal(resp); err != nil {
			b.Fatal(err)
		}
		convert += mid.Sub(start)
		encode += time.Since(mid)
	}
	b.ReportMetric(float64(convert.Nanoseconds())/float64(b.N), "convert-ns/page")
	b.ReportMetric(float64(encode.Nanoseconds())/float64(b.N), "encode-ns/page")
	b.ReportMetric(float64(convert)/float64(encode), "convert-x-encode")
}
