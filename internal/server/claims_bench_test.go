package server_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
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

// attacherInFlight is the controller calls Kubernetes' external-attacher
// keeps in flight (its --worker-threads default): the throughput is also
// measured with client.max_destructive_in_flight set to it.
const attacherInFlight = 10

// BenchmarkClaimRelease measures a volume claim (controller publish, stage
// and publish) and its release (unpublish, unstage, controller unpublish)
// through a three-server cluster and an agent, each step checkpointed
// through raft, beside the same six CSI calls made directly against the
// plugin's socket in the same run. It reports p50 and p99 of both paths,
// the ratio of the p50s, what a claim and a release cost (raft writes, the
// leader's log entries; fsyncs of the agent's mount records), their
// durability floor (see durabilityFloor), and the claims
// and releases per second of 16 workloads claiming and releasing volumes
// of their own at once, beside the serial rate of the p50s, with
// client.max_destructive_in_flight 1 and attacherInFlight, and the cores
// the process kept busy meanwhile (cores-busy-*; the servers, the agent
// and the plugin all run in it, so at the machine's core count the rate
// is bound by CPU, not by waiting).
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
	setInFlight(b, c, cl, 1)
	node := c.Agent(0).NodeID()
	raftIndex := leader.Server().Raft().LastIndex
	syncs := watchRecordSyncs(c.Agent(0))
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

	floor := newDurabilityFloor(b, leader.Server(), c.Agent(0).DataDir)
	var directClaim, directRelease, claims, releases []time.Duration
	var claimWrites, releaseWrites, claimSyncs, releaseSyncs uint64
	syncs.take(b)
	b.ResetTimer()
	for i := range b.N {
		staging := filepath.Join(dir, "staging")
		target := filepath.Join(dir, fmt.Sprintf("w-%d", i))
		claimTook, releaseTook, err := directClaimRelease(ctx, ctrl, nodeSvc, capability, direct.GetExternalId(), staging, target)
		if err != nil {
			b.Fatal(err)
		}
		directClaim, directRelease = append(directClaim, claimTook), append(directRelease, releaseTook)
		b.StopTimer()
		floor.sample(b)
		b.StartTimer()

		workload := fmt.Sprintf("w-%d", i)
		index := raftIndex()
		start := time.Now()
		if _, err := cl.ClaimVolume(ctx, &csisupdv1.VolumeClaimRequest{Id: "bench", NodeId: node, WorkloadId: workload}); err != nil {
			b.Fatal(err)
		}
		claims = append(claims, time.Since(start))
		b.StopTimer()
		claimWrites += raftIndex() - index
		claimSyncs += syncs.take(b)
		index = raftIndex()
		b.StartTimer()
		start = time.Now()
		if _, err := cl.ReleaseVolume(ctx, &csisupdv1.VolumeReleaseRequest{Id: "bench", NodeId: node, WorkloadId: workload}); err != nil {
			b.Fatal(err)
		}
		releases = append(releases, time.Since(start))
		b.StopTimer()
		releaseWrites += raftIndex() - index
		releaseSyncs += syncs.take(b)
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
	claimP50, directClaimP50 := report("claim", claims), report("direct-claim", directClaim)
	releaseP50, directReleaseP50 := report("release", releases), report("direct-release", directRelease)
	b.ReportMetric(float64(claimP50)/float64(directClaimP50), "claim-p50-x-direct")
	b.ReportMetric(float64(releaseP50)/float64(directReleaseP50), "release-p50-x-direct")
	b.ReportMetric(float64(claimWrites)/float64(b.N), "raft-writes/claim")
	b.ReportMetric(float64(releaseWrites)/float64(b.N), "raft-writes/release")
	b.ReportMetric(float64(claimSyncs)/float64(b.N), "node-fsyncs/claim")
	b.ReportMetric(float64(releaseSyncs)/float64(b.N), "node-fsyncs/release")
	raftP50, fsyncP50 := floor.report(b)
	reportFloor(b, "claim", claimP50, directClaimP50, float64(claimWrites)/float64(b.N), raftP50, float64(claimSyncs)/float64(b.N), fsyncP50)
	reportFloor(b, "release", releaseP50, directReleaseP50, float64(releaseWrites)/float64(b.N), raftP50, float64(releaseSyncs)/float64(b.N), fsyncP50)
	// One workload claiming and releasing after another, at the p50s.
	serial := 1 / (claimP50 + releaseP50).Seconds()
	b.ReportMetric(serial, "serial-claims/s")

	// Throughput: 16 workloads, each claiming and releasing a volume of
	// its own, as many rounds as the benchmark has iterations (at least 5),
	// once with the agent's default of one controller call in flight and
	// once with Kubernetes' attacher's ten.
	var parIDs []string
	for w := range claimConcurrency {
		parIDs = append(parIDs, create(fmt.Sprintf("par-%d", w)).GetExternalId())
	}
	rounds := max(b.N, 5)
	// The plugin's own ceiling: the same 16 workloads making the six CSI
	// calls directly, at once.
	directRate := directThroughput(b, ctrl, nodeSvc, capability, dir, parIDs, rounds)
	b.ReportMetric(directRate, "direct-claims/s-16-workloads")
	b.ReportMetric(directRate/serial, "direct-claims/s-16-workloads-x-serial")
	for _, inFlight := range []int{1, attacherInFlight} {
		setInFlight(b, c, cl, inFlight)
		index := raftIndex()
		cpu0, t0 := testutil.ProcessCPU(b, os.Getpid()), time.Now()
		rate := claimThroughput(b, cl, node, rounds)
		busy := (testutil.ProcessCPU(b, os.Getpid()) - cpu0).Seconds() / time.Since(t0).Seconds()
		suffix := "-16-workloads"
		if inFlight != 1 {
			suffix += fmt.Sprintf("-inflight%d", inFlight)
		}
		b.ReportMetric(rate, "claims/s"+suffix)
		// Servers, agent and plugin share this process: at runtime.NumCPU
		// cores busy the machine, not a wait, bounds the rate.
		b.ReportMetric(busy, "cores-busy"+suffix)
		b.ReportMetric(rate/serial, "claims/s"+suffix+"-x-serial")
		b.ReportMetric(float64(raftIndex()-index)/float64(claimConcurrency*rounds), "raft-writes/claim+release"+suffix)
	}
	if left := plugin.NodeVolumes(); len(left) != 0 {
		b.Fatalf("the plugin still has %+v after every release", left)
	}
}

