package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testutil"
)

// run maps usage errors to 2, other errors to 1 and success to 0.
func TestRunExitCodes(t *testing.T) {
	t.Setenv("CSISUPD_ADDR", "")
	addr := testutil.FreeAddr(t)
	tests := []struct {
		args []string
		want int
	}{
		{[]string{"version"}, exitOK},
		{[]string{"--help"}, exitOK},
		{[]string{"agent", "--no-such-flag"}, exitUsage},
		{[]string{"agent", "extra"}, exitUsage},
		{[]string{"status", "extra"}, exitUsage},
		{[]string{"events", "--replay", "many"}, exitUsage},
		{[]string{"no-such-command"}, exitUsage},
		{[]string{"--address", addr, "--timeout", "2s", "status"}, exitError},
		{[]string{"agent", "--config", "/nonexistent/csisupd.hcl"}, exitError},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			if got := run(tt.args); got != tt.want {
				t.Errorf("run(%q) = %d, want %d", tt.args, got, tt.want)
			}
		})
	}
}

// status with no agent names the address it tried.
func TestStatusNoAgent(t *testing.T) {
	addr := testutil.FreeAddr(t)
	root := newRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs([]string{"--address", addr, "status"})
	err := root.Execute()
	if err == nil || !strings.Contains(err.Error(), addr) {
		t.Fatalf("status error = %v, want one naming %s", err, addr)
	}
}

func TestVersionCommand(t *testing.T) {
	b := currentBuild()
	tests := []struct {
		args  []string
		check func(string) error
	}{
		{[]string{"version"}, func(s string) error {
			if !strings.HasPrefix(s, "csisupd "+b.Version+" (commit "+b.Commit) {
				return fmt.Errorf("unexpected text %q", s)
			}
			return nil
		}},
		{[]string{"version", "--json"}, func(s string) error {
			var v map[string]any
			if err := json.Unmarshal([]byte(s), &v); err != nil {
				return err
			}
			if v["version"] != b.Version || v["commit"] != b.Commit || !strings.HasPrefix(v["go"].(string), "go") {
				return fmt.Errorf("unexpected JSON %v", v)
			}
			if _, ok := v["dirty"].(bool); !ok {
				return fmt.Errorf("dirty = %v, want a boolean", v["dirty"])
			}
			if _, ok := v["build_time"]; !ok {
				return fmt.Errorf("no build_time in %v", v)
			}
			return nil
		}},
	}
	for _, tt := range tests {
		root := newRootCommand()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetArgs(tt.args)
		if err := root.Execute(); err != nil {
			t.Fatalf("%v: %v", tt.args, err)
		}
		if err := tt.check(out.String()); err != nil {
			t.Errorf("%v: %v", tt.args, err)
		}
	}
}

// status --json always carries every contract field, with empty lists and
// objects rather than null, max_volumes a number, and last_probe null
// before the first probe.
func TestStatusJSONContract(t *testing.T) {
	probe := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name       string
		plugin     *csisupdv1.Plugin
		lastProbe  any
		maxVolumes float64
	}{
		{"never probed", &csisupdv1.Plugin{Id: "a", Type: "unknown", HealthState: "unknown"}, nil, 0},
		{"probed", &csisupdv1.Plugin{Id: "b", Type: "monolith", Healthy: true, HealthState: "healthy",
			NodeId: "n1", MaxVolumes: 1<<31 - 1, ControllerCapabilities: []string{"CREATE_DELETE_VOLUME"},
			LastProbe: timestamppb.New(probe)}, "2026-01-02T03:04:05Z", 1<<31 - 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := printProto(&out, &csisupdv1.StatusResponse{Plugins: []*csisupdv1.Plugin{tt.plugin}}); err != nil {
				t.Fatal(err)
			}
			var doc struct {
				Plugins []map[string]any `json:"plugins"`
				Ignored []any            `json:"ignored"`
			}
			if err := json.Unmarshal(out.Bytes(), &doc); err != nil || len(doc.Plugins) != 1 {
				t.Fatalf("status JSON %s: %v", out.Bytes(), err)
			}
			if doc.Ignored == nil {
				t.Errorf("ignored is not a list: %s", out.Bytes())
			}
			p := doc.Plugins[0]
			for _, key := range []string{"id", "type", "healthy", "health_description", "socket", "vendor_name",
				"vendor_version", "node_id", "max_volumes", "accessible_topology", "controller_capabilities",
				"node_capabilities", "last_probe"} {
				if _, ok := p[key]; !ok {
					t.Errorf("no %q in %s", key, out.Bytes())
				}
			}
			for _, key := range []string{"plugin_capabilities", "controller_capabilities", "node_capabilities"} {
				if _, ok := p[key].([]any); !ok {
					t.Errorf("%s = %v, want a list", key, p[key])
				}
			}
			for _, key := range []string{"accessible_topology", "manifest"} {
				if _, ok := p[key].(map[string]any); !ok {
					t.Errorf("%s = %v, want an object", key, p[key])
				}
			}
			if p["id"] != tt.plugin.GetId() || p["healthy"] != tt.plugin.GetHealthy() {
				t.Errorf("id, healthy = %v, %v; want %v, %v", p["id"], p["healthy"], tt.plugin.GetId(), tt.plugin.GetHealthy())
			}
			if p["max_volumes"] != tt.maxVolumes {
				t.Errorf("max_volumes = %#v, want the number %v", p["max_volumes"], tt.maxVolumes)
			}
			if p["last_probe"] != tt.lastProbe {
				t.Errorf("last_probe = %v, want %v", p["last_probe"], tt.lastProbe)
			}
		})
	}
}

// events --json prints one object per line with the contract fields, the
// index as a string (a uint64 in the proto3 JSON mapping).
func TestEventJSONLine(t *testing.T) {
	var out bytes.Buffer
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	events := []*csisupdv1.Event{
		{Index: 1, Time: timestamppb.New(at), Type: "plugin-registered", PluginId: "p", Description: "registered"},
		{Index: 2, Time: timestamppb.New(at), Type: "plugin-healthy", PluginId: "p"},
	}
	for _, e := range events {
		if err := printEvent(&out, e, true); err != nil {
			t.Fatal(err)
		}
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines, want 2:\n%s", len(lines), out.String())
	}
	// The layout is encoding/json's, the same for every build (protojson
	// alone varies its spaces).
	if want := `{"index":"1","time":"2026-01-02T03:04:05Z","type":"plugin-registered","plugin_id":"p","description":"registered","volume_id":"","workload_id":""}`; lines[0] != want {
		t.Errorf("line 0 = %s\nwant      %s", lines[0], want)
	}
	for i, line := range lines {
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("line %d %q: %v", i, line, err)
		}
		for _, key := range []string{"time", "type", "plugin_id", "description", "index"} {
			if _, ok := e[key]; !ok {
				t.Errorf("line %d has no %q: %s", i, key, line)
			}
		}
		want := events[i]
		if e["time"] != "2026-01-02T03:04:05Z" || e["type"] != want.GetType() || e["plugin_id"] != want.GetPluginId() ||
			e["description"] != want.GetDescription() || e["index"] != fmt.Sprint(want.GetIndex()) {
			t.Errorf("line %d = %v, want the values of %v", i, e, want)
		}
	}
}
