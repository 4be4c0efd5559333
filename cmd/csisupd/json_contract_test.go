package main

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// documentedKeys are the keys the README's "JSON output (stable)" section
// lists (DESIGN section 6 lists a subset of them), by command and by where
// they are in its output: "" is the top-level object, "plugins[]" every
// element of its list "plugins".
func documentedKeys() map[string]map[string][]string {
	return map[string]map[string][]string{
		"status": {
			"":          {"name", "version", "started_at", "plugin_dir", "ignored", "cluster", "plugins", "mounts"},
			"ignored[]": {"path", "reason"},
			"plugins[]": {"id", "type", "healthy", "health_state", "health_description", "health_since", "socket",
				"vendor_name", "vendor_version", "manifest", "node_id", "max_volumes", "accessible_topology",
				"plugin_capabilities", "controller_capabilities", "node_capabilities", "last_probe", "registered_at"},
		},
		"events":           {"": {"time", "type", "plugin_id", "description", "index", "volume_id", "workload_id"}},
		"events --cluster": {"": {"index", "time", "type", "node_id", "plugin_id", "volume_id", "snapshot_id", "description"}},
		"volume snapshot list": {
			"":            {"snapshots"},
			"snapshots[]": {"id", "plugin_id", "source_volume_id", "external_id", "size_bytes", "ready_to_use", "created_at"},
		},
		// plugin mounts is computed from the configuration, without an
		// agent: its document is encoding/json's, not an API message.
		"plugin mounts": {
			"":         {"plugin_id", "mounts", "notes"},
			"mounts[]": {"source", "target", "propagation", "read_only", "reason"},
		},
	}
}

// The README documents exactly the keys documentedKeys lists, so the live
// test below checks the contract as the README states it.
func TestREADMEListsTheDocumentedKeys(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "commands.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "### JSON output (stable)\n")
	if !ok {
		t.Fatal(`docs/commands.md has no "### JSON output (stable)" section`)
	}
	if end := strings.Index(section, "\n#"); end >= 0 {
		section = section[:end]
	}
	// A bullet starts at "- " and runs to the next one or a blank line.
	bullets := regexp.MustCompile(`(?m)^- `).Split(section, -1)
	field := regexp.MustCompile("`([a-z][a-z_]*)`")
	for command, paths := range documentedKeys() {
		var want []string
		for _, ks := range paths {
			want = append(want, ks...)
		}
		sort.Strings(want)
		var bullet string
		for _, b := range bullets {
			if strings.HasPrefix(b, "`csisupd "+command+" --json`") {
				bullet, _, _ = strings.Cut(b, "\n\n")
			}
		}
		if bullet == "" {
			t.Errorf("README's JSON section has no bullet for `csisupd %s --json`", command)
			continue
		}
		var got []string
		for _, m := range field.FindAllStringSubmatch(bullet, -1) {
			got = append(got, m[1])
		}
		sort.Strings(got)
		got = slices.Compact(got)
		if !slices.Equal(got, want) {
			t.Errorf("README documents for %s the keys\n  %v\nthe contract test checks\n  %v", command, got, want)
		}
	}
}

