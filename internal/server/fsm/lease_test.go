package fsm

import (
	"testing"

	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// TestLeaseExpiryEvent checks that a claim whose lease expired raises
// exactly one volume-claim-expired event over its whole release, and
// that a release for another reason raises none.
func TestLeaseExpiryEvent(t *testing.T) {
	for _, tc := range []struct {
		reason string
		want   int
	}{
		{rules.ReasonLeaseExpired, 1},
		{rules.ReasonReleased, 0},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			e := newAvailabilityEnv(t)
			if err := e.claim("w"); err != nil {
				t.Fatal(err)
			}
			step := func(mk func(*statepb.Volume, *statepb.VolumeClaim) *statepb.ClaimStepCommand) applied {
				v := e.f.State().Volume("v")
				_, c := rules.Find(v, "n1", "w")
				return e.must(e.apply(&statepb.LogEntry{Command: &statepb.LogEntry_ClaimStep{ClaimStep: mk(v, c)}}))
			}
			expired := 0
			count := func(r applied) {
				for _, ev := range r.Events {
					if ev.GetType() == "volume-claim-expired" {
						expired++
						if ev.GetVolumeId() != "v" || ev.GetNodeId() != "n1" || ev.GetPluginId() != "p" {
							t.Errorf("event %v, want volume v, node n1, plugin p", ev)
						}
					}
				}
			}
			count(step(func(v *statepb.Volume, c *statepb.VolumeClaim) *statepb.ClaimStepCommand {
				return rules.StartRelease(v, c, tc.reason)
			}))
			// A failed step of the release repeats nothing.
			count(step(func(v *statepb.Volume, c *statepb.VolumeClaim) *statepb.ClaimStepCommand {
				return rules.Fail(v, c, "node unpublish failed")
			}))
			count(step(rules.NodeUnpublished))
			count(step(rules.ControllerUnpublished))
			if expired != tc.want {
				t.Fatalf("%d volume-claim-expired events, want %d", expired, tc.want)
			}
			_, c := rules.Find(e.f.State().Volume("v"), "n1", "w")
			if c.GetReleaseReason() != tc.reason {
				t.Fatalf("release_reason %q, want %q", c.GetReleaseReason(), tc.reason)
			}
		})
	}
}
