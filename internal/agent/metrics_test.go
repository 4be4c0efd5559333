package agent

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/consulsync/consultest"
	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
	"github.com/csisupd/csisupd/internal/testutil/metricsdoc"
)

// metricsDevAgent starts an in-process dev agent (server and client, one
// server bootstrapped) registering in a Consul test agent, with one test
// plugin p1.
func metricsDevAgent(t *testing.T) (*Agent, *testplugin.Plugin, *consultest.Agent) {
	t.Helper()
	consul, err := consultest.New(consultest.Config{NodeName: "metrics-node"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(consul.Close)

	cfg := testConfig(t)
	cfg.Dev = true
	cfg.Name = "metrics-node"
	cfg.Server.Enabled, cfg.Server.BootstrapExpect = true, 1
	cfg.Ports.Raft = testutil.FreePorts(t, 1)[0]
	cfg.Consul.Enabled, cfg.Consul.Address = true, consul.Addr()
	cfg.Consul.SyncInterval = time.Hour // passes on change, not on time
	// A probe timeout far above a probe's cost, so that a loaded machine
	// does not flap the plugin and add transitions the test does not cause.
	cfg.Client.ProbeInterval, cfg.Client.ProbeTimeout = 500*time.Millisecond, 500*time.Millisecond

	sock := filepath.Join(cfg.Client.PluginDir, "p1", "csi.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		t.Fatal(err)
	}
	p, err := testplugin.New(testplugin.Config{
		Socket: sock, StateDir: filepath.Join(cfg.DataDir, "plugin-p1"), Type: testplugin.TypeMonolith,
		NodeID: "metrics-node", Logger: hclog.NewNullLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)

	a, err := New(Config{Config: cfg, Version: "test", Logger: hclog.NewNullLogger()})
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, a)
	return a, p, consul
}

// scrape reads the agent's /metrics.
func scrape(t *testing.T, a *Agent) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + a.HTTPAddr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: %s", resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics is not Prometheus text: %v", err)
	}
	return fams
}

// value returns the value of the series of family name whose labels
// include want (a counter, gauge or untyped value, or a histogram's sample
// count), and whether there is one.
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		case m.Untyped != nil:
			return m.GetUntyped().GetValue(), true
		}
	}
	return 0, false
}

