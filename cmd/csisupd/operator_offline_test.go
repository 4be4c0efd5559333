package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testcluster"
)

// agentDirOf returns an agent data_dir whose server directory is member
// m's data dir, as the agent lays it out.
func agentDirOf(t *testing.T, m *testcluster.Member) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Symlink(m.DataDir, filepath.Join(dir, "server")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestRecoverOfflinePeers reads the raft configuration of stopped
// servers, refuses a running one, and recovers a server with the
// peers.json the command printed.
func TestRecoverOfflinePeers(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 3})
	c.WaitForLeader(t, 30*time.Second)
	addr := c.Member(0).RPCAddr
	if _, err := execute(t, "--address", addr, "volume", "register", "keep", "--plugin", "tp", "--external-id", "ext-keep"); err != nil {
		t.Fatal(err)
	}
	m := c.Member(0)
	dir := agentDirOf(t, m)

	_, err := execute(t, "operator", "raft", "offline-peers", "--data-dir", dir, "--lock-timeout", "200ms")
	if err == nil || !strings.Contains(err.Error(), "a server is running on this data dir") || !strings.Contains(err.Error(), "stop the server first") || !strings.Contains(err.Error(), dir) {
		t.Fatalf("offline-peers of a running server: %v", err)
	}
	for i := range 3 {
		c.Stop(i)
	}

	out, err := execute(t, "operator", "raft", "offline-peers", "--data-dir", dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, mem := range c.Members() {
		if !strings.Contains(out, mem.ID) || !strings.Contains(out, mem.RaftAddr) {
			t.Fatalf("offline-peers output lacks %s at %s:\n%s", mem.ID, mem.RaftAddr, out)
		}
	}
	if !strings.Contains(out, "voter") || !strings.Contains(out, "last index") {
		t.Fatalf("offline-peers output:\n%s", out)
	}

	doc := mustJSON(t, "operator", "raft", "offline-peers", "--data-dir", dir)
	const stateKeys = "configuration_index,configuration_source,last_index,last_term,peers_file_pending,raft_dir,servers,snapshot_id"
	if keys(doc) != stateKeys {
		t.Fatalf("--json keys %s, want %s", keys(doc), stateKeys)
	}
	if servers, _ := doc["servers"].([]any); len(servers) != 3 || doc["last_index"].(float64) < 1 || doc["last_term"].(float64) < 1 {
		t.Fatalf("--json: %v", doc)
	}

	out, err = execute(t, "operator", "raft", "offline-peers", "--data-dir", dir, "--peers-json", "--keep", m.ID)
	if err != nil {
		t.Fatal(err)
	}
	var peers []map[string]any
	if err := json.Unmarshal([]byte(out), &peers); err != nil {
		t.Fatalf("--peers-json: %v\n%s", err, out)
	}
	if len(peers) != 1 || keys(peers[0]) != "address,id,non_voter" ||
		peers[0]["id"] != m.ID || peers[0]["address"] != m.RaftAddr || peers[0]["non_voter"] != false {
		t.Fatalf("--peers-json --keep %s: %v", m.ID, peers)
	}

	for _, bad := range []struct {
		args  []string
		want  string
		usage bool
	}{
		{[]string{"--data-dir", dir, "--peers-json", "--keep", "nobody"}, "nobody are not in the raft configuration", false},
		{[]string{"--data-dir", dir, "--keep", m.ID}, "--keep applies to --peers-json only", true},
		{[]string{}, "--data-dir is required", true},
		{[]string{"--data-dir", t.TempDir()}, "no raft store", false},
	} {
		_, err := execute(t, append([]string{"operator", "raft", "offline-peers"}, bad.args...)...)
		if err == nil || !strings.Contains(err.Error(), bad.want) || errors.As(err, new(usageError)) != bad.usage {
			t.Fatalf("offline-peers %v: %v, want %q (usage error: %v)", bad.args, err, bad.want, bad.usage)
		}
	}

	// The printed file recovers the server alone.
	peersFile := filepath.Join(m.DataDir, "raft", "peers.json")
	if err := os.WriteFile(peersFile, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	if doc := mustJSON(t, "operator", "raft", "offline-peers", "--data-dir", dir); doc["peers_file_pending"] != true {
		t.Fatalf("pending peers.json not reported: %v", doc)
	}
	c.Restart(0)
	if leader := c.WaitForLeader(t, 30*time.Second); leader.ID != m.ID {
		t.Fatalf("leader %s after recovery", leader.ID)
	}
	vol := mustJSON(t, "--address", addr, "volume", "status", "keep")
	if vol["external_id"] != "ext-keep" {
		t.Fatalf("volume after recovery: %v", vol)
	}
	peerDoc := mustJSON(t, "--address", addr, "operator", "raft", "list-peers")
	if ps, _ := peerDoc["peers"].([]any); len(ps) != 1 {
		t.Fatalf("peers after recovery: %v", peerDoc)
	}
}
