package fsm

import (
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// TestClaimTakeRecordsTheEntrysTerm checks that a taken claim stores the
// raft term of the entry that took it as its leader_term, whatever the
// command carries, alone or inside a batch, and that later steps keep it.
func TestClaimTakeRecordsTheEntrysTerm(t *testing.T) {
	take := func(workload string, term uint64) *statepb.LogEntry {
		return &statepb.LogEntry{Time: timestamppb.Now(), Command: &statepb.LogEntry_ClaimTake{ClaimTake: &statepb.ClaimTakeCommand{VolumeId: "v",
			Claim: &statepb.VolumeClaim{NodeId: "n1", CsiNodeId: "csi-n1", WorkloadId: workload, State: rules.StateTaken,
				LeaderTerm: term, Usage: &statepb.VolumeUsage{AccessType: "mount", AccessMode: "MULTI_NODE_MULTI_WRITER"}}}}}
	}
	f, err := New(Config{Events: testEvents(t, 64, 32)})
	if err != nil {
		t.Fatal(err)
	}
	setup := []*statepb.LogEntry{
		register("n1", &statepb.Plugin{Id: "p", Type: "node", Healthy: true, NodeId: "csi-n1"}),
		{Time: timestamppb.Now(), Command: &statepb.LogEntry_VolumeCreate{VolumeCreate: &statepb.VolumeCreateCommand{Volume: &statepb.Volume{
			Id: "v", PluginId: "p", ExternalId: "x-v",
			Capabilities: []*statepb.VolumeCapability{{AccessType: "mount", AccessMode: "MULTI_NODE_MULTI_WRITER"}}}}}},
	}
	for i, r := range applyAll(t, f, setup...) {
		if r.Err != nil {
			t.Fatalf("setup entry %d: %v", i, r.Err)
		}
	}
	// w1 alone at term 3, claiming to be of term 9; w2 in a batch at
	// term 4; w3 at term 4 with no term in the command.
	batch := &statepb.LogEntry{Time: timestamppb.Now(), Command: &statepb.LogEntry_Batch{Batch: &statepb.LogBatch{
		Entries: []*statepb.LogEntry{take("w2", 0)}}}}
	logs := []*raft.Log{
		termLog(t, 10, 3, take("w1", 9)),
		termLog(t, 11, 4, batch),
		termLog(t, 12, 4, take("w3", 0)),
	}
	for i, r := range f.ApplyBatch(logs) {
		res := r.(Result)
		if res.Err != nil || res.Errs != nil && res.Errs[0] != nil {
			t.Fatalf("take %d: %v %v", i, res.Err, res.Errs)
		}
	}
	want := map[string]uint64{"w1": 3, "w2": 4, "w3": 4}
	check := func(when string) {
		t.Helper()
		v := f.State().Volume("v")
		if len(v.GetClaims()) != len(want) {
			t.Fatalf("%s: claims %v, want %d", when, v.GetClaims(), len(want))
		}
		for _, c := range v.GetClaims() {
			if c.GetLeaderTerm() != want[c.GetWorkloadId()] {
				t.Errorf("%s: claim of %s has leader_term %d, want %d", when, c.GetWorkloadId(), c.GetLeaderTerm(), want[c.GetWorkloadId()])
			}
		}
	}
	check("after the takes")

	// A later step of another leader (term 5) leaves the term of the
	// leader that took the claim.
	v := f.State().Volume("v")
	_, c := rules.Find(v, "n1", "w1")
	step := rules.Mounted(v, c, false, nil, "/host/w1", "")
	if r := f.ApplyBatch([]*raft.Log{termLog(t, 13, 5, &statepb.LogEntry{Time: timestamppb.Now(),
		Command: &statepb.LogEntry_ClaimStep{ClaimStep: step}})})[0].(Result); r.Err != nil {
		t.Fatalf("mounted step: %v", r.Err)
	}
	if _, c = rules.Find(f.State().Volume("v"), "n1", "w1"); !c.GetMounted() {
		t.Fatalf("claim of w1 after the mounted step: %v", c)
	}
	check("after a step of a later term")
}

// termLog encodes e as the raft log at index, written in term.
func termLog(t testing.TB, index, term uint64, e *statepb.LogEntry) *raft.Log {
	l := commandLog(t, index, e)
	l.Term = term
	return l
}
