package fsm

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

func plug(id, typ string, healthy bool) *statepb.Plugin {
	return &statepb.Plugin{Id: id, Type: typ, Healthy: healthy, VendorName: "v-" + id, VendorVersion: "1"}
}

func register(id string, plugins ...*statepb.Plugin) *statepb.LogEntry {
	return &statepb.LogEntry{Command: &statepb.LogEntry_NodeUpsert{NodeUpsert: &statepb.ClusterNode{
		Id: id, Name: "name-" + id, Address: id + ":4780", Plugins: plugins,
	}}}
}

func setPlugins(id string, plugins ...*statepb.Plugin) *statepb.LogEntry {
	return &statepb.LogEntry{Command: &statepb.LogEntry_NodePlugins{NodePlugins: &statepb.NodePluginsCommand{NodeId: id, Plugins: plugins}}}
}

func setStatus(id, st string) *statepb.LogEntry {
	return &statepb.LogEntry{Command: &statepb.LogEntry_NodeStatus{NodeStatus: &statepb.NodeStatusCommand{NodeId: id, Status: st}}}
}

// applyAll feeds entries through the FSM as raft would and returns the
// results.
func applyAll(t *testing.T, f *FSM, entries ...*statepb.LogEntry) []Result {
	t.Helper()
	var logs []*raft.Log
	for i, e := range entries {
		data, err := proto.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		logs = append(logs, &raft.Log{Index: f.State().LatestIndex() + uint64(i) + 1, Type: raft.LogCommand, Data: data})
	}
	var out []Result
	for _, r := range f.ApplyBatch(logs) {
		out = append(out, r.(Result))
	}
	return out
}

func TestPluginAggregation(t *testing.T) {
	type counts struct{ ch, ce, nh, ne uint32 }
	tests := []struct {
		name    string
		entries []*statepb.LogEntry
		plugin  string
		want    *counts // nil: plugin absent
	}{
		{
			name:    "monolith on two ready nodes",
			entries: []*statepb.LogEntry{register("a", plug("p", "monolith", true)), register("b", plug("p", "monolith", true))},
			plugin:  "p", want: &counts{2, 2, 2, 2},
		},
		{
			name:    "unhealthy instance",
			entries: []*statepb.LogEntry{register("a", plug("p", "monolith", true)), register("b", plug("p", "monolith", false))},
			plugin:  "p", want: &counts{1, 2, 1, 2},
		},
		{
			name:    "controller and node split",
			entries: []*statepb.LogEntry{register("a", plug("p", "controller", true)), register("b", plug("p", "node", true)), register("c", plug("p", "node", true))},
			plugin:  "p", want: &counts{1, 1, 2, 2},
		},
		{
			name: "down node stops counting",
			entries: []*statepb.LogEntry{register("a", plug("p", "monolith", true)), register("b", plug("p", "monolith", true)),
				setStatus("b", state.NodeStatusDown)},
			plugin: "p", want: &counts{1, 2, 1, 2},
		},
		{
			name: "node back to ready counts again",
			entries: []*statepb.LogEntry{register("a", plug("p", "monolith", true)), setStatus("a", state.NodeStatusDown),
				setStatus("a", state.NodeStatusReady)},
			plugin: "p", want: &counts{1, 1, 1, 1},
		},
		{
			name:    "plugin removed from its only node is collected",
			entries: []*statepb.LogEntry{register("a", plug("p", "monolith", true), plug("q", "node", true)), setPlugins("a", plug("q", "node", true))},
			plugin:  "p", want: nil,
		},
		{
			name:    "re-registration without the plugin collects it",
			entries: []*statepb.LogEntry{register("a", plug("p", "monolith", true)), register("a")},
			plugin:  "p", want: nil,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := newFSM(testEvents(t, 16, 8))
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range applyAll(t, f, tt.entries...) {
				if r.Err != nil {
					t.Fatalf("entry %d: %v", i, r.Err)
				}
			}
			p := f.State().Plugin(tt.plugin)
			if tt.want == nil {
				if p != nil {
					t.Fatalf("plugin %s still present: %v", tt.plugin, p)
				}
				return
			}
			if p == nil {
				t.Fatalf("plugin %s missing", tt.plugin)
			}
			got := counts{p.ControllersHealthy, p.ControllersExpected, p.NodesHealthy, p.NodesExpected}
			if got != *tt.want {
				t.Fatalf("controllers %d/%d nodes %d/%d, want %d/%d %d/%d",
					got.ch, got.ce, got.nh, got.ne, tt.want.ch, tt.want.ce, tt.want.nh, tt.want.ne)
			}
		})
	}
}

