package testcluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// errPartitioned is returned by dials of a partitioned server.
var errPartitioned = errors.New("testcluster: network partitioned")

// netGate tracks one server's connections and cuts them when the server is
// partitioned.
type netGate struct {
	mu      sync.Mutex
	blocked bool
	conns   map[net.Conn]struct{}
}

func newNetGate() *netGate { return &netGate{conns: map[net.Conn]struct{}{}} }

// setBlocked changes the partition state; blocking closes every connection.
func (g *netGate) setBlocked(b bool) {
	g.mu.Lock()
	g.blocked = b
	var conns []net.Conn
	if b {
		for c := range g.conns {
			conns = append(conns, c)
		}
	}
	g.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

func (g *netGate) isBlocked() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.blocked
}

// track registers c, or closes it and returns false when blocked.
func (g *netGate) track(c net.Conn) (net.Conn, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.blocked {
		c.Close()
		return nil, false
	}
	tc := &trackedConn{Conn: c, gate: g}
	g.conns[tc] = struct{}{}
	return tc, true
}

type trackedConn struct {
	net.Conn
	gate *netGate
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.gate.mu.Lock()
		delete(c.gate.conns, c)
		c.gate.mu.Unlock()
	})
	return c.Conn.Close()
}

// gatedListener closes connections accepted while the gate is blocked.
type gatedListener struct {
	net.Listener
	gate *netGate
}

func (l *gatedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if tc, ok := l.gate.track(c); ok {
			return tc, nil
		}
	}
}

// dial connects from the gated server to addr, failing while partitioned
// or when the target is partitioned.
func (g *netGate) dial(ctx context.Context, target *netGate, addr string) (net.Conn, error) {
	if g.isBlocked() || (target != nil && target.isBlocked()) {
		return nil, fmt.Errorf("dial %s: %w", addr, errPartitioned)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	tc, ok := g.track(c)
	if !ok {
		return nil, fmt.Errorf("dial %s: %w", addr, errPartitioned)
	}
	return tc, nil
}

// raftLayer is a raft.StreamLayer over a pre-bound listener whose
// connections pass through a gate.
type raftLayer struct {
	*gatedListener
	gate   *netGate
	lookup func(addr string) *netGate
}

var _ raft.StreamLayer = (*raftLayer)(nil)

func (l *raftLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return l.gate.dial(ctx, l.lookup(string(addr)), string(addr))
}
