package agent

import (
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"runtime"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// newHTTPHandler serves /v1/health (liveness), /v1/ready (readiness),
// with telemetry.prometheus_metrics /metrics (Prometheus) and, while
// enable_debug is set, Go's runtime profiles under /debug/pprof/.
func (a *Agent) newHTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", a.serveHealth)
	mux.HandleFunc("GET /v1/ready", a.serveReady)
	// net/http/pprof's handlers, on this mux only. The package also adds
	// them to http.DefaultServeMux when imported (its init), which the
	// agent never serves.
	debug := a.debug.Load
	mux.Handle("/debug/pprof/", whenDebug(debug, http.HandlerFunc(pprof.Index)))
	mux.Handle("/debug/pprof/cmdline", whenDebug(debug, http.HandlerFunc(pprof.Cmdline)))
	mux.Handle("/debug/pprof/profile", whenDebug(debug, http.HandlerFunc(pprof.Profile)))
	mux.Handle("/debug/pprof/symbol", whenDebug(debug, http.HandlerFunc(pprof.Symbol)))
	mux.Handle("/debug/pprof/trace", whenDebug(debug, http.HandlerFunc(pprof.Trace)))
	if !a.cfg.Telemetry.PrometheusMetrics {
		return mux
	}
	a.metrics.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "csisupd_agent_info",
			Help: "Always 1; the labels describe the agent.",
			ConstLabels: prometheus.Labels{
				"version": a.version, "go_version": runtime.Version(),
				"server": strconv.FormatBool(a.server != nil), "client": strconv.FormatBool(a.cfg.Client.Enabled),
			},
		}, func() float64 { return 1 }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "csisupd_agent_ready",
			Help: "1 when /v1/ready answers 200, else 0.",
		}, func() float64 {
			if ok, _ := a.readiness(); ok {
				return 1
			}
			return 0
		}),
	)
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.metrics, promhttp.HandlerOpts{}))
	return mux
}

// serveHealth is liveness: 200 while the agent serves and every
// supervision loop turns, 503 while it starts or when a loop is wedged
// (the case in which systemd's watchdog restarts it).
func (a *Agent) serveHealth(w http.ResponseWriter, _ *http.Request) {
	select {
	case <-a.ready:
	default:
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "starting"})
		return
	}
	if stale := a.watchdog.Stale(); len(stale) > 0 {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "stalled", "stalled_loops": stale})
		return
	}
	total, healthy := a.pluginCounts()
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "plugins": total, "healthy_plugins": healthy})
}

// serveReady is readiness, for load balancers and probes: 200 once the
// agent serves, its first plugin scan is done and, on a server, a leader
// is known.
func (a *Agent) serveReady(w http.ResponseWriter, _ *http.Request) {
	ok, reason := a.readiness()
	body := map[string]any{"ready": ok}
	code := http.StatusOK
	if !ok {
		body["reason"], code = reason, http.StatusServiceUnavailable
	}
	writeJSON(w, code, body)
}

// readiness reports whether the agent is ready, and why not.
func (a *Agent) readiness() (bool, string) {
	select {
	case <-a.ready:
	default:
		return false, "starting: first plugin scan not done"
	}
	if a.server != nil && a.server.Leader() == "" {
		return false, "no cluster leader"
	}
	return true, ""
}

func (a *Agent) pluginCounts() (total, healthy int) {
	for _, p := range a.manager.Registry().List() {
		total++
		if p.Healthy() {
			healthy++
		}
	}
	return total, healthy
}

func writeJSON(w http.ResponseWriter, code int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
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
