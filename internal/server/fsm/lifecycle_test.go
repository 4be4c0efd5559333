package fsm

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// The setup entries of the lifecycle tests are applied at second 1000,
// the entry under test at second 2000.
const (
	setupSec = 1000
	entrySec = 2000
)

func volCreate(id string, capacity, limit int64) *statepb.LogEntry {
	return &statepb.LogEntry{Command: &statepb.LogEntry_VolumeCreate{VolumeCreate: &statepb.VolumeCreateCommand{
		Volume: &statepb.Volume{Id: id, PluginId: "p", ExternalId: "x-" + id, CapacityBytes: capacity, CapacityLimitBytes: limit},
	}}}
}

func volExpand(id string, index uint64, e *statepb.VolumeExpansion, capacity int64) *statepb.LogEntry {
	return &statepb.LogEntry{Command: &statepb.LogEntry_VolumeExpand{VolumeExpand: &statepb.VolumeExpandCommand{
		VolumeId: id, VolumeIndex: index, Expansion: e, CapacityBytes: capacity,
	}}}
}

func volModify(id string, index uint64, params map[string]string) *statepb.LogEntry {
	return &statepb.LogEntry{Command: &statepb.LogEntry_VolumeModify{VolumeModify: &statepb.VolumeModifyCommand{
		VolumeId: id, VolumeIndex: index, MutableParameters: params,
	}}}
}

func volDelete(id string, index uint64) *statepb.LogEntry {
	return &statepb.LogEntry{Command: &statepb.LogEntry_VolumeDeleteChecked{VolumeDeleteChecked: &statepb.VolumeDeleteCommand{VolumeId: id, VolumeIndex: index}}}
}

func snapPut(index uint64, s *statepb.VolumeSnapshot) *statepb.LogEntry {
	return &statepb.LogEntry{Command: &statepb.LogEntry_SnapshotPut{SnapshotPut: &statepb.SnapshotPutCommand{Snapshot: s, SnapshotIndex: index}}}
}

func snapDelete(id string, index uint64) *statepb.LogEntry {
	return &statepb.LogEntry{Command: &statepb.LogEntry_SnapshotDelete{SnapshotDelete: &statepb.SnapshotDeleteCommand{SnapshotId: id, SnapshotIndex: index}}}
}

// snapOf returns snapshot id of volume v in state st.
func snapOf(id, v, st string) *statepb.VolumeSnapshot {
	return &statepb.VolumeSnapshot{Id: id, PluginId: "p", SourceVolumeId: v, State: st, ExternalId: "ext-" + id, ControllerNodeId: "n1"}
}

func expansion(capacity int64, st string) *statepb.VolumeExpansion {
	return &statepb.VolumeExpansion{CapacityBytes: capacity, State: st}
}

// refusal says how the entry under test must fail; nil: it is applied.
type refusal func(error) bool

func withCode(c codes.Code) refusal {
	return func(err error) bool { return status.Code(err) == c }
}

func stale(err error) bool {
	d, ok := csisupdv1.ErrorDetail[*csisupdv1.ClaimRefused](err)
	return ok && d.GetRule() == csisupdv1.ClaimRuleStale && status.Code(err) == codes.FailedPrecondition
}

func notFound(err error) bool { return errors.Is(err, state.ErrNotFound) }

// lifecycleCase applies setup (each must be applied), then entry at
// index len(setup)+1.
type lifecycleCase struct {
	name  string
	setup []*statepb.LogEntry
	entry *statepb.LogEntry
	// refused, when set, is how entry must fail: the state must not
	// change and no event may be emitted.
	refused refusal
	// check looks at the state after an applied entry at index at.
	check func(t *testing.T, st *state.Store, at uint64)
	// events are the events of entry, "type topic/key snapshot".
	events []string
	// desc, when set, is in the description of the entry's last event.
	desc string
}

