package server

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/retry"
)

func plug(id, typ string, healthy bool) *csisupdv1.Plugin {
	return &csisupdv1.Plugin{Id: id, Type: typ, Healthy: healthy, VendorName: "v-" + id, VendorVersion: "1"}
}

func register(id string, plugins ...*csisupdv1.Plugin) *csisupdv1.LogEntry {
	return &csisupdv1.LogEntry{Command: &csisupdv1.LogEntry_NodeUpsert{NodeUpsert: &csisupdv1.ClusterNode{
		Id: id, Name: "name-" + id, Address: id + ":4780", Plugins: plugins,
	}}}
}

func setPlugins(id string, plugins ...*csisupdv1.Plugin) *csisupdv1.LogEntry {
	return &csisupdv1.LogEntry{Command: &csisupdv1.LogEntry_NodePlugins{NodePlugins: &csisupdv1.NodePluginsCommand{NodeId: id, Plugins: plugins}}}
}

func setStatus(id, st string) *csisupdv1.LogEntry {
	return &csisupdv1.LogEntry{Command: &csisupdv1.LogEntry_NodeStatus{NodeStatus: &csisupdv1.NodeStatusCommand{NodeId: id, Status: st}}}
}

// applyAll feeds entries through the FSM as raft would and returns the
// results.
func applyAll(t *testing.T, f *fsm, entries ...*csisupdv1.LogEntry) []applyResult {
	t.Helper()
	var logs []*raft.Log
	for i, e := range entries {
		data, err := proto.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		logs = append(logs, &raft.Log{Index: f.State().LatestIndex() + uint64(i) + 1, Type: raft.LogCommand, Data: data})
	}
	var out []applyResult
	for _, r := range f.ApplyBatch(logs) {
		out = append(out, r.(applyResult))
	}
	return out
}

