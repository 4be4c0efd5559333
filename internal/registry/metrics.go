package registry

import (
	"context"
	"errors"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/plugin"
)

// Probe failure reasons, the reason label of
// csisupd_plugin_probe_failures_total.
const (
	// reasonTimeout: the probe ran into its timeout.
	reasonTimeout = "timeout"
	// reasonUnreachable: no connection to the plugin (refused, socket
	// gone, connection broken).
	reasonUnreachable = "unreachable"
	// reasonNotReady: the plugin answered ready=false.
	reasonNotReady = "not_ready"
	// reasonProtocol: the answer violated the gRPC protocol
	// (csiclient.IsProtocolViolation).
	reasonProtocol = "protocol"
	// reasonError: the plugin answered with any other error.
	reasonError = "error"
)

// probeBuckets are the buckets of the per-plugin probe histogram: fewer
// than config.LatencyBuckets, since each bucket is one series per plugin in
// every scrape. A probe that times out is counted as a failure by reason
// as well.
func probeBuckets() []float64 {
	return []float64{.001, .005, .01, .05, .25, 1, 5}
}

// metrics are a registry's Prometheus series that are counted as things
// happen. Every Registry has its own set, created by New and updated
// whether or not anything scrapes it, so no code path asks whether
// metrics are on; the Manager filling the registry registers them
// (ManagerConfig.Metrics, through register) together with
// managerCollector, which reads the rest at scrape time.
//
// Series labelled by plugin_id are created when the plugin is registered
// and deleted when it is deregistered (forget), so their number is bounded
// by the plugins on the node, not by every plugin the agent ever saw. They
// are kept only once the metrics are registered: with metrics off, 1,000
// plugins would otherwise hold about 2 MiB of histograms nothing reads.
type metrics struct {
	perPlugin atomic.Bool // set by register: the plugin_id series are kept

	probeDuration      *prometheus.HistogramVec // plugin_id
	probeFailures      *prometheus.CounterVec   // plugin_id, reason
	lastHealthy        *prometheus.GaugeVec     // plugin_id
	transitions        *prometheus.CounterVec   // plugin_id, to
	fingerprintTime    prometheus.Histogram
	fingerprintChanges *prometheus.CounterVec // plugin_id
	coalesced          prometheus.Counter
	scans              prometheus.Counter
	scanDuration       prometheus.Histogram
}

func newMetrics() *metrics {
	return &metrics{
		probeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "csisupd_plugin_probe_duration_seconds",
			Help:    "Duration of each probe of the plugin (CSI Probe), failed ones included.",
			Buckets: probeBuckets(),
		}, []string{"plugin_id"}),
		probeFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "csisupd_plugin_probe_failures_total",
			Help: "Probes that found the plugin unhealthy, by reason: timeout, unreachable, not_ready, protocol or error.",
		}, []string{"plugin_id", "reason"}),
		lastHealthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "csisupd_plugin_last_healthy_probe_timestamp_seconds",
			Help: "Unix time of the plugin's latest healthy probe; absent before the first.",
		}, []string{"plugin_id"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "csisupd_plugin_health_transitions_total",
			Help: "Changes of the plugin's health state (plugin-healthy and plugin-unhealthy events), by the state changed to.",
		}, []string{"plugin_id", "to"}),
		// One histogram for every plugin: a fingerprint is taken every few
		// minutes, and 17 series per plugin would be most of a large
		// node's scrape.
		fingerprintTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "csisupd_plugin_fingerprint_duration_seconds",
			Help:    "Duration of each fingerprint of a plugin, failed ones included, all plugins of the node together.",
			Buckets: config.LatencyBuckets(),
		}),
		fingerprintChanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "csisupd_plugin_fingerprint_changes_total",
			Help: "Fingerprints that differed from the plugin's previous one (plugin-fingerprint-changed events).",
		}, []string{"plugin_id"}),
		coalesced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "csisupd_plugin_updates_coalesced_total",
			Help: "Registry changes folded into a notification still pending for a subscriber that had not read it yet.",
		}),
		scans: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "csisupd_watcher_scans_total",
			Help: "Full scans of the plugin directory.",
		}),
		scanDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "csisupd_watcher_scan_duration_seconds",
			Help:    "Duration of each full scan of the plugin directory.",
			Buckets: config.LatencyBuckets(),
		}),
	}
}

// register registers every collector of m with r and from then on keeps
// the series labelled by plugin_id.
func (m *metrics) register(r prometheus.Registerer) error {
	var errs []error
	for _, c := range []prometheus.Collector{m.probeDuration, m.probeFailures, m.lastHealthy, m.transitions,
		m.fingerprintTime, m.fingerprintChanges, m.coalesced, m.scans, m.scanDuration} {
		errs = append(errs, r.Register(c))
	}
	m.perPlugin.Store(true)
	return errors.Join(errs...)
}

// label returns s as a label value. Prometheus refuses label values that
// are not valid UTF-8 (it panics in WithLabelValues), and a plugin id, as
// read from a directory name, or a vendor name from a plugin's answer
// need not be: their invalid bytes are written \xNN, as on the wire.
func label(s string) string { return plugin.WireString(s) }

// added is called when plugin id is registered. Its series appear with
// their first observation: a zero series per plugin and counter would
// be a large node's scrape for nothing (the alerts read
// csisupd_plugin_healthy, which every plugin has).
func (m *metrics) added(string) {}

