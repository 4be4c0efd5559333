package fsm

import (
	"testing"

	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// TestNodeGoneNeedsTheNodeDown checks that a claim is released without
// its node only while the node is down or gone: a leader's decision that
// a node came back since would free a volume still mounted there.
func TestNodeGoneNeedsTheNodeDown(t *testing.T) {
	tests := []struct {
		name   string
		status string
		again  bool // the claim is node_gone already
		want   codes.Code
	}{
		{"node ready", state.NodeStatusReady, false, codes.FailedPrecondition},
		{"node down", state.NodeStatusDown, false, codes.OK},
		{"node back, decision stored before", state.NodeStatusReady, true, codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := New(Config{Events: testEvents(t, 64, 32)})
			if err != nil {
				t.Fatal(err)
			}
			apply := func(e *statepb.LogEntry) error {
				e.Time = timestamppb.Now()
				return applyAll(t, f, e)[0].Err
			}
			must := func(err error) {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
			}
			must(apply(register("n1", &statepb.Plugin{Id: "p", Type: "node", Healthy: true, NodeId: "csi-n1"})))
			must(apply(&statepb.LogEntry{Command: &statepb.LogEntry_VolumeCreate{VolumeCreate: &statepb.VolumeCreateCommand{
				Volume: &statepb.Volume{Id: "v", PluginId: "p", ExternalId: "x-v",
					Capabilities: []*statepb.VolumeCapability{{AccessType: "mount", AccessMode: "SINGLE_NODE_WRITER"}}}}}}))
			v := f.State().Volume("v")
			must(apply(&statepb.LogEntry{Command: &statepb.LogEntry_ClaimTake{ClaimTake: rules.Take(v, &statepb.VolumeClaim{
				NodeId: "n1", CsiNodeId: "csi-n1", WorkloadId: "w", State: rules.StateTaken,
				Usage: &statepb.VolumeUsage{AccessType: "mount", AccessMode: "SINGLE_NODE_WRITER"}})}}))
			if tt.again {
				must(apply(setStatus("n1", state.NodeStatusDown)))
				v := f.State().Volume("v")
				must(apply(&statepb.LogEntry{Command: &statepb.LogEntry_ClaimStep{ClaimStep: rules.ReleaseWithoutNode(v, v.GetClaims()[0])}}))
			}
			must(apply(setStatus("n1", tt.status)))
			v = f.State().Volume("v")
			err = apply(&statepb.LogEntry{Command: &statepb.LogEntry_ClaimStep{ClaimStep: rules.ReleaseWithoutNode(v, v.GetClaims()[0])}})
			if got := status.Code(err); got != tt.want {
				t.Fatalf("node_gone step with the node %s: %v, want %s", tt.status, err, tt.want)
			}
			if c := f.State().Volume("v").GetClaims()[0]; c.GetNodeGone() != (tt.want == codes.OK) {
				t.Errorf("claim node_gone = %v after the step", c.GetNodeGone())
			}
		})
	}
}