func (tt lifecycleCase) run(t *testing.T) {
	events := testEvents(t, 64, 32)
	f, err := newFSM(events)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range tt.setup {
		if r := applyAll(t, f, at(setupSec, e))[0]; r.Err != nil {
			t.Fatalf("setup entry %d: %v", i, r.Err)
		}
	}
	before := f.State()
	setupIndex := before.LatestIndex()
	volsBefore, snapsBefore := before.Volumes(""), before.VolumeSnapshots()
	res := applyAll(t, f, at(entrySec, tt.entry))[0]
	st := f.State()
	if res.Index != setupIndex+1 || st.LatestIndex() != res.Index {
		t.Fatalf("entry applied at %d, latest index %d; want %d", res.Index, st.LatestIndex(), setupIndex+1)
	}
	got := readAll(t, events, setupIndex)
	if tt.refused != nil {
		if res.Err == nil || !tt.refused(res.Err) {
			t.Fatalf("entry: error %v, not the refusal wanted", res.Err)
		}
		if !equalRows(volsBefore, st.Volumes("")) || !equalRows(snapsBefore, st.VolumeSnapshots()) {
			t.Fatalf("a refused entry changed the state:\nvolumes %v\nsnapshots %v", st.Volumes(""), st.VolumeSnapshots())
		}
		if len(got) != 0 {
			t.Fatalf("a refused entry emitted events:\n%s", eventLines(got))
		}
		return
	}
	if res.Err != nil {
		t.Fatalf("entry: %v", res.Err)
	}
	if tt.check != nil {
		tt.check(t, st, res.Index)
	}
	want := ""
	for _, line := range tt.events {
		want += line + "\n"
	}
	if eventLines(got) != want {
		t.Fatalf("events:\n%swant:\n%s", eventLines(got), want)
	}
	for _, e := range got {
		if e.Index != res.Index || e.Payload.GetIndex() != res.Index || e.Payload.GetTime().GetSeconds() != entrySec {
			t.Errorf("event %s at index %d (payload %d, time %v), want index %d at second %d",
				e.Payload.GetType(), e.Index, e.Payload.GetIndex(), e.Payload.GetTime(), res.Index, entrySec)
		}
	}
	if tt.desc != "" && (len(got) == 0 || !strings.Contains(got[len(got)-1].Payload.GetDescription(), tt.desc)) {
		t.Fatalf("last event's description does not say %q:\n%s", tt.desc, eventLines(got))
	}
}

func equalRows[M proto.Message](a, b []M) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !proto.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// eventLines renders events as "type topic/key snapshot" lines.
func eventLines(events []Event) string {
	var b strings.Builder
	for _, e := range events {
		fmt.Fprintf(&b, "%s %s/%s %s\n", e.Payload.GetType(), e.Topic, e.Key, e.Payload.GetSnapshotId())
	}
	return b.String()
}

// wantVolume checks the row of a volume written at index at.
func wantVolume(t *testing.T, st *state.Store, id string, at uint64, check func(v *statepb.Volume) bool) {
	t.Helper()
	v := st.Volume(id)
	if v == nil {
		t.Fatalf("volume %s is gone", id)
	}
	if v.GetModifyIndex() != at || v.GetCreateIndex() != 1 || v.GetCreatedAt().GetSeconds() != setupSec {
		t.Fatalf("volume %s: modify index %d, create index %d, created at %v; want %d, 1, second %d",
			id, v.GetModifyIndex(), v.GetCreateIndex(), v.GetCreatedAt(), at, setupSec)
	}
	if !check(v) {
		t.Fatalf("volume %s: %v", id, v)
	}
}

