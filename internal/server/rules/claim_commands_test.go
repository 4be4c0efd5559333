package rules

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

var allStates = []string{StateTaken, StateUnpublishing, StateNodeUnpublished, StateControllerUnpublished}

// TestLegalTransitions lists every pair of states: exactly the moves of
// the claim state machine are legal.
func TestLegalTransitions(t *testing.T) {
	legal := map[[2]string]bool{
		{StateTaken, StateTaken}:                                 true,
		{StateTaken, StateUnpublishing}:                          true,
		{StateUnpublishing, StateUnpublishing}:                   true,
		{StateUnpublishing, StateNodeUnpublished}:                true,
		{StateNodeUnpublished, StateNodeUnpublished}:             true,
		{StateNodeUnpublished, StateControllerUnpublished}:       true,
		{StateControllerUnpublished, StateControllerUnpublished}: true,
	}
	for _, from := range append(allStates, "", "bogus") {
		for _, to := range append(allStates, "", "bogus") {
			if got, want := Legal(from, to), legal[[2]string{from, to}]; got != want {
				t.Errorf("Legal(%q, %q) = %v, want %v", from, to, got, want)
			}
		}
	}
}

func claimIn(state string) *statepb.VolumeClaim {
	return &statepb.VolumeClaim{
		NodeId: "n", WorkloadId: "w", State: state, ClaimIndex: 7,
		Mounted: state == StateTaken || state == StateUnpublishing, HostPath: "/h",
		ControllerPublished: state != StateControllerUnpublished, PublishContext: map[string]string{"k": "v"},
	}
}

func volumeWith(c *statepb.VolumeClaim) *statepb.Volume {
	return &statepb.Volume{Id: "v", ModifyIndex: 9, Claims: []*statepb.VolumeClaim{{NodeId: "n", WorkloadId: "other", State: StateTaken}, c}}
}

// TestApplyStep applies each step command to a claim in each state: the
// legal ones change exactly what the step records, the others are
// refused with the stale rule (or InvalidArgument for a move that is no
// transition) and change nothing.
func TestApplyStep(t *testing.T) {
	now := timestamppb.Now()
	fresh := &statepb.VolumeClaim{NodeId: "n", WorkloadId: "w", State: StateTaken, ClaimIndex: 7}
	tests := []struct {
		name  string
		claim *statepb.VolumeClaim
		cmd   func(v *statepb.Volume, c *statepb.VolumeClaim) *statepb.ClaimStepCommand
		check func(c *statepb.VolumeClaim) bool
	}{
		{"published", fresh, func(v *statepb.Volume, c *statepb.VolumeClaim) *statepb.ClaimStepCommand {
			return Published(v, c, map[string]string{"a": "b"})
		}, func(c *statepb.VolumeClaim) bool {
			return c.State == StateTaken && c.ControllerPublished && c.PublishContext["a"] == "b" && !c.Mounted
		}},
		{"mounted with its publication", fresh, func(v *statepb.Volume, c *statepb.VolumeClaim) *statepb.ClaimStepCommand {
			return Mounted(v, c, true, map[string]string{"a": "b"}, "/host", "/staging")
		}, func(c *statepb.VolumeClaim) bool {
			return c.State == StateTaken && c.ControllerPublished && c.Mounted && c.HostPath == "/host" && c.StagingPath == "/staging"
		}},
		{"mounted without a publication", fresh, func(v *statepb.Volume, c *statepb.VolumeClaim) *statepb.ClaimStepCommand {
			return Mounted(v, c, false, nil, "/host", "")
		}, func(c *statepb.VolumeClaim) bool {
			return c.Mounted && !c.ControllerPublished && c.PublishContext == nil
		}},
		{"release starts", claimIn(StateTaken), released, func(c *statepb.VolumeClaim) bool {
			return c.State == StateUnpublishing && c.Mounted && c.StateUpdatedAt == now && c.ReleaseReason == ReasonReleased
		}},
		{"a failed claim starts its release", claimIn(StateTaken), func(v *statepb.Volume, c *statepb.VolumeClaim) *statepb.ClaimStepCommand {
			return Fail(v, c, "mount failed")
		}, func(c *statepb.VolumeClaim) bool {
			return c.State == StateUnpublishing && c.LastError == "mount failed"
		}},
		{"a failed release step keeps the state", claimIn(StateNodeUnpublished), func(v *statepb.Volume, c *statepb.VolumeClaim) *statepb.ClaimStepCommand {
			return Fail(v, c, "unpublish failed")
		}, func(c *statepb.VolumeClaim) bool {
			return c.State == StateNodeUnpublished && c.LastError == "unpublish failed" && c.StateUpdatedAt == nil
		}},
		{"released without its node", claimIn(StateTaken), ReleaseWithoutNode, func(c *statepb.VolumeClaim) bool {
			return c.State == StateUnpublishing && c.NodeGone
		}},
		{"node gone while unpublishing", claimIn(StateUnpublishing), ReleaseWithoutNode, func(c *statepb.VolumeClaim) bool {
			return c.State == StateUnpublishing && c.NodeGone
		}},
		{"node unpublished", claimIn(StateUnpublishing), NodeUnpublished, func(c *statepb.VolumeClaim) bool {
			return c.State == StateNodeUnpublished && !c.Mounted && c.LastError == ""
		}},
		{"controller unpublished", claimIn(StateNodeUnpublished), ControllerUnpublished, func(c *statepb.VolumeClaim) bool {
			return c.State == StateControllerUnpublished && !c.ControllerPublished
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := volumeWith(tt.claim)
			got, err := ApplyStep(v, tt.cmd(v, tt.claim), now)
			if err != nil {
				t.Fatalf("ApplyStep: %v", err)
			}
			if !tt.check(got) {
				t.Fatalf("claim after the step: %v", got)
			}
			if got == tt.claim {
				t.Fatal("ApplyStep changed the stored claim instead of a copy")
			}
		})
	}
}

