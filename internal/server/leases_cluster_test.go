package server_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/testutil"
)

// claimLeased claims vol for workload on agent's node with a lease.
func (cc *claimCluster) claimLeased(t *testing.T, vol string, agent int, workload string, lease time.Duration) (*csisupdv1.VolumeClaimResponse, error) {
	t.Helper()
	return cc.control(t).ClaimVolume(context.Background(), &csisupdv1.VolumeClaimRequest{
		Id: vol, NodeId: cc.c.Agent(agent).NodeID(), WorkloadId: workload, LeaseTtl: durationpb.New(lease), Owner: "sched",
	})
}

// TestLeaseExpiryReleasesTheClaim claims a volume with a 5 s lease and
// never renews it: the leader releases it through the node and the
// controller, with release_reason lease_expired while it releases, and
// one volume-claim-expired event.
func TestLeaseExpiryReleasesTheClaim(t *testing.T) {
	cc := newClaimCluster(t)
	cc.create(t, "leased", "SINGLE_NODE_WRITER")
	resp, err := cc.claimLeased(t, "leased", 1, "w1", rules.MinLeaseTTL)
	if err != nil {
		t.Fatal(err)
	}
	c := resp.GetClaim()
	if c.GetLeaseTtl().AsDuration() != rules.MinLeaseTTL || c.GetOwner() != "sched" || c.GetLeaseDeadline() == nil ||
		c.GetLeaseDeadline().AsTime().Sub(c.GetLeaseRenewedAt().AsTime()) != rules.MinLeaseTTL {
		t.Fatalf("claim answer %v: want lease_ttl 5s, owner sched, and its lease times", c)
	}
	// Slow node calls keep the claim in its release long enough to be
	// seen there.
	cc.plugins[1].SetSlow(300 * time.Millisecond)
	var reasons []string
	testutil.WaitFor(t, rules.MinLeaseTTL+30*time.Second, "the expired claim freed", func() bool {
		cl := claimOf(cc.volume(t, "leased"), cc.c.Agent(1).NodeID(), "w1")
		if cl == nil {
			return true
		}
		if rules.Releasing(cl.GetState()) && !slices.Contains(reasons, cl.GetReleaseReason()) {
			reasons = append(reasons, cl.GetReleaseReason())
		}
		return false
	})
	if !slices.Equal(reasons, []string{rules.ReasonLeaseExpired}) {
		t.Fatalf("release reasons seen while releasing: %q, want only %s", reasons, rules.ReasonLeaseExpired)
	}
	if got := methods(cc.plugins[1].NodeLog()); !slices.Contains(got, "NodeUnpublishVolume") || !slices.Contains(got, "NodeUnstageVolume") {
		t.Fatalf("node calls %v: want the expired claim unpublished and unstaged", got)
	}
	var unpublishes int64
	for _, p := range cc.plugins {
		unpublishes += p.Stats().Calls["ControllerUnpublishVolume"]
	}
	if unpublishes != 1 {
		t.Fatalf("%d ControllerUnpublishVolume calls, want 1", unpublishes)
	}
	events := volumeEvents(t, cc.control(t), "leased", typeIs("volume-claim-freed"))
	var expired int
	for _, ev := range events {
		if ev.GetType() == "volume-claim-expired" {
			expired++
		}
	}
	if expired != 1 {
		t.Fatalf("%d volume-claim-expired events, want 1: %v", expired, events)
	}
}

