package nodevolumes

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// copyRecords copies the files of from's records directory (the journal)
// into to's records directory: the data directory an agent killed at this moment would
// leave.
func copyRecords(t *testing.T, from, to string) {
	t.Helper()
	src := filepath.Join(from, RecordsDir)
	dst := filepath.Join(to, RecordsDir)
	if err := os.MkdirAll(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, en := range entries {
		b, err := os.ReadFile(filepath.Join(src, en.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, en.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func waitRecovered(t *testing.T, m *Manager) {
	t.Helper()
	select {
	case <-m.Recovered():
	case <-time.After(waitTime):
		t.Fatal("the startup recovery did not finish")
	}
}

// An agent that stopped while a mount was staging or publishing undoes the
// mount when it starts again: nothing stays staged, no record stays. The
// record says staging during the publish too: the publish after a stage is
// recorded only once it is done, and the undo of a staging record
// unpublishes as well.
func TestRestartUndoesUnfinishedMount(t *testing.T) {
	for _, tc := range []struct{ method, state string }{
		{"NodeStageVolume", StateStaging},
		{"NodePublishVolume", StateStaging},
	} {
		t.Run(tc.method, func(t *testing.T) {
			e := newEnv(t, Config{}, false)
			e.plug.SetFaults(testplugin.Faults{Delays: map[string]time.Duration{tc.method: time.Minute}})
			mounted := make(chan error, 1)
			go func() {
				_, err := e.m.Mount(context.Background(), mountReq("v1", "w1"))
				mounted <- err
			}()
			testutil.WaitFor(t, waitTime, tc.method+" in flight", func() bool { return e.plug.Stats().InFlight[tc.method] == 1 })
			if rec, ok := e.readRecord(t, "tp", "v1", "w1", defaultKey); !ok || rec.State != tc.state {
				t.Fatalf("record during %s = %+v, %t; want state %s", tc.method, rec, ok, tc.state)
			}
			// The data directory as a crash now would leave it.
			crashed := filepath.Join(e.dir, "crashed")
			copyRecords(t, e.dataDir, crashed)
			if tc.method == "NodePublishVolume" {
				if n, ok := e.plug.node(t, "v1"); !ok || n.StagingPath == "" {
					t.Fatalf("the plugin did not stage before the publish: %+v", n)
				}
			}
			// The plugin dies too; the first manager gives up.
			e.plug.Kill()
			select {
			case err := <-mounted:
				if err == nil {
					t.Fatal("Mount succeeded with the plugin killed")
				}
			case <-time.After(waitTime):
				t.Fatal("Mount did not return after the plugin was killed")
			}
			e.plug.SetFaults(testplugin.Faults{})
			if err := e.plug.Start(); err != nil {
				t.Fatal(err)
			}
			e.plug.ResetStats()

			m2 := e.manager(t, Config{DataDir: crashed}, true)
			waitRecovered(t, m2)
			if _, ok := e.plug.node(t, "v1"); ok {
				t.Error("the volume is still staged or published after the restart")
			}
			if got := e.plug.calls("NodeUnstageVolume"); got != 1 {
				t.Errorf("NodeUnstageVolume calls = %d, want 1", got)
			}
			if got := m2.List("", ""); len(got) != 0 {
				t.Errorf("mounts after the restart = %v, want none", got)
			}
			if recs := readRecords(t, crashed); len(recs) != 0 {
				t.Errorf("records after the restart: %v", recs)
			}
		})
	}
}

// An agent that stopped while an unmount was unpublishing finishes it when
// it starts again, retrying while the plugin is not back, without holding
// up other plugins' volumes.
func TestRestartFinishesUnpublishing(t *testing.T) {
	e := newEnv(t, Config{}, false)
	other := startPlugin(t, e.dir, "tp2", testplugin.TypeNode)
	e.plugins.set(nodeModel("tp2"), other.client)
	ctx := context.Background()
	if _, err := e.m.Mount(ctx, mountReq("v1", "w1")); err != nil {
		t.Fatal(err)
	}
	e.plug.Kill()
	if _, err := e.m.Unmount(ctx, unmountReq("v1", "w1")); status.Code(err) != codes.Unavailable {
		t.Fatalf("Unmount with the plugin killed: %v, want Unavailable", err)
	}
	rec, ok := e.readRecord(t, "tp", "v1", "w1", defaultKey)
	if !ok || rec.State != StateUnpublishing || !strings.Contains(rec.Error, "unpublishing failed") {
		t.Fatalf("record after the failed unmount = %+v, %t; want state unpublishing with the error", rec, ok)
	}
	// The agent restarts before the plugin is registered again.
	e.plugins.remove("tp")
	if err := e.plug.Start(); err != nil {
		t.Fatal(err)
	}
	m2 := e.manager(t, Config{}, true)
	testutil.WaitFor(t, waitTime, "a failed recovery attempt", func() bool {
		return strings.Contains(e.logs.String(), "cannot finish an unfinished mount step yet")
	})
	select {
	case <-m2.Recovered():
		t.Fatal("recovered while the plugin is missing")
	default:
	}
	if _, err := m2.Mount(ctx, &csisupdv1.MountVolumeRequest{PluginId: "tp2", VolumeId: "v2", WorkloadId: "w1"}); err != nil {
		t.Fatalf("Mount of another plugin's volume during the recovery: %v", err)
	}
	e.plugins.set(nodeModel("tp"), e.plug.client)
	waitRecovered(t, m2)
	if _, ok := e.plug.node(t, "v1"); ok {
		t.Error("the volume is still staged or published after the recovery")
	}
	if got := m2.List("tp", ""); len(got) != 0 {
		t.Errorf("tp mounts after the recovery = %v, want none", got)
	}
	if got := m2.List("tp2", ""); len(got) != 1 || got[0].GetState() != StatePublished {
		t.Errorf("tp2 mounts = %v, want v2 published", got)
	}
}

// An unmount that failed while unstaging is finished by the next agent.
func TestRestartFinishesUnstaging(t *testing.T) {
	e := newEnv(t, Config{}, false)
	ctx := context.Background()
	if _, err := e.m.Mount(ctx, mountReq("v1", "w1")); err != nil {
		t.Fatal(err)
	}
	e.plug.SetFaults(testplugin.Faults{Errors: map[string]codes.Code{"NodeUnstageVolume": codes.Internal}})
	if _, err := e.m.Unmount(ctx, unmountReq("v1", "w1")); status.Code(err) != codes.Internal {
		t.Fatalf("Unmount: %v, want Internal", err)
	}
	if rec, ok := e.readRecord(t, "tp", "v1", "w1", defaultKey); !ok || rec.State != StateUnstaging {
		t.Fatalf("record = %+v, %t; want state unstaging", rec, ok)
	}
	if n, ok := e.plug.node(t, "v1"); !ok || len(n.Targets) != 0 || n.StagingPath == "" {
		t.Fatalf("plugin node record = %+v, %t; want staged and unpublished", n, ok)
	}
	e.plug.SetFaults(testplugin.Faults{})
	m2 := e.manager(t, Config{}, true)
	waitRecovered(t, m2)
	if _, ok := e.plug.node(t, "v1"); ok {
		t.Error("the volume is still staged after the restart")
	}
	if e.plug.calls("NodeUnpublishVolume") != 1 {
		t.Errorf("NodeUnpublishVolume calls = %d: the finished unpublish was repeated", e.plug.calls("NodeUnpublishVolume"))
	}
	if files := e.diskRecords(t); len(files) != 0 {
		t.Errorf("records left: %v", files)
	}
}

// A published mount survives a restart unchanged.
func TestRestartKeepsPublishedMounts(t *testing.T) {
	e := newEnv(t, Config{}, false)
	mnt, err := e.m.Mount(context.Background(), mountReq("v1", "w1"))
	if err != nil {
		t.Fatal(err)
	}
	m2 := e.manager(t, Config{}, true)
	waitRecovered(t, m2)
	got := m2.List("", "")
	if len(got) != 1 || got[0].GetHostPath() != mnt.GetHostPath() || got[0].GetState() != StatePublished ||
		!got[0].GetCreatedAt().AsTime().Equal(mnt.GetCreatedAt().AsTime()) {
		t.Fatalf("mounts after the restart = %v, want %v", got, mnt)
	}
	if _, err := m2.Unmount(context.Background(), unmountReq("v1", "w1")); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.plug.node(t, "v1"); ok {
		t.Error("the volume is still staged after the unmount")
	}
}

func TestCorruptRecordFailsNew(t *testing.T) {
	e := newEnv(t, Config{}, false)
	if _, err := e.m.Mount(context.Background(), mountReq("v1", "w1")); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(e.dataDir, RecordsDir)
	good := recordName("tp", "v1", "w1", defaultKey)
	bad := filepath.Join(dir, "0123456789abcdef0123456789abcdef.json")
	if err := os.WriteFile(bad, []byte(`{"version": 1, "plugin_id": "tp", `), 0o600); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(dir, "."+good+".tmp123")
	if err := os.WriteFile(stale, []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := New(Config{DataDir: e.dataDir, Plugins: e.plugins, RPCTimeout: time.Second, Retry: shortRetry})
	if err == nil || !strings.Contains(err.Error(), bad) || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("New with a corrupt record: %v, want an error naming %s", err, bad)
	}
	if !exists(bad) {
		t.Errorf("%s was removed", bad)
	}
	if st, err := readJournal(filepath.Join(dir, journalName)); err != nil || st.records[good] == nil {
		t.Errorf("the good record %s was removed from the journal: %v", good, err)
	}
	// Once the corrupt record is gone, New loads the good one and drops
	// the unfinished write.
	if err := os.Remove(bad); err != nil {
		t.Fatal(err)
	}
	m, err := New(Config{DataDir: e.dataDir, Plugins: e.plugins, RPCTimeout: time.Second, Retry: shortRetry})
	if err != nil {
		t.Fatal(err)
	}
	if got := m.List("", ""); len(got) != 1 {
		t.Errorf("mounts = %v, want the good record", got)
	}
	if exists(stale) {
		t.Error("the unfinished write was not removed")
	}
	// A record file under another mount's name is corrupt too.
	rec, _ := e.readRecord(t, "tp", "v1", "w1", defaultKey)
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{DataDir: e.dataDir, Plugins: e.plugins, RPCTimeout: time.Second, Retry: shortRetry}); err == nil || !strings.Contains(err.Error(), "belongs in") {
		t.Errorf("New with a misnamed record: %v, want an error", err)
	}
}

func TestConfigValidation(t *testing.T) {
	plugins := newFixedPlugins()
	valid := func() Config {
		return Config{DataDir: "/data", Plugins: plugins, RPCTimeout: time.Second, Retry: shortRetry}
	}
	cases := []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"no data dir", func(c *Config) { c.DataDir = "" }, "Config.DataDir"},
		{"relative data dir", func(c *Config) { c.DataDir = "data" }, "Config.DataDir"},
		{"no plugins", func(c *Config) { c.Plugins = nil }, "Config.Plugins"},
		{"no timeout", func(c *Config) { c.RPCTimeout = 0 }, "Config.RPCTimeout"},
		{"zero retry", func(c *Config) { c.Retry.Base = 0 }, "Config.Retry"},
		{"negative interval", func(c *Config) { c.ReconcileInterval = -time.Second }, "Config.ReconcileInterval"},
		{"bad plugin id", func(c *Config) { c.PluginDirs = map[string]PluginDirs{"a/b": {}} }, `Config.PluginDirs["a/b"]`},
		{"relative mount dir", func(c *Config) { c.PluginDirs = map[string]PluginDirs{"p": {MountDir: "m"}} }, `PluginDirs["p"].MountDir`},
		{"relative plugin mount dir", func(c *Config) { c.PluginDirs = map[string]PluginDirs{"p": {PluginMountDir: "m"}} }, `PluginDirs["p"].PluginMountDir`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := valid()
			tc.change(&cfg)
			if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New: %v, want an error naming %s", err, tc.want)
			}
		})
	}
	// All problems are reported at once.
	_, err := New(Config{})
	for _, f := range []string{"Config.DataDir", "Config.Plugins", "Config.RPCTimeout", "Config.Retry"} {
		if err == nil || !strings.Contains(err.Error(), f) {
			t.Errorf("New(Config{}): %v, want it to name %s", err, f)
		}
	}
	m, err := New(Config{DataDir: testutil.TempDir(t), Plugins: plugins, RPCTimeout: time.Second, Retry: shortRetry})
	if err != nil {
		t.Fatal(err)
	}
	if m.interval != DefaultReconcileInterval {
		t.Errorf("default reconcile interval = %s, want %s", m.interval, DefaultReconcileInterval)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := m.Run(ctx); err != nil {
		t.Errorf("Run: %v", err)
	}
	if err := m.Run(ctx); err == nil {
		t.Error("a second Run succeeded")
	}
}

// claimSource is a ClaimSource whose answer the test sets.
type claimSource struct {
	mu     sync.Mutex
	claims []*csisupdv1.NodeClaimRef
	index  uint64
	err    error
	calls  int
	// reading, when set, runs in each call before it answers, as what
	// happens on the node while the servers read the claims.
	reading func()
}

func (c *claimSource) get(context.Context) ([]*csisupdv1.NodeClaimRef, uint64, error) {
	c.mu.Lock()
	c.calls++
	claims, index, err, reading := c.claims, c.index, c.err, c.reading
	c.mu.Unlock()
	if reading != nil {
		reading()
	}
	return claims, index, err
}

func (c *claimSource) set(claims []*csisupdv1.NodeClaimRef, index uint64, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.claims, c.index, c.err = claims, index, err
}

func (c *claimSource) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

func TestReconcileRemovesReleasedClusterMounts(t *testing.T) {
	src := &claimSource{err: errors.New("servers unreachable")}
	e := newEnv(t, Config{Claims: src.get, ReconcileInterval: time.Hour}, true)
	testutil.WaitFor(t, waitTime, "the first reconcile", func() bool { return src.count() >= 1 })
	ctx := context.Background()
	mount := func(volume string, cluster bool, index uint64) {
		t.Helper()
		req := mountReq(volume, "w1")
		req.Cluster, req.ClaimIndex = cluster, index
		if _, err := e.m.Mount(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	mount("held", true, 5)     // still claimed
	mount("released", true, 6) // released: removed
	mount("newer", true, 20)   // claimed after the answer was read: kept
	mount("local", false, 0)   // a local scheduler's: never touched

	// A failed round changes nothing.
	e.m.TriggerReconcile()
	testutil.WaitFor(t, waitTime, "a failed reconcile", func() bool { return strings.Contains(e.logs.String(), "servers unreachable") })
	if got := len(e.m.List("", "")); got != 4 {
		t.Fatalf("mounts after a failed reconcile = %d, want 4", got)
	}

	src.set([]*csisupdv1.NodeClaimRef{{VolumeId: "held", WorkloadId: "w1", ClaimIndex: 5}}, 10, nil)
	e.m.TriggerReconcile()
	testutil.WaitFor(t, waitTime, "the released mount to go", func() bool { return len(e.m.List("tp", "released")) == 0 })
	var left []string
	for _, mnt := range e.m.List("", "") {
		left = append(left, mnt.GetVolumeId())
	}
	if strings.Join(left, ",") != "held,local,newer" {
		t.Errorf("mounts after the reconcile = %v, want held, local, newer", left)
	}
	if _, ok := e.plug.node(t, "released"); ok {
		t.Error("the released volume is still staged or published")
	}
}

// A settling record survives a restart: the next agent loads it and
// repeats its undo once it is due.
func TestRestartKeepsSettling(t *testing.T) {
	e := newEnv(t, Config{RPCTimeout: 200 * time.Millisecond}, false)
	e.plug.SetFaults(testplugin.Faults{Errors: map[string]codes.Code{"NodePublishVolume": codes.Unavailable}})
	if _, err := e.m.Mount(context.Background(), mountReq("v1", "w1")); status.Code(err) != codes.Unavailable {
		t.Fatalf("Mount: %v, want Unavailable", err)
	}
	e.plug.SetFaults(testplugin.Faults{})
	if rec, ok := e.readRecord(t, "tp", "v1", "w1", defaultKey); !ok || rec.State != StateSettling {
		t.Fatalf("record after the failed mount = %+v, %t; want settling", rec, ok)
	}
	unpublishes := e.plug.calls("NodeUnpublishVolume")
	m2 := e.manager(t, Config{RPCTimeout: 200 * time.Millisecond}, true)
	waitRecovered(t, m2)
	if got := m2.List("", ""); len(got) != 0 {
		t.Errorf("mounts after the settling = %v, want none", got)
	}
	if e.plug.calls("NodeUnpublishVolume") <= unpublishes {
		t.Error("the restarted agent did not repeat the undo")
	}
}
