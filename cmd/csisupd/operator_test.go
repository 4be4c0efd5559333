package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

func TestRaftPeersAndSnapshots(t *testing.T) {
	c, addr := oneNodeCluster(t)
	peers := mustJSON(t, "--address", addr, "operator", "raft", "list-peers")
	ps := peers["peers"].([]any)
	if len(ps) != 1 {
		t.Fatalf("peers: %v", ps)
	}
	p := ps[0].(map[string]any)
	if p["id"] != c.Member(0).ID || p["rpc_address"] != addr || p["suffrage"] != "voter" || p["leader"] != true {
		t.Fatalf("peer: %v", p)
	}
	// The leader's autopilot has judged itself healthy by now (or soon):
	// the health fields are filled in, in the JSON and in the table.
	testutil.WaitFor(t, 10*time.Second, "the leader judged healthy by autopilot", func() bool {
		p := mustJSON(t, "--address", addr, "operator", "raft", "list-peers")["peers"].([]any)[0].(map[string]any)
		return p["healthy"] == true && p["stable_since"] != nil && p["last_contact_ms"] == "0" &&
			p["last_index"] != "0" && p["last_term"] != "0"
	})
	table, err := execute(t, "--address", addr, "operator", "raft", "list-peers")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "ID RAFT ADDRESS RPC ADDRESS SUFFRAGE LEADER HEALTHY STABLE SINCE LAST CONTACT LAST INDEX LAST TERM" {
		t.Fatalf("list-peers table:\n%s", table)
	}
	if f := strings.Fields(lines[1]); len(f) < 8 || f[3] != "voter" || f[4] != "true" || f[5] != "true" {
		t.Fatalf("list-peers row: %q", lines[1])
	}
	if _, err := execute(t, "--address", addr, "operator", "raft", "remove-peer", "no-such-server"); err == nil ||
		!strings.Contains(err.Error(), "not in the raft configuration") {
		t.Fatalf("remove-peer of an unknown server: %v", err)
	}

	// Save with one volume, delete it, restore: it is back.
	if _, err := execute(t, "--address", addr, "volume", "register", "keep", "--plugin", "tp", "--external-id", "ext-keep"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "state.snap")
	saved := mustJSON(t, "--address", addr, "operator", "snapshot", "save", file)
	info, err := os.Stat(file)
	// bytes is an int64: a string in the proto3 JSON mapping.
	if err != nil || info.Size() == 0 || saved["file"] != file || saved["bytes"] != strconv.FormatInt(info.Size(), 10) {
		t.Fatalf("snapshot file: %v, %v; reported %v", info, err, saved)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("snapshot save left temporary files: %v", entries)
	}
	if _, err := execute(t, "--address", addr, "volume", "delete", "keep", "--deregister-only"); err != nil {
		t.Fatal(err)
	}
	restored := mustJSON(t, "--address", addr, "operator", "snapshot", "restore", file)
	// restore prints SnapshotRestoreResponse: the raft index, a uint64, as a string.
	s, _ := restored["index"].(string)
	if idx, err := strconv.ParseUint(s, 10, 64); err != nil || idx == 0 || len(restored) != 1 {
		t.Fatalf("restore: %v", restored)
	}
	vol := mustJSON(t, "--address", addr, "volume", "status", "keep")
	if vol["external_id"] != "ext-keep" {
		t.Fatalf("volume after restore: %v", vol)
	}

	bad := filepath.Join(dir, "bad.snap")
	if err := os.WriteFile(bad, []byte("not a snapshot"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := execute(t, "--address", addr, "operator", "snapshot", "restore", bad); err == nil ||
		!strings.Contains(err.Error(), "not a csisupd snapshot") {
		t.Fatalf("restore of a bad file: %v", err)
	}
	if _, err := execute(t, "--address", addr, "operator", "snapshot", "restore", filepath.Join(dir, "missing")); err == nil ||
		!strings.Contains(err.Error(), "snapshot file") {
		t.Fatalf("restore of a missing file: %v", err)
	}
}
