package rules

import (
	"testing"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

func TestLeaseExpiry(t *testing.T) {
	ready := &statepb.ClusterNode{Id: "n1", Status: state.NodeStatusReady}
	down := &statepb.ClusterNode{Id: "n1", Status: state.NodeStatusDown}
	for _, tc := range []struct {
		name       string
		c          *statepb.VolumeClaim
		claimIndex uint64
		node       *statepb.ClusterNode
		release    bool
		wait       bool
	}{
		{"a taken claim on a ready node", claimIn(StateTaken), 7, ready, true, false},
		{"an unfinished claim", func() *statepb.VolumeClaim { c := claimIn(StateTaken); c.Mounted = false; return c }(), 7, ready, true, false},
		{"a claim on a down node waits", claimIn(StateTaken), 7, down, false, true},
		{"a claim whose node is gone waits", claimIn(StateTaken), 7, nil, false, true},
		{"a claim taken again", claimIn(StateTaken), 3, ready, false, false},
		{"a claim being released", claimIn(StateUnpublishing), 7, ready, false, false},
		{"a claim that is gone", nil, 7, ready, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := &statepb.Volume{Id: "v"}
			if tc.c != nil {
				v = volumeWith(tc.c)
			}
			cmd, wait := LeaseExpiry(v, tc.c, tc.claimIndex, tc.node)
			if wait != tc.wait || (cmd != nil) != tc.release {
				t.Fatalf("LeaseExpiry = %v, wait %v; want a release %v, wait %v", cmd, wait, tc.release, tc.wait)
			}
			if cmd == nil {
				return
			}
			if cmd.GetReleaseReason() != ReasonLeaseExpired || cmd.GetFrom() != StateTaken || cmd.GetTo() != StateUnpublishing {
				t.Fatalf("step %v, want taken -> unpublishing with reason %s", cmd, ReasonLeaseExpired)
			}
			got, err := ApplyStep(v, cmd, timestamppb.Now())
			if err != nil || got.GetReleaseReason() != ReasonLeaseExpired {
				t.Fatalf("ApplyStep: %v, %v; want the claim releasing with reason %s", got, err, ReasonLeaseExpired)
			}
		})
	}
}