// directClaimRelease makes the six CSI calls of a claim (controller
// publish, stage, publish) and of its release (unpublish, unstage,
// controller unpublish) of volume id directly, and returns how long each
// half took.
func directClaimRelease(ctx context.Context, ctrl csi.ControllerClient, nodeSvc csi.NodeClient, capability *csi.VolumeCapability, id, staging, target string) (claim, release time.Duration, err error) {
	start := time.Now()
	pub, err := ctrl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "csi-node-0", VolumeCapability: capability})
	if err == nil {
		_, err = nodeSvc.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: capability, PublishContext: pub.GetPublishContext()})
	}
	if err == nil {
		_, err = nodeSvc.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: capability, PublishContext: pub.GetPublishContext()})
	}
	if err != nil {
		return 0, 0, err
	}
	claim, start = time.Since(start), time.Now()
	_, err = nodeSvc.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
	if err == nil {
		_, err = nodeSvc.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	}
	if err == nil {
		_, err = ctrl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "csi-node-0"})
	}
	return claim, time.Since(start), err
}

// workloadRounds runs claimConcurrency workloads at once, workload w
// calling round(w, r) for r from 0 to rounds-1 and stopping at its first
// error, and returns the rounds per second of them all. It fails b with
// the workloads' errors.
func workloadRounds(b *testing.B, rounds int, round func(w, r int) error) float64 {
	var wg sync.WaitGroup
	errs := make(chan error, claimConcurrency)
	start := time.Now()
	for w := range claimConcurrency {
		wg.Go(func() {
			for r := range rounds {
				if err := round(w, r); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return float64(claimConcurrency*rounds) / time.Since(start).Seconds()
}

// directThroughput runs claimConcurrency workloads, each making the six
// CSI calls of a claim and a release on volume ids[w] directly, rounds
// times, and returns the claims (each with its release) per second.
func directThroughput(b *testing.B, ctrl csi.ControllerClient, nodeSvc csi.NodeClient, capability *csi.VolumeCapability, dir string, ids []string, rounds int) float64 {
	return workloadRounds(b, rounds, func(w, r int) error {
		staging := filepath.Join(dir, fmt.Sprintf("direct-par-%d-staging", w))
		target := filepath.Join(dir, fmt.Sprintf("direct-par-%d-%d", w, r))
		if _, _, err := directClaimRelease(context.Background(), ctrl, nodeSvc, capability, ids[w], staging, target); err != nil {
			return fmt.Errorf("direct claim and release of %s: %w", ids[w], err)
		}
		return nil
	})
}

// claimThroughput runs claimConcurrency workloads, each claiming and
// releasing volume par-<w> rounds times, and returns the claims (each with
// its release) per second.
func claimThroughput(b *testing.B, cl csisupdv1.ControlClient, node string, rounds int) float64 {
	ctx := context.Background()
	return workloadRounds(b, rounds, func(w, r int) error {
		vol, workload := fmt.Sprintf("par-%d", w), fmt.Sprintf("par-%d-%d", w, r)
		if _, err := cl.ClaimVolume(ctx, &csisupdv1.VolumeClaimRequest{Id: vol, NodeId: node, WorkloadId: workload}); err != nil {
			return fmt.Errorf("claim %s for %s: %w", vol, workload, err)
		}
		if _, err := cl.ReleaseVolume(ctx, &csisupdv1.VolumeReleaseRequest{Id: vol, NodeId: node, WorkloadId: workload}); err != nil {
			return fmt.Errorf("release %s for %s: %w", vol, workload, err)
		}
		return nil
	})
}

// setInFlight restarts agent 0 with client.max_destructive_in_flight = n
// (the setting takes effect only at start), unless its config sets n
// already, and waits until plugin tp is healthy in the restarted agent and
// in the servers' view.
func setInFlight(b *testing.B, c *testcluster.Cluster, cl csisupdv1.ControlClient, n int) {
	b.Helper()
	a := c.Agent(0)
	text, err := os.ReadFile(a.ConfigFile)
	if err != nil {
		b.Fatal(err)
	}
	const setting = "\n  max_destructive_in_flight = "
	cfg := string(text)
	if i := strings.Index(cfg, setting); i >= 0 {
		end := i + len(setting) + strings.Index(cfg[i+len(setting):], "\n")
		cfg = cfg[:i] + cfg[end:]
	}
	edited := strings.Replace(cfg, "client {", "client {"+setting+strconv.Itoa(n), 1)
	switch {
	case edited == cfg:
		b.Fatalf("no client block in agent config %s", a.ConfigFile)
	case edited == string(text):
		return // set already
	}
	if err := os.WriteFile(a.ConfigFile, []byte(edited), 0o600); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	before, err := cl.GetNode(ctx, &csisupdv1.NodeGetRequest{Id: a.NodeID()})
	if err != nil {
		b.Fatal(err)
	}
	c.StopAgent(0)
	c.RestartAgent(0)
	// The servers' view from before the restart says healthy too: the
	// node's record must have been written since (the restarted agent
	// registers with its plugins as restored, not probed yet, then
	// reports them probed).
	testutil.WaitFor(b, 30*time.Second, "plugin tp healthy after agent 0's restart", func() bool {
		n, err := cl.GetNode(ctx, &csisupdv1.NodeGetRequest{Id: a.NodeID()})
		if err != nil || n.GetNode().GetModifyIndex() <= before.GetNode().GetModifyIndex() ||
			!slices.ContainsFunc(n.GetNode().GetPlugins(), func(p *csisupdv1.Plugin) bool { return p.GetId() == "tp" && p.GetHealthy() }) {
			return false
		}
		p, err := cl.GetPlugin(ctx, &csisupdv1.PluginGetRequest{Id: "tp"})
		return err == nil && p.GetPlugin().GetNodesHealthy() == 1 && p.GetPlugin().GetControllersHealthy() == 1
	})
}

// recordSyncs counts the fsyncs of an agent's mount records as the agent
// counts them (csisupd_volume_record_syncs_total): the syncs of their
// journal and of its directory.
type recordSyncs struct {
	a    *testcluster.Agent
	last uint64
}

func watchRecordSyncs(a *testcluster.Agent) *recordSyncs {
	return &recordSyncs{a: a, last: a.Agent().VolumeRecordSyncs()}
}

// take returns the fsyncs since its last call. The syncs of a step are
// made before the step returns.
func (s *recordSyncs) take(b *testing.B) uint64 {
	b.Helper()
	n := s.a.Agent().VolumeRecordSyncs()
	d := n - s.last
	s.last = n
	return d
}
