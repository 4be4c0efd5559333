package server_test

import (
	"context"
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

// TestCutOffLeaderAcknowledgesNothing cuts the leader's raft off from the
// other servers while clients still reach it. Until its lease runs out it
// believes it leads, and the other servers may already have a new leader
// that moved the state on (the nemesis found one, paused by SIGSTOP, that
// acknowledged the release of a claim it had never seen). So an answer it
// would give from its own state, without a raft write, must first hear
// from a quorum: a release with nothing to release, a claim already
// mounted and a create of a volume that exists all fail as "no leader".
func TestCutOffLeaderAcknowledgesNothing(t *testing.T) {
	// Raft timings ten times the fastest: a lease of a second, far longer
	// than the calls below take to arrive.
	c := testcluster.New(t, testcluster.Config{Servers: 3, Agents: 1, Configure: func(_ int, cfg *server.Config) {
		cfg.RaftMultiplier = 10
	}})
	c.Agent(0).StartPlugin("tp", testplugin.Config{NodeID: "csi-node-0"})
	leader := c.WaitForLeader(t, 60*time.Second)
	ctl := c.Control(leader.Index)
	testutil.WaitFor(t, 30*time.Second, "plugin tp healthy", func() bool {
		p, err := ctl.GetPlugin(context.Background(), &csisupdv1.PluginGetRequest{Id: "tp"})
		return err == nil && p.GetPlugin().GetNodesHealthy() == 1 && p.GetPlugin().GetControllersHealthy() == 1
	})
	create := &csisupdv1.VolumeCreateRequest{
		Id: "v", PluginId: "tp", CapacityMinBytes: 1 << 20,
		Capabilities: []*csisupdv1.VolumeCapability{{AccessType: "mount", AccessMode: "SINGLE_NODE_WRITER"}},
	}
	if _, err := ctl.CreateVolume(context.Background(), create); err != nil {
		t.Fatal(err)
	}
	node := c.Agent(0).NodeID()
	claim := &csisupdv1.VolumeClaimRequest{Id: "v", NodeId: node, WorkloadId: "w1"}
	if _, err := ctl.ClaimVolume(context.Background(), claim); err != nil {
		t.Fatal(err)
	}

	c.PartitionRaft(leader.Index)
	defer c.HealRaft(leader.Index)
	calls := map[string]func(ctx context.Context) error{
		"release of a claim it does not hold": func(ctx context.Context) error {
			_, err := ctl.ReleaseVolume(ctx, &csisupdv1.VolumeReleaseRequest{Id: "v", NodeId: node, WorkloadId: "w-never-claimed"})
			return err
		},
		"claim already mounted": func(ctx context.Context) error {
			_, err := ctl.ClaimVolume(ctx, claim)
			return err
		},
		"create of a volume that exists": func(ctx context.Context) error {
			_, err := ctl.CreateVolume(ctx, create)
			return err
		},
	}
	errs := make(map[string]chan error)
	for name, call := range calls {
		ch := make(chan error, 1)
		errs[name] = ch
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			ch <- call(ctx)
		}()
	}
	for name, ch := range errs {
		err := <-ch
		if err == nil {
			t.Errorf("%s: acknowledged by a leader cut off from its quorum", name)
			continue
		}
		if status.Code(err) != codes.Unavailable {
			t.Errorf("%s: %v; want Unavailable (no leader)", name, err)
		}
	}
}
