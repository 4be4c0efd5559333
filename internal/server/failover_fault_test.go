//go:build fault

// The failover acceptance test. Run it with
//
//	go test -race -tags fault -run TestVolumeWorkRightAfterFailover -v ./internal/server/
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
	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// failoverBound is how soon after a new leader is known volume work must
// succeed again (issue: "volume work at once after a leader change").
const failoverBound = 2 * time.Second

// realisticTTLs gives the nodes heartbeat TTLs as long as production's
// (the default minimum is 10 s): far longer than failoverBound, so that
// volume work cannot wait for the nodes' next heartbeats on their TTL.
func realisticTTLs(_ int, cfg *server.Config) {
	cfg.MinHeartbeatTTL = 20 * time.Second
	cfg.FailoverHeartbeatTTL = time.Minute
}

// TestVolumeWorkRightAfterFailover kills the leader of 3 servers with 2
// agents, then restarts every server: each time, a volume create and a
// volume claim succeed within failoverBound of a new leader being known,
// without waiting for the nodes' heartbeats, which are due on TTLs of 20 s
// and more. Each call is retried on errors a client retries; the figures
// are logged.
func TestVolumeWorkRightAfterFailover(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 3, Agents: 2, Configure: realisticTTLs})
	// One controller, on agent 0, and a node service on both: the claims
	// on agent 1 need a call to each agent, and the controller is the
	// one that made the volume (test plugins do not share their volumes).
	c.Agent(0).StartPlugin("tp", testplugin.Config{})
	c.Agent(1).StartPlugin("tp", testplugin.Config{Type: testplugin.TypeNode})
	claimNode := c.Agent(1).NodeID()
	testutil.WaitFor(t, 30*time.Second, "plugin tp healthy on both agents", func() bool {
		ctl := c.Control(c.WaitForLeader(t, 30*time.Second).Index)
		p, err := ctl.GetPlugin(context.Background(), &csisupdv1.PluginGetRequest{Id: "tp"})
		return err == nil && p.GetPlugin().GetNodesHealthy() == 2 && p.GetPlugin().GetControllersHealthy() == 1
	})

	for _, phase := range []struct {
		name string
		// vol is the volume claimed after the fault.
		vol   string
		fault func(t *testing.T) *testcluster.Member
	}{
		{"leader killed", "claimed-after-kill", func(t *testing.T) *testcluster.Member {
			old := c.WaitForLeader(t, 30*time.Second)
			c.Kill(old.Index)
			return waitForNewLeader(t, c, old.ID)
		}},
		{"every server restarted", "claimed-after-restart", func(t *testing.T) *testcluster.Member {
			for _, m := range c.Members() {
				c.Stop(m.Index)
			}
			for _, m := range c.Members() {
				c.Restart(m.Index)
			}
			return waitForNewLeader(t, c, "")
		}},
	} {
		t.Run(phase.name, func(t *testing.T) {
			// A volume to claim, made before the fault.
			claimVol := phase.vol
			if _, err := c.Control(c.WaitForLeader(t, 30*time.Second).Index).CreateVolume(context.Background(), &csisupdv1.VolumeCreateRequest{
				Id: claimVol, PluginId: "tp", Capabilities: []*csisupdv1.VolumeCapability{{AccessType: "mount", AccessMode: "SINGLE_NODE_WRITER"}},
			}); err != nil {
				t.Fatalf("create %s before the fault: %v", claimVol, err)
			}
			leader := phase.fault(t)
			known := time.Now()
			// Calls go through a follower, as a CLI's may: it forwards
			// them to the leader.
			ctl := c.Control(follower(c, leader).Index)
			var wg sync.WaitGroup
			var create, claim firstSuccess
			wg.Add(2)
			go func() {
				defer wg.Done()
				create = retryFrom(known, func(ctx context.Context) error {
					_, err := ctl.CreateVolume(ctx, &csisupdv1.VolumeCreateRequest{Id: "after-" + claimVol, PluginId: "tp"})
					return err
				})
			}()
			go func() {
				defer wg.Done()
				claim = retryFrom(known, func(ctx context.Context) error {
					_, err := ctl.ClaimVolume(ctx, &csisupdv1.VolumeClaimRequest{
						Id: claimVol, NodeId: claimNode, WorkloadId: "w-" + claimVol,
						Usage: &csisupdv1.VolumeUsage{AccessMode: "SINGLE_NODE_WRITER"},
					})
					return err
				})
			}()
			wg.Wait()
			t.Logf("%s: new leader %s; create succeeded after %v (%d attempts), claim after %v (%d attempts)",
				phase.name, leader.ID, create.after, create.attempts, claim.after, claim.attempts)
			for what, r := range map[string]firstSuccess{"create": create, "claim": claim} {
				if r.err != nil {
					t.Errorf("%s after the new leader was known: %v; last error retried: %v", what, r.err, r.lastRetried)
				} else if r.after > failoverBound {
					t.Errorf("%s first succeeded %v after the new leader was known, want within %v; last error before: %v",
						what, r.after, failoverBound, r.lastRetried)
				}
			}
		})
	}
}

// waitForNewLeader waits for a single ready leader other than old and
// returns it.
func waitForNewLeader(t *testing.T, c *testcluster.Cluster, old string) *testcluster.Member {
	t.Helper()
	var leader *testcluster.Member
	testutil.WaitFor(t, 30*time.Second, "a new leader", func() bool {
		leader = c.Leader()
		return leader != nil && leader.ID != old
	})
	return leader
}

// follower returns a running member other than leader.
func follower(c *testcluster.Cluster, leader *testcluster.Member) *testcluster.Member {
	for _, m := range c.Members() {
		if m.Running() && m != leader {
			return m
		}
	}
	return leader
}

// firstSuccess is how a call retried from a moment went.
type firstSuccess struct {
	// after is when the call first succeeded, counted from the moment.
	after    time.Duration
	attempts int
	// err is the error that ended the retries, if none succeeded.
	err error
	// lastRetried is the last retryable error before the success.
	lastRetried error
}

// retryFrom makes call until it succeeds, retrying on errors a client
// retries (marked retryable, or Unavailable), for up to 30 s after from.
func retryFrom(from time.Time, call func(ctx context.Context) error) firstSuccess {
	deadline := from.Add(30 * time.Second)
	var r firstSuccess
	for {
		r.attempts++
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		err := call(ctx)
		cancel()
		if err == nil {
			r.after = time.Since(from)
			return r
		}
		if !csisupdv1.IsRetryable(err) && status.Code(err) != codes.Unavailable {
			r.err = err
			return r
		}
		r.lastRetried = err
		if time.Now().After(deadline) {
			r.err = fmt.Errorf("no success within 30 s: %w", err)
			return r
		}
		time.Sleep(50 * time.Millisecond) // a client's pause between retries
	}
}
