package rules

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// wantCode fails t unless err has code want (codes.OK: err is nil).
func wantCode(t *testing.T, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("error %v: code %s, want %s", err, got, want)
	}
}

// wantStale fails t unless err refuses with the stale rule.
func wantStale(t *testing.T, err error) {
	t.Helper()
	wantCode(t, err, codes.FailedPrecondition)
	d, ok := csisupdv1.ErrorDetail[*csisupdv1.ClaimRefused](err)
	if !ok || d.GetRule() != csisupdv1.ClaimRuleStale {
		t.Fatalf("error %v: detail %v, want the %q rule", err, d, csisupdv1.ClaimRuleStale)
	}
}

func TestCheckExpandRequest(t *testing.T) {
	const gib = int64(1 << 30)
	under := &statepb.VolumeExpansion{CapacityBytes: 4 * gib, State: ExpansionController}
	tests := []struct {
		name      string
		vol       *statepb.Volume
		required  int64
		limit     int64
		wantLimit int64
		wantDone  bool
		wantCode  codes.Code
	}{
		{"grow without a limit", &statepb.Volume{CapacityBytes: gib}, 2 * gib, 0, 0, false, codes.OK},
		{"grow within the request's limit", &statepb.Volume{CapacityBytes: gib}, 2 * gib, 3 * gib, 3 * gib, false, codes.OK},
		{"the volume's limit when the request has none", &statepb.Volume{CapacityBytes: gib, CapacityLimitBytes: 5 * gib}, 2 * gib, 0, 5 * gib, false, codes.OK},
		{"the volume's limit caps a larger request limit", &statepb.Volume{CapacityBytes: gib, CapacityLimitBytes: 5 * gib}, 2 * gib, 8 * gib, 5 * gib, false, codes.OK},
		{"a smaller request limit is kept", &statepb.Volume{CapacityBytes: gib, CapacityLimitBytes: 5 * gib}, 2 * gib, 3 * gib, 3 * gib, false, codes.OK},
		{"exactly the limit", &statepb.Volume{CapacityBytes: gib, CapacityLimitBytes: 2 * gib}, 2 * gib, 0, 2 * gib, false, codes.OK},
		{"already that size", &statepb.Volume{CapacityBytes: 2 * gib}, 2 * gib, 0, 0, true, codes.OK},
		{"zero bytes", &statepb.Volume{CapacityBytes: gib}, 0, 0, 0, false, codes.InvalidArgument},
		{"negative bytes", &statepb.Volume{CapacityBytes: gib}, -1, 0, 0, false, codes.InvalidArgument},
		{"negative limit", &statepb.Volume{CapacityBytes: gib}, 2 * gib, -1, 0, false, codes.InvalidArgument},
		{"over the request's limit", &statepb.Volume{CapacityBytes: gib}, 4 * gib, 3 * gib, 0, false, codes.InvalidArgument},
		{"over the volume's limit", &statepb.Volume{CapacityBytes: gib, CapacityLimitBytes: 3 * gib}, 4 * gib, 0, 0, false, codes.InvalidArgument},
		{"over the volume's limit, request limit larger", &statepb.Volume{CapacityBytes: gib, CapacityLimitBytes: 3 * gib}, 4 * gib, 8 * gib, 0, false, codes.InvalidArgument},
		{"shrink", &statepb.Volume{CapacityBytes: 2 * gib}, gib, 0, 0, false, codes.InvalidArgument},
		{"the expansion under way asked again", &statepb.Volume{CapacityBytes: gib, Expansion: under}, 4 * gib, 0, 0, false, codes.OK},
		{"the expansion under way asked again, with a limit", &statepb.Volume{CapacityBytes: gib, Expansion: under}, 4 * gib, 6 * gib, 6 * gib, false, codes.OK},
		{"another expansion is under way", &statepb.Volume{CapacityBytes: gib, Expansion: under}, 3 * gib, 0, 0, false, codes.FailedPrecondition},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.vol.Id = "v"
			limit, done, err := CheckExpandRequest(tt.vol, tt.required, tt.limit)
			wantCode(t, err, tt.wantCode)
			if err != nil {
				return
			}
			if limit != tt.wantLimit || done != tt.wantDone {
				t.Fatalf("limit %d, done %v; want %d, %v", limit, done, tt.wantLimit, tt.wantDone)
			}
		})
	}
}

