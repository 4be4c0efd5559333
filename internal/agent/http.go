package agent

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/csisupd/csisupd/internal/registry"
)

// newHTTPHandler serves /v1/health (200 once the agent serves, with plugin
// counts), /metrics (Prometheus) and, while debug reports true
// (enable_debug), Go's runtime profiles under /debug/pprof/.
func newHTTPHandler(pr *prometheus.Registry, reg *registry.Registry, ready <-chan struct{}, debug func() bool) http.Handler {
	pr.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		newPluginCollector(reg),
	)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(pr, promhttp.HandlerOpts{}))
	// net/http/pprof's handlers, on this mux only. The package also adds
	// them to http.DefaultServeMux when imported (its init), which the
	// agent never serves.
	mux.Handle("/debug/pprof/", whenDebug(debug, http.HandlerFunc(pprof.Index)))
	mux.Handle("/debug/pprof/cmdline", whenDebug(debug, http.HandlerFunc(pprof.Cmdline)))
	mux.Handle("/debug/pprof/profile", whenDebug(debug, http.HandlerFunc(pprof.Profile)))
	mux.Handle("/debug/pprof/symbol", whenDebug(debug, http.HandlerFunc(pprof.Symbol)))
	mux.Handle("/debug/pprof/trace", whenDebug(debug, http.HandlerFunc(pprof.Trace)))
	mux.HandleFunc("GET /v1/health", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		body := map[string]any{"status": "starting"}
		code := http.StatusServiceUnavailable
		select {
		case <-ready:
			code = http.StatusOK
			total, healthy := 0, 0
			for _, p := range reg.List() {
				total++
				if p.Healthy() {
					healthy++
				}
			}
			body = map[string]any{"status": "ok", "plugins": total, "healthy_plugins": healthy}
		default:
		}
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(body)
	})
	return mux
}

// whenDebug serves h while debug reports true, else 404, as if the path
// did not exist: enable_debug can change on reload.
func whenDebug(debug func() bool, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !debug() {
			http.NotFound(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// pluginCollector exports the registry at scrape time, so the registry
// carries no metrics code and an unscraped agent pays nothing.
type pluginCollector struct {
	reg     *registry.Registry
	healthy *prometheus.Desc
	events  *prometheus.Desc
}

func newPluginCollector(reg *registry.Registry) *pluginCollector {
	return &pluginCollector{
		reg: reg,
		healthy: prometheus.NewDesc("csisupd_plugin_healthy",
			"1 when the plugin's latest probe was healthy, else 0.",
			[]string{"plugin_id", "type", "vendor_name", "vendor_version"}, nil),
		events: prometheus.NewDesc("csisupd_plugin_events_total",
			"Plugin events emitted since the agent started.", nil, nil),
	}
}

func (c *pluginCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.healthy
	ch <- c.events
}

func (c *pluginCollector) Collect(ch chan<- prometheus.Metric) {
	for _, p := range c.reg.List() {
		v := 0.0
		if p.Healthy() {
			v = 1
		}
		fp := p.Fingerprint
		ch <- prometheus.MustNewConstMetric(c.healthy, prometheus.GaugeValue, v,
			p.ID, string(fp.Type), fp.VendorName, fp.VendorVersion)
	}
	_, last := c.reg.EventLog().Range() // the latest index; copies nothing
	ch <- prometheus.MustNewConstMetric(c.events, prometheus.CounterValue, float64(last))
}
