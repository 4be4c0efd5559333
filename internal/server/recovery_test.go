package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/server/raftnode"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testutil"
)

// recoveryConfig is a server config for member m's id, addresses and data
// dir, started outside the test cluster so that a refused start can be
// seen as New's error.
func recoveryConfig(m *testcluster.Member) server.Config {
	join := config.DefaultRetry().ServerJoin
	join.Base, join.Cap = join.Base/20, join.Cap/20
	settings := config.DefaultServerSettings()
	settings.BootstrapExpect, settings.RaftMultiplier = 1, 2
	settings.RPCTimeout, settings.ApplyTimeout = 2*time.Second, 5*time.Second
	return server.Config{
		ServerSettings: settings,
		ID:             m.ID, DataDir: m.DataDir, RaftAddr: m.RaftAddr, RPCAddr: m.RPCAddr,
		Join: join, Connect: config.DefaultRetry().ServerConnect,
	}
}

// registerVol registers volume id through member i.
func registerVol(t *testing.T, c *testcluster.Cluster, i int, id string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Control(i).RegisterVolume(ctx, &csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{
		Id: id, PluginId: "p1", ExternalId: "ext-" + id,
	}}); err != nil {
		t.Fatalf("register %s: %v", id, err)
	}
}

func writePeersFile(t *testing.T, dataDir, content string) string {
	t.Helper()
	path := filepath.Join(raftnode.RaftDir(dataDir), raftnode.PeersFileName)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestRecoverFromBogusVoter adds a voter that does not exist to a
// one-server cluster, which loses its quorum for good; the offline read
// of the stopped server shows both voters, a peers.json made from it
// with only the real server brings the cluster back with its state, and
// the file is gone afterwards.
func TestRecoverFromBogusVoter(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 1})
	m := c.WaitForLeader(t, 30*time.Second)
	registerVol(t, c, 0, "before-snapshot")
	if err := m.Server().Raft().Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	registerVol(t, c, 0, "after-snapshot")

	// The change is never committed (the bogus voter never answers); the
	// leader steps down when it cannot reach a quorum.
	go m.Server().Raft().AddVoter("bogus", "127.0.0.1:9", 0, 0)
	testutil.WaitFor(t, 30*time.Second, "the leader to step down", func() bool { return !m.Server().IsLeader() })

	if _, err := raftnode.ReadOfflineRaftState(m.DataDir, 200*time.Millisecond); !errors.Is(err, raftnode.ErrServerRunning) {
		t.Fatalf("offline read of a running server: %v, want ErrServerRunning", err)
	}
	c.Kill(0)

	st, err := raftnode.ReadOfflineRaftState(m.DataDir, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Servers) != 2 || st.ConfigurationSource != "log" || st.SnapshotID == "" || st.LastIndex < st.ConfigurationIndex || st.LastTerm == 0 {
		t.Fatalf("offline state: %+v", st)
	}
	got := map[string]raftnode.OfflinePeer{}
	for _, p := range st.Servers {
		got[p.ID] = p
	}
	if got[m.ID].Address != m.RaftAddr || got[m.ID].Suffrage != "voter" || got["bogus"].Address != "127.0.0.1:9" || got["bogus"].Suffrage != "voter" {
		t.Fatalf("offline servers: %+v", st.Servers)
	}
	peers, err := st.PeersFile([]string{m.ID})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.PeersFile([]string{"nobody"}); err == nil || !strings.Contains(err.Error(), "nobody") {
		t.Fatalf("PeersFile of an unknown id: %v", err)
	}
	data, err := json.Marshal(peers)
	if err != nil {
		t.Fatal(err)
	}
	path := writePeersFile(t, m.DataDir, string(data))

	c.Restart(0)
	if leader := c.WaitForLeader(t, 30*time.Second); leader.ID != m.ID {
		t.Fatalf("leader %s", leader.ID)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("peers.json after a successful recovery: %v", err)
	}
	conf, err := m.Server().Configuration()
	if err != nil {
		t.Fatal(err)
	}
	if len(conf.Servers) != 1 || conf.Servers[0].ID != raft.ServerID(m.ID) || conf.Servers[0].Suffrage != raft.Voter {
		t.Fatalf("configuration after recovery: %+v", conf.Servers)
	}
	for _, id := range []string{"before-snapshot", "after-snapshot"} {
		if v := m.Server().State().Volume(id); v == nil || v.GetExternalId() != "ext-"+id {
			t.Fatalf("volume %s after recovery: %v", id, v)
		}
	}
	// The recovered cluster takes writes again.
	registerVol(t, c, 0, "after-recovery")
}

