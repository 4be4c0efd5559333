package server_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// claimCreate is a claim of vol by workload on agent that creates vol on
// plugin nl when it does not exist.
func (nc *nodeLocalCluster) claimCreate(t *testing.T, vol string, agent int, workload, mode string, ephemeral bool) (*csisupdv1.VolumeClaimResponse, error) {
	t.Helper()
	return nc.control(t).ClaimVolume(context.Background(), &csisupdv1.VolumeClaimRequest{
		Id: vol, NodeId: nc.c.Agent(agent).NodeID(), WorkloadId: workload,
		Usage: &csisupdv1.VolumeUsage{AccessMode: mode},
		Create: &csisupdv1.VolumeCreateRequest{PluginId: "nl", CapacityMinBytes: 1 << 20,
			Capabilities: []*csisupdv1.VolumeCapability{{AccessType: "mount", AccessMode: mode}}},
		Ephemeral: ephemeral,
	})
}

// created counts the volumes named name that the plugin instances hold.
func (nc *nodeLocalCluster) created(name string) int {
	n := 0
	for _, p := range nc.plugins {
		for _, v := range p.Volumes() {
			if v.Name == name {
				n++
			}
		}
	}
	return n
}

// TestClaimCreatesOnTheClaimingNode claims a volume that does not exist
// with create, on the node a stable order would try last: the node-local
// plugin of that node creates it, the volume records that node's
// topology, and the claim is mounted there. A second claim with create
// claims the volume as it is: no second CreateVolume. A claim with create
// whose requisite the node does not meet is refused before anything is
// created.
func TestClaimCreatesOnTheClaimingNode(t *testing.T) {
	nc := newNodeLocalCluster(t, nil)
	home := 1 - nc.stableFirst()
	mode := "MULTI_NODE_MULTI_WRITER"
	resp, err := nc.claimCreate(t, "scratch", home, "w1", mode, false)
	if err != nil {
		t.Fatalf("claim with create: %v", err)
	}
	if !resp.GetClaim().GetMounted() || resp.GetClaim().GetHostPath() == "" {
		t.Errorf("claim with create: %v, want it mounted with a host path", resp.GetClaim())
	}
	if at := nc.holder(t, "scratch"); at != home {
		t.Errorf("the plugin on agent %d holds the volume, want the claiming agent %d", at, home)
	}
	v := nc.volume(t, "scratch")
	if top := v.GetAccessibleTopology(); len(top) != 1 || top[0].GetSegments()[testplugin.DefaultTopologyKey] != fmt.Sprintf("csi-node-%d", home) {
		t.Errorf("recorded topology %v, want the claiming node's {%s: csi-node-%d}", top, testplugin.DefaultTopologyKey, home)
	}
	if v.GetControllerNodeId() != nc.c.Agent(home).NodeID() || v.GetEphemeral() {
		t.Errorf("volume: controller node %s ephemeral %v, want %s and not ephemeral", v.GetControllerNodeId(), v.GetEphemeral(), nc.c.Agent(home).NodeID())
	}
	if _, err := nc.claimCreate(t, "scratch", home, "w2", mode, true); err != nil {
		t.Fatalf("a second claim with create of the existing volume: %v", err)
	}
	if calls := nc.plugins[0].Stats().Calls["CreateVolume"] + nc.plugins[1].Stats().Calls["CreateVolume"]; calls != 1 {
		t.Errorf("%d CreateVolume calls for two claims with create, want 1: an existing volume is claimed as it is", calls)
	}
	if nc.volume(t, "scratch").GetEphemeral() {
		t.Error("a claim with create and ephemeral of an existing volume made it ephemeral")
	}

	_, err = nc.control(t).ClaimVolume(context.Background(), &csisupdv1.VolumeClaimRequest{
		Id: "elsewhere", NodeId: nc.c.Agent(home).NodeID(), WorkloadId: "w1",
		Create: &csisupdv1.VolumeCreateRequest{PluginId: "nl", AccessibilityRequirements: &csisupdv1.TopologyRequirement{
			Requisite: []*csisupdv1.TopologySegment{nodeSegment(1 - home)}}},
	})
	if d, ok := csisupdv1.ErrorDetail[*csisupdv1.ClaimRefused](err); !ok || d.GetRule() != csisupdv1.ClaimRuleTopology {
		t.Fatalf("claim with create requiring the other node: %v, want ClaimRefused rule topology", err)
	}
	if n := nc.created("elsewhere"); n != 0 {
		t.Errorf("a refused claim with create left %d volumes in the plugins", n)
	}
	if _, err := nc.control(t).ClaimVolume(context.Background(), &csisupdv1.VolumeClaimRequest{
		Id: "bad", NodeId: nc.c.Agent(home).NodeID(), WorkloadId: "w1", Ephemeral: true,
	}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("ephemeral without create: %v, want InvalidArgument", err)
	}
}