func TestFSMVolumeExpand(t *testing.T) {
	started := []*statepb.LogEntry{volCreate("v", 10, 100), volExpand("v", 1, expansion(40, rules.ExpansionController), 0)}
	tests := []lifecycleCase{
		{
			name:  "an expansion starts",
			setup: []*statepb.LogEntry{volCreate("v", 10, 100)},
			entry: volExpand("v", 1, &statepb.VolumeExpansion{CapacityBytes: 40, LimitBytes: 100, State: rules.ExpansionController}, 0),
			check: func(t *testing.T, st *state.Store, at uint64) {
				wantVolume(t, st, "v", at, func(v *statepb.Volume) bool {
					e := v.GetExpansion()
					return v.GetCapacityBytes() == 10 && e.GetCapacityBytes() == 40 && e.GetLimitBytes() == 100 && e.GetState() == rules.ExpansionController
				})
			},
			events: []string{"volume-updated volume/v "},
			desc:   "expansion to 40 bytes: state controller",
		},
		{
			name:  "the controller step is recorded",
			setup: started,
			entry: volExpand("v", 2, &statepb.VolumeExpansion{CapacityBytes: 40, State: rules.ExpansionNodes, NodesPending: []string{"n1", "n2"}}, 40),
			check: func(t *testing.T, st *state.Store, at uint64) {
				wantVolume(t, st, "v", at, func(v *statepb.Volume) bool {
					e := v.GetExpansion()
					return v.GetCapacityBytes() == 40 && e.GetState() == rules.ExpansionNodes && len(e.GetNodesPending()) == 2
				})
			},
			events: []string{"volume-updated volume/v "},
			desc:   "state nodes, nodes pending: n1, n2",
		},
		{
			name:  "a failed step is recorded",
			setup: started,
			entry: volExpand("v", 2, &statepb.VolumeExpansion{CapacityBytes: 40, State: rules.ExpansionController, LastError: "plugin said no"}, 0),
			check: func(t *testing.T, st *state.Store, at uint64) {
				wantVolume(t, st, "v", at, func(v *statepb.Volume) bool {
					return v.GetCapacityBytes() == 10 && v.GetExpansion().GetLastError() == "plugin said no"
				})
			},
			events: []string{"volume-updated volume/v "},
			desc:   "last error: plugin said no",
		},
		{
			name:  "the expansion is done",
			setup: started,
			entry: volExpand("v", 2, nil, 40),
			check: func(t *testing.T, st *state.Store, at uint64) {
				wantVolume(t, st, "v", at, func(v *statepb.Volume) bool {
					return v.GetCapacityBytes() == 40 && v.GetExpansion() == nil
				})
			},
			events: []string{"volume-expanded volume/v "},
			desc:   "expanded to 40 bytes (was 10)",
		},
		{
			// The plugin refused the controller step: the volume keeps
			// its size, and the event says the expansion was abandoned.
			name:  "the expansion is abandoned",
			setup: append(started[:2:2], volExpand("v", 2, &statepb.VolumeExpansion{CapacityBytes: 40, State: rules.ExpansionController, LastError: "out of range"}, 0)),
			entry: volExpand("v", 3, nil, 0),
			check: func(t *testing.T, st *state.Store, at uint64) {
				wantVolume(t, st, "v", at, func(v *statepb.Volume) bool {
					return v.GetCapacityBytes() == 10 && v.GetExpansion() == nil
				})
			},
			events: []string{"volume-updated volume/v "},
			desc:   "expansion to 40 bytes abandoned at 10 bytes: out of range",
		},
		{
			name:    "decided on an older row",
			setup:   started,
			entry:   volExpand("v", 1, nil, 40),
			refused: stale,
		},
		{
			name:    "a new expansion over the volume's limit",
			setup:   []*statepb.LogEntry{volCreate("v", 10, 100)},
			entry:   volExpand("v", 1, expansion(200, rules.ExpansionController), 0),
			refused: withCode(codes.InvalidArgument),
		},
		{
			name:    "a new expansion that shrinks",
			setup:   []*statepb.LogEntry{volCreate("v", 10, 0)},
			entry:   volExpand("v", 1, expansion(5, rules.ExpansionController), 0),
			refused: withCode(codes.InvalidArgument),
		},
		{
			name:    "another target while one is under way",
			setup:   started,
			entry:   volExpand("v", 2, expansion(50, rules.ExpansionNodes), 0),
			refused: withCode(codes.FailedPrecondition),
		},
		{
			name:    "an unknown state",
			setup:   started,
			entry:   volExpand("v", 2, expansion(40, "resizing"), 0),
			refused: withCode(codes.InvalidArgument),
		},
		{
			name:    "nothing under way to end",
			setup:   []*statepb.LogEntry{volCreate("v", 10, 0)},
			entry:   volExpand("v", 1, nil, 40),
			refused: withCode(codes.FailedPrecondition),
		},
		{
			name:    "a recorded capacity that shrinks",
			setup:   started,
			entry:   volExpand("v", 2, nil, 5),
			refused: withCode(codes.InvalidArgument),
		},
		{
			name:    "an unknown volume",
			setup:   []*statepb.LogEntry{volCreate("v", 10, 0)},
			entry:   volExpand("w", 1, expansion(40, rules.ExpansionController), 0),
			refused: notFound,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, tt.run)
	}
}

