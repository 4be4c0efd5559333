package nodevolumes

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/retry"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
	"github.com/csisupd/csisupd/internal/testutil/sanitytest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, sanitytest.IgnoreGinkgo())
}

// shortRetry keeps retries fast in tests.
var shortRetry = retry.Policy{Base: time.Millisecond, Cap: 2 * time.Millisecond, Multiplier: 2, Jitter: 0}

// waitTime bounds every wait of the tests.
const waitTime = 10 * time.Second

// fixedPlugins is a csiclient.PluginLookup whose read models the test writes, with a
// real csiclient connection per plugin socket.
type fixedPlugins struct {
	mu      sync.Mutex
	plugins map[string]*csisupdv1.Plugin
	clients map[string]*csiclient.Client
}

func newFixedPlugins() *fixedPlugins {
	return &fixedPlugins{plugins: make(map[string]*csisupdv1.Plugin), clients: make(map[string]*csiclient.Client)}
}

func (f *fixedPlugins) Lookup(id string) (*csisupdv1.Plugin, *csiclient.Client, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.plugins[id]
	if !ok {
		return nil, nil, false
	}
	return proto.Clone(p).(*csisupdv1.Plugin), f.clients[id], true
}

// set stores the read model of p.Id with client c (nil: not fingerprinted).
func (f *fixedPlugins) set(p *csisupdv1.Plugin, c *csiclient.Client) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.plugins[p.GetId()] = p
	f.clients[p.GetId()] = c
}

func (f *fixedPlugins) remove(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.plugins, id)
	delete(f.clients, id)
}

// nodeModel is the read model of a healthy node plugin with every node
// capability the test plugin has.
func nodeModel(id string) *csisupdv1.Plugin {
	return &csisupdv1.Plugin{
		Id: id, Type: string(plugin.TypeNode), Healthy: true, HealthState: "healthy", NodeId: "node-1",
		NodeCapabilities: []string{plugin.CapStageUnstageVolume, plugin.CapGetVolumeStats, plugin.CapExpandVolume},
	}
}

// events records the manager's events.
type events struct {
	mu  sync.Mutex
	evs []plugin.Event
}

func (e *events) Emit(ev plugin.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.evs = append(e.evs, ev)
}

func (e *events) types() []plugin.EventType {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []plugin.EventType
	for _, ev := range e.evs {
		out = append(out, ev.Type)
	}
	return out
}

func (e *events) all() []plugin.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]plugin.Event(nil), e.evs...)
}

// testPlugin is a running test plugin with its connection.
type testPlugin struct {
	*testplugin.Plugin
	stateDir string
	client   *csiclient.Client
}

// startPlugin starts a test plugin of typ in dir/name; it stops with the
// test.
func startPlugin(t *testing.T, dir, name, typ string) *testPlugin {
	t.Helper()
	return startPluginWith(t, dir, name, testplugin.Config{Type: typ})
}

// startPluginWith starts a test plugin of cfg in dir/name, on node-1; it
// stops with the test.
func startPluginWith(t *testing.T, dir, name string, cfg testplugin.Config) *testPlugin {
	t.Helper()
	sock := filepath.Join(dir, name+".sock")
	stateDir := filepath.Join(dir, name+"-state")
	cfg.Socket, cfg.StateDir, cfg.NodeID = sock, stateDir, "node-1"
	p, err := testplugin.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	c, err := csiclient.New(csiclient.Config{Socket: sock, Redial: config.DefaultRetry().PluginRedial})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &testPlugin{Plugin: p, stateDir: stateDir, client: c}
}

// nodeRecord is the test plugin's node record of a volume.
type nodeRecord struct {
	StagingPath string                     `json:"staging_path"`
	Targets     map[string]json.RawMessage `json:"targets"`
}

