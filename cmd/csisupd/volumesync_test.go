package main

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
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
