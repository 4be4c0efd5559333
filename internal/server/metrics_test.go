package server_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testutil"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// registries gives each server of a test cluster a registry of its own.
type registries struct {
	mu   sync.Mutex
	byID map[string]*prometheus.Registry
}

// configure sets a new registry as c's Metrics.
func (r *registries) configure(c *server.Config) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byID == nil {
		r.byID = map[string]*prometheus.Registry{}
	}
	r.byID[c.ID] = prometheus.NewRegistry()
	c.Metrics = r.byID[c.ID]
}

func (r *registries) of(id string) *prometheus.Registry {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.byID[id]
}

// families returns the names of g's families that start with prefix.
func families(t testing.TB, g prometheus.Gatherer, prefix string) []string {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	var out []string
	for _, f := range fams {
		if strings.HasPrefix(f.GetName(), prefix) {
			out = append(out, f.GetName())
		}
	}
	return out
}

// series is one expected series: a name, its label pairs and its value.
type series struct {
	name   string
	labels []string
	value  float64
}

// checkSeries reports every series of want that g lacks or holds with
// another value.
func checkSeries(t testing.TB, g prometheus.Gatherer, want []series) {
	t.Helper()
	for _, w := range want {
		got, ok := testutil.MetricValue(t, g, w.name, w.labels...)
		if !ok {
			t.Errorf("no series %s%v", w.name, w.labels)
		} else if got != w.value {
			t.Errorf("%s%v = %v, want %v", w.name, w.labels, got, w.value)
		}
	}
}