// node reads the plugin's node record of volume id; ok is false when the
// plugin has none (neither staged nor published).
func (p *testPlugin) node(t *testing.T, id string) (nodeRecord, bool) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(p.stateDir, "node", id+".json"))
	if errors.Is(err, os.ErrNotExist) {
		return nodeRecord{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	var n nodeRecord
	if err := json.Unmarshal(b, &n); err != nil {
		t.Fatal(err)
	}
	return n, true
}

// dataPath is the directory of volume id in the plugin's state.
func (p *testPlugin) dataPath(id string) string { return filepath.Join(p.stateDir, "data", id) }

func (p *testPlugin) calls(method string) int64 { return p.Stats().Calls[method] }

// env is a manager over one test plugin "tp".
type env struct {
	dir     string
	dataDir string
	plug    *testPlugin
	plugins *fixedPlugins
	events  *events
	logs    *testutil.SyncBuffer
	m       *Manager
}

// newEnv starts plugin "tp" (a node plugin) and a manager with cfg's
// non-zero fields over it; run starts the manager's Run for the test.
func newEnv(t *testing.T, cfg Config, run bool) *env {
	t.Helper()
	dir := testutil.TempDir(t)
	e := &env{dir: dir, dataDir: filepath.Join(dir, "data"), plugins: newFixedPlugins(), events: &events{}, logs: &testutil.SyncBuffer{}}
	e.plug = startPlugin(t, dir, "tp", testplugin.TypeNode)
	e.plugins.set(nodeModel("tp"), e.plug.client)
	e.m = e.manager(t, cfg, run)
	return e
}

// manager makes a manager on e's data directory.
func (e *env) manager(t *testing.T, cfg Config, run bool) *Manager {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = e.dataDir
	}
	cfg.Plugins = e.plugins
	if cfg.RPCTimeout == 0 {
		cfg.RPCTimeout = 5 * time.Second
	}
	if cfg.Retry == (retry.Policy{}) {
		cfg.Retry = shortRetry
	}
	if cfg.Events == nil {
		cfg.Events = e.events
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.New(&hclog.LoggerOptions{Level: hclog.Trace, Output: e.logs})
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if run {
		startRun(t, m)
	}
	return m
}

// startRun runs m until the test ends, and checks that Run returns soon
// after its context ends.
func startRun(t *testing.T, m *Manager) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(waitTime):
			t.Errorf("Run did not return within %s of its context ending", waitTime)
		}
	})
}

// diskRecords returns the names of the records on disk, sorted.
func (e *env) diskRecords(t *testing.T) []string {
	t.Helper()
	recs := readRecords(t, e.dataDir)
	names := make([]string, 0, len(recs))
	for name := range recs {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// readRecords reads the records of dataDir from disk, changing nothing:
// the journal's and the per-file ones.
func readRecords(t *testing.T, dataDir string) map[string]*record {
	t.Helper()
	st, files, _, err := readDir(filepath.Join(dataDir, RecordsDir))
	if err != nil {
		t.Fatal(err)
	}
	for name, r := range files {
		if st.records[name] == nil {
			st.records[name] = r
		}
	}
	return st.records
}

// readRecord reads the record of a mount from disk.
func (e *env) readRecord(t *testing.T, plugin, volume, workload, usageKey string) (*record, bool) {
	t.Helper()
	r, ok := readRecords(t, e.dataDir)[recordName(plugin, volume, workload, usageKey)]
	return r, ok
}

// mountReq is a mount request of plugin tp with the default usage.
func mountReq(volume, workload string) *csisupdv1.MountVolumeRequest {
	return &csisupdv1.MountVolumeRequest{PluginId: "tp", VolumeId: volume, WorkloadId: workload}
}

func unmountReq(volume, workload string) *csisupdv1.UnmountVolumeRequest {
	return &csisupdv1.UnmountVolumeRequest{PluginId: "tp", VolumeId: volume, WorkloadId: workload}
}

// defaultKey is the usage key of the default usage.
const defaultKey = "rw-file-system-single-node-writer"

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// pluginViewRoots makes a mount root and another path through which a
// plugin sees the same directory (a link to it).
func pluginViewRoots(t *testing.T) (hostRoot, pluginView string) {
	t.Helper()
	dir := testutil.TempDir(t)
	hostRoot = filepath.Join(dir, "host-root")
	pluginView = filepath.Join(dir, "plugin-view")
	if err := os.MkdirAll(hostRoot, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(hostRoot, pluginView); err != nil {
		t.Fatal(err)
	}
	return hostRoot, pluginView
}