func TestCheckOfflineExpansion(t *testing.T) {
	claimed := &statepb.Volume{Id: "v", PluginId: "p", Claims: []*statepb.VolumeClaim{
		{NodeId: "n1", WorkloadId: "w1", State: StateTaken},
		{NodeId: "n2", WorkloadId: "w2", State: StateUnpublishing},
	}}
	free := &statepb.Volume{Id: "v", PluginId: "p"}
	tests := []struct {
		name    string
		vol     *statepb.Volume
		caps    []string
		refused bool
	}{
		{"offline only, claimed", claimed, []string{"CONTROLLER_SERVICE", CapExpansionOffline}, true},
		{"offline only, not claimed", free, []string{CapExpansionOffline}, false},
		{"online and offline, claimed", claimed, []string{CapExpansionOffline, CapExpansionOnline}, false},
		{"online only, claimed", claimed, []string{CapExpansionOnline}, false},
		{"no expansion capability, claimed", claimed, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckOfflineExpansion(tt.vol, tt.caps)
			if !tt.refused {
				wantCode(t, err, codes.OK)
				return
			}
			wantCode(t, err, codes.FailedPrecondition)
			for _, c := range tt.vol.GetClaims() {
				if name := RefOf("v", c).String(); !strings.Contains(err.Error(), name) {
					t.Errorf("error %q does not name the claim %s", err, name)
				}
			}
		})
	}
}

func TestExpansionNodesOf(t *testing.T) {
	tests := []struct {
		name   string
		claims []*statepb.VolumeClaim
		want   []string
	}{
		{"no claims", nil, nil},
		{"mounted taken claims, sorted, each node once", []*statepb.VolumeClaim{
			{NodeId: "n2", WorkloadId: "a", State: StateTaken, Mounted: true},
			{NodeId: "n1", WorkloadId: "a", State: StateTaken, Mounted: true},
			{NodeId: "n2", WorkloadId: "b", State: StateTaken, Mounted: true},
		}, []string{"n1", "n2"}},
		{"not mounted, or releasing, need nothing", []*statepb.VolumeClaim{
			{NodeId: "n3", WorkloadId: "a", State: StateTaken},
			{NodeId: "n4", WorkloadId: "a", State: StateUnpublishing, Mounted: true},
			{NodeId: "n5", WorkloadId: "a", State: StateNodeUnpublished},
			{NodeId: "n1", WorkloadId: "a", State: StateTaken, Mounted: true},
		}, []string{"n1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ExpansionNodesOf(&statepb.Volume{Id: "v", Claims: tt.claims}); !slices.Equal(got, tt.want) {
				t.Fatalf("nodes %v, want %v", got, tt.want)
			}
		})
	}
}

func TestNewExpansionAndStep(t *testing.T) {
	now := timestamppb.New(time.Unix(1000, 0))
	v := &statepb.Volume{Id: "v", ModifyIndex: 12, CapacityBytes: 10, Claims: []*statepb.VolumeClaim{
		{NodeId: "n1", WorkloadId: "w", State: StateTaken, Mounted: true},
	}}
	tests := []struct {
		state       string
		wantPending []string
	}{
		{ExpansionController, nil},
		{ExpansionNodes, []string{"n1"}},
	}
	for _, tt := range tests {
		t.Run(tt.state, func(t *testing.T) {
			cmd := NewExpansion(v, 20, 30, tt.state, now)
			want := &statepb.VolumeExpandCommand{VolumeId: "v", VolumeIndex: 12, Expansion: &statepb.VolumeExpansion{
				CapacityBytes: 20, LimitBytes: 30, State: tt.state, StartedAt: now, NodesPending: tt.wantPending,
			}}
			if !proto.Equal(cmd, want) {
				t.Fatalf("command %v, want %v", cmd, want)
			}
			if err := CheckExpandStep(v, cmd); err != nil {
				t.Fatalf("the new expansion is refused: %v", err)
			}
		})
	}
	next := &statepb.VolumeExpansion{CapacityBytes: 20, State: ExpansionNodes}
	step := ExpansionStep(v, next, 25)
	if step.GetVolumeId() != "v" || step.GetVolumeIndex() != 12 || step.GetExpansion() != next || step.GetCapacityBytes() != 25 {
		t.Fatalf("step %v", step)
	}
	if done := ExpansionStep(v, nil, 0); done.GetExpansion() != nil || done.GetCapacityBytes() != 0 {
		t.Fatalf("done step %v", done)
	}
}

