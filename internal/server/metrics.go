package server

import (
	"context"
	"fmt"
	"maps"
	"time"

	gometrics "github.com/hashicorp/go-metrics/compat"
	gometricsprom "github.com/hashicorp/go-metrics/compat/prometheus"
	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/csisupd/csisupd/internal/server/raftnode"
	cl "github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/state"
)

// raftMetricsService prefixes the names of raft's own go-metrics:
// raft.apply becomes csisupd_raft_apply.
const raftMetricsService = "csisupd"

// serverMetrics holds the server's counters and what it registered. The
// gauges are read from the server's state at scrape time (stateCollector),
// so nothing is kept twice.
type serverMetrics struct {
	// heartbeats counts node heartbeats this server handled as leader.
	heartbeats prometheus.Counter
	// forwarded counts requests this server forwarded to the leader, by
	// full gRPC method name.
	forwarded *prometheus.CounterVec
	// bootstrapExpect is the cluster's configured server count, set once:
	// the alerts compare the raft configuration's voters, and the servers
	// that answer, with it.
	bootstrapExpect prometheus.Gauge

	reg        prometheus.Registerer
	registered []prometheus.Collector
	// raftGlobal is the go-metrics global this server installed for raft,
	// nil when it installed none.
	raftGlobal *gometrics.Metrics
}

// newServerMetrics creates the server's collectors and, when reg is not
// nil, registers them and installs raft's go-metrics global with a sink
// registered in reg. With a nil reg the counters still count, registered
// nowhere, and go-metrics' global is left alone.
func newServerMetrics(s *Server, reg prometheus.Registerer) (*serverMetrics, error) {
	m := &serverMetrics{
		heartbeats: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "csisupd_cluster_heartbeats_total",
			Help: "Node heartbeats this server handled as leader (a follower forwards them: csisupd_server_forwarded_requests_total).",
		}),
		forwarded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "csisupd_server_forwarded_requests_total",
			Help: "Requests this server forwarded to the leader, by full gRPC method name.",
		}, []string{"method"}),
		bootstrapExpect: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "csisupd_server_bootstrap_expect",
			Help: "The number of servers the cluster is configured with (server.bootstrap_expect).",
		}),
		reg: reg,
	}
	m.bootstrapExpect.Set(float64(s.cfg.BootstrapExpect))
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.heartbeats, m.forwarded, m.bootstrapExpect, &stateCollector{s: s}} {
		if err := reg.Register(c); err != nil {
			m.close()
			return nil, fmt.Errorf("server: metrics: %w", err)
		}
		m.registered = append(m.registered, c)
	}
	if err := m.installRaftMetrics(); err != nil {
		m.close()
		return nil, err
	}
	return m, nil
}

// installRaftMetrics routes raft's own metrics (csisupd_raft_*) to a
// Prometheus sink registered in m.reg. hashicorp/raft reports them only
// to go-metrics' process-wide global, so this is the one global the
// server sets: the last server created in a process owns it, and a
// server that stops while it still owns it puts back a sink that drops
// everything.
func (m *serverMetrics) installRaftMetrics() error {
	sink, err := gometricsprom.NewPrometheusSinkFrom(gometricsprom.PrometheusOpts{
		// Series raft stops updating (a peer that left, a follower's
		// leader-only timings) disappear after the default minute.
		Expiration: gometricsprom.DefaultPrometheusOpts.Expiration,
		// Set, so the sink never registers in Prometheus' default registry.
		Registerer: m.reg,
		// The name of the sink's placeholder descriptor; never exported.
		Name: "csisupd_raft_go_metrics_sink",
	})
	if err != nil {
		return fmt.Errorf("server: raft metrics sink: %w", err)
	}
	m.registered = append(m.registered, sink)
	global, err := gometrics.NewGlobal(raftMetricsConfig(), sink)
	if err != nil {
		return fmt.Errorf("server: raft metrics: %w", err)
	}
	m.raftGlobal = global
	return nil
}

// raftMetricsConfig is the go-metrics configuration of raft's metrics:
// the csisupd prefix, no hostname in names, and no runtime metrics (the
// go_* collector of client_golang reports those, and go-metrics' would
// start a goroutine of its own).
func raftMetricsConfig() *gometrics.Config {
	c := gometrics.DefaultConfig(raftMetricsService)
	c.EnableHostname = false
	c.HostName = ""
	c.EnableRuntimeMetrics = false
	return c
}

// close unregisters what the server registered, so that a new server can
// register in the same registry, and gives go-metrics' global back to a
// sink that drops everything if this server still owns it.
func (m *serverMetrics) close() {
	if m.raftGlobal != nil && gometrics.Default() == m.raftGlobal {
		// Errors come from sinks' URLs only; a blackhole sink has none.
		_, _ = gometrics.NewGlobal(raftMetricsConfig(), &gometrics.BlackholeSink{})
	}
	m.raftGlobal = nil
	for _, c := range m.registered {
		m.reg.Unregister(c)
	}
	m.registered = nil
}

// countForwarded counts one request forwarded to the leader. ctx is the
// request's server context, which names the method.
func (m *serverMetrics) countForwarded(ctx context.Context) {
	method, ok := grpc.Method(ctx)
	if !ok {
		method = "unknown"
	}
	m.forwarded.WithLabelValues(method).Inc()
}