func TestFSMErrorsAndEvents(t *testing.T) {
	events := testEvents(t, 16, 8)
	f, err := newFSM(events)
	if err != nil {
		t.Fatal(err)
	}
	res := applyAll(t, f,
		setPlugins("ghost", plug("p", "node", true)),
		setStatus("ghost", state.NodeStatusDown),
		&statepb.LogEntry{Command: &statepb.LogEntry_VolumeDelete{VolumeDelete: "nope"}},
		register("a", plug("p", "node", true)),
		setStatus("a", state.NodeStatusReady), // no change: no event
		setStatus("a", state.NodeStatusDown),
	)
	for i := range 3 {
		if !errors.Is(res[i].Err, state.ErrNotFound) {
			t.Errorf("entry %d: error %v, want state.ErrNotFound", i, res[i].Err)
		}
	}
	for i := 3; i < len(res); i++ {
		if res[i].Err != nil {
			t.Errorf("entry %d: %v", i, res[i].Err)
		}
	}
	var types []string
	for _, e := range readAll(t, events, 0) {
		types = append(types, e.Payload.GetType())
	}
	if got, want := strings.Join(types, ","), "node-registered,node-down"; got != want {
		t.Fatalf("events %s, want %s", got, want)
	}
	if f.State().LatestIndex() != uint64(len(res)) {
		t.Fatalf("latest index %d, want %d", f.State().LatestIndex(), len(res))
	}
}

func TestFSMSnapshotRestore(t *testing.T) {
	f, err := newFSM(testEvents(t, 16, 8))
	if err != nil {
		t.Fatal(err)
	}
	applyAll(t, f,
		register("a", plug("p", "monolith", true)),
		register("b", plug("p", "monolith", true)),
		setStatus("b", state.NodeStatusDown),
		&statepb.LogEntry{Command: &statepb.LogEntry_VolumeUpsert{VolumeUpsert: &statepb.Volume{Id: "v", PluginId: "p", ExternalId: "x"}}},
		&statepb.LogEntry{Command: &statepb.LogEntry_ServerUpsert{ServerUpsert: &statepb.ServerRecord{Id: "s1", RpcAddress: "h:1"}}},
	)
	snap := snapshotOf(t, f)
	g, err := newFSM(testEvents(t, 16, 8))
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Restore(io.NopCloser(strings.NewReader(snap))); err != nil {
		t.Fatal(err)
	}
	st := g.State()
	p := st.Plugin("p")
	if p == nil || p.ControllersHealthy != 1 || p.ControllersExpected != 2 {
		t.Fatalf("restored plugin: %v", p)
	}
	if st.Volume("v") == nil || st.Server("s1").GetRpcAddress() != "h:1" || len(st.Nodes()) != 2 {
		t.Fatal("restored state is missing objects")
	}
	if st.LatestIndex() != f.State().LatestIndex() {
		t.Fatalf("restored index %d, want %d", st.LatestIndex(), f.State().LatestIndex())
	}
	if err := g.Restore(io.NopCloser(strings.NewReader("garbage"))); err == nil {
		t.Fatal("restore of garbage succeeded")
	}
}

type memSink struct{ strings.Builder }

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { return nil }
func (s *memSink) Close() error  { return nil }

// newFSM returns an FSM that publishes to events.
func newFSM(events *Events) (*FSM, error) {
	return New(Config{Events: events})
}
