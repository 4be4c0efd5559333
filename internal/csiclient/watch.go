package csiclient

import (
	"net"
	"sync"
	"sync/atomic"
)

// watchedConn tells its owner, once, that the plugin is gone: at the first
// failed read, or when the connection is closed without its owner asking
// (x/net closes it once a plugin that said GOAWAY, a graceful stop, has no
// stream left, and when a write to it times out). Watching costs nothing
// beyond the reads the connection makes anyway.
type watchedConn struct {
	net.Conn
	onDisconnect func()
	owned        atomic.Bool // the owner is closing the connection
	// broken is set before the owner is told: a call that the news sends
	// at once (the supervisor probes right away) must not take this
	// connection, which x/net may not have seen fail yet.
	broken atomic.Bool
	gone   sync.Once
}

func (c *watchedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil {
		c.ended()
	}
	return n, err
}

func (c *watchedConn) Close() error {
	c.ended()
	return c.Conn.Close()
}

// closeOwned marks the coming close as the owner's own doing: no news.
func (c *watchedConn) closeOwned() { c.owned.Store(true) }

// isBroken reports whether a read failed or the connection was closed.
func (c *watchedConn) isBroken() bool { return c.broken.Load() }

func (c *watchedConn) ended() {
	c.broken.Store(true)
	if !c.owned.Load() {
		c.gone.Do(c.onDisconnect)
	}
}