func TestFSMVolumeModify(t *testing.T) {
	modified := []*statepb.LogEntry{volCreate("v", 10, 0), volModify("v", 1, map[string]string{"iops": "100", "tier": "gold"})}
	params := func(want map[string]string) func(*testing.T, *state.Store, uint64) {
		return func(t *testing.T, st *state.Store, at uint64) {
			wantVolume(t, st, "v", at, func(v *statepb.Volume) bool { return maps.Equal(v.GetMutableParameters(), want) })
		}
	}
	tests := []lifecycleCase{
		{
			name:   "first parameters",
			setup:  []*statepb.LogEntry{volCreate("v", 10, 0)},
			entry:  volModify("v", 1, map[string]string{"tier": "gold", "iops": "100"}),
			check:  params(map[string]string{"iops": "100", "tier": "gold"}),
			events: []string{"volume-modified volume/v "},
			desc:   "mutable parameters set: iops, tier",
		},
		{
			name:   "changes merge over the stored parameters",
			setup:  modified,
			entry:  volModify("v", 2, map[string]string{"iops": "200", "bw": "1G"}),
			check:  params(map[string]string{"iops": "200", "tier": "gold", "bw": "1G"}),
			events: []string{"volume-modified volume/v "},
			desc:   "mutable parameters set: bw, iops",
		},
		{
			name:    "decided on an older row",
			setup:   modified,
			entry:   volModify("v", 1, map[string]string{"iops": "200"}),
			refused: stale,
		},
		{
			name:    "no parameters",
			setup:   modified,
			entry:   volModify("v", 2, nil),
			refused: withCode(codes.InvalidArgument),
		},
		{
			name:    "an unknown volume",
			setup:   modified,
			entry:   volModify("w", 2, map[string]string{"iops": "200"}),
			refused: notFound,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, tt.run)
	}
}

// wantSnapshot checks the row of snapshot id written at index at and
// first stored at index created (at second createdSec).
func wantSnapshot(t *testing.T, st *state.Store, id string, at, created uint64, createdSec int64, check func(s *statepb.VolumeSnapshot) bool) {
	t.Helper()
	s := st.VolumeSnapshot(id)
	if s == nil {
		t.Fatalf("snapshot %s not stored", id)
	}
	if s.GetModifyIndex() != at || s.GetCreateIndex() != created || s.GetCreatedAt().GetSeconds() != createdSec {
		t.Fatalf("snapshot %s: modify index %d, create index %d, created at %v; want %d, %d, second %d",
			id, s.GetModifyIndex(), s.GetCreateIndex(), s.GetCreatedAt(), at, created, createdSec)
	}
	if !check(s) {
		t.Fatalf("snapshot %s: %v", id, s)
	}
}

