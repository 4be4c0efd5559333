package consulsync

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/csisupd/csisupd/internal/config"
)

// Write operations, as csisupd_consul_sync_writes_total's operation label
// names them: one per Consul agent endpoint the syncer writes to.
const (
	opServiceRegister   = "service_register"   // PUT /v1/agent/service/register
	opServiceDeregister = "service_deregister" // PUT /v1/agent/service/deregister/:id
	opCheckRegister     = "check_register"     // PUT /v1/agent/check/register
	opCheckUpdate       = "check_update"       // PUT /v1/agent/check/update/:id (TTL)
	opCheckDeregister   = "check_deregister"   // PUT /v1/agent/check/deregister/:id
)

// Failure reasons, as csisupd_consul_sync_failures_total's reason label
// names them.
const (
	reasonUnreachable = "unreachable" // no connection, or it broke before an answer
	reasonForbidden   = "forbidden"   // HTTP 403: the ACL token is unknown or lacks a permission
	reasonRejected    = "rejected"    // any other error status from Consul
	reasonTimeout     = "timeout"     // RequestTimeout passed
	reasonOther       = "other"
)

// syncMetrics are the syncer's collectors.
type syncMetrics struct {
	passes      prometheus.Counter
	duration    prometheus.Histogram
	writes      *prometheus.CounterVec
	failures    *prometheus.CounterVec
	lastSuccess prometheus.Gauge
}

// newSyncMetrics creates the collectors, with every operation and reason
// at zero, and registers them in reg unless it is nil.
func newSyncMetrics(reg prometheus.Registerer) (*syncMetrics, error) {
	m := &syncMetrics{
		passes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "csisupd_consul_sync_passes_total",
			Help: "Consul sync passes run, failed or not (a pass cut short by shutdown is not counted).",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "csisupd_consul_sync_duration_seconds",
			Help:    "Duration of each Consul sync pass.",
			Buckets: config.LatencyBuckets(),
		}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "csisupd_consul_sync_writes_total",
			Help: "Writes the Consul agent accepted, by endpoint; a steady-state pass makes none.",
		}, []string{"operation"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "csisupd_consul_sync_failures_total",
			Help: "Failed Consul sync passes, by the reason of their first failed request.",
		}, []string{"reason"}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "csisupd_consul_sync_last_success_timestamp_seconds",
			Help: "Unix time of the end of the latest Consul sync pass that succeeded; 0 before the first.",
		}),
	}
	for _, op := range []string{opServiceRegister, opServiceDeregister, opCheckRegister, opCheckUpdate, opCheckDeregister} {
		m.writes.WithLabelValues(op)
	}
	for _, r := range []string{reasonUnreachable, reasonForbidden, reasonRejected, reasonTimeout, reasonOther} {
		m.failures.WithLabelValues(r)
	}
	if reg == nil {
		return m, nil
	}
	if err := errors.Join(
		reg.Register(m.passes), reg.Register(m.duration), reg.Register(m.writes),
		reg.Register(m.failures), reg.Register(m.lastSuccess),
	); err != nil {
		return nil, fmt.Errorf("consulsync: metrics: %w", err)
	}
	return m, nil
}

// wrote counts one accepted write.
func (m *syncMetrics) wrote(op string) { m.writes.WithLabelValues(op).Inc() }

// failureReason classifies a failed request (or the first request of a
// failed pass) for the failures counter.
func failureReason(err error) string {
	var pe *passError
	if errors.As(err, &pe) && len(pe.errs) > 0 {
		err = pe.errs[0]
	}
	switch code := statusCode(err); {
	case code == http.StatusForbidden:
		return reasonForbidden
	case code != 0:
		return reasonRejected
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return reasonTimeout
	}
	var (
		oe  *net.OpError
		dns *net.DNSError
	)
	if errors.As(err, &oe) || errors.As(err, &dns) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return reasonUnreachable
	}
	return reasonOther
}
