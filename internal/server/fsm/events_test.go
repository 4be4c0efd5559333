package fsm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
	"github.com/csisupd/csisupd/internal/stream"
	"github.com/csisupd/csisupd/internal/testutil"
)

// testEvents returns an event holder closed when the test ends.
func testEvents(t testing.TB, size, maxLag int) *Events {
	t.Helper()
	c, err := NewEvents(stream.Config{Size: size, MaxLag: maxLag}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// doneCtx is a done context: Next with it returns what is available
// without waiting.
func doneCtx() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// readBatches returns the batches buffered after index after, one slice
// per batch, read without waiting.
func readBatches(t testing.TB, c *Events, after uint64) [][]Event {
	t.Helper()
	sub, err := c.Subscribe(after, false)
	if err != nil {
		t.Fatalf("subscribe after %d: %v", after, err)
	}
	defer sub.Close()
	var out [][]Event
	for {
		batch, err := sub.Next(doneCtx(), nil) // nil dst: one batch a call
		if errors.Is(err, context.Canceled) {
			return out
		}
		if err != nil {
			t.Fatalf("next after %d: %v", after, err)
		}
		out = append(out, batch)
	}
}

// readAll returns the events buffered after index after.
func readAll(t testing.TB, c *Events, after uint64) []Event {
	t.Helper()
	var out []Event
	for _, b := range readBatches(t, c, after) {
		out = append(out, b...)
	}
	return out
}

// describe renders events as "index topic/key type" lines.
func describe(events []Event) string {
	var b strings.Builder
	for _, e := range events {
		fmt.Fprintf(&b, "%d %s/%s %s\n", e.Index, e.Topic, e.Key, e.Payload.GetType())
	}
	return b.String()
}

func TestEventTopic(t *testing.T) {
	tests := []struct {
		event      *csisupdv1.ClusterEvent
		topic, key string
	}{
		{&csisupdv1.ClusterEvent{Type: "node-registered", NodeId: "n"}, TopicNode, "n"},
		{&csisupdv1.ClusterEvent{Type: "node-plugins-updated", NodeId: "n"}, TopicNode, "n"},
		{&csisupdv1.ClusterEvent{Type: "node-down", NodeId: "n"}, TopicNode, "n"},
		{&csisupdv1.ClusterEvent{Type: "node-ready", NodeId: "n"}, TopicNode, "n"},
		{&csisupdv1.ClusterEvent{Type: "plugin-gc", NodeId: "n", PluginId: "p"}, TopicPlugin, "p"},
		{&csisupdv1.ClusterEvent{Type: "volume-created", PluginId: "p", VolumeId: "v"}, TopicVolume, "v"},
		{&csisupdv1.ClusterEvent{Type: "volume-claimed", PluginId: "p", VolumeId: "v"}, TopicVolume, "v"},
		{&csisupdv1.ClusterEvent{Type: "volume-deleted", PluginId: "p", VolumeId: "v"}, TopicVolume, "v"},
	}
	for _, tt := range tests {
		t.Run(tt.event.GetType(), func(t *testing.T) {
			if topic, key := Topic(tt.event); topic != tt.topic || key != tt.key {
				t.Fatalf("eventTopic = %s/%s, want %s/%s", topic, key, tt.topic, tt.key)
			}
		})
	}
}

// commandLog encodes e as the raft log at index.
func commandLog(t testing.TB, index uint64, e *statepb.LogEntry) *raft.Log {
	t.Helper()
	data, err := proto.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	return &raft.Log{Index: index, Type: raft.LogCommand, Data: data}
}

func TestFSMPublishesOneBatchPerEntry(t *testing.T) {
	events := testEvents(t, 16, 8)
	f, err := newFSM(events)
	if err != nil {
		t.Fatal(err)
	}
	volume := &statepb.LogEntry{Command: &statepb.LogEntry_VolumeUpsert{VolumeUpsert: &statepb.Volume{Id: "v", PluginId: "p", ExternalId: "x"}}}
	batch := &statepb.LogEntry{Command: &statepb.LogEntry_Batch{Batch: &statepb.LogBatch{Entries: []*statepb.LogEntry{
		setPlugins("a"), volume,
	}}}}
	// One ApplyBatch of several entries, as raft hands them over: each
	// entry with events is one batch at its raft index, whatever the
	// number of events; entries without events publish nothing.
	f.ApplyBatch([]*raft.Log{
		{Index: 3, Type: raft.LogConfiguration},
		commandLog(t, 5, register("a", plug("p", "monolith", true))),
		commandLog(t, 6, batch),
		commandLog(t, 7, &statepb.LogEntry{Command: &statepb.LogEntry_ServerUpsert{ServerUpsert: &statepb.ServerRecord{Id: "s1"}}}),
		commandLog(t, 9, setStatus("a", state.NodeStatusDown)),
	})
	f.ApplyBatch([]*raft.Log{commandLog(t, 10, &statepb.LogEntry{Command: &statepb.LogEntry_Noop{}})})

	var got []string
	for _, b := range readBatches(t, events, 0) {
		got = append(got, describe(b))
	}
	want := []string{
		"5 node/a node-registered\n",
		"6 node/a node-plugins-updated\n6 plugin/p plugin-gc\n6 volume/v volume-created\n",
		"9 node/a node-down\n",
	}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("batches:\n%s\nwant:\n%s", strings.Join(got, "|"), strings.Join(want, "|"))
	}
	for _, e := range readAll(t, events, 0) {
		if e.Payload.GetIndex() != e.Index {
			t.Errorf("event %s has index %d in a batch at %d", e.Payload.GetType(), e.Payload.GetIndex(), e.Index)
		}
	}
	// The latest index is the last applied entry's, events or not: a
	// subscription without replay starts there.
	if _, latest := events.buf.Range(); latest != 10 {
		t.Fatalf("latest published index %d, want 10", latest)
	}
	sub, err := events.Subscribe(0, true)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if sub.Index() != 10 {
		t.Fatalf("no-replay subscription starts at %d, want 10", sub.Index())
	}
}

func TestClusterEventsRefusedPublishIsLogged(t *testing.T) {
	var logs testutil.SyncBuffer
	c, err := NewEvents(stream.Config{Size: 4, MaxLag: 2}, hclog.New(&hclog.LoggerOptions{Output: &logs}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ev := Event{Topic: TopicNode, Key: "a", Payload: &csisupdv1.ClusterEvent{Index: 5, Type: "node-down", NodeId: "a"}}
	c.Publish(5, ev)
	c.Publish(5, ev) // not greater than the latest: refused
	if n := len(readAll(t, c, 0)); n != 1 {
		t.Fatalf("%d events buffered, want 1", n)
	}
	if !strings.Contains(logs.String(), "cluster events not published") {
		t.Fatalf("refused publish not logged: %q", logs.String())
	}
}

// snapshotOf returns the encoded snapshot of f's state.
func snapshotOf(t testing.TB, f *FSM) string {
	t.Helper()
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	return sink.String()
}

func TestFSMRestoreEndsEvents(t *testing.T) {
	tests := []struct {
		name string
		// newer restores a snapshot newer than the state, as a follower
		// installs one from the leader; else an older one, as an
		// operator restores a backup.
		newer bool
	}{
		{"older snapshot", false},
		{"newer snapshot", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			events := testEvents(t, 16, 8)
			f, err := newFSM(events)
			if err != nil {
				t.Fatal(err)
			}
			applyAll(t, f, register("a", plug("p", "monolith", true)))
			snapIndex := f.State().LatestIndex()
			snap := snapshotOf(t, f)
			if tt.newer {
				// The snapshot comes from another FSM that went further.
				g, err := newFSM(testEvents(t, 16, 8))
				if err != nil {
					t.Fatal(err)
				}
				applyAll(t, g, register("a", plug("p", "monolith", true)), register("b"), register("c"), register("d"), register("e"))
				snapIndex = g.State().LatestIndex()
				snap = snapshotOf(t, g)
			}
			applyAll(t, f, register("b"), setStatus("b", state.NodeStatusDown))
			before := f.State().LatestIndex()
			sub, err := events.Subscribe(0, false)
			if err != nil {
				t.Fatal(err)
			}
			defer sub.Close()

			if err := f.Restore(io.NopCloser(strings.NewReader(snap))); err != nil {
				t.Fatal(err)
			}
			// The restore is a write at an index never handed out before.
			at := max(snapIndex, before+1)
			if got := f.State().LatestIndex(); got != at {
				t.Fatalf("restored state index %d, want %d", got, at)
			}

			// An open subscription is given what was buffered, then is
			// gone: the state changed without events.
			var got []Event
			for {
				dst, err := sub.Next(doneCtx(), nil)
				if err == nil {
					got = append(got, dst...)
					continue
				}
				var gone *stream.GoneError
				if err := events.Ended(sub, err); !errors.As(err, &gone) || gone.After != before || gone.Oldest != at {
					t.Fatalf("open subscription ended with %v, want gone after %d, oldest %d", err, before, at)
				}
				break
			}
			if len(got) != 3 {
				t.Fatalf("open subscription read %d events before the end, want the 3 published:\n%s", len(got), describe(got))
			}

			// A new subscription after an index the restore left behind is
			// gone; after the restore point, or after 0, it follows.
			var gone *stream.GoneError
			if _, err := events.Subscribe(at-1, false); !errors.As(err, &gone) || gone.After != at-1 || gone.Oldest != at {
				t.Fatalf("subscribe after %d: %v, want gone (oldest %d)", at-1, err, at)
			}
			applyAll(t, f, setStatus("a", state.NodeStatusDown))
			want := fmt.Sprintf("%d node/a node-down\n", at+1)
			for _, after := range []uint64{0, at} {
				if got := describe(readAll(t, events, after)); got != want {
					t.Fatalf("after %d, events:\n%s\nwant:\n%s", after, got, want)
				}
			}
		})
	}
}

func TestClusterEventsClose(t *testing.T) {
	events := testEvents(t, 4, 2)
	events.Publish(1, Event{Topic: TopicNode, Key: "a", Payload: &csisupdv1.ClusterEvent{Index: 1, Type: "node-down", NodeId: "a"}})
	sub, err := events.Subscribe(0, false)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	events.Close()
	// What was published before is still given, then the end.
	if dst, err := sub.Next(context.Background(), nil); err != nil || len(dst) != 1 {
		t.Fatalf("next after close: %d events, %v; want the one buffered", len(dst), err)
	}
	_, err = sub.Next(context.Background(), nil)
	if err = events.Ended(sub, err); !errors.Is(err, ErrClosed) {
		t.Fatalf("end after close: %v, want %v", err, ErrClosed)
	}
	if _, err := events.Subscribe(0, false); !errors.Is(err, ErrClosed) {
		t.Fatalf("subscribe after close: %v, want %v", err, ErrClosed)
	}
	if err := events.Restore(9); err != nil {
		t.Fatal(err)
	}
	if _, err := events.Subscribe(0, false); !errors.Is(err, ErrClosed) {
		t.Fatalf("subscribe after a restore after close: %v, want %v", err, ErrClosed)
	}
}