func TestCheckExpandStep(t *testing.T) {
	under := func(state string) *statepb.VolumeExpansion {
		return &statepb.VolumeExpansion{CapacityBytes: 40, State: state}
	}
	idle := &statepb.Volume{Id: "v", ModifyIndex: 5, CapacityBytes: 10, CapacityLimitBytes: 50}
	expanding := &statepb.Volume{Id: "v", ModifyIndex: 5, CapacityBytes: 10, Expansion: under(ExpansionController)}
	tests := []struct {
		name  string
		vol   *statepb.Volume
		cmd   *statepb.VolumeExpandCommand
		code  codes.Code
		stale bool
	}{
		{"new expansion", idle, &statepb.VolumeExpandCommand{VolumeIndex: 5, Expansion: under(ExpansionController)}, codes.OK, false},
		{"new expansion straight to the nodes", idle, &statepb.VolumeExpandCommand{VolumeIndex: 5, Expansion: under(ExpansionNodes)}, codes.OK, false},
		{"decided on an older row", idle, &statepb.VolumeExpandCommand{VolumeIndex: 4, Expansion: under(ExpansionController)}, codes.FailedPrecondition, true},
		{"a step of an expansion decided on an older row", expanding, &statepb.VolumeExpandCommand{VolumeIndex: 6}, codes.FailedPrecondition, true},
		{"nothing to end", idle, &statepb.VolumeExpandCommand{VolumeIndex: 5}, codes.FailedPrecondition, false},
		{"new expansion over the volume's limit", idle, &statepb.VolumeExpandCommand{VolumeIndex: 5,
			Expansion: &statepb.VolumeExpansion{CapacityBytes: 60, State: ExpansionController}}, codes.InvalidArgument, false},
		{"new expansion over its own limit", idle, &statepb.VolumeExpandCommand{VolumeIndex: 5,
			Expansion: &statepb.VolumeExpansion{CapacityBytes: 40, LimitBytes: 30, State: ExpansionController}}, codes.InvalidArgument, false},
		{"new expansion that shrinks", idle, &statepb.VolumeExpandCommand{VolumeIndex: 5,
			Expansion: &statepb.VolumeExpansion{CapacityBytes: 5, State: ExpansionController}}, codes.InvalidArgument, false},
		{"new expansion in an unknown state", idle, &statepb.VolumeExpandCommand{VolumeIndex: 5, Expansion: under("resizing")}, codes.InvalidArgument, false},
		{"new expansion without a state", idle, &statepb.VolumeExpandCommand{VolumeIndex: 5, Expansion: under("")}, codes.InvalidArgument, false},
		{"controller step done", expanding, &statepb.VolumeExpandCommand{VolumeIndex: 5, Expansion: under(ExpansionNodes), CapacityBytes: 40}, codes.OK, false},
		{"a failure recorded", expanding, &statepb.VolumeExpandCommand{VolumeIndex: 5,
			Expansion: &statepb.VolumeExpansion{CapacityBytes: 40, State: ExpansionController, LastError: "boom"}}, codes.OK, false},
		{"expansion done", expanding, &statepb.VolumeExpandCommand{VolumeIndex: 5, CapacityBytes: 40}, codes.OK, false},
		{"expansion done, size unknown", expanding, &statepb.VolumeExpandCommand{VolumeIndex: 5}, codes.OK, false},
		{"a step that changes the target", expanding, &statepb.VolumeExpandCommand{VolumeIndex: 5,
			Expansion: &statepb.VolumeExpansion{CapacityBytes: 80, State: ExpansionNodes}}, codes.FailedPrecondition, false},
		{"a step to an unknown state", expanding, &statepb.VolumeExpandCommand{VolumeIndex: 5, Expansion: under("bogus")}, codes.InvalidArgument, false},
		{"a recorded capacity that shrinks", expanding, &statepb.VolumeExpandCommand{VolumeIndex: 5, CapacityBytes: 9}, codes.InvalidArgument, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := proto.Clone(tt.vol)
			err := CheckExpandStep(tt.vol, tt.cmd)
			if tt.stale {
				wantStale(t, err)
			} else {
				wantCode(t, err, tt.code)
			}
			if !proto.Equal(before, tt.vol) {
				t.Fatal("the check changed the volume")
			}
		})
	}
}

