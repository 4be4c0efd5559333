package fsm

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// availabilityEnv is an FSM with node n1 running plugin p and volume v of
// p, whose applied entries' errors and events the test reads.
type availabilityEnv struct {
	t      *testing.T
	f      *FSM
	events *Events
}

// applied is an entry's result and the events it raised.
type applied struct {
	Result
	Events []*csisupdv1.ClusterEvent
}

func newAvailabilityEnv(t *testing.T) *availabilityEnv {
	events := testEvents(t, 64, 32)
	f, err := New(Config{Events: events})
	if err != nil {
		t.Fatal(err)
	}
	e := &availabilityEnv{t: t, f: f, events: events}
	e.must(e.apply(register("n1", &statepb.Plugin{Id: "p", Type: "node", Healthy: true, NodeId: "csi-n1"})))
	e.must(e.apply(&statepb.LogEntry{Command: &statepb.LogEntry_VolumeCreate{VolumeCreate: &statepb.VolumeCreateCommand{
		Volume: &statepb.Volume{Id: "v", PluginId: "p", ExternalId: "x-v",
			Capabilities: []*statepb.VolumeCapability{{AccessType: "mount", AccessMode: "MULTI_NODE_MULTI_WRITER"}}}}}}))
	return e
}

func (e *availabilityEnv) apply(entry *statepb.LogEntry) applied {
	entry.Time = timestamppb.Now()
	before := e.f.State().LatestIndex()
	r := applied{Result: applyAll(e.t, e.f, entry)[0]}
	if r.Err == nil {
		for _, ev := range readAll(e.t, e.events, before) {
			r.Events = append(r.Events, ev.Payload)
		}
	}
	return r
}

func (e *availabilityEnv) must(r applied) applied {
	e.t.Helper()
	if r.Err != nil {
		e.t.Fatal(r.Err)
	}
	return r
}

func (e *availabilityEnv) claim(workload string) error {
	v := e.f.State().Volume("v")
	return e.apply(&statepb.LogEntry{Command: &statepb.LogEntry_ClaimTake{ClaimTake: rules.Take(v, &statepb.VolumeClaim{
		NodeId: "n1", CsiNodeId: "csi-n1", WorkloadId: workload, State: rules.StateTaken,
		Usage: &statepb.VolumeUsage{AccessType: "mount", AccessMode: "MULTI_NODE_MULTI_WRITER"}})}}).Err
}

func setAvailability(v, a string) *statepb.LogEntry {
	return &statepb.LogEntry{Command: &statepb.LogEntry_VolumeAvailability{VolumeAvailability: &statepb.VolumeAvailabilityCommand{VolumeId: v, Availability: a}}}
}

func drain(node, plugin string, on bool) *statepb.LogEntry {
	return &statepb.LogEntry{Command: &statepb.LogEntry_PluginDrain{PluginDrain: &statepb.PluginDrainCommand{NodeId: node, PluginId: plugin, Draining: on}}}
}

func refusedBy(err error, rule string) bool {
	d, ok := csisupdv1.ErrorDetail[*csisupdv1.ClaimRefused](err)
	return ok && d.GetRule() == rule
}

func TestFSMVolumeAvailability(t *testing.T) {
	e := newAvailabilityEnv(t)
	if err := e.claim("w1"); err != nil {
		t.Fatal(err)
	}
	r := e.must(e.apply(setAvailability("v", rules.AvailabilityPause)))
	if len(r.Events) != 1 || r.Events[0].GetType() != "volume-availability" || !strings.Contains(r.Events[0].GetDescription(), "pause (was active)") {
		t.Errorf("events of pause = %v", r.Events)
	}
	if err := e.claim("w2"); !refusedBy(err, csisupdv1.ClaimRuleAvailability) {
		t.Fatalf("claim of a paused volume: %v, want the availability rule", err)
	}
	if n := len(e.f.State().Volume("v").GetClaims()); n != 1 {
		t.Errorf("claims of the paused volume = %d, want the one taken before", n)
	}
	// Setting it again changes nothing and says nothing.
	if r := e.must(e.apply(setAvailability("v", rules.AvailabilityPause))); len(r.Events) != 0 {
		t.Errorf("a repeated pause raised %v", r.Events)
	}
	e.must(e.apply(setAvailability("v", rules.AvailabilityDrain)))
	if err := e.claim("w2"); !refusedBy(err, csisupdv1.ClaimRuleAvailability) {
		t.Fatalf("claim of a draining volume: %v", err)
	}
	e.must(e.apply(setAvailability("v", rules.AvailabilityActive)))
	if err := e.claim("w2"); err != nil {
		t.Fatalf("claim of an active volume again: %v", err)
	}
	if r := e.apply(setAvailability("v", "paused")); r.Err == nil {
		t.Error("a bad availability was applied")
	}
	if r := e.apply(setAvailability("nope", rules.AvailabilityPause)); r.Err == nil {
		t.Error("the availability of a missing volume was applied")
	}
}