// TestRecoverRefusesBadPeersFile starts a stopped server with broken
// peers.json files: each start fails with an error naming the file and
// the fault, and the file is kept.
func TestRecoverRefusesBadPeersFile(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 1})
	m := c.WaitForLeader(t, 30*time.Second)
	registerVol(t, c, 0, "v1")
	c.Stop(0)

	self := func(extra string) string {
		return `[{"id": "` + m.ID + `", "address": "` + m.RaftAddr + `", "non_voter": false}` + extra + `]`
	}
	cases := []struct{ name, content, want string }{
		{"not json", `{"id": `, "not a JSON array"},
		{"empty", `[]`, "lists no servers"},
		{"old format", `["` + m.RaftAddr + `"]`, "entry 1 is not an object"},
		{"unknown field", `[{"id": "` + m.ID + `", "address": "` + m.RaftAddr + `", "nonvoter": true}]`, `entry 1: json: unknown field "nonvoter"`},
		{"empty id", self(`, {"id": "", "address": "127.0.0.1:2"}`), "entry 2 has an empty id"},
		{"bad address", self(`, {"id": "b", "address": "127.0.0.1"}`), `entry 2 (id "b"): address "127.0.0.1"`},
		{"bad port", self(`, {"id": "b", "address": "127.0.0.1:http"}`), `entry 2 (id "b"): address "127.0.0.1:http": port`},
		{"duplicate id", self(`, {"id": "` + m.ID + `", "address": "127.0.0.1:2"}`), `entry 2: id "` + m.ID + `" is also the id of entry 1`},
		{"duplicate address", self(`, {"id": "b", "address": "` + m.RaftAddr + `"}`), "is also the address of entry 1"},
		{"no voter", `[{"id": "` + m.ID + `", "address": "` + m.RaftAddr + `", "non_voter": true}]`, "lists no voter"},
		{"not this server", `[{"id": "other", "address": "127.0.0.1:2"}]`, `does not list this server (id "` + m.ID + `")`},
		{"wrong own address", `[{"id": "` + m.ID + `", "address": "127.0.0.1:2"}]`, "advertises raft address " + m.RaftAddr},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := writePeersFile(t, m.DataDir, tc.content)
			s, err := server.New(recoveryConfig(m), nil)
			if err == nil {
				s.Shutdown(context.Background())
				t.Fatal("server started with a bad peers.json")
			}
			if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want the file %s and %q", err, path, tc.want)
			}
			if _, err := os.Stat(path); err != nil {
				t.Fatalf("bad peers.json not kept: %v", err)
			}
		})
	}
	os.Remove(filepath.Join(raftnode.RaftDir(m.DataDir), raftnode.PeersFileName))

	// A server without raft state has nothing to recover.
	ports := testutil.FreePorts(t, 2)
	fresh := &testcluster.Member{ID: "fresh", DataDir: t.TempDir(),
		RPCAddr: fmt.Sprintf("127.0.0.1:%d", ports[0]), RaftAddr: fmt.Sprintf("127.0.0.1:%d", ports[1])}
	if err := os.MkdirAll(raftnode.RaftDir(fresh.DataDir), 0o700); err != nil {
		t.Fatal(err)
	}
	path := writePeersFile(t, fresh.DataDir, `[{"id": "`+fresh.ID+`", "address": "`+fresh.RaftAddr+`"}]`)
	if s, err := server.New(recoveryConfig(fresh), nil); err == nil {
		s.Shutdown(context.Background())
		t.Fatal("server without raft state started with a peers.json")
	} else if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "no initial state") {
		t.Fatalf("error %q", err)
	}

	// The first server, its file removed, starts with its state.
	c.Restart(0)
	testutil.WaitFor(t, 30*time.Second, "v1 after the refused starts", func() bool {
		return m.Server().State().Volume("v1") != nil
	})
}
