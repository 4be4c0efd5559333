package rpc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// ConnTagger is a gRPC stats.Handler that gives every transport connection
// a process-unique id, carried by the context of each stream on it. The
// Agent service counts event streams per connection by that id. Install it
// with grpc.StatsHandler(&rpc.ConnTagger{}) on the server that serves the
// Agent service.
//
// Without it the service falls back to the peer address, which names one
// connection on a TCP listener (a remote ip:port pair is unique among the
// live connections to one local address) but not on a unix socket or an
// in-memory listener, where every peer has the same address: there the
// per-connection cap would act as a second global cap.
type ConnTagger struct {
	last atomic.Uint64
}

// connIDKey is the context key of the connection id.
type connIDKey struct{}

// TagConn stores a new connection id in the connection's context.
func (c *ConnTagger) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return context.WithValue(ctx, connIDKey{}, c.last.Add(1))
}

// HandleConn does nothing: the id is all the tagger is for.
func (*ConnTagger) HandleConn(context.Context, stats.ConnStats) {}

// TagRPC returns ctx unchanged.
func (*ConnTagger) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

// HandleRPC does nothing.
func (*ConnTagger) HandleRPC(context.Context, stats.RPCStats) {}

// connKey names the transport connection a stream arrived on: the
// ConnTagger id when the server has one, else the peer address.
func connKey(ctx context.Context) any {
	if id, ok := ctx.Value(connIDKey{}).(uint64); ok {
		return id
	}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.Network() + " " + p.Addr.String()
	}
	return "unknown peer"
}

// subscriberLimits counts the open event streams, in all and per
// connection, and refuses a new one beyond either cap. Counting is a few
// map operations under a mutex taken once when a stream opens and once
// when it ends, never per event.
type subscriberLimits struct {
	mu      sync.Mutex
	max     int // client.max_event_subscribers
	perConn int // client.max_event_subscribers_per_connection
	total   int
	conns   map[any]int // open streams per connection; no zero entries
}

func newSubscriberLimits(total, perConn int) *subscriberLimits {
	l := &subscriberLimits{conns: make(map[any]int)}
	l.set(total, perConn)
	return l
}

// set changes the caps, which the caller has validated (positive).
// Streams already open stay open even when they are now beyond a cap.
func (l *subscriberLimits) set(total, perConn int) {
	l.mu.Lock()
	l.max, l.perConn = total, perConn
	l.mu.Unlock()
}

// acquire admits one stream of ctx's connection, or returns a
// ResourceExhausted status naming the cap and its configuration key. The
// caller must call release once the stream ends.
func (l *subscriberLimits) acquire(ctx context.Context) (release func(), err error) {
	key := connKey(ctx)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.total >= l.max {
		return nil, status.Errorf(codes.ResourceExhausted,
			"too many event streams: the agent serves at most %d at a time (client.max_event_subscribers); close one or raise the limit", l.max)
	}
	if l.conns[key] >= l.perConn {
		return nil, status.Errorf(codes.ResourceExhausted,
			"too many event streams on one connection: at most %d per connection (client.max_event_subscribers_per_connection); close one or raise the limit", l.perConn)
	}
	l.total++
	l.conns[key]++
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.total--
		if l.conns[key]--; l.conns[key] == 0 {
			delete(l.conns, key)
		}
	}, nil
}

// open returns the number of open streams and of connections with one.
func (l *subscriberLimits) open() (streams, conns int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total, len(l.conns)
}

// subscriberMetrics are the event streams' series: the open streams,
// read from the limits at scrape time (they count them already), and the
// streams ended because they fell behind.
type subscriberMetrics struct {
	limits  *subscriberLimits
	open    *prometheus.Desc
	dropped prometheus.Counter
}

func newSubscriberMetrics(limits *subscriberLimits) *subscriberMetrics {
	return &subscriberMetrics{
		limits: limits,
		open: prometheus.NewDesc("csisupd_event_subscribers",
			"Open event stream subscriptions (WatchEvents).", nil, nil),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "csisupd_event_subscribers_dropped_total",
			Help: "Event stream subscriptions ended because they fell behind the event log (EventsFellBehind, or EventsGone after they started).",
		}),
	}
}

// register registers the series with r; nil registers nothing.
func (m *subscriberMetrics) register(r prometheus.Registerer) error {
	if r == nil {
		return nil
	}
	if err := errors.Join(r.Register(m), r.Register(m.dropped)); err != nil {
		return fmt.Errorf("rpc: event stream metrics: %w", err)
	}
	return nil
}

// Describe implements prometheus.Collector for the open streams.
func (m *subscriberMetrics) Describe(ch chan<- *prometheus.Desc) { ch <- m.open }

// Collect implements prometheus.Collector for the open streams.
func (m *subscriberMetrics) Collect(ch chan<- prometheus.Metric) {
	streams, _ := m.limits.open()
	ch <- prometheus.MustNewConstMetric(m.open, prometheus.GaugeValue, float64(streams))
}
