package state

import (
	"maps"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/csisupd/csisupd/internal/server/statepb"
)

func snapshotIDs(snaps []*statepb.VolumeSnapshot) []string {
	var out []string
	for _, s := range snaps {
		out = append(out, s.GetId())
	}
	return out
}

func TestVolumeSnapshotsTable(t *testing.T) {
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	if s.VolumeSnapshot("a") != nil || len(s.VolumeSnapshots()) != 0 {
		t.Fatal("a new store has volume snapshots")
	}
	write(t, s, func(txn *Txn) error {
		for _, id := range []string{"d", "b", "a", "c", "e"} {
			vol := "v1"
			if id == "b" || id == "d" {
				vol = "v2"
			}
			if err := txn.PutVolumeSnapshot(&statepb.VolumeSnapshot{Id: id, SourceVolumeId: vol, State: "creating"}); err != nil {
				return err
			}
		}
		if txn.VolumeSnapshot("a") == nil || len(txn.VolumeSnapshots()) != 5 {
			t.Error("the transaction does not see its own writes")
		}
		if s.VolumeSnapshot("a") != nil {
			t.Error("a reader sees an uncommitted write")
		}
		return nil
	})
	if got := snapshotIDs(s.VolumeSnapshots()); !slices.Equal(got, []string{"a", "b", "c", "d", "e"}) {
		t.Fatalf("snapshots %v, want sorted by id", got)
	}
	// A put replaces the row of its id.
	write(t, s, func(txn *Txn) error {
		return txn.PutVolumeSnapshot(&statepb.VolumeSnapshot{Id: "c", SourceVolumeId: "v1", State: "created", ModifyIndex: 4})
	})
	if c := s.VolumeSnapshot("c"); c.GetState() != "created" || c.GetModifyIndex() != 4 || len(s.VolumeSnapshots()) != 5 {
		t.Fatalf("snapshot c after its update: %v, %d rows", c, len(s.VolumeSnapshots()))
	}

	ofV1 := func(v *statepb.VolumeSnapshot) bool { return v.GetSourceVolumeId() == "v1" }
	tests := []struct {
		name     string
		from     string
		limit    int
		keep     func(*statepb.VolumeSnapshot) bool
		want     []string
		wantNext string
	}{
		{"all", "", 0, nil, []string{"a", "b", "c", "d", "e"}, ""},
		{"first page", "", 2, nil, []string{"a", "b"}, "c"},
		{"middle page", "c", 2, nil, []string{"c", "d"}, "e"},
		{"last page", "e", 2, nil, []string{"e"}, ""},
		{"a page of exactly the rest", "d", 2, nil, []string{"d", "e"}, ""},
		{"from an id between rows", "bb", 0, nil, []string{"c", "d", "e"}, ""},
		{"from past the end", "z", 2, nil, nil, ""},
		{"filtered", "", 0, ofV1, []string{"a", "c", "e"}, ""},
		{"filtered, first page: next is the next kept row", "", 1, ofV1, []string{"a"}, "c"},
		{"filtered, second page", "c", 1, ofV1, []string{"c"}, "e"},
		{"filtered, nothing kept", "", 2, func(*statepb.VolumeSnapshot) bool { return false }, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			page, next := s.VolumeSnapshotsPage(tt.from, tt.limit, tt.keep)
			if got := snapshotIDs(page); !slices.Equal(got, tt.want) || next != tt.wantNext {
				t.Fatalf("page %v, next %q; want %v, %q", got, next, tt.want, tt.wantNext)
			}
		})
	}

	write(t, s, func(txn *Txn) error {
		return txn.DeleteVolumeSnapshot(txn.VolumeSnapshot("b"))
	})
	if s.VolumeSnapshot("b") != nil || !slices.Equal(snapshotIDs(s.VolumeSnapshots()), []string{"a", "c", "d", "e"}) {
		t.Fatalf("after deleting b: %v", snapshotIDs(s.VolumeSnapshots()))
	}
	txn := s.Write()
	defer txn.Abort()
	if err := txn.DeleteVolumeSnapshot(&statepb.VolumeSnapshot{Id: "b"}); err == nil {
		t.Fatal("delete of a snapshot not stored succeeded")
	}
}