// TestConcurrentClaimsCreateOneVolume sends 8 claims with create of one
// new volume at once, 4 from workloads on each node: exactly one volume
// is created, in one plugin, and each claim either succeeds or is
// refused by a claim rule (the other node does not reach the volume).
func TestConcurrentClaimsCreateOneVolume(t *testing.T) {
	nc := newNodeLocalCluster(t, nil)
	nc.control(t) // a leader first, so that the claims race each other and not an election
	errs := make([]error, 8)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, errs[i] = nc.claimCreate(t, "raced", i%2, fmt.Sprintf("w%d", i), "MULTI_NODE_MULTI_WRITER", false)
		}()
	}
	close(start)
	wg.Wait()
	ok := 0
	for i, err := range errs {
		if err == nil {
			ok++
			continue
		}
		if _, refused := csisupdv1.ErrorDetail[*csisupdv1.ClaimRefused](err); !refused {
			t.Errorf("claim %d: %v, want success or a ClaimRefused error", i, err)
		}
	}
	if ok == 0 {
		t.Error("no claim succeeded")
	}
	if n := nc.created("raced"); n != 1 {
		t.Errorf("the plugins hold %d volumes named raced, want 1", n)
	}
	v := nc.volume(t, "raced")
	if got := len(v.GetClaims()); got != ok {
		t.Errorf("the volume has %d claims, want the %d that succeeded", got, ok)
	}
}

// TestEphemeralVolumeDeletedAtLastRelease creates an ephemeral volume
// with its first claim and claims it again: the first release keeps it,
// the last deletes it in the plugin and in the cluster.
func TestEphemeralVolumeDeletedAtLastRelease(t *testing.T) {
	nc := newNodeLocalCluster(t, nil)
	mode := "MULTI_NODE_MULTI_WRITER"
	resp, err := nc.claimCreate(t, "temp", 0, "w1", mode, true)
	if err != nil {
		t.Fatalf("claim with create and ephemeral: %v", err)
	}
	if !resp.GetVolume().GetEphemeral() {
		t.Error("the created volume does not record ephemeral")
	}
	if _, err := nc.claimCreate(t, "temp", 0, "w2", mode, true); err != nil {
		t.Fatalf("second claim: %v", err)
	}
	if err := nc.release(t, "temp", 0, "w1"); err != nil {
		t.Fatalf("release w1: %v", err)
	}
	if at := nc.holder(t, "temp"); at != 0 || len(nc.volume(t, "temp").GetClaims()) != 1 {
		t.Fatalf("after the first of two releases: holder %d, want the volume kept on agent 0 with one claim", at)
	}
	if calls := nc.plugins[0].Stats().Calls["DeleteVolume"]; calls != 0 {
		t.Errorf("%d DeleteVolume calls while a claim is left", calls)
	}
	if err := nc.release(t, "temp", 0, "w2"); err != nil {
		t.Fatalf("release w2: %v", err)
	}
	if calls := nc.plugins[0].Stats().Calls["DeleteVolume"]; calls != 1 {
		t.Errorf("%d DeleteVolume calls after the last release, want 1", calls)
	}
	if at := nc.holder(t, "temp"); at >= 0 {
		t.Errorf("the plugin on agent %d still holds the volume after its last release", at)
	}
	if _, err := nc.control(t).GetVolume(context.Background(), &csisupdv1.VolumeGetRequest{Id: "temp"}); status.Code(err) != codes.NotFound {
		t.Errorf("get volume after the last release: %v, want NotFound", err)
	}

	// A volume created by a claim without ephemeral stays.
	if _, err := nc.claimCreate(t, "durable", 1, "w1", mode, false); err != nil {
		t.Fatal(err)
	}
	if err := nc.release(t, "durable", 1, "w1"); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "durable freed", func() bool { return len(nc.volume(t, "durable").GetClaims()) == 0 })
	if at := nc.holder(t, "durable"); at != 1 {
		t.Errorf("a volume created without ephemeral: holder %d after its release, want it kept on agent 1", at)
	}
}