// TestApplyStepRefusesStale refuses steps built from another state: a
// claim in another state than the step's from, a claim taken again (other
// claim_index), a claim that is gone, and moves that are no transition.
func TestApplyStepRefusesStale(t *testing.T) {
	now := timestamppb.Now()
	for _, state := range allStates {
		for _, mk := range []func(*statepb.Volume, *statepb.VolumeClaim) *statepb.ClaimStepCommand{
			released, NodeUnpublished, ControllerUnpublished,
		} {
			c := claimIn(state)
			v := volumeWith(c)
			for _, from := range allStates {
				cmd := mk(v, c)
				cmd.From = from
				_, err := ApplyStep(v, cmd, now)
				switch {
				case !Legal(cmd.From, cmd.To):
					if status.Code(err) != codes.InvalidArgument {
						t.Errorf("%s -> %s: %v, want InvalidArgument", cmd.From, cmd.To, err)
					}
				case from != state:
					if rule(err) != csisupdv1.ClaimRuleStale {
						t.Errorf("step from %s of a claim in %s: %v, want the stale rule", from, state, err)
					}
				case err != nil:
					t.Errorf("legal step %s -> %s: %v", cmd.From, cmd.To, err)
				}
			}
		}
	}
	c := claimIn(StateTaken)
	v := volumeWith(c)
	cmd := StartRelease(v, c, ReasonReleased)
	cmd.ClaimIndex = 3
	if _, err := ApplyStep(v, cmd, now); rule(err) != csisupdv1.ClaimRuleStale {
		t.Errorf("step of an earlier claim of the same workload: %v, want the stale rule", err)
	}
	cmd = StartRelease(v, c, ReasonReleased)
	cmd.WorkloadId = "gone"
	if _, err := ApplyStep(v, cmd, now); rule(err) != csisupdv1.ClaimRuleStale {
		t.Errorf("step of a claim that is gone: %v, want the stale rule", err)
	}
}