// status --json and events --json against a live agent carry every key
// the README documents, where it documents it, and the values have the
// JSON types the contract promises.
func TestDocumentedJSONKeys(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 1, Agents: 1})
	a := c.Agent(0)
	a.StartPlugin("tp", testplugin.Config{NodeID: "csi-a", MaxVolumes: 5})
	// A file that is not a socket is listed in `ignored`.
	if err := os.WriteFile(filepath.Join(a.PluginDir, "notes.txt"), []byte("not a plugin"), 0o600); err != nil {
		t.Fatal(err)
	}
	want := documentedKeys()

	var status map[string]any
	testutil.WaitFor(t, 30*time.Second, "plugin tp probed and notes.txt ignored in status", func() bool {
		out, err := execute(t, "--address", a.RPCAddr, "status", "--json")
		status = nil
		if err != nil || json.Unmarshal([]byte(out), &status) != nil {
			return false
		}
		plugins, _ := status["plugins"].([]any)
		ignored, _ := status["ignored"].([]any)
		if len(plugins) != 1 || len(ignored) != 1 {
			return false
		}
		_, probed := plugins[0].(map[string]any)["last_probe"].(string)
		return probed
	})
	checkKeys(t, "status", status, want["status"])
	p := status["plugins"].([]any)[0].(map[string]any)
	if p["id"] != "tp" || p["type"] != "monolith" || p["healthy"] != true || p["node_id"] != "csi-a" {
		t.Errorf("status plugin: %v", p)
	}
	if p["max_volumes"] != float64(5) {
		t.Errorf("max_volumes = %#v, want the number 5", p["max_volumes"])
	}
	for _, key := range []string{"last_probe", "registered_at", "health_since"} {
		if s, _ := p[key].(string); !rfc3339(s) {
			t.Errorf("%s = %#v, want an RFC 3339 time", key, p[key])
		}
	}
	for _, key := range []string{"plugin_capabilities", "controller_capabilities", "node_capabilities"} {
		if _, ok := p[key].([]any); !ok {
			t.Errorf("%s = %#v, want a list", key, p[key])
		}
	}
	for _, key := range []string{"manifest", "accessible_topology"} {
		if _, ok := p[key].(map[string]any); !ok {
			t.Errorf("%s = %#v, want an object", key, p[key])
		}
	}

	lines := watchEventLines(t, a.RPCAddr, nil, "plugin-registered", "plugin-healthy")
	for _, line := range lines {
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("events --json line %q: %v", line, err)
		}
		checkKeys(t, "events", e, want["events"])
		if s, _ := e["time"].(string); !rfc3339(s) {
			t.Errorf("event time = %#v, want an RFC 3339 time", e["time"])
		}
		// index is a uint64: a string in the proto3 JSON mapping.
		if s, _ := e["index"].(string); !regexp.MustCompile(`^[1-9][0-9]*$`).MatchString(s) {
			t.Errorf("event index = %#v, want a decimal string", e["index"])
		}
	}

	for _, line := range watchLines(t, c.WaitForLeader(t, 30*time.Second).RPCAddr, []string{"events", "--cluster", "--json"}, "node-registered") {
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("events --cluster --json line %q: %v", line, err)
		}
		checkKeys(t, "events --cluster", e, want["events --cluster"])
		if s, _ := e["time"].(string); !rfc3339(s) {
			t.Errorf("cluster event time = %#v, want an RFC 3339 time", e["time"])
		}
		if s, _ := e["index"].(string); !regexp.MustCompile(`^[1-9][0-9]*$`).MatchString(s) {
			t.Errorf("cluster event index = %#v, want a decimal string", e["index"])
		}
	}
}

// checkKeys fails the test for every key of want missing in doc. A path
// "x[]" names every element of the list x, which must have one at least.
func checkKeys(t *testing.T, command string, doc map[string]any, want map[string][]string) {
	t.Helper()
	for path, ks := range want {
		objects, where := []any{doc}, "the object"
		if list, ok := strings.CutSuffix(path, "[]"); ok {
			where = "an element of " + list
			objects, _ = doc[list].([]any)
			if len(objects) == 0 {
				t.Errorf("%s --json: %s is no list with elements: %v", command, list, doc[list])
			}
		}
		for _, o := range objects {
			m, _ := o.(map[string]any)
			for _, k := range ks {
				if _, ok := m[k]; !ok {
					t.Errorf("%s --json: %s has no %q: %v", command, where, k, o)
				}
			}
		}
	}
}

// watchEventLines runs `events --json --plugin tp` with the extra flags
// against the agent at addr until plugin tp's events of the given types
// have arrived, stops it, and returns every line it printed.
func watchEventLines(t *testing.T, addr string, flags []string, types ...string) []string {
	t.Helper()
	return watchLines(t, addr, append([]string{"events", "--json", "--plugin", "tp"}, flags...), types...)
}

// watchLines runs a following command (args, with --json) against addr
// until events of the given types have arrived, stops it, and returns
// every line it printed.
func watchLines(t *testing.T, addr string, args []string, types ...string) []string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out testutil.SyncBuffer
	root := newRootCommand()
	root.SetOut(&out)
	root.SetErr(io.Discard)
	root.SetArgs(append([]string{"--address", addr}, args...))
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	lines := func() []string { return strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") }
	testutil.WaitFor(t, 30*time.Second, strings.Join(args, " ")+": "+strings.Join(types, ", "), func() bool {
		seen := map[string]bool{}
		for _, line := range lines() {
			var e struct {
				Type string `json:"type"`
			}
			if json.Unmarshal([]byte(line), &e) == nil {
				seen[e.Type] = true
			}
		}
		for _, typ := range types {
			if !seen[typ] {
				return false
			}
		}
		return true
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v", strings.Join(args, " "), err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not stop within 10 s of its context's end", strings.Join(args, " "))
	}
	return lines()
}

func rfc3339(s string) bool {
	_, err := time.Parse(time.RFC3339Nano, s)
	return err == nil
}

