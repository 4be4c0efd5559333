package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testutil"
)

// TestMountUsage: no usage flag leaves the volume's default (nil); the
// flags given make the usage, of access type mount unless block.
func TestMountUsage(t *testing.T) {
	tests := []struct {
		mode, typ string
		readOnly  bool
		want      *csisupdv1.VolumeUsage
	}{
		{"", "", false, nil},
		{"", "mount", false, &csisupdv1.VolumeUsage{AccessType: "mount"}},
		{"", "block", false, &csisupdv1.VolumeUsage{AccessType: "block"}},
		{"", "", true, &csisupdv1.VolumeUsage{AccessType: "mount", ReadOnly: true}},
		{"multi-node-reader-only", "", true, &csisupdv1.VolumeUsage{AccessType: "mount", AccessMode: "MULTI_NODE_READER_ONLY", ReadOnly: true}},
		{"single-node-writer", "block", false, &csisupdv1.VolumeUsage{AccessType: "block", AccessMode: "SINGLE_NODE_WRITER"}},
	}
	for _, tt := range tests {
		got, err := mountUsage(tt.mode, tt.typ, tt.readOnly)
		if err != nil || !proto.Equal(got, tt.want) || (got == nil) != (tt.want == nil) {
			t.Errorf("mountUsage(%q, %q, %v) = %v, %v; want %v", tt.mode, tt.typ, tt.readOnly, got, err, tt.want)
		}
	}
}

// TestMountUsageErrors: mistakes in how volume mount and unmount are
// called are usage errors naming the flag, found before any agent is
// dialled; a --link path that holds a file is refused before the claim.
func TestMountUsageErrors(t *testing.T) {
	addr := testutil.FreeAddr(t) // nothing listens: no test may reach an agent
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args  []string
		usage bool
		want  string
	}{
		{[]string{"volume", "mount", "v"}, true, "--workload"},
		{[]string{"volume", "mount", "v", "--workload", "w", "--lease", "1s"}, true, "--lease"},
		{[]string{"volume", "mount", "v", "--workload", "w", "--lease", "25h"}, true, "--lease"},
		{[]string{"volume", "mount", "v", "--workload", "w", "--access-type", "file"}, true, "--access-type"},
		{[]string{"volume", "mount", "v", "--workload", "w", "--access-mode", "writer"}, true, "--access-mode"},
		{[]string{"volume", "mount", "v", "w"}, true, "received 2"},
		{[]string{"volume", "mount", "v", "--workload", "w", "--link", file}, false, "is a regular file, not a symbolic link: refusing to replace it"},
		{[]string{"volume", "unmount", "v"}, true, "--workload"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, err := execute(t, append([]string{"--address", addr}, tt.args...)...)
			if err == nil || errors.As(err, new(usageError)) != tt.usage || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want a usage error %v naming %q", err, tt.usage, tt.want)
			}
		})
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "data" {
		t.Fatalf("the file at --link: %q, %v; want it untouched", b, err)
	}
}

// TestLinks makes, replaces and removes --link symbolic links: parents
// are made, a link is replaced, and a directory or a file is never
// replaced nor removed.
func TestLinks(t *testing.T) {
	dir := t.TempDir()
	link := filepath.Join(dir, "run", "volumes", "data")
	if err := replaceLink(link, "/mnt/one"); err != nil {
		t.Fatal(err)
	}
	wantLink := func(target string) {
		t.Helper()
		got, err := os.Readlink(link)
		if err != nil || got != target {
			t.Fatalf("link %s -> %q, %v; want -> %s", link, got, err, target)
		}
	}
	wantLink("/mnt/one")
	if info, err := os.Stat(filepath.Dir(link)); err != nil || info.Mode().Perm() != 0o755 {
		t.Fatalf("the link's directory: %v, %v; want mode 0755", info, err)
	}
	if err := replaceLink(link, "/mnt/two"); err != nil {
		t.Fatal(err)
	}
	wantLink("/mnt/two")
	if entries, _ := os.ReadDir(filepath.Dir(link)); len(entries) != 1 {
		t.Fatalf("the link's directory holds %v, want the link alone", entries)
	}
	if err := removeLink(link); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(link); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the link after removeLink: %v", err)
	}
	if err := removeLink(link); err != nil {
		t.Fatalf("removeLink of a missing link: %v", err)
	}

	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{replaceLink(sub, "/mnt/one"), removeLink(sub)} {
		if err == nil || !strings.Contains(err.Error(), sub) || !strings.Contains(err.Error(), "a directory") {
			t.Errorf("a directory at the link's path: %v, want an error naming it", err)
		}
	}
	if info, err := os.Lstat(sub); err != nil || !info.IsDir() {
		t.Fatalf("the directory at the link's path: %v, %v; want it untouched", info, err)
	}
	if err := replaceLink(link, ""); err == nil {
		t.Error("a link to an empty host path was made")
	}
}

// TestVolumeMountCommands mounts a volume through the local agent (the
// client agent's address, not the server's) with a link, mounts it again
// (the same claim), shows it in volume status with its owner and lease,
// and unmounts it, removing the link.
func TestVolumeMountCommands(t *testing.T) {
	c, addr := oneNodeCluster(t)
	a := c.Agent(0)
	run := runAt(t, addr)
	run("volume", "create", "data", "--plugin", "tp", "--capacity", "1MiB")
	link := filepath.Join(t.TempDir(), "volumes", "data")

	out, err := execute(t, "--address", a.RPCAddr, "volume", "mount", "data", "--workload", "job-1", "--link", link)
	if err != nil {
		t.Fatalf("volume mount: %v", err)
	}
	hostPath := strings.TrimSpace(out)
	if !filepath.IsAbs(hostPath) || strings.Contains(hostPath, "\n") {
		t.Fatalf("volume mount printed %q, want the host path alone", out)
	}
	if got, err := os.Readlink(link); err != nil || got != hostPath {
		t.Fatalf("link %s -> %q, %v; want -> %s", link, got, err, hostPath)
	}
	claim := mustJSON(t, "--address", a.RPCAddr, "volume", "mount", "data", "--workload", "job-1", "--link", link)
	if claim["host_path"] != hostPath || claim["owner"] != defaultMountOwner || claim["lease_ttl"] != "30s" || claim["state"] != "taken" {
		t.Fatalf("volume mount again --json: %v, want the same claim at %s, owner %s, lease 30s", claim, hostPath, defaultMountOwner)
	}
	vol := mustJSON(t, "--address", addr, "volume", "status", "data")
	if claims := vol["claims"].([]any); len(claims) != 1 || claims[0].(map[string]any)["workload_id"] != "job-1" {
		t.Fatalf("claims after mounting twice: %v, want one of job-1", claims)
	}

	out = runAt(t, a.RPCAddr)("volume", "unmount", "data", "--workload", "job-1", "--link", link)
	if !strings.Contains(out, "Released volume data of workload job-1") {
		t.Fatalf("volume unmount: %q", out)
	}
	if _, err := os.Lstat(link); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the link after unmount: %v, want it removed", err)
	}
	vol = mustJSON(t, "--address", addr, "volume", "status", "data")
	if claims := vol["claims"].([]any); len(claims) != 0 {
		t.Fatalf("claims after unmount: %v", claims)
	}
	// Unmounting again finds nothing to release: success.
	runAt(t, a.RPCAddr)("volume", "unmount", "data", "--workload", "job-1", "--link", link)
}
