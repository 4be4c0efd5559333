package raftnode

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/csisupd/csisupd/internal/tlsutil"
)

// tcpLayer is raft's stream layer on a TCP listener bound to the raft
// port, advertising the configured raft address.
type tcpLayer struct {
	net.Listener
	advertise net.Addr
}

// newTCPLayer binds addr, which must name an address other servers can
// reach (not 0.0.0.0), as raft's own TCP transport requires.
func newTCPLayer(addr string) (*tcpLayer, error) {
	adv, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("server: raft address %q: %w", addr, err)
	}
	if adv.IP == nil || adv.IP.IsUnspecified() {
		return nil, fmt.Errorf("server: raft address %q is not an address other servers can reach", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("server: raft transport on %s: %w", addr, err)
	}
	return &tcpLayer{Listener: ln, advertise: adv}, nil
}

func (l *tcpLayer) Addr() net.Addr { return l.advertise }

func (l *tcpLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return net.DialTimeout("tcp", string(addr), timeout)
}

// tlsLayer carries raft over TLS with server certificates on both ends: it
// accepts only peers whose verified certificate has the server role (a
// plain-text connection, or one with a client or CLI certificate, is
// refused and logged by the listener), and dials only peers that prove the
// server role. Certificates come from the Configurator at each handshake,
// so a reload applies to new raft connections.
type tlsLayer struct {
	net.Listener // the role-checking TLS listener over inner; closing it closes inner
	inner        raft.StreamLayer
	conf         *tlsutil.Configurator
}

// raftHandshakeTimeout bounds one TLS handshake on the raft port.
const raftHandshakeTimeout = 10 * time.Second

func newTLSLayer(inner raft.StreamLayer, conf *tlsutil.Configurator, logger hclog.Logger) *tlsLayer {
	return &tlsLayer{
		Listener: tlsutil.NewListener(inner, tlsutil.ListenerConfig{
			TLS:              conf.IncomingConfig(),
			Region:           conf.Region(),
			RequireRole:      tlsutil.RoleServer,
			HandshakeTimeout: raftHandshakeTimeout,
			Logger:           logger,
		}),
		inner: inner,
		conf:  conf,
	}
}

func (l *tlsLayer) Addr() net.Addr { return l.inner.Addr() }

func (l *tlsLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	start := time.Now()
	raw, err := l.inner.Dial(addr, timeout)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(timeout-time.Since(start), time.Millisecond))
	defer cancel()
	conn := tls.Client(raw, l.conf.OutgoingConfig(tlsutil.RoleServer))
	if err := conn.HandshakeContext(ctx); err != nil {
		_ = raw.Close()
		return nil, fmt.Errorf("raft TLS handshake with %s: %w", addr, err)
	}
	return conn, nil
}

// closingLayer closes every connection it accepted or dialled when it is
// closed. Raft's network transport closes only the listener at shutdown:
// the goroutine serving each incoming connection would live on until the
// peer hung up, and pooled outgoing connections would stay open, so a
// stopped server would hold sockets and goroutines, and keep its peers'
// goroutines blocked on them.
type closingLayer struct {
	raft.StreamLayer

	mu     sync.Mutex
	closed bool
	conns  map[*layerConn]struct{}
}

func newClosingLayer(inner raft.StreamLayer) *closingLayer {
	return &closingLayer{StreamLayer: inner, conns: map[*layerConn]struct{}{}}
}

// Accept returns the next incoming connection, tracked until it closes.
func (l *closingLayer) Accept() (net.Conn, error) {
	c, err := l.StreamLayer.Accept()
	if err != nil {
		return nil, err
	}
	return l.track(c)
}

// Dial connects to a peer; the connection is tracked until it closes.
func (l *closingLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	c, err := l.StreamLayer.Dial(addr, timeout)
	if err != nil {
		return nil, err
	}
	return l.track(c)
}

func (l *closingLayer) track(c net.Conn) (net.Conn, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		_ = c.Close()
		return nil, net.ErrClosed
	}
	tc := &layerConn{Conn: c, layer: l}
	l.conns[tc] = struct{}{}
	return tc, nil
}

// Close closes the listener and every tracked connection.
func (l *closingLayer) Close() error {
	l.mu.Lock()
	l.closed = true
	conns := make([]*layerConn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	l.mu.Unlock()
	err := l.StreamLayer.Close()
	for _, c := range conns {
		_ = c.Close()
	}
	return err
}

// layerConn is a connection of a closingLayer; closing it untracks it.
type layerConn struct {
	net.Conn
	layer *closingLayer
	once  sync.Once
}

func (c *layerConn) Close() error {
	c.once.Do(func() {
		c.layer.mu.Lock()
		delete(c.layer.conns, c)
		c.layer.mu.Unlock()
	})
	return c.Conn.Close()
}
