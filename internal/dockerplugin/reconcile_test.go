package dockerplugin_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testutil"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// engineMount is one entry of a container summary's Mounts.
type engineMount struct {
	Type        string
	Name        string `json:",omitempty"`
	Source      string
	Destination string
	Driver      string `json:",omitempty"`
	Mode        string
	RW          bool
	Propagation string
}

// engineContainer is a container summary of GET /containers/json.
type engineContainer struct {
	ID      string `json:"Id"`
	Names   []string
	Image   string
	Command string
	Created int64
	State   string
	Status  string
	Labels  map[string]string
	Mounts  []engineMount
}

// fakeEngine serves GET /containers/json as Docker Engine API v1.43
// (Docker 24) documents it, which Podman's compat API answers alike: a
// JSON array of container summaries with Id, Names, State, Status and
// Mounts (among others), running containers only unless the query has
// all set to a true value; errors are {"message": "..."} with the status.
// It notes each list in the cluster's call log, so that tests see the
// order of the reconcile's calls.
type fakeEngine struct {
	socket  string
	cluster *fakeCluster

	mu         sync.Mutex
	containers []engineContainer
	// status, when not 0, is the error status of every answer; body,
	// when not "", the raw body of every answer.
	status int
	body   string
	lists  int
}

func startEngine(t *testing.T, cluster *fakeCluster, containers ...engineContainer) *fakeEngine {
	t.Helper()
	e := &fakeEngine{socket: filepath.Join(testutil.TempDir(t), "docker.sock"), cluster: cluster, containers: containers}
	l, err := net.Listen("unix", e.socket)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /containers/json", e.list)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: waitTimeout}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return e
}

func (e *fakeEngine) list(w http.ResponseWriter, r *http.Request) {
	e.cluster.note("engine list")
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lists++
	w.Header().Set("Content-Type", "application/json")
	if e.status != 0 {
		w.WriteHeader(e.status)
		_ = json.NewEncoder(w).Encode(map[string]string{"message": "engine trouble"})
		return
	}
	if e.body != "" {
		_, _ = w.Write([]byte(e.body))
		return
	}
	all, _ := strconv.ParseBool(r.URL.Query().Get("all"))
	out := []engineContainer{}
	for _, c := range e.containers {
		if all || c.State == "running" {
			out = append(out, c)
		}
	}
	_ = json.NewEncoder(w).Encode(out)
}

func (e *fakeEngine) listed() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lists
}

// container returns a container summary of id in state, mounting the
// named volumes.
func container(id, state string, volumes ...string) engineContainer {
	c := engineContainer{ID: id, Names: []string{"/c-" + id[:6]}, Image: "img", Command: "sh", Created: 1700000000, State: state, Status: state}
	for _, v := range volumes {
		c.Mounts = append(c.Mounts, engineMount{Type: "volume", Name: v, Source: "/var/lib/csisupd/volumes/" + v, Destination: "/data", Driver: "csisupd", Mode: "z", RW: true})
	}
	return c
}

// hexID returns a 64-hex id made of c.
func hexID(c byte) string {
	b := make([]byte, 64)
	for i := range b {
		b[i] = c
	}
	return string(b)
}

// runWithEngine runs a Server with the engine's socket and interval.
func runWithEngine(t *testing.T, fc *fakeCluster, engineSocket string, interval time.Duration) *pluginClient {
	cfg := testConfig(t, fc)
	cfg.EngineSocket, cfg.ReconcileInterval = engineSocket, interval
	return startServer(t, cfg)
}

// waitSyncs waits until the cluster saw at least n Syncs and returns
// them.
func waitSyncs(t *testing.T, fc *fakeCluster, n int) []syncCall {
	t.Helper()
	testutil.WaitFor(t, waitTimeout, strconv.Itoa(n)+" Sync calls", func() bool { return len(fc.synced()) >= n })
	return fc.synced()
}

// TestReconcile checks a pass: the claims index is read before the
// engine's list, the live workloads reach Sync with that index, and the
// claims of containers that exited or are gone are released while those
// of live ones, of other owners and of other nodes stay.
func TestReconcile(t *testing.T) {
	fc := newFakeCluster(nodeID)
	for _, v := range []string{"v1", "v2", "v3", "v4"} {
		fc.addVolume(&csisupdv1.Volume{Id: v, PluginId: "testplugin"})
	}
	// An engine that mounts with container ids: A runs, B exited, a
	// created container is being started (Mount comes before it runs).
	a, b, starting, dead := hexID('a'), hexID('b'), hexID('f'), hexID('e')
	fc.addClaim("v1", nodeID, "docker-"+a, "docker")
	fc.addClaim("v1", nodeID, "docker-"+b, "docker")
	fc.addClaim("v1", nodeID, "systemd-web", "systemd")
	fc.addClaim("v1", "node-2", "docker-"+b, "docker")
	fc.addClaim("v4", nodeID, "docker-"+starting, "docker")
	// Docker's Mount ids are its own, no container's: the claims on v2,
	// which running container D mounts by name, are live (the engine
	// cannot say which of them is D's); the one on v3, which only a dead
	// container mounts, is not; so is v1's claim of an unknown id, as A
	// mounts v1.
	d := hexID('d')
	fc.addClaim("v1", nodeID, "docker-"+hexID('0'), "docker")
	fc.addClaim("v2", nodeID, "docker-"+hexID('1'), "docker")
	fc.addClaim("v3", nodeID, "docker-"+hexID('3'), "docker")
	idx, _ := fc.ClaimsIndex(context.Background())

	e := startEngine(t, fc,
		container(a, "running", "v1"), container(b, "exited", "v1"), container(d, "running", "v2"),
		container(starting, "created", "v4"), container(dead, "dead", "v3"))
	runWithEngine(t, fc, e.socket, time.Hour)

	syncs := waitSyncs(t, fc, 1)
	wantLive := []string{"docker-" + hexID('0'), "docker-" + hexID('1'), "docker-" + a, "docker-" + d, "docker-" + starting}
	if s := syncs[0]; s.owner != "docker" || !slices.Equal(s.workloads, wantLive) || s.knownIndex != idx {
		t.Fatalf("Sync(%q, %v, %d), want Sync(docker, %v, %d)", s.owner, s.workloads, s.knownIndex, wantLive, idx)
	}
	calls := fc.calls()
	// The claims index read by the test itself comes first.
	if want := []string{"ClaimsIndex", "ClaimsIndex", "engine list", "ListVolumes", "Sync"}; !slices.Equal(calls, want) {
		t.Fatalf("calls %v, want %v: the claims index before the engine's list, Sync last", calls, want)
	}
	for v, want := range map[string][]string{
		"v1": {"docker-" + hexID('0'), "docker-" + a, "docker-" + b, "systemd-web"}, // B's on node-2 stays
		"v2": {"docker-" + hexID('1')},
		"v3": {},
		"v4": {"docker-" + starting},
	} {
		if got := fc.workloads(v); !slices.Equal(got, want) {
			t.Errorf("claims of %s after the pass: %v, want %v", v, got, want)
		}
	}
}