func TestFSMSnapshotCommands(t *testing.T) {
	vol := volCreate("v", 10, 0)
	creating := []*statepb.LogEntry{vol, snapPut(0, snapOf("s", "v", rules.SnapshotCreating))}
	created := func() *statepb.VolumeSnapshot {
		s := snapOf("s", "v", rules.SnapshotCreated)
		s.SizeBytes, s.ReadyToUse = 10, true
		return s
	}
	stored := append(creating[:2:2], snapPut(2, created()))
	tests := []lifecycleCase{
		{
			name:  "a new snapshot is recorded as creating, without an event",
			setup: []*statepb.LogEntry{vol},
			entry: snapPut(0, snapOf("s", "v", rules.SnapshotCreating)),
			check: func(t *testing.T, st *state.Store, at uint64) {
				wantSnapshot(t, st, "s", at, at, entrySec, func(s *statepb.VolumeSnapshot) bool {
					return s.GetState() == rules.SnapshotCreating && s.GetSourceVolumeId() == "v"
				})
			},
		},
		{
			name:  "created: volume-snapshot-created",
			setup: creating,
			entry: snapPut(2, created()),
			check: func(t *testing.T, st *state.Store, at uint64) {
				wantSnapshot(t, st, "s", at, 2, setupSec, func(s *statepb.VolumeSnapshot) bool {
					return s.GetState() == rules.SnapshotCreated && s.GetReadyToUse() && s.GetSizeBytes() == 10
				})
			},
			events: []string{"volume-snapshot-created volume/v s"},
			desc:   "external id ext-s, 10 bytes, ready to use: true",
		},
		{
			name:  "a failed attempt while creating: no event",
			setup: creating,
			entry: snapPut(2, &statepb.VolumeSnapshot{Id: "s", PluginId: "p", SourceVolumeId: "v", State: rules.SnapshotCreating, LastError: "busy"}),
			check: func(t *testing.T, st *state.Store, at uint64) {
				wantSnapshot(t, st, "s", at, 2, setupSec, func(s *statepb.VolumeSnapshot) bool { return s.GetLastError() == "busy" })
			},
		},
		{
			name:  "created again, ready now: no second created event",
			setup: []*statepb.LogEntry{vol, snapPut(0, snapOf("s", "v", rules.SnapshotCreating)), snapPut(2, snapOf("s", "v", rules.SnapshotCreated))},
			entry: snapPut(3, created()),
			check: func(t *testing.T, st *state.Store, at uint64) {
				wantSnapshot(t, st, "s", at, 2, setupSec, func(s *statepb.VolumeSnapshot) bool { return s.GetReadyToUse() })
			},
		},
		{
			name:  "deleting: no event yet",
			setup: stored,
			entry: snapPut(3, snapOf("s", "v", rules.SnapshotDeleting)),
			check: func(t *testing.T, st *state.Store, at uint64) {
				wantSnapshot(t, st, "s", at, 2, setupSec, func(s *statepb.VolumeSnapshot) bool { return s.GetState() == rules.SnapshotDeleting })
			},
		},
		{
			name:  "a create that cannot finish goes to deleting: no event",
			setup: creating,
			entry: snapPut(2, snapOf("s", "v", rules.SnapshotDeleting)),
			check: func(t *testing.T, st *state.Store, at uint64) {
				wantSnapshot(t, st, "s", at, 2, setupSec, func(s *statepb.VolumeSnapshot) bool { return s.GetState() == rules.SnapshotDeleting })
			},
		},
		{
			name:  "deleted: volume-snapshot-deleted",
			setup: append(stored[:3:3], snapPut(3, snapOf("s", "v", rules.SnapshotDeleting))),
			entry: snapDelete("s", 4),
			check: func(t *testing.T, st *state.Store, at uint64) {
				if s := st.VolumeSnapshot("s"); s != nil {
					t.Fatalf("snapshot still stored: %v", s)
				}
			},
			events: []string{"volume-snapshot-deleted volume/v s"},
			desc:   "snapshot s of volume v deleted",
		},
		{
			name:   "deleted without an index",
			setup:  stored,
			entry:  snapDelete("s", 0),
			check:  func(t *testing.T, st *state.Store, at uint64) {},
			events: []string{"volume-snapshot-deleted volume/v s"},
		},
		{name: "a new snapshot of an unknown volume", setup: []*statepb.LogEntry{vol}, entry: snapPut(0, snapOf("s", "w", rules.SnapshotCreating)), refused: withCode(codes.NotFound)},
		{name: "a new snapshot that is already created", setup: []*statepb.LogEntry{vol}, entry: snapPut(0, created()), refused: withCode(codes.InvalidArgument)},
		{name: "a new snapshot with a taken id", setup: stored, entry: snapPut(0, snapOf("s", "v", rules.SnapshotCreating)), refused: withCode(codes.AlreadyExists)},
		{name: "a new snapshot of another plugin", setup: []*statepb.LogEntry{vol}, entry: snapPut(0, &statepb.VolumeSnapshot{Id: "s", PluginId: "q", SourceVolumeId: "v", State: rules.SnapshotCreating}), refused: withCode(codes.InvalidArgument)},
		{name: "a change decided on an older row", setup: stored, entry: snapPut(2, snapOf("s", "v", rules.SnapshotDeleting)), refused: stale},
		{
			// The plugin refused the delete: the snapshot is kept, and no
			// second volume-snapshot-created is emitted.
			name:  "back from deleting after a refused delete",
			setup: append(stored[:3:3], snapPut(3, snapOf("s", "v", rules.SnapshotDeleting))),
			entry: snapPut(4, created()),
			check: func(t *testing.T, st *state.Store, at uint64) {
				if s := st.VolumeSnapshot("s"); s.GetState() != rules.SnapshotCreated || s.GetModifyIndex() != at {
					t.Fatalf("snapshot after a refused delete: %v", s)
				}
			},
		},
		{name: "back from created to creating", setup: stored, entry: snapPut(3, snapOf("s", "v", rules.SnapshotCreating)), refused: withCode(codes.FailedPrecondition)},
		{name: "a change of an unknown snapshot", setup: []*statepb.LogEntry{vol}, entry: snapPut(1, created()), refused: withCode(codes.NotFound)},
		{name: "delete decided on an older row", setup: stored, entry: snapDelete("s", 2), refused: stale},
		{name: "delete of an unknown snapshot", setup: stored, entry: snapDelete("t", 0), refused: withCode(codes.NotFound)},
	}
	for _, tt := range tests {
		t.Run(tt.name, tt.run)
	}
}