func TestApplyExpandStep(t *testing.T) {
	e := &statepb.VolumeExpansion{CapacityBytes: 40, State: ExpansionNodes}
	tests := []struct {
		name          string
		cmd           *statepb.VolumeExpandCommand
		wantExpansion *statepb.VolumeExpansion
		wantCapacity  int64
	}{
		{"a step with a known size", &statepb.VolumeExpandCommand{Expansion: e, CapacityBytes: 40}, e, 40},
		{"a step with no size keeps the capacity", &statepb.VolumeExpandCommand{Expansion: e}, e, 10},
		{"done clears the expansion", &statepb.VolumeExpandCommand{CapacityBytes: 42}, nil, 42},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := &statepb.Volume{Id: "v", CapacityBytes: 10, Expansion: &statepb.VolumeExpansion{CapacityBytes: 40, State: ExpansionController}}
			ApplyExpandStep(v, tt.cmd)
			if !proto.Equal(v.GetExpansion(), tt.wantExpansion) || v.GetCapacityBytes() != tt.wantCapacity {
				t.Fatalf("expansion %v, capacity %d; want %v, %d", v.GetExpansion(), v.GetCapacityBytes(), tt.wantExpansion, tt.wantCapacity)
			}
		})
	}
}

func TestCheckModify(t *testing.T) {
	v := &statepb.Volume{Id: "v", ModifyIndex: 3}
	tests := []struct {
		name  string
		cmd   *statepb.VolumeModifyCommand
		code  codes.Code
		stale bool
	}{
		{"current row", &statepb.VolumeModifyCommand{VolumeId: "v", VolumeIndex: 3, MutableParameters: map[string]string{"iops": "100"}}, codes.OK, false},
		{"decided on an older row", &statepb.VolumeModifyCommand{VolumeId: "v", VolumeIndex: 2, MutableParameters: map[string]string{"iops": "100"}}, codes.FailedPrecondition, true},
		{"no parameters", &statepb.VolumeModifyCommand{VolumeId: "v", VolumeIndex: 3}, codes.InvalidArgument, false},
		{"empty parameters", &statepb.VolumeModifyCommand{VolumeId: "v", VolumeIndex: 3, MutableParameters: map[string]string{}}, codes.InvalidArgument, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckModify(v, tt.cmd)
			if tt.stale {
				wantStale(t, err)
				return
			}
			wantCode(t, err, tt.code)
		})
	}
}

func TestMergeMutable(t *testing.T) {
	tests := []struct {
		name             string
		current, changes map[string]string
		want             map[string]string
	}{
		{"nothing at all", nil, nil, map[string]string{}},
		{"first parameters", nil, map[string]string{"iops": "100"}, map[string]string{"iops": "100"}},
		{"kept without changes", map[string]string{"iops": "100"}, nil, map[string]string{"iops": "100"}},
		{"changed and added, others kept", map[string]string{"iops": "100", "tier": "gold"}, map[string]string{"iops": "200", "bw": "1G"},
			map[string]string{"iops": "200", "tier": "gold", "bw": "1G"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			current := maps.Clone(tt.current)
			got := MergeMutable(current, tt.changes)
			if got == nil || !maps.Equal(got, tt.want) {
				t.Fatalf("merged %v, want %v", got, tt.want)
			}
			if !maps.Equal(current, tt.current) {
				t.Fatalf("the current parameters changed to %v", current)
			}
		})
	}
}

var snapshotStates = []string{SnapshotCreating, SnapshotCreated, SnapshotDeleting, "", "bogus"}

// TestSnapshotTransitions lists every pair of states for a change of a
// stored snapshot: exactly the moves of the snapshot state machine pass.
func TestSnapshotTransitions(t *testing.T) {
	legal := map[[2]string]bool{
		{SnapshotCreating, SnapshotCreating}: true,
		{SnapshotCreating, SnapshotCreated}:  true,
		{SnapshotCreating, SnapshotDeleting}: true,
		{SnapshotCreated, SnapshotCreated}:   true,
		{SnapshotCreated, SnapshotDeleting}:  true,
		{SnapshotDeleting, SnapshotDeleting}: true,
		{SnapshotDeleting, SnapshotCreated}:  true,
	}
	src := &statepb.Volume{Id: "v", PluginId: "p"}
	for _, from := range snapshotStates {
		for _, to := range snapshotStates {
			t.Run(fmt.Sprintf("%q to %q", from, to), func(t *testing.T) {
				old := &statepb.VolumeSnapshot{Id: "s", PluginId: "p", SourceVolumeId: "v", State: from, ModifyIndex: 8}
				cmd := &statepb.SnapshotPutCommand{SnapshotIndex: 8, Snapshot: &statepb.VolumeSnapshot{Id: "s", PluginId: "p", SourceVolumeId: "v", State: to}}
				err := CheckSnapshotPut(old, src, cmd)
				if legal[[2]string{from, to}] {
					wantCode(t, err, codes.OK)
				} else {
					wantCode(t, err, codes.FailedPrecondition)
				}
			})
		}
	}
}