// `events --index N` starts after event N: a stream that fell behind
// continues where it was told to, without a gap; the error that ends it
// names the command.
func TestEventsFromIndex(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 1, Agents: 1})
	a := c.Agent(0)
	a.StartPlugin("tp", testplugin.Config{})
	all := watchEventLines(t, a.RPCAddr, nil, "plugin-registered", "plugin-healthy")
	var first struct {
		Index string `json:"index"`
	}
	if err := json.Unmarshal([]byte(all[0]), &first); err != nil || first.Index == "" {
		t.Fatalf("first event %q: %v", all[0], err)
	}
	resumed := watchEventLines(t, a.RPCAddr, []string{"--index", first.Index}, "plugin-healthy")
	if !slices.Equal(resumed, all[1:]) {
		t.Errorf("events --index %s printed\n%s\nwant the events after it\n%s", first.Index,
			strings.Join(resumed, "\n"), strings.Join(all[1:], "\n"))
	}

	err := eventsError("127.0.0.1:4780", csisupdv1.NewEventsFellBehindError(41, 800, 768))
	if err == nil || !strings.Contains(err.Error(), "resume from index 41") || !strings.Contains(err.Error(), "csisupd events --index 41") {
		t.Errorf("fell-behind error %q does not name the index and the command", err)
	}
}

// volume snapshot list --json prints {"snapshots": [...]} with every key
// the README documents, every page of the listing in it, size_bytes a
// string (an int64), ready_to_use a bool (false too) and created_at an
// RFC 3339 time. Plugin "slow" reports its snapshots not ready to use for
// longer than the test runs.
func TestSnapshotListJSONContract(t *testing.T) {
	_, addr, _ := oneNodeClusterWith(t, map[string]testplugin.Config{
		"tp":   {NodeID: "csi-a"},
		"slow": {NodeID: "csi-a", SnapshotReadyAfter: 1 << 30},
	})
	for _, args := range [][]string{
		{"volume", "create", "data", "--plugin", "tp", "--capacity", "1GiB"},
		{"volume", "create", "logs", "--plugin", "slow", "--capacity", "2MiB"},
		{"volume", "snapshot", "create", "data", "s1"},
	} {
		if _, err := execute(t, append([]string{"--address", addr}, args...)...); err != nil {
			t.Fatalf("%s: %v", strings.Join(args, " "), err)
		}
	}
	out, err := execute(t, "--address", addr, "volume", "snapshot", "create", "logs", "s2")
	if err != nil || !strings.HasSuffix(out, ", 2 MiB, not ready to use yet)\n") {
		t.Fatalf("snapshot create of plugin slow: %v\n%s", err, out)
	}
	for _, pageSize := range []string{"0", "1"} {
		doc := mustJSON(t, "--address", addr, "volume", "snapshot", "list", "--page-size", pageSize)
		checkKeys(t, "volume snapshot list", doc, documentedKeys()["volume snapshot list"])
		snaps, _ := doc["snapshots"].([]any)
		if len(snaps) != 2 {
			t.Fatalf("--page-size %s: snapshots = %v, want both", pageSize, doc["snapshots"])
		}
		if _, ok := doc["next_token"]; ok {
			t.Errorf("--page-size %s: the listing of every page has a next_token: %v", pageSize, doc)
		}
		first, second := snaps[0].(map[string]any), snaps[1].(map[string]any)
		if ext, _ := first["external_id"].(string); first["id"] != "s1" || first["plugin_id"] != "tp" || first["source_volume_id"] != "data" ||
			!strings.HasPrefix(ext, "snap-") || first["size_bytes"] != "1073741824" || first["ready_to_use"] != true {
			t.Errorf("--page-size %s: first snapshot %v", pageSize, first)
		}
		for _, s := range []map[string]any{first, second} {
			if c, _ := s["created_at"].(string); !rfc3339(c) {
				t.Errorf("created_at = %#v, want an RFC 3339 time", s["created_at"])
			}
		}
		if second["id"] != "s2" || second["plugin_id"] != "slow" || second["size_bytes"] != "2097152" || second["ready_to_use"] != false {
			t.Errorf("--page-size %s: second snapshot %v, want s2 of plugin slow with ready_to_use false", pageSize, second)
		}
	}
	// A snapshot not ready to use yet is not restored.
	if _, err := execute(t, "--address", addr, "volume", "create", "warm", "--plugin", "slow", "--snapshot", "s2"); err == nil ||
		!strings.Contains(err.Error(), `snapshot "s2" is not ready to use yet`) {
		t.Errorf("restore of a snapshot not ready to use: %v", err)
	}
	// An empty listing is an empty list, not null.
	doc := mustJSON(t, "--address", addr, "volume", "snapshot", "list", "--volume", "none")
	if snaps, ok := doc["snapshots"].([]any); !ok || len(snaps) != 0 {
		t.Errorf("empty listing: snapshots = %#v, want []", doc["snapshots"])
	}
}