func TestPluginAggregation(t *testing.T) {
	type counts struct{ ch, ce, nh, ne uint32 }
	tests := []struct {
		name    string
		entries []*csisupdv1.LogEntry
		plugin  string
		want    *counts // nil: plugin absent
	}{
		{
			name:    "monolith on two ready nodes",
			entries: []*csisupdv1.LogEntry{register("a", plug("p", "monolith", true)), register("b", plug("p", "monolith", true))},
			plugin:  "p", want: &counts{2, 2, 2, 2},
		},
		{
			name:    "unhealthy instance",
			entries: []*csisupdv1.LogEntry{register("a", plug("p", "monolith", true)), register("b", plug("p", "monolith", false))},
			plugin:  "p", want: &counts{1, 2, 1, 2},
		},
		{
			name:    "controller and node split",
			entries: []*csisupdv1.LogEntry{register("a", plug("p", "controller", true)), register("b", plug("p", "node", true)), register("c", plug("p", "node", true))},
			plugin:  "p", want: &counts{1, 1, 2, 2},
		},
		{
			name: "down node stops counting",
			entries: []*csisupdv1.LogEntry{register("a", plug("p", "monolith", true)), register("b", plug("p", "monolith", true)),
				setStatus("b", NodeStatusDown)},
			plugin: "p", want: &counts{1, 2, 1, 2},
		},
		{
			name: "node back to ready counts again",
			entries: []*csisupdv1.LogEntry{register("a", plug("p", "monolith", true)), setStatus("a", NodeStatusDown),
				setStatus("a", NodeStatusReady)},
			plugin: "p", want: &counts{1, 1, 1, 1},
		},
		{
			name:    "plugin removed from its only node is collected",
			entries: []*csisupdv1.LogEntry{register("a", plug("p", "monolith", true), plug("q", "node", true)), setPlugins("a", plug("q", "node", true))},
			plugin:  "p", want: nil,
		},
		{
			name:    "re-registration without the plugin collects it",
			entries: []*csisupdv1.LogEntry{register("a", plug("p", "monolith", true)), register("a")},
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
		setStatus("ghost", NodeStatusDown),
		&csisupdv1.LogEntry{Command: &csisupdv1.LogEntry_VolumeDelete{VolumeDelete: "nope"}},
		register("a", plug("p", "node", true)),
		setStatus("a", NodeStatusReady), // no change: no event
		setStatus("a", NodeStatusDown),
	)
	for i := range 3 {
		if !errors.Is(res[i].Err, ErrNotFound) {
			t.Errorf("entry %d: error %v, want ErrNotFound", i, res[i].Err)
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
		setStatus("b", NodeStatusDown),
		&csisupdv1.LogEntry{Command: &csisupdv1.LogEntry_VolumeUpsert{VolumeUpsert: &csisupdv1.Volume{Id: "v", PluginId: "p", ExternalId: "x"}}},
		&csisupdv1.LogEntry{Command: &csisupdv1.LogEntry_ServerUpsert{ServerUpsert: &csisupdv1.ServerRecord{Id: "s1", RpcAddress: "h:1"}}},
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

func TestConfigValidate(t *testing.T) {
	ok := Config{ID: "s1", DataDir: "d", RaftAddr: "127.0.0.1:4781", RPCAddr: "127.0.0.1:4780", BootstrapExpect: 1,
		RaftMultiplier: 1, Join: config.DefaultRetry().ServerJoin, Connect: config.DefaultRetry().ServerConnect,
		ServerTuning: config.DefaultServerTuning()}
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string // "" means valid
	}{
		{"valid single server", func(*Config) {}, ""},
		{"missing id", func(c *Config) { c.ID = "" }, "id is required"},
		{"missing data dir", func(c *Config) { c.DataDir = "" }, "data_dir"},
		{"bad raft address", func(c *Config) { c.RaftAddr = "nope" }, "raft address"},
		{"bad rpc address", func(c *Config) { c.RPCAddr = "" }, "rpc address"},
		{"zero bootstrap_expect", func(c *Config) { c.BootstrapExpect = 0 }, "bootstrap_expect = 0"},
		{"expect 3 without retry_join", func(c *Config) { c.BootstrapExpect = 3 }, "retry_join"},
		{"bad retry_join address", func(c *Config) { c.BootstrapExpect = 3; c.RetryJoin = []string{"x"} }, `retry_join address "x"`},
		{"raft multiplier too big", func(c *Config) { c.RaftMultiplier = 11 }, "raft_multiplier"},
		{"no join policy: none of its own", func(c *Config) { c.Join = retry.Policy{} }, "Join: retry: Base must be positive"},
		{"join jitter of one", func(c *Config) { c.Join.Jitter = 1 }, "Join: retry: Jitter"},
		{"no raft multiplier: none of its own", func(c *Config) { c.RaftMultiplier = 0 }, "raft_multiplier = 0"},
		{"no tuning: none of its own", func(c *Config) { c.ServerTuning = config.ServerTuning{} }, "server tuning: RPCTimeout must be positive"},
		{"event buffer and lag", func(c *Config) { c.EventBufferSize, c.EventMaxLag = 16, 15 }, ""},
		{"event lag as large as the buffer", func(c *Config) { c.EventBufferSize, c.EventMaxLag = 16, 16 }, "EventMaxLag = 16 with EventBufferSize = 16"},
		{"event lag beyond the default buffer", func(c *Config) { c.EventMaxLag = 2000 }, "EventMaxLag = 2000 with EventBufferSize = 1024"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.mutate(&c)
			err := c.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want it to mention %q", err, tt.want)
			}
		})
	}
}

func TestRateScaledInterval(t *testing.T) {
	tests := []struct {
		rate float64
		min  time.Duration
		n    int
		want time.Duration
	}{
		{50, 10 * time.Second, 0, 10 * time.Second},
		{50, 10 * time.Second, 500, 10 * time.Second},
		{50, 10 * time.Second, 2000, 40 * time.Second},
		{0, time.Second, 1000, time.Second},
	}
	for _, tt := range tests {
		if got := rateScaledInterval(tt.rate, tt.min, tt.n); got != tt.want {
			t.Errorf("rateScaledInterval(%v, %v, %d) = %v, want %v", tt.rate, tt.min, tt.n, got, tt.want)
		}
	}
}