// TestSnapshotRoundTripKeepsLifecycle: a state snapshot keeps the volume
// snapshots and every new field of a volume.
func TestSnapshotRoundTripKeepsLifecycle(t *testing.T) {
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	vols := []*statepb.Volume{
		{
			Id: "v1", PluginId: "p", CapacityBytes: 10, CapacityLimitBytes: 100,
			MutableParameters: map[string]string{"iops": "100"},
			Expansion: &statepb.VolumeExpansion{CapacityBytes: 40, LimitBytes: 100, State: "nodes", NodesPending: []string{"n1"},
				NodesDone: []string{"n2"}, LastError: "boom", StartedAt: &timestamppb.Timestamp{Seconds: 1000}},
		},
		{
			Id: "v2", PluginId: "p", CapacityBytes: 10,
			ContentSource: &statepb.VolumeContentSource{Source: &statepb.VolumeContentSource_SnapshotId{SnapshotId: "s1"}},
		},
		{
			Id: "v3", PluginId: "p",
			ContentSource: &statepb.VolumeContentSource{Source: &statepb.VolumeContentSource_VolumeId{VolumeId: "v1"}},
		},
	}
	snaps := []*statepb.VolumeSnapshot{
		{Id: "s1", PluginId: "p", SourceVolumeId: "v1", ExternalId: "x1", SizeBytes: 10, ReadyToUse: true, State: "created",
			ControllerNodeId: "n1", Parameters: map[string]string{"k": "v"}, CreateIndex: 3, ModifyIndex: 4,
			AccessibleTopology: []*statepb.TopologySegment{{Segments: map[string]string{"zone": "a"}}}},
		{Id: "s2", PluginId: "p", SourceVolumeId: "v1", State: "creating", LastError: "busy", CreateIndex: 5, ModifyIndex: 5},
	}
	write(t, s, func(txn *Txn) error {
		for _, v := range vols {
			if err := txn.PutVolume(v); err != nil {
				return err
			}
		}
		for _, sn := range snaps {
			if err := txn.PutVolumeSnapshot(sn); err != nil {
				return err
			}
		}
		return txn.SetLatestIndex(6)
	})
	data, err := EncodeSnapshot(s.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	snap, err := DecodeSnapshot(data)
	if err != nil {
		t.Fatal(err)
	}
	r, err := FromSnapshot(snap, 9)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range vols {
		if got := r.Volume(want.GetId()); !proto.Equal(got, want) {
			t.Errorf("restored volume %v, want %v", got, want)
		}
	}
	for _, want := range snaps {
		if got := r.VolumeSnapshot(want.GetId()); !proto.Equal(got, want) {
			t.Errorf("restored snapshot %v, want %v", got, want)
		}
	}
	if got := snapshotIDs(r.VolumeSnapshots()); !slices.Equal(got, []string{"s1", "s2"}) {
		t.Errorf("restored snapshots %v", got)
	}
}

// Counts counts volume snapshots by state, created ones not ready yet
// apart, and expansions under way by state.
func TestCountsSnapshotsAndExpansions(t *testing.T) {
	s, err := New()
	if err != nil {
		t.Fatal(err)
	}
	txn := s.Write()
	for _, snap := range []*statepb.VolumeSnapshot{
		{Id: "a", State: "creating"},
		{Id: "b", State: "created", ReadyToUse: true},
		{Id: "c", State: "created"},
		{Id: "d", State: "deleting"},
		{Id: "e", State: "created", ReadyToUse: true},
	} {
		if err := txn.PutVolumeSnapshot(snap); err != nil {
			t.Fatal(err)
		}
	}
	for _, v := range []*statepb.Volume{
		{Id: "v1", Expansion: &statepb.VolumeExpansion{State: "controller"}},
		{Id: "v2", Expansion: &statepb.VolumeExpansion{State: "nodes"}},
		{Id: "v3", Expansion: &statepb.VolumeExpansion{State: "nodes"}},
		{Id: "v4"},
	} {
		if err := txn.PutVolume(v); err != nil {
			t.Fatal(err)
		}
	}
	txn.Commit()
	n := s.Counts()
	if want := map[string]int{"creating": 1, "created": 2, SnapshotNotReady: 1, "deleting": 1}; !maps.Equal(n.Snapshots, want) {
		t.Errorf("Counts().Snapshots = %v, want %v", n.Snapshots, want)
	}
	if want := map[string]int{"controller": 1, "nodes": 2}; !maps.Equal(n.Expansions, want) {
		t.Errorf("Counts().Expansions = %v, want %v", n.Expansions, want)
	}
}