func TestCheckSnapshotPut(t *testing.T) {
	src := &statepb.Volume{Id: "v", PluginId: "p"}
	snap := func(state string) *statepb.VolumeSnapshot {
		return &statepb.VolumeSnapshot{Id: "s", PluginId: "p", SourceVolumeId: "v", State: state}
	}
	stored := &statepb.VolumeSnapshot{Id: "s", PluginId: "p", SourceVolumeId: "v", State: SnapshotCreating, ModifyIndex: 8}
	tests := []struct {
		name   string
		old    *statepb.VolumeSnapshot
		source *statepb.Volume
		cmd    *statepb.SnapshotPutCommand
		code   codes.Code
		stale  bool
	}{
		{"new", nil, src, &statepb.SnapshotPutCommand{Snapshot: snap(SnapshotCreating)}, codes.OK, false},
		{"new without an id", nil, src, &statepb.SnapshotPutCommand{Snapshot: &statepb.VolumeSnapshot{PluginId: "p", SourceVolumeId: "v", State: SnapshotCreating}}, codes.InvalidArgument, false},
		{"new with a taken id", stored, src, &statepb.SnapshotPutCommand{Snapshot: snap(SnapshotCreating)}, codes.AlreadyExists, false},
		{"new of an unknown volume", nil, nil, &statepb.SnapshotPutCommand{Snapshot: snap(SnapshotCreating)}, codes.NotFound, false},
		{"new of another plugin's volume", nil, &statepb.Volume{Id: "v", PluginId: "q"}, &statepb.SnapshotPutCommand{Snapshot: snap(SnapshotCreating)}, codes.InvalidArgument, false},
		{"new, already created", nil, src, &statepb.SnapshotPutCommand{Snapshot: snap(SnapshotCreated)}, codes.InvalidArgument, false},
		{"new, deleting", nil, src, &statepb.SnapshotPutCommand{Snapshot: snap(SnapshotDeleting)}, codes.InvalidArgument, false},
		{"change", stored, src, &statepb.SnapshotPutCommand{SnapshotIndex: 8, Snapshot: snap(SnapshotCreated)}, codes.OK, false},
		{"change after the volume is gone", stored, nil, &statepb.SnapshotPutCommand{SnapshotIndex: 8, Snapshot: snap(SnapshotCreated)}, codes.OK, false},
		{"change of a snapshot not stored", nil, src, &statepb.SnapshotPutCommand{SnapshotIndex: 8, Snapshot: snap(SnapshotCreated)}, codes.NotFound, false},
		{"change decided on an older row", stored, src, &statepb.SnapshotPutCommand{SnapshotIndex: 7, Snapshot: snap(SnapshotCreated)}, codes.FailedPrecondition, true},
		{"change of the volume", stored, src, &statepb.SnapshotPutCommand{SnapshotIndex: 8,
			Snapshot: &statepb.VolumeSnapshot{Id: "s", PluginId: "p", SourceVolumeId: "w", State: SnapshotCreated}}, codes.InvalidArgument, false},
		{"change of the plugin", stored, src, &statepb.SnapshotPutCommand{SnapshotIndex: 8,
			Snapshot: &statepb.VolumeSnapshot{Id: "s", PluginId: "q", SourceVolumeId: "v", State: SnapshotCreated}}, codes.InvalidArgument, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckSnapshotPut(tt.old, tt.source, tt.cmd)
			if tt.stale {
				wantStale(t, err)
				return
			}
			wantCode(t, err, tt.code)
		})
	}
}