// TestRenewClaims renews a leased claim every 2 s for 20 s through a
// follower: it stays taken, and each answer names it with its deadline
// and the workloads lost; a workload with a claim without a lease is
// neither. The claim again with another lease is refused, and a lease out
// of bounds is InvalidArgument naming lease_ttl.
func TestRenewClaims(t *testing.T) {
	cc := newClaimCluster(t)
	cc.create(t, "leased", "SINGLE_NODE_WRITER")
	cc.create(t, "plain", "SINGLE_NODE_WRITER")
	if _, err := cc.claimLeased(t, "leased", 0, "w1", rules.MinLeaseTTL); err != nil {
		t.Fatal(err)
	}
	if _, err := cc.claim(t, "plain", 0, "w2", nil); err != nil {
		t.Fatal(err)
	}
	node := cc.c.Agent(0).NodeID()
	leader := cc.c.WaitForLeader(t, 30*time.Second)
	follower := cc.c.Control((leader.Index + 1) % 3)
	var last time.Time
	for i := range 10 {
		resp, err := follower.RenewClaims(context.Background(), &csisupdv1.RenewClaimsRequest{NodeId: node, WorkloadIds: []string{"w1", "w2", "gone"}})
		if err != nil {
			t.Fatalf("renewal %d: %v", i, err)
		}
		r := resp.GetRenewed()
		if len(r) != 1 || r[0].GetVolumeId() != "leased" || r[0].GetWorkloadId() != "w1" || r[0].GetLeaseTtl().AsDuration() != rules.MinLeaseTTL ||
			r[0].GetDeadline().AsTime().Before(last) {
			t.Fatalf("renewal %d: renewed %v, want the claim of w1 with a deadline not before %v", i, r, last)
		}
		last = r[0].GetDeadline().AsTime()
		if !slices.Equal(resp.GetLostWorkloadIds(), []string{"gone"}) {
			t.Fatalf("renewal %d: lost %v, want [gone]", i, resp.GetLostWorkloadIds())
		}
		if c := claimOf(cc.volume(t, "leased"), node, "w1"); c.GetState() != rules.StateTaken || c.GetReleaseReason() != "" {
			t.Fatalf("after renewal %d: claim %v, want taken", i, c)
		}
		waitOut(t, 2*time.Second)
	}
	v := cc.volume(t, "leased")
	if c := claimOf(v, node, "w1"); c.GetLeaseDeadline() == nil || c.GetLeaseRenewedAt() == nil {
		t.Fatalf("the leader's answer has no lease times: %v", c)
	}
	stale, err := follower.GetVolume(context.Background(), &csisupdv1.VolumeGetRequest{Id: "leased", Stale: true})
	if err != nil {
		t.Fatal(err)
	}
	if c := claimOf(stale.GetVolume(), node, "w1"); c.GetLeaseTtl() == nil || c.GetLeaseDeadline() != nil || c.GetLeaseRenewedAt() != nil {
		t.Fatalf("a follower's stale read: %v, want the lease_ttl without the leader's lease times", c)
	}

	_, err = cc.claimLeased(t, "leased", 0, "w1", time.Minute)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "lease_ttl") {
		t.Fatalf("claim again with another lease: %v, want FailedPrecondition naming lease_ttl", err)
	}
	if _, err := cc.claimLeased(t, "leased", 0, "w1", rules.MinLeaseTTL); err != nil {
		t.Fatalf("claim again with the same lease: %v", err)
	}
	for _, d := range []time.Duration{time.Second, 25 * time.Hour} {
		_, err := cc.claimLeased(t, "plain", 1, "w3", d)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "lease_ttl") {
			t.Fatalf("claim with a lease of %v: %v, want InvalidArgument naming lease_ttl", d, err)
		}
	}
	if _, err := follower.RenewClaims(context.Background(), &csisupdv1.RenewClaimsRequest{NodeId: node}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("renewal without workloads: %v, want InvalidArgument", err)
	}
	if _, err := follower.RenewClaims(context.Background(), &csisupdv1.RenewClaimsRequest{NodeId: "nobody", WorkloadIds: []string{"w1"}}); status.Code(err) != codes.NotFound {
		t.Fatalf("renewal on an unknown node: %v, want NotFound", err)
	}
}

// waitOut lets d pass: the test's subject is what happens over time (a
// lease kept alive by renewals), not a synchronisation.
func waitOut(t *testing.T, d time.Duration) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	<-timer.C
}