// forget deletes every series of plugin id: it was deregistered.
func (m *metrics) forget(id string) {
	id = label(id)
	m.probeDuration.DeleteLabelValues(id)
	m.probeFailures.DeletePartialMatch(prometheus.Labels{"plugin_id": id})
	m.lastHealthy.DeleteLabelValues(id)
	m.transitions.DeletePartialMatch(prometheus.Labels{"plugin_id": id})
	m.fingerprintChanges.DeleteLabelValues(id)
}

// probed records one probe of plugin id.
func (m *metrics) probed(id string, r heartbeat.Result) {
	if !m.perPlugin.Load() {
		return
	}
	id = label(id)
	m.probeDuration.WithLabelValues(id).Observe(r.Duration.Seconds())
	switch r.State {
	case heartbeat.Healthy:
		m.lastHealthy.WithLabelValues(id).Set(float64(r.At.UnixNano()) / 1e9)
	case heartbeat.Unhealthy:
		m.probeFailures.WithLabelValues(id, probeFailureReason(r.Err)).Inc()
	}
}

// transition records a change of plugin id's health to state to.
func (m *metrics) transition(id string, to heartbeat.State) {
	if m.perPlugin.Load() && (to == heartbeat.Healthy || to == heartbeat.Unhealthy) {
		m.transitions.WithLabelValues(label(id), string(to)).Inc()
	}
}

// fingerprintChanged records that plugin id's fingerprint changed.
func (m *metrics) fingerprintChanged(id string) {
	if !m.perPlugin.Load() {
		return
	}
	m.fingerprintChanges.WithLabelValues(label(id)).Inc()
}

// fingerprinted records one fingerprint of plugin id that took d.
func (m *metrics) fingerprinted(_ string, d time.Duration) {
	m.fingerprintTime.Observe(d.Seconds())
}

// scanned records one full scan of the plugin directory that took d.
func (m *metrics) scanned(d time.Duration) {
	m.scans.Inc()
	m.scanDuration.Observe(d.Seconds())
}

// probeFailureReason says why a probe that found the plugin unhealthy
// failed, from the Probe call's error: none means the plugin answered
// ready=false. A protocol violation is looked for first, since csiclient
// gives it a status code (Internal, Unavailable) that would otherwise
// pass for another reason.
func probeFailureReason(err error) string {
	if err == nil {
		return reasonNotReady
	}
	if csiclient.IsProtocolViolation(err) {
		return reasonProtocol
	}
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
		return reasonUnreachable
	}
	st, ok := status.FromError(err)
	if !ok {
		// A bare context error still says what happened.
		st = status.FromContextError(err)
	}
	switch {
	case st.Code() == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded):
		return reasonTimeout
	case st.Code() == codes.Unavailable:
		return reasonUnreachable
	default:
		return reasonError
	}
}

// managerCollector reports at scrape time what the registry and the
// reconciler already hold, so nothing is counted twice and an unscraped
// agent pays nothing for it.
type managerCollector struct {
	reg       *Registry
	abandoned func() uint64

	healthy, events, plugins, abandonedDesc *prometheus.Desc
}

func newManagerCollector(reg *Registry, abandoned func() uint64) *managerCollector {
	return &managerCollector{
		reg:       reg,
		abandoned: abandoned,
		healthy: prometheus.NewDesc("csisupd_plugin_healthy",
			"1 when the plugin's latest probe was healthy, else 0.",
			[]string{"plugin_id", "type", "vendor_name", "vendor_version"}, nil),
		events: prometheus.NewDesc("csisupd_plugin_events_total",
			"Plugin events emitted since the agent started.", nil, nil),
		plugins: prometheus.NewDesc("csisupd_registry_plugins",
			"Plugins in the node's registry.", nil, nil),
		abandonedDesc: prometheus.NewDesc("csisupd_registry_abandoned_supervisors",
			"Plugin supervisors that did not stop in time and were left behind; each holds a goroutine and a plugin connection.",
			nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *managerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.healthy
	ch <- c.events
	ch <- c.plugins
	ch <- c.abandonedDesc
}

// Collect implements prometheus.Collector.
func (c *managerCollector) Collect(ch chan<- prometheus.Metric) {
	plugins := c.reg.List()
	for _, p := range plugins {
		v := 0.0
		if p.Healthy() {
			v = 1
		}
		fp := p.Fingerprint
		ch <- prometheus.MustNewConstMetric(c.healthy, prometheus.GaugeValue, v,
			label(p.ID), label(string(fp.Type)), label(fp.VendorName), label(fp.VendorVersion))
	}
	_, last := c.reg.EventLog().Range() // the latest index; copies nothing
	ch <- prometheus.MustNewConstMetric(c.events, prometheus.CounterValue, float64(last))
	ch <- prometheus.MustNewConstMetric(c.plugins, prometheus.GaugeValue, float64(len(plugins)))
	ch <- prometheus.MustNewConstMetric(c.abandonedDesc, prometheus.GaugeValue, float64(c.abandoned()))
}

// registerMetrics registers the registry's collectors and the manager's
// scrape-time collector with r.
func registerMetrics(r prometheus.Registerer, m *metrics, c *managerCollector) error {
	return errors.Join(m.register(r), r.Register(c))
}
