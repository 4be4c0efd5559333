package server_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// BenchmarkSnapshotAndExpand measures a snapshot create (recorded before
// and after CreateSnapshot, each through raft) and an expansion of a
// claimed volume (ControllerExpandVolume and NodeExpandVolume, each step
// checkpointed through raft) through a three-server cluster and an agent,
// beside the same CSI calls made directly against the plugin's socket in
// the same run. It reports p50 and p99 of each path, the ratio of the
// p50s, the raft writes of each operation and its durability floor (see
// durabilityFloor).
func BenchmarkSnapshotAndExpand(b *testing.B) {
	c := testcluster.New(b, testcluster.Config{Servers: 3, Agents: 1, Configure: fastVolumeWatcher})
	plugin := c.Agent(0).StartPlugin("tp", testplugin.Config{NodeID: "csi-node-0", NodeExpansionRequired: true})
	leader := c.WaitForLeader(b, 30*time.Second)
	cl := c.Control(leader.Index)
	ctx := context.Background()
	testutil.WaitFor(b, 30*time.Second, "plugin tp healthy", func() bool {
		p, err := cl.GetPlugin(ctx, &csisupdv1.PluginGetRequest{Id: "tp"})
		return err == nil && p.GetPlugin().GetNodesHealthy() == 1 && p.GetPlugin().GetControllersHealthy() == 1
	})
	node := c.Agent(0).NodeID()
	for _, id := range []string{"direct", "bench"} {
		if _, err := cl.CreateVolume(ctx, &csisupdv1.VolumeCreateRequest{Id: id, PluginId: "tp", CapacityMinBytes: 1 << 20}); err != nil {
			b.Fatal(err)
		}
	}
	// Both volumes are claimed, so that the expansions reach the node.
	for _, id := range []string{"direct", "bench"} {
		if _, err := cl.ClaimVolume(ctx, &csisupdv1.VolumeClaimRequest{Id: id, NodeId: node, WorkloadId: "w"}); err != nil {
			b.Fatal(err)
		}
	}
	direct, err := cl.GetVolume(ctx, &csisupdv1.VolumeGetRequest{Id: "direct"})
	if err != nil {
		b.Fatal(err)
	}
	directID := direct.GetVolume().GetExternalId()
	var directPath, directStaging string
	for _, call := range plugin.NodeLog() {
		if call.Method == "NodePublishVolume" && call.VolumeID == directID {
			directPath, directStaging = call.Path, call.StagingPath
		}
	}
	if directPath == "" {
		b.Fatalf("no NodePublishVolume of %s in the node log", directID)
	}

	conn, err := grpc.NewClient("unix://"+plugin.Socket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	ctrl, nodeSvc := csi.NewControllerClient(conn), csi.NewNodeClient(conn)

	raftIndex := leader.Server().Raft().LastIndex
	floor := newDurabilityFloor(b, leader.Server(), "")
	var snaps, directSnaps, expands, directExpands []time.Duration
	var snapWrites, expandWrites uint64
	b.ResetTimer()
	for i := range b.N {
		size := int64(2+i) << 20
		start := time.Now()
		if _, err := ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: fmt.Sprintf("direct-%d", i), SourceVolumeId: directID}); err != nil {
			b.Fatal(err)
		}
		directSnaps = append(directSnaps, time.Since(start))
		index := raftIndex()
		start = time.Now()
		if _, err := cl.CreateVolumeSnapshot(ctx, &csisupdv1.VolumeSnapshotCreateRequest{VolumeId: "bench", Id: fmt.Sprintf("bench-%d", i)}); err != nil {
			b.Fatal(err)
		}
		snaps = append(snaps, time.Since(start))
		b.StopTimer()
		snapWrites += raftIndex() - index
		floor.sample(b)
		b.StartTimer()

		start = time.Now()
		if _, err := ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: directID, CapacityRange: &csi.CapacityRange{RequiredBytes: size}}); err != nil {
			b.Fatal(err)
		}
		if _, err := nodeSvc.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: directID, VolumePath: directPath, StagingTargetPath: directStaging,
			CapacityRange: &csi.CapacityRange{RequiredBytes: size}}); err != nil {
			b.Fatal(err)
		}
		directExpands = append(directExpands, time.Since(start))
		index = raftIndex()
		start = time.Now()
		if _, err := cl.ExpandVolume(ctx, &csisupdv1.VolumeExpandRequest{Id: "bench", CapacityMinBytes: size}); err != nil {
			b.Fatal(err)
		}
		expands = append(expands, time.Since(start))
		b.StopTimer()
		expandWrites += raftIndex() - index
		b.StartTimer()
	}
	b.StopTimer()
	report := func(name string, d []time.Duration) time.Duration {
		slices.Sort(d)
		p50, p99 := d[len(d)/2], d[len(d)*99/100]
		b.ReportMetric(float64(p50.Microseconds())/1000, name+"-p50-ms")
		b.ReportMetric(float64(p99.Microseconds())/1000, name+"-p99-ms")
		return p50
	}
	snapP50, directSnapP50 := report("snapshot", snaps), report("direct-snapshot", directSnaps)
	expandP50, directExpandP50 := report("expand", expands), report("direct-expand", directExpands)
	b.ReportMetric(float64(snapP50)/float64(directSnapP50), "snapshot-p50-x-direct")
	b.ReportMetric(float64(expandP50)/float64(directExpandP50), "expand-p50-x-direct")
	b.ReportMetric(float64(snapWrites)/float64(b.N), "raft-writes/snapshot")
	b.ReportMetric(float64(expandWrites)/float64(b.N), "raft-writes/expand")
	raftP50, _ := floor.report(b)
	reportFloor(b, "snapshot", snapP50, directSnapP50, float64(snapWrites)/float64(b.N), raftP50, 0, 0)
	reportFloor(b, "expand", expandP50, directExpandP50, float64(expandWrites)/float64(b.N), raftP50, 0, 0)
}
