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
	mu          sync.Mutex
	blocked     bool
	raftBlocked bool              // only raft is cut off; RPCs pass
	conns       map[net.Conn]bool // true for raft connections
}

func newNetGate() *netGate { return &netGate{conns: map[net.Conn]bool{}} }

// setBlocked changes the partition state; blocking closes every connection,
// raft's first: a killed leader must not commit anything after the kill,
// and closing its RPC connections cancels calls in flight, whose failure
// handling would write through a raft connection not yet closed.
func (g *netGate) setBlocked(b bool) {
	g.mu.Lock()
	g.blocked = b
	g.closeCutLocked()
}

// setRaftBlocked cuts (or restores) only the raft connections: the server
// keeps serving RPCs while it hears from no other server.
func (g *netGate) setRaftBlocked(b bool) {
	g.mu.Lock()
	g.raftBlocked = b
	g.closeCutLocked()
}

// closeCutLocked closes, raft's first, the connections the gate's state
// now cuts, and unlocks mu before closing them.
func (g *netGate) closeCutLocked() {
	var raftConns, others []net.Conn
	for c, isRaft := range g.conns {
		switch {
		case !g.cutLocked(isRaft):
		case isRaft:
			raftConns = append(raftConns, c)
		default:
			others = append(others, c)
		}
	}
	g.mu.Unlock()
	for _, c := range append(raftConns, others...) {
		c.Close()
	}
}

// cutLocked reports whether a connection, a raft one when isRaft, is cut
// off. The caller holds mu.
func (g *netGate) cutLocked(isRaft bool) bool {
	return g.blocked || isRaft && g.raftBlocked
}

// isBlocked reports whether a connection, a raft one when isRaft, is cut
// off.
func (g *netGate) isBlocked(isRaft bool) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.cutLocked(isRaft)
}

// track registers c, a raft connection when isRaft, or closes it and
// returns false when blocked.
func (g *netGate) track(c net.Conn, isRaft bool) (net.Conn, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cutLocked(isRaft) {
		c.Close()
		return nil, false
	}
	tc := &trackedConn{Conn: c, gate: g}
	g.conns[tc] = isRaft
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
	raft bool // it is the raft listener
}

func (l *gatedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if tc, ok := l.gate.track(c, l.raft); ok {
			return tc, nil
		}
	}
}

// dial connects from the gated server to addr, failing while partitioned
// or when the target is partitioned; isRaft marks a raft connection.
func (g *netGate) dial(ctx context.Context, target *netGate, addr string, isRaft bool) (net.Conn, error) {
	if g.isBlocked(isRaft) || (target != nil && target.isBlocked(isRaft)) {
		return nil, fmt.Errorf("dial %s: %w", addr, errPartitioned)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	tc, ok := g.track(c, isRaft)
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
	return l.gate.dial(ctx, l.lookup(string(addr)), string(addr), true)
}