func TestClusterMetrics(t *testing.T) {
	var regs registries
	e := newClaimEnv(t, 1, regs.configure, map[string][]*csisupdv1.Plugin{"node-a": {monolith("p1", "node-a")}})
	reg := regs.of("server-0")
	ctx := context.Background()
	if _, err := e.cl.CreateVolume(ctx, &csisupdv1.VolumeCreateRequest{Id: "vol-1", PluginId: "p1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.claim("vol-1", "node-a", "w1", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cl.SetVolumeAvailability(ctx, &csisupdv1.VolumeAvailabilityRequest{Id: "vol-1", Availability: "pause"}); err != nil {
		t.Fatal(err)
	}

	checkSeries(t, reg, []series{
		{"csisupd_cluster_nodes", []string{"status", "ready"}, 1},
		{"csisupd_cluster_nodes", []string{"status", "down"}, 0},
		{"csisupd_cluster_plugins", nil, 1},
		{"csisupd_cluster_volumes", nil, 1},
		{"csisupd_cluster_claims", []string{"state", "taken"}, 1},
		{"csisupd_cluster_claims", []string{"state", "unpublishing"}, 0},
		{"csisupd_cluster_claims", []string{"state", "node-unpublished"}, 0},
		{"csisupd_cluster_claims", []string{"state", "controller-unpublished"}, 0},
		{"csisupd_cluster_volume_snapshots", []string{"state", "creating"}, 0},
		{"csisupd_cluster_volume_snapshots", []string{"state", "created"}, 0},
		{"csisupd_cluster_volume_snapshots", []string{"state", "created-not-ready"}, 0},
		{"csisupd_cluster_volume_snapshots", []string{"state", "deleting"}, 0},
		{"csisupd_cluster_volume_expansions", []string{"state", "controller"}, 0},
		{"csisupd_cluster_volume_expansions", []string{"state", "nodes"}, 0},
		{"csisupd_cluster_volumes_abnormal", nil, 0},
		{"csisupd_cluster_volumes_unavailable", []string{"availability", "pause"}, 1},
		{"csisupd_cluster_volumes_unavailable", []string{"availability", "drain"}, 0},
		{"csisupd_cluster_heartbeat_timers", nil, 1},
		{"csisupd_server_leader", nil, 1},
		{"csisupd_server_bootstrap_expect", nil, 1},
		{"csisupd_server_raft_last_contact_seconds", nil, 0},
		{"csisupd_server_raft_peers", []string{"suffrage", "voter"}, 1},
		{"csisupd_server_raft_peers", []string{"suffrage", "nonvoter"}, 0},
	})
	commit, _ := testutil.MetricValue(t, reg, "csisupd_server_raft_commit_index")
	applied, _ := testutil.MetricValue(t, reg, "csisupd_server_raft_applied_index")
	last, _ := testutil.MetricValue(t, reg, "csisupd_server_raft_last_index")
	// The claim was applied before it was answered.
	if claimed := e.volume(t, "vol-1").GetClaims()[0].GetClaimIndex(); commit < float64(claimed) || applied < float64(claimed) || last < commit {
		t.Errorf("raft indexes: commit %v, applied %v, last %v; the claim's index is %d", commit, applied, last, claimed)
	}
	testutil.WaitFor(t, 10*time.Second, "a node heartbeat counted", func() bool {
		n, _ := testutil.MetricValue(t, reg, "csisupd_cluster_heartbeats_total")
		return n >= 1
	})

	// Raft's own metrics reach the same registry, named csisupd_raft_*,
	// and nothing of them lands in the default registry.
	if got, _ := testutil.MetricValue(t, reg, "csisupd_raft_apply"); got < 1 {
		t.Errorf("csisupd_raft_apply = %v after raft writes; raft families: %v", got, families(t, reg, "csisupd_raft_"))
	}
	if leaked := families(t, prometheus.DefaultGatherer, "csisupd_"); len(leaked) > 0 {
		t.Errorf("families in the default registry: %v", leaked)
	}
	for _, f := range families(t, reg, "csisupd_") {
		if strings.HasPrefix(f, "csisupd_runtime_") || strings.Contains(f, "_runtime_") {
			t.Errorf("go-metrics runtime family %s exported", f)
		}
	}

	// Shutdown unregisters everything, raft's sink included.
	e.c.Shutdown()
	if left := families(t, reg, "csisupd_"); len(left) > 0 {
		t.Errorf("families left registered after Shutdown: %v", left)
	}
}

func TestForwardedRequestsCounted(t *testing.T) {
	var regs registries
	e := newClaimEnv(t, 3, regs.configure, map[string][]*csisupdv1.Plugin{"node-a": {monolith("p1", "node-a")}})
	leader := e.c.Leader()
	follower := e.c.Member((leader.Index + 1) % 3) // e.cl's server
	const method = "/csisupd.v1.Control/CreateVolume"
	forwarded := func(m *testcluster.Member) float64 {
		v, _ := testutil.MetricValue(t, regs.of(m.ID), "csisupd_server_forwarded_requests_total", "method", method)
		return v
	}
	if n := forwarded(follower); n != 0 {
		t.Fatalf("forwarded %s = %v before any", method, n)
	}
	if _, err := e.cl.CreateVolume(context.Background(), &csisupdv1.VolumeCreateRequest{Id: "vol-1", PluginId: "p1"}); err != nil {
		t.Fatal(err)
	}
	if n := forwarded(follower); n != 1 {
		t.Errorf("the follower counted %v forwarded %s, want 1", n, method)
	}
	if n := forwarded(leader); n != 0 {
		t.Errorf("the leader counted %v forwarded %s, want 0", n, method)
	}

	// Each server reports its own role; the state replicates.
	for _, m := range e.c.Members() {
		reg := regs.of(m.ID)
		wantLeader := 0.0
		if m == leader {
			wantLeader = 1
		}
		if got, _ := testutil.MetricValue(t, reg, "csisupd_server_leader"); got != wantLeader {
			t.Errorf("%s: leader = %v, want %v", m.ID, got, wantLeader)
		}
		if got, _ := testutil.MetricValue(t, reg, "csisupd_server_raft_peers", "suffrage", "voter"); got != 3 {
			t.Errorf("%s: voters = %v, want 3", m.ID, got)
		}
		if got, _ := testutil.MetricValue(t, reg, "csisupd_server_bootstrap_expect"); got != 3 {
			t.Errorf("%s: bootstrap_expect = %v, want 3", m.ID, got)
		}
		testutil.WaitFor(t, 10*time.Second, m.ID+" has the volume", func() bool {
			v, _ := testutil.MetricValue(t, reg, "csisupd_cluster_volumes")
			return v == 1
		})
		if m != leader {
			if got, _ := testutil.MetricValue(t, reg, "csisupd_cluster_heartbeat_timers"); got != 0 {
				t.Errorf("follower %s holds %v heartbeat timers", m.ID, got)
			}
			if _, ok := testutil.MetricValue(t, reg, "csisupd_server_raft_last_contact_seconds"); !ok {
				t.Errorf("follower %s reports no last contact", m.ID)
			}
		}
	}
}

// loopNames returns the loops the monitor tracks, from its metrics.
func loopNames(t testing.TB, g prometheus.Gatherer) []string {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range fams {
		if f.GetName() != "csisupd_watchdog_loop_beat_age_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "loop" {
					out = append(out, l.GetValue())
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

func TestServerLoopsBeatAndAWedgedOneIsStale(t *testing.T) {
	clock := testutil.NewClock(time.Unix(1_700_000_000, 0))
	monReg := prometheus.NewRegistry()
	mon, err := watchdog.New(watchdog.Config{Timeout: 100 * time.Millisecond, Now: clock.Now, Metrics: monReg})
	if err != nil {
		t.Fatal(err)
	}
	e := newClaimEnv(t, 1, func(c *server.Config) {
		c.Watchdog = mon
		// A call to an agent waits as long as the agent does, so this
		// test decides when the hung unmount ends.
		c.RPCTimeout = time.Hour
	}, map[string][]*csisupdv1.Plugin{"node-a": {monolith("p1", "node-a")}})

	want := []string{"server batcher", "server join", "server leader loop", "server leadership monitor", "volume health monitor", "volume watcher"}
	testutil.WaitFor(t, 10*time.Second, "every loop registered", func() bool { return slices.Equal(loopNames(t, monReg), want) })
	// Idle loops beat on their own: far past the timeout, every loop is
	// fresh again after its next tick.
	clock.Advance(time.Minute)
	testutil.WaitFor(t, 10*time.Second, "every idle loop beat", func() bool { return len(mon.Stale()) == 0 })

	// A release whose unmount fails is left to the volume watcher; then
	// the agent hangs in the watcher's next unmount.
	ctx := context.Background()
	if _, err := e.cl.CreateVolume(ctx, &csisupdv1.VolumeCreateRequest{Id: "vol-1", PluginId: "p1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.claim("vol-1", "node-a", "w1", nil); err != nil {
		t.Fatal(err)
	}
	e.nv.setFail(nil, errors.New("unmount failed"))
	if _, err := e.release("vol-1", "node-a", "w1"); err == nil {
		t.Fatal("release succeeded with a failing unmount")
	}
	entered, release := e.nv.holdUnmounts()
	defer release()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the volume watcher did not retry the unmount")
	}
	// The watcher waits in the call and cannot beat; the other loops can.
	// Within the call's deadline (RPCTimeout) it is busy, not wedged.
	clock.Advance(time.Minute)
	testutil.WaitFor(t, 10*time.Second, "no loop stale while the watcher waits within its call's deadline", func() bool {
		return len(mon.Stale()) == 0
	})
	// Past the deadline the call is stuck, and the watcher is stale.
	clock.Advance(2 * time.Hour)
	testutil.WaitFor(t, 10*time.Second, "only the volume watcher stale", func() bool {
		return slices.Equal(mon.Stale(), []string{"volume watcher"})
	})
	release()
	testutil.WaitFor(t, 10*time.Second, "the watcher beat again", func() bool { return len(mon.Stale()) == 0 })
	testutil.WaitFor(t, 10*time.Second, "the release finished", func() bool { return len(e.volume(t, "vol-1").GetClaims()) == 0 })

	// Stopped loops are unregistered, not wedged.
	e.c.Shutdown()
	clock.Advance(time.Hour)
	if stale := mon.Stale(); len(stale) != 0 {
		t.Errorf("stale after Shutdown: %v", stale)
	}
	if left := loopNames(t, monReg); len(left) != 0 {
		t.Errorf("loops left after Shutdown: %v", left)
	}
}
