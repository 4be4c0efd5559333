package rpc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// TagConns returns ln whose connections each carry a process-unique id in
// their remote address, which gRPC hands to every stream on the
// connection as its peer address: the Agent service counts event streams
// per connection by that id. Serve the Agent service on a listener from
// TagConns.
//
// Without it the service falls back to the peer address, which names one
// connection on a TCP listener (a remote ip:port pair is unique among the
// live connections to one local address) but not on a unix socket or an
// in-memory listener, where every peer has the same address: there the
// per-connection cap would act as a second global cap. The id is given
// once per connection, at accept, so that calls pay nothing for it (a
// gRPC stats handler, which did this before, made gRPC build its stats
// events on every call: 18 allocations each).
func TagConns(ln net.Listener) net.Listener { return &taggingListener{Listener: ln} }

// taggingListener is TagConns' listener.
type taggingListener struct {
	net.Listener
	last atomic.Uint64
}

// Accept accepts a connection and gives it the next id.
func (l *taggingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &taggedConn{Conn: c, remote: taggedAddr{addr: c.RemoteAddr(), id: l.last.Add(1)}}, nil
}

// taggedConn is a connection whose remote address carries its id.
type taggedConn struct {
	net.Conn
	remote taggedAddr
}

// RemoteAddr returns the connection's remote address with its id.
func (c *taggedConn) RemoteAddr() net.Addr { return c.remote }

// taggedAddr is a remote address and the id of its connection. It reads
// as the address alone.
type taggedAddr struct {
	addr net.Addr // nil when the connection has none
	id   uint64
}

// Network returns the address's network.
func (a taggedAddr) Network() string {
	if a.addr == nil {
		return "unknown"
	}
	return a.addr.Network()
}

// String returns the address.
func (a taggedAddr) String() string {
	if a.addr == nil {
		return "unknown"
	}
	return a.addr.String()
}

// connKey names the transport connection a stream arrived on: its
// TagConns id when the listener gave it one, else the peer address.
func connKey(ctx context.Context) any {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "unknown peer"
	}
	if a, ok := p.Addr.(taggedAddr); ok {
		return a.id
	}
	return p.Addr.Network() + " " + p.Addr.String()
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
