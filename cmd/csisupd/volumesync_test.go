package main

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testutil"
)

// TestReadWorkloadsFrom reads --workloads-from files and stdin: blank
// lines and comments skipped, lines trimmed, and a bad id refused with the
// file and the line named.
func TestReadWorkloadsFrom(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", "# live allocations\nalloc-1\n\n  alloc-2  \n#alloc-3\nalloc.4")
	bad := write("bad", "alloc-1\n\n# next is bad\na/b\n")
	long := write("long", "alloc-1\n"+strings.Repeat("x", 70<<10)+"\n")
	tests := []struct {
		name, file, stdin string
		want              []string
		err               string
	}{
		{"a file", good, "", []string{"alloc-1", "alloc-2", "alloc.4"}, ""},
		{"stdin", "-", "w1\r\nw2\n", []string{"w1", "w2"}, ""},
		{"empty stdin: no live workload", "-", "", nil, ""},
		{"a bad id names the file and line", bad, "", nil, bad + `:4: workload id "a/b"`},
		{"a bad id on stdin", "-", "ok\n..\n", nil, `stdin:2: workload id ".."`},
		{"a missing file", filepath.Join(dir, "nope"), "", nil, "no such file"},
		{"a line too long", long, "", nil, long + ":2: line too long"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := readWorkloadsFrom(tt.file, strings.NewReader(tt.stdin))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want it to contain %q", err, tt.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) {
				t.Fatalf("read %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

// TestVolumeSyncAndCheckUsageErrors checks the flags of volume sync and
// volume check: each mistake is a usage error (exit code 2), found before
// any server is called (the address refuses connections).
func TestVolumeSyncAndCheckUsageErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "workloads")
	if err := os.WriteFile(bad, []byte("w1\nnot ok\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const addr = "127.0.0.1:1"
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"volume", "sync", "--owner", "nomad"}, "--node"},
		{[]string{"volume", "sync", "--node", "n1"}, "--owner"},
		{[]string{"volume", "sync", "--node", "n1", "--owner", "my scheduler"}, `--owner "my scheduler"`},
		{[]string{"volume", "sync", "--node", "n1", "--owner", "nomad", "--workload", "a/b"}, `--workload "a/b"`},
		{[]string{"volume", "sync", "--node", "n1", "--owner", "nomad", "--workloads-from", bad}, bad + `:2: workload id "not ok"`},
		{[]string{"volume", "sync", "--node", "n1", "--owner", "nomad", "--known-index", "-1"}, "known-index"},
		{[]string{"volume", "sync", "extra", "--node", "n1", "--owner", "nomad"}, ""},
		{[]string{"volume", "check"}, ""},
		{[]string{"volume", "check", "v", "--access-mode", "sometimes"}, `--access-mode "sometimes"`},
		{[]string{"volume", "check", "v", "--node"}, "--node"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, err := execute(t, append([]string{"--address", addr}, tt.args...)...)
			if !errors.As(err, new(usageError)) {
				t.Fatalf("error %v, want a usage error", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want it to name %q", err, tt.want)
			}
			if got := run(append([]string{"--address", addr}, tt.args...)); got != exitUsage {
				t.Errorf("exit code %d, want %d", got, exitUsage)
			}
		})
	}
}

// TestCheckUsage checks the usage volume check asks about.
func TestCheckUsage(t *testing.T) {
	if u, err := checkUsage("", false, false); u != nil || err != nil {
		t.Errorf("no flags: %v, %v; want the volume's default (nil)", u, err)
	}
	u, err := checkUsage("multi-node-reader-only", true, true)
	if err != nil || u.GetAccessMode() != "MULTI_NODE_READER_ONLY" || !u.GetReadOnly() || u.GetAccessType() != "block" {
		t.Errorf("every flag: %v, %v", u, err)
	}
	if u, err := checkUsage("", true, false); err != nil || u.GetAccessMode() != "" || u.GetAccessType() != "mount" || !u.GetReadOnly() {
		t.Errorf("--read-only: %v, %v; want a read-only mount usage with the volume's access mode", u, err)
	}
}

// TestVolumeSyncAndCheck runs both commands against a real cluster: the
// check finds the node ok, then refuses a second writer; a sync that
// reads its live list from stdin releases the owner's claim it leaves
// out, and keeps one taken after its known index.
func TestVolumeSyncAndCheck(t *testing.T) {
	c, addr := oneNodeCluster(t)
	a := c.Agent(0)
	run := runAt(t, addr)
	run("volume", "create", "data", "--plugin", "tp", "--capacity", "1MiB")
	run("volume", "create", "more", "--plugin", "tp", "--capacity", "1MiB", "--access-mode", "multi-node-multi-writer")

	if out := run("volume", "check", "data"); !strings.Contains(out, a.Name) || !strings.Contains(out, a.NodeID()) || !strings.Contains(out, " ok ") {
		t.Fatalf("check of a free volume: %q", out)
	}
	ctx := context.Background()
	cl := c.Control(0)
	claim := func(vol, workload string) uint64 {
		t.Helper()
		resp, err := cl.ClaimVolume(ctx, &csisupdv1.VolumeClaimRequest{Id: vol, NodeId: a.NodeID(), WorkloadId: workload, Owner: "sched"})
		if err != nil {
			t.Fatalf("claim %s for %s: %v", vol, workload, err)
		}
		return resp.GetClaim().GetClaimIndex()
	}
	known := claim("data", "gone")
	claim("more", "late")
	out := run("volume", "check", "data", "--node", a.Name)
	if !strings.Contains(out, "refused") || !strings.Contains(out, "access-mode: ") {
		t.Fatalf("check of a second writer: %q", out)
	}
	check := mustJSON(t, "--address", addr, "volume", "check", "data")
	if nodes, _ := check["nodes"].([]any); len(nodes) != 1 || keys(nodes[0]) != "message,node_id,node_name,ok,rule" ||
		nodes[0].(map[string]any)["ok"] != false || nodes[0].(map[string]any)["rule"] != "access-mode" {
		t.Fatalf("check --json: %v, want one node refused by access-mode", check)
	}

	root := newRootCommand()
	var buf strings.Builder
	root.SetOut(&buf)
	root.SetErr(io.Discard)
	root.SetIn(strings.NewReader("# nothing of sched is alive\n\n"))
	root.SetArgs([]string{"--address", addr, "volume", "sync", "--node", a.Name, "--owner", "sched", "--workloads-from", "-",
		"--known-index", strconv.FormatUint(known, 10)})
	if err := root.Execute(); err != nil {
		t.Fatalf("sync: %v", err)
	}
	if out := buf.String(); !strings.Contains(out, "data") || !strings.Contains(out, "releasing (not in sync)") ||
		!strings.Contains(out, "more") || !strings.Contains(out, "kept (taken after the known index)") {
		t.Fatalf("sync: %q", out)
	}
	testutil.WaitFor(t, 30*time.Second, "the synced claim freed", func() bool {
		resp, err := cl.GetVolume(ctx, &csisupdv1.VolumeGetRequest{Id: "data"})
		return err == nil && len(resp.GetVolume().GetClaims()) == 0
	})
	sync := mustJSON(t, "--address", addr, "volume", "sync", "--node", a.NodeID(), "--owner", "sched", "--known-index", strconv.FormatUint(known, 10))
	if released, _ := sync["released"].([]any); keys(sync) != "kept_by_index,released" || len(released) != 0 || len(sync["kept_by_index"].([]any)) != 1 {
		t.Fatalf("sync --json once in sync: %v, want none released and one kept by index", sync)
	}
}
