package agent

import (
	"encoding/json"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/csisupd/csisupd/internal/registry"
)

// newHTTPHandler serves /v1/health (200 once the agent serves, with plugin
// counts) and /metrics (Prometheus): pr holds the runtime collectors
// registered here and the series every component registered itself (the
// registry's plugin series among them, see registry.ManagerConfig.Metrics).
func newHTTPHandler(pr *prometheus.Registry, reg *registry.Registry, ready <-chan struct{}) http.Handler {
	pr.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(pr, promhttp.HandlerOpts{}))
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