func TestCheckRemove(t *testing.T) {
	for _, state := range allStates {
		c := claimIn(state)
		v := volumeWith(c)
		i, err := CheckRemove(v, Remove(v, c))
		if state == StateControllerUnpublished {
			if err != nil || i != 1 {
				t.Errorf("remove of a released claim: %d, %v", i, err)
			}
			continue
		}
		if rule(err) != csisupdv1.ClaimRuleStale {
			t.Errorf("remove of a claim in %s: %v, want the stale rule", state, err)
		}
	}
	c := claimIn(StateControllerUnpublished)
	v := volumeWith(c)
	cmd := Remove(v, c)
	cmd.ClaimIndex++
	if _, err := CheckRemove(v, cmd); rule(err) != csisupdv1.ClaimRuleStale {
		t.Errorf("remove of another claim of the workload: %v, want the stale rule", err)
	}
}

func TestUnfinished(t *testing.T) {
	tests := []struct {
		claim *statepb.VolumeClaim
		want  bool
	}{
		{&statepb.VolumeClaim{State: StateTaken}, true},
		{&statepb.VolumeClaim{State: StateTaken, ControllerPublished: true}, true},
		{&statepb.VolumeClaim{State: StateTaken, Mounted: true}, false},
		{&statepb.VolumeClaim{State: StateTaken, NodeGone: true}, false},
		{&statepb.VolumeClaim{State: StateUnpublishing}, false},
	}
	for _, tt := range tests {
		if got := Unfinished(tt.claim); got != tt.want {
			t.Errorf("Unfinished(%v) = %v, want %v", tt.claim, got, tt.want)
		}
	}
}

// rule returns the ClaimRefused rule of err, or "".
func rule(err error) string {
	d, ok := csisupdv1.ErrorDetail[*csisupdv1.ClaimRefused](err)
	if !ok {
		return ""
	}
	return d.GetRule()
}

func TestCheckCreateAndDelete(t *testing.T) {
	v := &statepb.Volume{Id: "v", ModifyIndex: 5}
	if err := CheckCreate(nil, v); err != nil {
		t.Fatalf("create of a new volume: %v", err)
	}
	if err := CheckCreate(&statepb.Volume{Id: "v"}, v); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("create over an existing volume: %v, want AlreadyExists", err)
	}
	if err := CheckCreate(nil, volumeWith(claimIn(StateTaken))); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("create of a volume with claims: %v, want InvalidArgument", err)
	}
	for _, idx := range []uint64{0, 5} {
		if err := CheckDelete(v, &statepb.VolumeDeleteCommand{VolumeIndex: idx}); err != nil {
			t.Fatalf("delete at index %d of a volume without claims: %v", idx, err)
		}
	}
	if err := CheckDelete(v, &statepb.VolumeDeleteCommand{VolumeIndex: 4}); rule(err) != csisupdv1.ClaimRuleStale {
		t.Fatalf("delete decided on an older row: %v, want the stale rule", err)
	}
	if err := CheckDelete(v, &statepb.VolumeDeleteCommand{VolumeIndex: 4, Forced: true}); rule(err) != csisupdv1.ClaimRuleStale {
		t.Fatalf("a forced delete decided on an older row: %v, want the stale rule", err)
	}
	for _, st := range allStates {
		if err := CheckDelete(volumeWith(claimIn(st)), &statepb.VolumeDeleteCommand{}); status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("delete of a volume with a claim %s: %v, want FailedPrecondition", st, err)
		}
		if err := CheckDelete(volumeWith(claimIn(st)), &statepb.VolumeDeleteCommand{Forced: true}); err != nil {
			t.Fatalf("forced delete of a volume with a claim %s: %v", st, err)
		}
	}
}

