package csiclient

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
)

// watchedDialer dials unix sockets like gRPC's default dialer and wraps each
// connection so that the first failed read calls onDisconnect, unless we
// closed the connection ourselves.
func watchedDialer(onDisconnect func()) func(context.Context, string) (net.Conn, error) {
	var d net.Dialer
	return func(ctx context.Context, addr string) (net.Conn, error) {
		// gRPC hands custom dialers the target's address: the socket path,
		// possibly still carrying the "unix:" scheme.
		path := strings.TrimPrefix(strings.TrimPrefix(addr, "unix://"), "unix:")
		c, err := d.DialContext(ctx, "unix", path)
		if err != nil {
			return nil, err
		}
		return &watchedConn{Conn: c, onDisconnect: onDisconnect}, nil
	}
}

// watchedConn reports the first read error of a connection it did not close.
type watchedConn struct {
	net.Conn
	onDisconnect func()
	closed       atomic.Bool
	once         sync.Once
}

func (c *watchedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil && !c.closed.Load() {
		c.once.Do(c.onDisconnect)
	}
	return n, err
}

func (c *watchedConn) Close() error {
	c.closed.Store(true)
	return c.Conn.Close()
}