var (
	leaderDesc = prometheus.NewDesc("csisupd_server_leader",
		"1 when this server is the raft leader, else 0.", nil, nil)
	commitIndexDesc = prometheus.NewDesc("csisupd_server_raft_commit_index",
		"The raft index this server knows to be committed.", nil, nil)
	appliedIndexDesc = prometheus.NewDesc("csisupd_server_raft_applied_index",
		"The raft index this server last gave to its state machine.", nil, nil)
	lastIndexDesc = prometheus.NewDesc("csisupd_server_raft_last_index",
		"The index of the last entry in this server's raft log or snapshot.", nil, nil)
	lastContactDesc = prometheus.NewDesc("csisupd_server_raft_last_contact_seconds",
		"Seconds since this follower last heard from the leader; 0 on the leader, absent before a follower's first contact.", nil, nil)
	peersDesc = prometheus.NewDesc("csisupd_server_raft_peers",
		"Servers in the raft configuration, by suffrage.", []string{"suffrage"}, nil)
	nodesDesc = prometheus.NewDesc("csisupd_cluster_nodes",
		"Nodes in the replicated state, by status.", []string{"status"}, nil)
	timersDesc = prometheus.NewDesc("csisupd_cluster_heartbeat_timers",
		"Node heartbeat TTL timers this server holds (only the leader holds any).", nil, nil)
	pluginsDesc = prometheus.NewDesc("csisupd_cluster_plugins",
		"Plugin ids known to the cluster.", nil, nil)
	volumesDesc = prometheus.NewDesc("csisupd_cluster_volumes",
		"Volumes in the replicated state.", nil, nil)
	claimsDesc = prometheus.NewDesc("csisupd_cluster_claims",
		"Volume claims in the replicated state, by state.", []string{"state"}, nil)
	snapshotsDesc = prometheus.NewDesc("csisupd_cluster_volume_snapshots",
		"Volume snapshots in the replicated state, by state (creating, created, created-not-ready, deleting).", []string{"state"}, nil)
	expansionsDesc = prometheus.NewDesc("csisupd_cluster_volume_expansions",
		"Volume expansions under way, by state (controller, nodes).", []string{"state"}, nil)
	abnormalDesc = prometheus.NewDesc("csisupd_cluster_volumes_abnormal",
		"Volumes with an abnormal health condition reported by their controller or a node.", nil, nil)
	unavailableDesc = prometheus.NewDesc("csisupd_cluster_volumes_unavailable",
		"Volumes an operator keeps from new claims, by availability (pause, drain).", []string{"availability"}, nil)
)

// stateCollector reports the server's raft and cluster state at scrape
// time. Reads from the state are local, so a follower's may trail the
// leader's.
type stateCollector struct {
	s *Server
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{leaderDesc, commitIndexDesc, appliedIndexDesc, lastIndexDesc,
		lastContactDesc, peersDesc, nodesDesc, timersDesc, pluginsDesc, volumesDesc, claimsDesc, snapshotsDesc, expansionsDesc,
		abnormalDesc, unavailableDesc} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	leader := s.IsLeader()
	gauge(leaderDesc, boolGauge(leader))
	gauge(commitIndexDesc, float64(s.node.Raft().CommitIndex()))
	gauge(appliedIndexDesc, float64(s.node.Raft().AppliedIndex()))
	gauge(lastIndexDesc, float64(s.node.Raft().LastIndex()))
	if leader {
		gauge(lastContactDesc, 0)
	} else if lc := s.node.Raft().LastContact(); !lc.IsZero() {
		gauge(lastContactDesc, time.Since(lc).Seconds())
	}
	peers := map[string]int{raftnode.SuffrageVoter: 0, raftnode.SuffrageNonvoter: 0}
	if conf, err := s.Configuration(); err == nil {
		for _, srv := range conf.Servers {
			if srv.Suffrage == raft.Voter {
				peers[raftnode.SuffrageVoter]++
			} else {
				// Staging, raft's old name for a nonvoter catching up.
				peers[raftnode.SuffrageNonvoter]++
			}
		}
	}
	for suffrage, n := range peers {
		gauge(peersDesc, float64(n), suffrage)
	}
	gauge(timersDesc, float64(s.heartbeats.Count()))

	// Every known status and state is reported, 0 when none is in it.
	n := s.State().Counts()
	nodes := map[string]int{state.NodeStatusReady: 0, state.NodeStatusDown: 0}
	claims := map[string]int{cl.StateTaken: 0, cl.StateUnpublishing: 0,
		cl.StateNodeUnpublished: 0, cl.StateControllerUnpublished: 0}
	maps.Copy(nodes, n.Nodes)
	maps.Copy(claims, n.Claims)
	for status, count := range nodes {
		gauge(nodesDesc, float64(count), status)
	}
	gauge(pluginsDesc, float64(n.Plugins))
	gauge(volumesDesc, float64(n.Volumes))
	for st, count := range claims {
		gauge(claimsDesc, float64(count), st)
	}
	snapshots := map[string]int{cl.SnapshotCreating: 0, cl.SnapshotCreated: 0, state.SnapshotNotReady: 0, cl.SnapshotDeleting: 0}
	maps.Copy(snapshots, n.Snapshots)
	for st, count := range snapshots {
		gauge(snapshotsDesc, float64(count), st)
	}
	expansions := map[string]int{cl.ExpansionController: 0, cl.ExpansionNodes: 0}
	maps.Copy(expansions, n.Expansions)
	for st, count := range expansions {
		gauge(expansionsDesc, float64(count), st)
	}
	gauge(abnormalDesc, float64(n.Abnormal))
	gauge(unavailableDesc, float64(n.Paused), cl.AvailabilityPause)
	gauge(unavailableDesc, float64(n.Draining), cl.AvailabilityDrain)
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