func TestCheckSnapshotDelete(t *testing.T) {
	stored := &statepb.VolumeSnapshot{Id: "s", ModifyIndex: 8}
	tests := []struct {
		name  string
		old   *statepb.VolumeSnapshot
		index uint64
		code  codes.Code
		stale bool
	}{
		{"stored, any row", stored, 0, codes.OK, false},
		{"stored, the row decided on", stored, 8, codes.OK, false},
		{"stored, an older row", stored, 7, codes.FailedPrecondition, true},
		{"not stored", nil, 0, codes.NotFound, false},
		{"not stored, with an index", nil, 8, codes.NotFound, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckSnapshotDelete(tt.old, "s", tt.index)
			if tt.stale {
				wantStale(t, err)
				return
			}
			wantCode(t, err, tt.code)
		})
	}
}

func TestCheckDeleteWithSnapshots(t *testing.T) {
	of := func(vol, state string) *statepb.VolumeSnapshot {
		return &statepb.VolumeSnapshot{Id: "s-" + vol + "-" + state, SourceVolumeId: vol, State: state}
	}
	tests := []struct {
		name      string
		expansion *statepb.VolumeExpansion
		snapshots []*statepb.VolumeSnapshot
		refused   bool
	}{
		{"no snapshots", nil, nil, false},
		{"created and deleting snapshots stay", nil, []*statepb.VolumeSnapshot{of("v", SnapshotCreated), of("v", SnapshotDeleting)}, false},
		{"another volume's snapshot being created", nil, []*statepb.VolumeSnapshot{of("w", SnapshotCreating)}, false},
		{"a snapshot being created", nil, []*statepb.VolumeSnapshot{of("v", SnapshotCreated), of("v", SnapshotCreating)}, true},
		{"an expansion under way", &statepb.VolumeExpansion{CapacityBytes: 9, State: ExpansionNodes}, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckDeleteWithSnapshots(&statepb.Volume{Id: "v", Expansion: tt.expansion}, tt.snapshots)
			if tt.refused {
				wantCode(t, err, codes.FailedPrecondition)
			} else {
				wantCode(t, err, codes.OK)
			}
		})
	}
}

func TestSnapshotNeedsWork(t *testing.T) {
	tests := []struct {
		state string
		ready bool
		want  bool
	}{
		{SnapshotCreating, false, true},
		{SnapshotCreating, true, true},
		{SnapshotCreated, false, true},
		{SnapshotCreated, true, false},
		{SnapshotDeleting, false, true},
		{SnapshotDeleting, true, true},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s, ready %t", tt.state, tt.ready), func(t *testing.T) {
			if got := SnapshotNeedsWork(&statepb.VolumeSnapshot{State: tt.state, ReadyToUse: tt.ready}); got != tt.want {
				t.Fatalf("SnapshotNeedsWork = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestTopologyFits(t *testing.T) {
	seg := func(kv ...string) *statepb.TopologySegment {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return &statepb.TopologySegment{Segments: m}
	}
	zoneA := seg("zone", "a")
	tests := []struct {
		name string
		segs []*statepb.TopologySegment
		have map[string]string
		want bool
	}{
		{"no segments: everywhere", nil, nil, true},
		{"no segments, any node", nil, map[string]string{"zone": "a"}, true},
		{"one segment met", []*statepb.TopologySegment{zoneA}, map[string]string{"zone": "a", "rack": "1"}, true},
		{"one segment, other value", []*statepb.TopologySegment{zoneA}, map[string]string{"zone": "b"}, false},
		{"one segment, key missing", []*statepb.TopologySegment{zoneA}, map[string]string{"rack": "1"}, false},
		{"node without topology", []*statepb.TopologySegment{zoneA}, nil, false},
		{"every key of a segment", []*statepb.TopologySegment{seg("zone", "a", "rack", "1")}, map[string]string{"zone": "a", "rack": "1"}, true},
		{"only some keys of a segment", []*statepb.TopologySegment{seg("zone", "a", "rack", "1")}, map[string]string{"zone": "a", "rack": "2"}, false},
		{"the second of two segments", []*statepb.TopologySegment{zoneA, seg("zone", "b")}, map[string]string{"zone": "b"}, true},
		{"an empty segment fits any node", []*statepb.TopologySegment{seg()}, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := TopologyFits(tt.segs, tt.have); got != tt.want {
				t.Fatalf("TopologyFits = %v, want %v", got, tt.want)
			}
		})
	}
}