func TestFSMPluginDrain(t *testing.T) {
	e := newAvailabilityEnv(t)
	r := e.must(e.apply(drain("n1", "p", true)))
	if len(r.Events) != 1 || r.Events[0].GetType() != "plugin-draining" {
		t.Errorf("events of the drain = %v", r.Events)
	}
	if err := e.claim("w1"); !refusedBy(err, csisupdv1.ClaimRuleAvailability) || !strings.Contains(err.Error(), `plugin "p" drains on node "n1"`) {
		t.Fatalf("claim during the drain: %v", err)
	}
	// The agent registering again or reporting its plugins keeps the
	// operator's drain.
	e.must(e.apply(register("n1", &statepb.Plugin{Id: "p", Type: "node", Healthy: true, NodeId: "csi-n1"})))
	e.must(e.apply(setPlugins("n1", &statepb.Plugin{Id: "p", Type: "node", Healthy: true, NodeId: "csi-n1"})))
	e.must(e.apply(setStatus("n1", state.NodeStatusDown)))
	e.must(e.apply(setStatus("n1", state.NodeStatusReady)))
	if got := e.f.State().Node("n1").GetDrainingPlugins(); !slices.Equal(got, []string{"p"}) {
		t.Fatalf("draining plugins after the agent's writes = %v, want [p]", got)
	}
	e.must(e.apply(drain("n1", "q", true)))
	e.must(e.apply(drain("n1", "p", false)))
	if got := e.f.State().Node("n1").GetDrainingPlugins(); !slices.Equal(got, []string{"q"}) {
		t.Fatalf("draining plugins = %v, want [q]", got)
	}
	if err := e.claim("w1"); err != nil {
		t.Fatalf("claim after the drain ended: %v", err)
	}
	if r := e.apply(drain("nope", "p", true)); r.Err == nil {
		t.Error("a drain on a missing node was applied")
	}
}

func TestFSMForcedDelete(t *testing.T) {
	e := newAvailabilityEnv(t)
	if err := e.claim("w1"); err != nil {
		t.Fatal(err)
	}
	del := func(forced bool) applied {
		return e.apply(&statepb.LogEntry{Command: &statepb.LogEntry_VolumeDeleteChecked{VolumeDeleteChecked: &statepb.VolumeDeleteCommand{VolumeId: "v", Forced: forced}}})
	}
	if r := del(false); r.Err == nil {
		t.Fatal("a volume with a claim was deleted")
	}
	r := e.must(del(true))
	if e.f.State().Volume("v") != nil {
		t.Fatal("the volume is still stored")
	}
	if len(r.Events) != 1 || !strings.Contains(r.Events[0].GetDescription(), "node n1 workload w1") {
		t.Errorf("events of the forced delete = %v, want one naming the claim left", r.Events)
	}
}

func TestFSMVolumeHealth(t *testing.T) {
	e := newAvailabilityEnv(t)
	report := func(source string, abnormal bool, msg string) *statepb.LogEntry {
		return &statepb.LogEntry{Command: &statepb.LogEntry_VolumeHealth{VolumeHealth: &statepb.VolumeHealthCommand{
			VolumeId: "v", Source: source, Abnormal: abnormal, Message: msg}}}
	}
	r := e.must(e.apply(report("n1", true, "DEGRADED")))
	if len(r.Events) != 1 || r.Events[0].GetType() != "volume-abnormal" || r.Events[0].GetNodeId() != "n1" {
		t.Fatalf("events = %v, want volume-abnormal on n1", r.Events)
	}
	idx := e.f.State().Volume("v").GetModifyIndex()
	// The same report again changes nothing.
	if r := e.must(e.apply(report("n1", true, "DEGRADED"))); len(r.Events) != 0 || e.f.State().Volume("v").GetModifyIndex() != idx {
		t.Errorf("a repeated report wrote the volume or raised %v", r.Events)
	}
	r = e.must(e.apply(report(rules.HealthSourceController, true, "INACCESSIBLE")))
	if len(r.Events) != 1 || r.Events[0].GetNodeId() != "" {
		t.Errorf("controller report events = %v", r.Events)
	}
	r = e.must(e.apply(report("n1", false, "")))
	if len(r.Events) != 1 || r.Events[0].GetType() != "volume-normal" {
		t.Errorf("events of normal = %v", r.Events)
	}
	if c := e.f.State().Volume("v").GetConditions(); len(c) != 1 || c[0].GetSource() != rules.HealthSourceController {
		t.Errorf("conditions = %v, want the controller's only", c)
	}
	if r := e.apply(report("", true, "x")); r.Err == nil {
		t.Error("a report without a source was applied")
	}
}
