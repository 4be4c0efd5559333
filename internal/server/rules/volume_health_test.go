package rules

import (
	"testing"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/csisupd/csisupd/internal/server/statepb"
)

func TestApplyHealth(t *testing.T) {
	t0, t1 := timestamppb.New(timestamppb.Now().AsTime().Add(-1)), timestamppb.Now()
	v := &statepb.Volume{Id: "v"}
	report := func(source string, abnormal bool, msg string) *statepb.VolumeHealthCommand {
		return &statepb.VolumeHealthCommand{VolumeId: "v", Source: source, Abnormal: abnormal, Message: msg}
	}
	if HealthChanged(v, "n1", false, "") {
		t.Error("normal over nothing is a change")
	}
	if !HealthChanged(v, "n1", true, "bad") {
		t.Error("abnormal over nothing is no change")
	}
	v.Conditions = ApplyHealth(v, report("n1", true, "bad"), t0)
	v.Conditions = ApplyHealth(v, report(HealthSourceController, true, "worse"), t0)
	if len(v.Conditions) != 2 || v.Conditions[0].GetSource() != HealthSourceController {
		t.Fatalf("conditions = %v, want two sorted by source", v.Conditions)
	}
	if HealthChanged(v, "n1", true, "bad") {
		t.Error("the same report again is a change")
	}
	// A new message keeps since; normal removes the condition.
	v.Conditions = ApplyHealth(v, report("n1", true, "still bad"), t1)
	if c := Condition(v, "n1"); c.GetMessage() != "still bad" || !c.GetSince().AsTime().Equal(t0.AsTime()) {
		t.Errorf("condition after a new message = %v, want since kept", c)
	}
	v.Conditions = ApplyHealth(v, report("n1", false, ""), t1)
	if Condition(v, "n1") != nil || len(v.Conditions) != 1 {
		t.Errorf("conditions after normal = %v", v.Conditions)
	}
	if err := CheckHealth(v, report("", true, "x")); err == nil {
		t.Error("a report without a source passed")
	}
	if typ, _ := HealthEvent(report("n1", true, "x")); typ != "volume-abnormal" {
		t.Errorf("event %s", typ)
	}
	if typ, _ := HealthEvent(report("n1", false, "")); typ != "volume-normal" {
		t.Errorf("event %s", typ)
	}
}

func TestNodeConditionsLeft(t *testing.T) {
	v := &statepb.Volume{
		Claims:     []*statepb.VolumeClaim{{NodeId: "n1", WorkloadId: "w"}},
		Conditions: []*statepb.VolumeCondition{{Source: HealthSourceController}, {Source: "n1"}, {Source: "n2"}},
	}
	if got := NodeConditionsLeft(v, "n1"); len(got) != 3 {
		t.Errorf("a node with a claim left loses its condition: %v", got)
	}
	got := NodeConditionsLeft(v, "n2")
	if len(got) != 2 || got[0].GetSource() != HealthSourceController || got[1].GetSource() != "n1" {
		t.Errorf("conditions after n2's last claim = %v", got)
	}
	if len(v.Conditions) != 3 {
		t.Error("NodeConditionsLeft changed the volume")
	}
}