// sum adds the values of every series of the counter or gauge family name.
func sum(fams map[string]*dto.MetricFamily, name string) float64 {
	total := 0.0
	for _, m := range fams[name].GetMetric() {
		total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return total
}

// TestMetricsOfADevAgent drives a dev agent through the life operators
// watch, scrapes /metrics and checks the series that tell it: a plugin
// healthy -> unhealthy -> healthy, a ClientCSI call that succeeds and one
// that fails, a volume create, a Consul pass. No label value is a volume,
// workload or node id, and every family is in the README's table.
func TestMetricsOfADevAgent(t *testing.T) {
	a, p, consul := metricsDevAgent(t)
	waitHealthy(t, a, "p1")

	// healthy -> unhealthy -> healthy
	p.SetFaults(testplugin.Faults{ProbeNotReady: true})
	testutil.WaitFor(t, 10*time.Second, "p1 unhealthy", func() bool {
		pl, ok := a.Registry().Get("p1")
		return ok && pl.Health.State == heartbeat.Unhealthy
	})
	p.SetFaults(testplugin.Faults{})
	waitHealthy(t, a, "p1")
	testutil.WaitFor(t, 10*time.Second, "the servers to hold p1 healthy again", a.nodes.Synced)

	conn, err := grpc.NewClient(a.RPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	control := csisupdv1.NewControlClient(conn)
	var volumeIDs []string
	for i := range 3 {
		id := fmt.Sprintf("metrics-vol-%d", i)
		resp, err := control.CreateVolume(ctx, &csisupdv1.VolumeCreateRequest{
			Id: id, PluginId: "p1",
			Capabilities: []*csisupdv1.VolumeCapability{{AccessType: "mount", AccessMode: "SINGLE_NODE_WRITER"}},
		})
		if err != nil {
			t.Fatalf("CreateVolume %s: %v", id, err)
		}
		volumeIDs = append(volumeIDs, id, resp.GetVolume().GetExternalId())
	}

	// ClientCSI: one call that succeeds, one that fails (unknown plugin).
	clientCSI := csisupdv1.NewClientCSIClient(conn)
	caps := []*csi.VolumeCapability{{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}}
	if _, err := clientCSI.ControllerValidateVolume(ctx, &csisupdv1.ControllerValidateVolumeRequest{
		PluginId: "p1", Request: &csi.ValidateVolumeCapabilitiesRequest{VolumeId: volumeIDs[1], VolumeCapabilities: caps},
	}); err != nil {
		t.Fatalf("ClientCSI call that should succeed: %v", err)
	}
	_, err = clientCSI.ControllerValidateVolume(ctx, &csisupdv1.ControllerValidateVolumeRequest{
		PluginId: "no-such-plugin", Request: &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "x", VolumeCapabilities: caps},
	})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("ClientCSI call for an unknown plugin: %v, want NotFound", err)
	}

	// A Consul pass has registered the agent and its plugin.
	testutil.WaitFor(t, 10*time.Second, "the Consul pass", func() bool {
		for _, svc := range consul.Services() {
			if svc.Service == "csi-plugin-p1" {
				return true
			}
		}
		return false
	})

	var fams map[string]*dto.MetricFamily
	type series struct {
		name   string
		labels map[string]string
		check  func(float64) bool
		want   string
	}
	atLeast := func(n float64) func(float64) bool { return func(v float64) bool { return v >= n } }
	exactly := func(n float64) func(float64) bool { return func(v float64) bool { return v == n } }
	const vvc = "ControllerValidateVolume"
	checks := []series{
		{"csisupd_plugin_healthy", map[string]string{"plugin_id": "p1", "type": "monolith"}, exactly(1), "1"},
		{"csisupd_plugin_health_transitions_total", map[string]string{"plugin_id": "p1", "to": "unhealthy"}, exactly(1), "1"},
		{"csisupd_plugin_health_transitions_total", map[string]string{"plugin_id": "p1", "to": "healthy"}, exactly(2), "2 (first probe, recovery)"},
		{"csisupd_plugin_probe_failures_total", map[string]string{"plugin_id": "p1", "reason": "not_ready"}, atLeast(1), ">= 1"},
		{"csisupd_plugin_probe_duration_seconds", map[string]string{"plugin_id": "p1"}, atLeast(3), ">= 3 observations"},
		{"csisupd_plugin_last_healthy_probe_timestamp_seconds", map[string]string{"plugin_id": "p1"}, atLeast(float64(time.Now().Add(-time.Minute).Unix())), "within the last minute"},
		{"csisupd_registry_plugins", nil, exactly(1), "1"},
		{"grpc_server_handled_total", map[string]string{"grpc_service": "csisupd.v1.ClientCSI", "grpc_method": vvc, "grpc_code": "OK"}, exactly(1), "1"},
		{"grpc_server_handled_total", map[string]string{"grpc_service": "csisupd.v1.ClientCSI", "grpc_method": vvc, "grpc_code": "NotFound"}, exactly(1), "1"},
		{"grpc_server_handling_seconds", map[string]string{"grpc_service": "csisupd.v1.ClientCSI", "grpc_method": vvc}, exactly(2), "2 observations"},
		{"grpc_server_handled_total", map[string]string{"grpc_service": "csisupd.v1.Control", "grpc_method": "CreateVolume", "grpc_code": "OK"}, exactly(3), "3"},
		{"grpc_client_handled_total", map[string]string{"grpc_service": "csi.v1.Controller", "grpc_method": "CreateVolume", "grpc_code": "OK"}, exactly(3), "3 (the agent's calls into the plugin)"},
		{"csisupd_cluster_volumes", nil, exactly(3), "3"},
		{"csisupd_cluster_nodes", map[string]string{"status": "ready"}, exactly(1), "1"},
		{"csisupd_server_leader", nil, exactly(1), "1"},
		{"csisupd_server_raft_applied_index", nil, atLeast(1), ">= 1"},
		{"csisupd_consul_sync_passes_total", nil, atLeast(1), ">= 1"},
		{"csisupd_consul_sync_last_success_timestamp_seconds", nil, atLeast(float64(time.Now().Add(-time.Minute).Unix())), "within the last minute"},
		{"csisupd_agent_ready", nil, exactly(1), "1"},
		{"csisupd_volume_record_syncs_total", nil, atLeast(1), ">= 1 (the new records journal's directory entry)"},
		{"csisupd_watchdog_timeout_seconds", nil, atLeast(1), "> 0"},
	}
	allHold := func() bool {
		fams = scrape(t, a)
		for _, c := range checks {
			if v, ok := value(fams, c.name, c.labels); !ok || !c.check(v) {
				return false
			}
		}
		return true
	}
	// Scrapes until every series holds, for at most 10 s; then each one
	// that does not is reported.
	for deadline := time.Now().Add(10 * time.Second); !allHold() && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond) // scrape interval
	}
	for _, c := range checks {
		if v, ok := value(fams, c.name, c.labels); !ok || !c.check(v) {
			t.Errorf("%s%v = %v (present %v), want %s", c.name, c.labels, v, ok, c.want)
		}
	}
	if writes := sum(fams, "csisupd_consul_sync_writes_total"); writes < 1 {
		t.Errorf("csisupd_consul_sync_writes_total = %v, want the pass's writes", writes)
	}

	// No label value grows with volumes, workloads or nodes.
	banned := append(volumeIDs, a.NodeID())
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				for _, id := range banned {
					if id != "" && strings.Contains(l.GetValue(), id) {
						t.Errorf("%s has label %s=%q: a volume or node id", name, l.GetName(), l.GetValue())
					}
				}
			}
		}
	}

	// Every family served is documented in the README's metrics table.
	table, err := metricsdoc.Table(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	for name := range fams {
		if !metricsdoc.Covers(table, name) {
			t.Errorf("metric %s is served but missing from the README's metrics table", name)
		}
	}
	// And every row names a metric that exists, but for the families
	// this scenario cannot produce.
	notHere := map[string]string{
		"csisupd_server_forwarded_requests_total":  "one server forwards nothing",
		"csisupd_consul_sync_failures_total":       "Consul answers",
		"csisupd_event_subscribers_dropped_total":  "no subscriber falls behind",
		"csisupd_plugin_updates_coalesced_total":   "depends on timing",
		"csisupd_watchdog_pings_total":             "not under systemd",
		"csisupd_plugin_fingerprint_changes_total": "the plugin keeps its fingerprint",
	}
	for name := range table {
		if strings.HasSuffix(name, "*") || notHere[name] != "" {
			continue
		}
		if _, ok := fams[name]; !ok {
			t.Errorf("the README documents %s, but a dev agent does not serve it", name)
		}
	}
}