func TestApplyStepRecordsAForcedSkip(t *testing.T) {
	c := claimIn(StateUnpublishing)
	v := volumeWith(c)
	cmd := NodeUnpublished(v, c)
	cmd.Forced, cmd.Skipped = true, "node-unpublish: node n did not answer"
	got, err := ApplyStep(v, cmd, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !got.GetForced() || len(got.GetSkippedSteps()) != 1 || got.GetSkippedSteps()[0] != cmd.Skipped || got.GetState() != StateNodeUnpublished {
		t.Fatalf("claim after a forced skip: forced=%v skipped=%v state=%s", got.GetForced(), got.GetSkippedSteps(), got.GetState())
	}
	if len(c.GetSkippedSteps()) != 0 {
		t.Error("ApplyStep changed the stored claim")
	}
	// A later step keeps the record.
	v2 := volumeWith(got)
	next, err := ApplyStep(v2, ControllerUnpublished(v2, got), nil)
	if err != nil || !next.GetForced() || len(next.GetSkippedSteps()) != 1 {
		t.Fatalf("the next step: %v, forced=%v skipped=%v", err, next.GetForced(), next.GetSkippedSteps())
	}
	// Only a forced release skips.
	cmd = NodeUnpublished(v, c)
	cmd.Skipped = "node-unpublish: x"
	if _, err := ApplyStep(v, cmd, nil); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a skip without force: %v, want InvalidArgument", err)
	}
}

// released builds the step that starts a release for ReleaseVolume.
func released(v *statepb.Volume, c *statepb.VolumeClaim) *statepb.ClaimStepCommand {
	return StartRelease(v, c, ReasonReleased)
}

// TestReleaseReasons checks which reason a claim keeps: the first, unless
// an operator's force or a node gone for good replaces it, and none on a
// step of taking or an unknown one.
func TestReleaseReasons(t *testing.T) {
	now := timestamppb.Now()
	for _, tc := range []struct {
		name   string
		had    string
		mk     func(*statepb.Volume, *statepb.VolumeClaim) *statepb.ClaimStepCommand
		want   string
		refuse bool
	}{
		{"a lease expires", "", func(v *statepb.Volume, c *statepb.VolumeClaim) *statepb.ClaimStepCommand {
			return StartRelease(v, c, ReasonLeaseExpired)
		}, ReasonLeaseExpired, false},
		{"a failed claim", "", func(v *statepb.Volume, c *statepb.VolumeClaim) *statepb.ClaimStepCommand {
			return Fail(v, c, "mount failed")
		}, ReasonFailed, false},
		{"the first reason stays", ReasonNotInSync, func(v *statepb.Volume, c *statepb.VolumeClaim) *statepb.ClaimStepCommand {
			cmd := Fail(v, c, "node unpublish failed")
			cmd.ReleaseReason = ReasonReleased
			return cmd
		}, ReasonNotInSync, false},
		{"a force replaces it", ReasonLeaseExpired, func(v *statepb.Volume, c *statepb.VolumeClaim) *statepb.ClaimStepCommand {
			cmd := Fail(v, c, "node unpublish failed")
			cmd.Forced = true
			return cmd
		}, ReasonForced, false},
		{"a node gone replaces it", ReasonLeaseExpired, ReleaseWithoutNode, ReasonNodeGone, false},
		{"an unknown reason", "", func(v *statepb.Volume, c *statepb.VolumeClaim) *statepb.ClaimStepCommand {
			return StartRelease(v, c, "bored")
		}, "", true},
		{"a reason on a step of taking", "", func(v *statepb.Volume, c *statepb.VolumeClaim) *statepb.ClaimStepCommand {
			cmd := Published(v, c, nil)
			cmd.ReleaseReason = ReasonReleased
			return cmd
		}, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := claimIn(StateTaken)
			if tc.had != "" {
				c = claimIn(StateUnpublishing)
				c.ReleaseReason = tc.had
			}
			v := volumeWith(c)
			got, err := ApplyStep(v, tc.mk(v, c), now)
			if tc.refuse {
				if status.Code(err) != codes.InvalidArgument {
					t.Fatalf("ApplyStep: %v, want InvalidArgument", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ApplyStep: %v", err)
			}
			if got.GetReleaseReason() != tc.want {
				t.Errorf("release_reason %q, want %q", got.GetReleaseReason(), tc.want)
			}
		})
	}
}
