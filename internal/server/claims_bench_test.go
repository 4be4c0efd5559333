package server_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
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

// claimConcurrency is how many workloads claim at once in the throughput
// part of BenchmarkClaimRelease.
const claimConcurrency = 16

// BenchmarkClaimRelease measures a volume claim (controller publish, stage
// and publish) and its release (unpublish, unstage, controller unpublish)
// through a three-server cluster and an agent, each step checkpointed
// through raft, beside the same six CSI calls made directly against the
// plugin's socket in the same run. It reports p50 and p99 of both paths,
// the ratio of the p50s (target: at most 3), the raft entries the leader
// applies per claim and per release (median), and the claims per second
// of 16 workloads claiming and releasing volumes of their own at once.
func BenchmarkClaimRelease(b *testing.B) {
	c := testcluster.New(b, testcluster.Config{Servers: 3, Agents: 1, Configure: fastVolumeWatcher})
	plugin := c.Agent(0).StartPlugin("tp", testplugin.Config{NodeID: "csi-node-0"})
	leader := c.WaitForLeader(b, 30*time.Second)
	cl := c.Control(leader.Index)
	ctx := context.Background()
	testutil.WaitFor(b, 30*time.Second, "plugin tp healthy", func() bool {
		p, err := cl.GetPlugin(ctx, &csisupdv1.PluginGetRequest{Id: "tp"})
		return err == nil && p.GetPlugin().GetNodesHealthy() == 1 && p.GetPlugin().GetControllersHealthy() == 1
	})
	node := c.Agent(0).NodeID()
	create := func(id string) *csisupdv1.Volume {
		resp, err := cl.CreateVolume(ctx, &csisupdv1.VolumeCreateRequest{Id: id, PluginId: "tp"})
		if err != nil {
			b.Fatal(err)
		}
		return resp.GetVolume()
	}
	direct := create("direct")
	create("bench")

	conn, err := grpc.NewClient("unix://"+plugin.Socket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	ctrl, nodeSvc := csi.NewControllerClient(conn), csi.NewNodeClient(conn)
	dir := testutil.TempDir(b)
	capability := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}

	var directClaim, directRelease, claims, releases []time.Duration
	// The raft entries the leader applied during each claim and release:
	// their writes, and any other write that fell in (the median leaves
	// those out).
	srv := leader.Server()
	var claimWrites, releaseWrites []uint64
	b.ResetTimer()
	for i := range b.N {
		staging := filepath.Join(dir, "staging")
		target := filepath.Join(dir, fmt.Sprintf("w-%d", i))
		id := direct.GetExternalId()
		start := time.Now()
		pub, err := ctrl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "csi-node-0", VolumeCapability: capability})
		if err == nil {
			_, err = nodeSvc.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: capability, PublishContext: pub.GetPublishContext()})
		}
		if err == nil {
			_, err = nodeSvc.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: capability, PublishContext: pub.GetPublishContext()})
		}
		if err != nil {
			b.Fatal(err)
		}
		directClaim = append(directClaim, time.Since(start))
		start = time.Now()
		_, err = nodeSvc.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
		if err == nil {
			_, err = nodeSvc.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
		}
		if err == nil {
			_, err = ctrl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "csi-node-0"})
		}
		if err != nil {
			b.Fatal(err)
		}
		directRelease = append(directRelease, time.Since(start))

		workload := fmt.Sprintf("w-%d", i)
		index := srv.AppliedIndex()
		start = time.Now()
		if _, err := cl.ClaimVolume(ctx, &csisupdv1.VolumeClaimRequest{Id: "bench", NodeId: node, WorkloadId: workload}); err != nil {
			b.Fatal(err)
		}
		claims = append(claims, time.Since(start))
		claimWrites = append(claimWrites, srv.AppliedIndex()-index)
		index = srv.AppliedIndex()
		start = time.Now()
		if _, err := cl.ReleaseVolume(ctx, &csisupdv1.VolumeReleaseRequest{Id: "bench", NodeId: node, WorkloadId: workload}); err != nil {
			b.Fatal(err)
		}
		releases = append(releases, time.Since(start))
		releaseWrites = append(releaseWrites, srv.AppliedIndex()-index)
	}
	b.StopTimer()
	report := func(name string, d []time.Duration) time.Duration {
		slices.Sort(d)
		p50, p99 := d[len(d)/2], d[len(d)*99/100]
		b.ReportMetric(float64(p50.Microseconds())/1000, name+"-p50-ms")
		b.ReportMetric(float64(p99.Microseconds())/1000, name+"-p99-ms")
		return p50
	}
	claimP50, directClaimP50 := report("claim", claims), report("direct-claim", directClaim)
	releaseP50, directReleaseP50 := report("release", releases), report("direct-release", directRelease)
	b.ReportMetric(float64(claimP50)/float64(directClaimP50), "claim-p50-x-direct")
	b.ReportMetric(float64(releaseP50)/float64(directReleaseP50), "release-p50-x-direct")
	median := func(n []uint64) float64 { slices.Sort(n); return float64(n[len(n)/2]) }
	b.ReportMetric(median(claimWrites), "raft-writes/claim")
	b.ReportMetric(median(releaseWrites), "raft-writes/release")

	// Throughput: 16 workloads, each claiming and releasing a volume of
	// its own, as many rounds as the benchmark has iterations (at least 5).
	for w := range claimConcurrency {
		create(fmt.Sprintf("par-%d", w))
	}
	rounds := max(b.N, 5)
	var wg sync.WaitGroup
	errs := make(chan error, claimConcurrency)
	start := time.Now()
	for w := range claimConcurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			vol := fmt.Sprintf("par-%d", w)
			for r := range rounds {
				workload := fmt.Sprintf("par-%d-%d", w, r)
				if _, err := cl.ClaimVolume(ctx, &csisupdv1.VolumeClaimRequest{Id: vol, NodeId: node, WorkloadId: workload}); err != nil {
					errs <- fmt.Errorf("claim %s for %s: %w", vol, workload, err)
					return
				}
				if _, err := cl.ReleaseVolume(ctx, &csisupdv1.VolumeReleaseRequest{Id: vol, NodeId: node, WorkloadId: workload}); err != nil {
					errs <- fmt.Errorf("release %s for %s: %w", vol, workload, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	b.ReportMetric(float64(claimConcurrency*rounds)/elapsed.Seconds(), "claims/s-16-workloads")
	if left := plugin.NodeVolumes(); len(left) != 0 {
		b.Fatalf("the plugin still has %+v after every release", left)
	}
}
