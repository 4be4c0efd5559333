//go:build fault

package server_test

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// TestEphemeralDeletedAfterLeaderKill releases the last claim of an
// ephemeral volume while the plugin fails DeleteVolume, so that the
// release finishes and the delete does not, then kills the leader and
// lets the plugin delete again: the new leader's volume watcher deletes
// the volume, in the plugin and in the cluster.
func TestEphemeralDeletedAfterLeaderKill(t *testing.T) {
	nc := newNodeLocalCluster(t, nil)
	if _, err := nc.claimCreate(t, "eph", 0, "w", "SINGLE_NODE_WRITER", true); err != nil {
		t.Fatalf("claim with create and ephemeral: %v", err)
	}
	nc.plugins[0].SetFaults(testplugin.Faults{Errors: map[string]codes.Code{"DeleteVolume": codes.Internal}})
	if err := nc.release(t, "eph", 0, "w"); err != nil {
		t.Fatalf("release: %v (a failed delete of an ephemeral volume does not fail its release)", err)
	}
	if nc.plugins[0].Stats().Calls["DeleteVolume"] == 0 {
		t.Fatal("the release did not try to delete the ephemeral volume")
	}
	old := nc.c.WaitForLeader(t, 30*time.Second)
	other := (old.Index + 1) % 3
	testutil.WaitFor(t, 10*time.Second, "the released, undeleted volume replicated before the kill", func() bool {
		v := nc.staleVolume(t, other, "eph")
		return v != nil && v.GetEphemeral() && len(v.GetClaims()) == 0
	})
	nc.c.Kill(old.Index)
	nc.plugins[0].SetFaults(testplugin.Faults{})

	testutil.WaitFor(t, 30*time.Second, "the new leader's watcher to delete the ephemeral volume", func() bool {
		return nc.staleVolume(t, other, "eph") == nil && nc.holder(t, "eph") < 0
	})
}