func TestFSMVolumeDeleteWithLifecycle(t *testing.T) {
	vol := volCreate("v", 10, 0)
	gone := func(t *testing.T, st *state.Store, at uint64) {
		if v := st.Volume("v"); v != nil {
			t.Fatalf("volume still stored: %v", v)
		}
	}
	legacyDelete := &statepb.LogEntry{Command: &statepb.LogEntry_VolumeDelete{VolumeDelete: "v"}}
	tests := []lifecycleCase{
		{
			name:    "a snapshot being created",
			setup:   []*statepb.LogEntry{vol, snapPut(0, snapOf("s", "v", rules.SnapshotCreating))},
			entry:   volDelete("v", 1),
			refused: withCode(codes.FailedPrecondition),
		},
		{
			name:    "a snapshot being created, delete of an earlier release",
			setup:   []*statepb.LogEntry{vol, snapPut(0, snapOf("s", "v", rules.SnapshotCreating))},
			entry:   legacyDelete,
			refused: withCode(codes.FailedPrecondition),
		},
		{
			name:    "an expansion under way",
			setup:   []*statepb.LogEntry{vol, volExpand("v", 1, expansion(40, rules.ExpansionNodes), 0)},
			entry:   volDelete("v", 2),
			refused: withCode(codes.FailedPrecondition),
		},
		{
			name:   "a created snapshot does not hold the volume",
			setup:  []*statepb.LogEntry{vol, snapPut(0, snapOf("s", "v", rules.SnapshotCreating)), snapPut(2, snapOf("s", "v", rules.SnapshotCreated))},
			entry:  volDelete("v", 1),
			check:  gone,
			events: []string{"volume-deleted volume/v "},
		},
		{
			name:   "another volume's snapshot being created",
			setup:  []*statepb.LogEntry{vol, volCreate("w", 10, 0), snapPut(0, snapOf("s", "w", rules.SnapshotCreating))},
			entry:  volDelete("v", 1),
			check:  gone,
			events: []string{"volume-deleted volume/v "},
		},
		{
			name:   "an expansion that is done",
			setup:  []*statepb.LogEntry{vol, volExpand("v", 1, expansion(40, rules.ExpansionNodes), 0), volExpand("v", 2, nil, 40)},
			entry:  volDelete("v", 3),
			check:  gone,
			events: []string{"volume-deleted volume/v "},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, tt.run)
	}
}

// TestFSMSnapshotRestoreKeepsLifecycle: a raft snapshot of the FSM keeps
// the volume snapshots and the new volume fields.
func TestFSMSnapshotRestoreKeepsLifecycle(t *testing.T) {
	f, err := newFSM(testEvents(t, 16, 8))
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range applyAll(t, f,
		at(setupSec, volCreate("v", 10, 100)),
		at(setupSec, volModify("v", 1, map[string]string{"iops": "100"})),
		at(setupSec, volExpand("v", 2, expansion(40, rules.ExpansionController), 0)),
		at(setupSec, snapPut(0, snapOf("s", "v", rules.SnapshotCreating))),
	) {
		if r.Err != nil {
			t.Fatalf("entry %d: %v", i, r.Err)
		}
	}
	g, err := newFSM(testEvents(t, 16, 8))
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Restore(nopCloser{strings.NewReader(snapshotOf(t, f))}); err != nil {
		t.Fatal(err)
	}
	if !equalRows(f.State().Volumes(""), g.State().Volumes("")) || !equalRows(f.State().VolumeSnapshots(), g.State().VolumeSnapshots()) {
		t.Fatalf("restored volumes %v, snapshots %v", g.State().Volumes(""), g.State().VolumeSnapshots())
	}
	v := g.State().Volume("v")
	if v.GetExpansion().GetCapacityBytes() != 40 || v.GetMutableParameters()["iops"] != "100" || v.GetCapacityLimitBytes() != 100 ||
		g.State().VolumeSnapshot("s").GetState() != rules.SnapshotCreating {
		t.Fatalf("restored volume %v, snapshot %v", v, g.State().VolumeSnapshot("s"))
	}
}

type nopCloser struct{ *strings.Reader }

func (nopCloser) Close() error { return nil }
