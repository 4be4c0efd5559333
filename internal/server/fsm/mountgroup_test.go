package fsm

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// TestClaimTakeMountGroup checks that claim_take applies the mount group
// rule itself: a take the leader built while the node's plugin had
// VOLUME_MOUNT_GROUP is refused when the plugin lost it before the entry
// was applied, and the group is stored with the claim when it did not.
func TestClaimTakeMountGroup(t *testing.T) {
	withGroup := &statepb.Plugin{Id: "p", Type: "node", Healthy: true, NodeId: "csi-n1",
		NodeCapabilities: []string{plugin.CapStageUnstageVolume, plugin.CapVolumeMountGroup}}
	without := &statepb.Plugin{Id: "p", Type: "node", Healthy: true, NodeId: "csi-n1",
		NodeCapabilities: []string{plugin.CapStageUnstageVolume}}
	take := func(workload string) *statepb.LogEntry {
		return &statepb.LogEntry{Command: &statepb.LogEntry_ClaimTake{ClaimTake: &statepb.ClaimTakeCommand{VolumeId: "v",
			Claim: &statepb.VolumeClaim{NodeId: "n1", CsiNodeId: "csi-n1", WorkloadId: workload, State: rules.StateTaken,
				Usage: &statepb.VolumeUsage{AccessType: "mount", AccessMode: "MULTI_NODE_MULTI_WRITER", VolumeMountGroup: "1000"}}}}}
	}
	tests := []struct {
		name    string
		plugins *statepb.Plugin
		refused bool
	}{
		{"plugin has VOLUME_MOUNT_GROUP", withGroup, false},
		{"plugin lost VOLUME_MOUNT_GROUP", without, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := New(Config{Events: testEvents(t, 64, 32)})
			if err != nil {
				t.Fatal(err)
			}
			entries := []*statepb.LogEntry{
				register("n1", withGroup),
				{Command: &statepb.LogEntry_VolumeCreate{VolumeCreate: &statepb.VolumeCreateCommand{Volume: &statepb.Volume{
					Id: "v", PluginId: "p", ExternalId: "x-v",
					Capabilities: []*statepb.VolumeCapability{{AccessType: "mount", AccessMode: "MULTI_NODE_MULTI_WRITER"}}}}}},
				setPlugins("n1", tt.plugins),
				take("w1"),
			}
			for _, e := range entries {
				e.Time = timestamppb.Now()
			}
			res := applyAll(t, f, entries...)
			for i, r := range res[:3] {
				if r.Err != nil {
					t.Fatalf("entry %d: %v", i, r.Err)
				}
			}
			err = res[3].Err
			v := f.State().Volume("v")
			if !tt.refused {
				if err != nil {
					t.Fatalf("claim_take refused: %v", err)
				}
				if len(v.GetClaims()) != 1 || v.GetClaims()[0].GetUsage().GetVolumeMountGroup() != "1000" {
					t.Fatalf("claims = %v, want one with mount group 1000", v.GetClaims())
				}
				return
			}
			d, ok := csisupdv1.ErrorDetail[*csisupdv1.CapabilityMissing](err)
			if status.Code(err) != codes.FailedPrecondition || !ok || d.GetCapability() != plugin.CapVolumeMountGroup || d.GetNode() != "n1" || d.GetPluginId() != "p" {
				t.Fatalf("claim_take error = %v, want CapabilityMissing VOLUME_MOUNT_GROUP of plugin p on node n1", err)
			}
			if len(v.GetClaims()) != 0 {
				t.Errorf("claims after the refusal = %v, want none", v.GetClaims())
			}
		})
	}
}