// TestReconcileRepeats checks that the reconcile runs every interval: a
// claim of a container that dies after the first pass is released by a
// later one.
func TestReconcileRepeats(t *testing.T) {
	fc := newFakeCluster(nodeID)
	fc.addVolume(&csisupdv1.Volume{Id: "v1", PluginId: "testplugin"})
	a := hexID('a')
	fc.addClaim("v1", nodeID, "docker-"+a, "docker")
	e := startEngine(t, fc, container(a, "running", "v1"))
	reg := prometheus.NewRegistry()
	wd, err := watchdog.New(watchdog.Config{Timeout: time.Minute, Metrics: reg})
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, fc)
	cfg.EngineSocket, cfg.ReconcileInterval, cfg.Watchdog = e.socket, 20*time.Millisecond, wd
	startServer(t, cfg)

	waitSyncs(t, fc, 1)
	if _, ok := testutil.MetricValue(t, reg, "csisupd_watchdog_loop_beat_age_seconds", "loop", "docker reconcile"); !ok {
		t.Error("the reconcile loop is not watched by the watchdog")
	}
	if stale := wd.Stale(); len(stale) != 0 {
		t.Errorf("stale loops %v while the reconcile runs", stale)
	}
	if got := fc.workloads("v1"); len(got) != 1 {
		t.Fatalf("claims after the first pass: %v, want A's", got)
	}
	e.mu.Lock()
	e.containers[0].State = "exited"
	e.mu.Unlock()
	testutil.WaitFor(t, waitTimeout, "A's claim released by a later pass", func() bool { return len(fc.workloads("v1")) == 0 })
}

// TestReconcileFailureReleasesNothing checks that a pass that cannot read
// the claims index, the engine's containers or the volumes calls no Sync,
// and that it is tried again at the next interval.
func TestReconcileFailureReleasesNothing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(fc *fakeCluster, e *fakeEngine)
		// noEngine points the plugin at a socket no one serves.
		noEngine bool
	}{
		{name: "engine error", setup: func(_ *fakeCluster, e *fakeEngine) { e.status = http.StatusInternalServerError }},
		{name: "engine answer not JSON", setup: func(_ *fakeCluster, e *fakeEngine) { e.body = `{"message": "not a list"}` }},
		{name: "engine truncated answer", setup: func(_ *fakeCluster, e *fakeEngine) { e.body = `[{"Id": "` }},
		{name: "engine not running", noEngine: true},
		{name: "claims index", setup: func(fc *fakeCluster, _ *fakeEngine) {
			fc.failWith("ClaimsIndex", errors.New("servers unreachable"))
		}},
		{name: "volumes", setup: func(fc *fakeCluster, _ *fakeEngine) {
			fc.failWith("ListVolumes", errors.New("servers unreachable"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc := newFakeCluster(nodeID)
			fc.addVolume(&csisupdv1.Volume{Id: "v1", PluginId: "testplugin"})
			fc.addClaim("v1", nodeID, "docker-"+hexID('a'), "docker")
			e := startEngine(t, fc)
			if tc.setup != nil {
				tc.setup(fc, e)
			}
			socket := e.socket
			if tc.noEngine {
				socket = filepath.Join(testutil.TempDir(t), "gone.sock")
			}
			runWithEngine(t, fc, socket, 10*time.Millisecond)
			count := func(what string) int {
				n := 0
				for _, c := range fc.calls() {
					if c == what {
						n++
					}
				}
				return n
			}
			testutil.WaitFor(t, waitTimeout, "three passes", func() bool { return count("ClaimsIndex") >= 3 })
			if n := count("Sync"); n != 0 {
				t.Fatalf("failed passes called Sync %d times", n)
			}
			if tc.name == "claims index" && e.listed() != 0 {
				t.Fatalf("a pass without the claims index listed the engine's containers %d times", e.listed())
			}
			if got := fc.workloads("v1"); len(got) != 1 {
				t.Fatalf("claims after failed passes: %v, want the claim kept", got)
			}
		})
	}
}
