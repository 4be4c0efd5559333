package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// complete runs cobra's __complete command and returns the candidates and
// the directive line.
func complete(t *testing.T, args ...string) ([]string, string) {
	t.Helper()
	root := newRootCommand()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(append([]string{"__complete"}, args...))
	if err := root.Execute(); err != nil {
		t.Fatalf("__complete %s: %v", strings.Join(args, " "), err)
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	return lines[:len(lines)-1], lines[len(lines)-1]
}

// Every enum flag completes its values; a directive keeps the shell from
// offering file names instead.
func TestCompleteEnumFlags(t *testing.T) {
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"volume", "create", "v", "--access-mode", ""}, []string{"multi-node-multi-writer", "multi-node-reader-only", "multi-node-single-writer",
			"single-node-multi-writer", "single-node-reader-only", "single-node-single-writer", "single-node-writer"}},
		{[]string{"volume", "claim", "v", "--access-mode", ""}, []string{"multi-node-multi-writer", "multi-node-reader-only", "multi-node-single-writer",
			"single-node-multi-writer", "single-node-reader-only", "single-node-single-writer", "single-node-writer"}},
		{[]string{"volume", "create", "v", "--access-type", ""}, []string{"mount", "block"}},
		{[]string{"volume", "mount", "v", "--access-type", ""}, []string{"mount", "block"}},
		{[]string{"monitor", "--log-level", ""}, []string{"trace", "debug", "info", "warn", "error"}},
		{[]string{"plugin", "mounts", "ebs", "--format", ""}, []string{"podman", "docker", "systemd", "json"}},
		{[]string{"volume", "availability", "v", ""}, []string{"active", "pause", "drain"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			got, directive := complete(t, tt.args...)
			if !slices.Equal(got, tt.want) {
				t.Errorf("candidates %q, want %q", got, tt.want)
			}
			if directive != ":4" {
				t.Errorf("directive %q, want :4 (no file completion)", directive)
			}
		})
	}
}

// Ids complete through the API: volumes, snapshots, plugins and nodes,
// as arguments and as flags, filtered by what was typed.
func TestCompleteIDs(t *testing.T) {
	_, addr := oneNodeCluster(t)
	for _, args := range [][]string{
		{"volume", "create", "data", "--plugin", "tp", "--capacity", "1GiB"},
		{"volume", "create", "logs", "--plugin", "tp", "--capacity", "1GiB"},
		{"volume", "snapshot", "create", "data", "s1"},
	} {
		if _, err := execute(t, append([]string{"--address", addr}, args...)...); err != nil {
			t.Fatalf("%s: %v", strings.Join(args, " "), err)
		}
	}
	nodeDoc := mustJSON(t, "--address", addr, "node", "status")
	nodes, _ := nodeDoc["nodes"].([]any)
	if len(nodes) != 1 {
		t.Fatalf("node status: %v", nodeDoc)
	}
	n, _ := nodes[0].(map[string]any)
	nodeID, nodeName := n["id"].(string), n["name"].(string)
	if nodeID == "" || nodeName == "" {
		t.Fatalf("node %v has no id or name", n)
	}
	wantNodes := []string{nodeID, nodeName}
	slices.Sort(wantNodes)
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"volume", "status", ""}, []string{"data", "logs"}},
		{[]string{"volume", "status", "d"}, []string{"data"}},
		{[]string{"volume", "snapshot", "create", ""}, []string{"data", "logs"}},
		{[]string{"volume", "snapshot", "status", ""}, []string{"s1"}},
		{[]string{"volume", "snapshot", "list", "--volume", "l"}, []string{"logs"}},
		{[]string{"plugin", "status", ""}, []string{"tp"}},
		{[]string{"volume", "list", "--plugin", ""}, []string{"tp"}},
		{[]string{"node", "status", ""}, wantNodes},
		{[]string{"volume", "claim", "data", "--node", ""}, wantNodes},
		// A second argument is not an id to complete.
		{[]string{"volume", "status", "data", ""}, nil},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			got, directive := complete(t, append([]string{"--address", addr}, tt.args...)...)
			if !slices.Equal(got, tt.want) {
				t.Errorf("candidates %q, want %q", got, tt.want)
			}
			if directive != ":4" {
				t.Errorf("directive %q, want :4", directive)
			}
		})
	}
}

// With no server answering, an id completion offers nothing, prints no
// error, and gives up within about its timeout.
func TestCompleteIDsFailsQuietly(t *testing.T) {
	addr := testutil.FreeAddr(t)
	start := time.Now()
	got, directive := complete(t, "--address", addr, "volume", "status", "")
	if len(got) != 0 || directive != ":4" {
		t.Errorf("candidates %q, directive %q; want none, :4", got, directive)
	}
	if d := time.Since(start); d > completionTimeout+2*time.Second {
		t.Errorf("completion took %s", d)
	}
}
