package csiclient

import (
	"net"
	"sync"
	"sync/atomic"
)

// watchedConn tells its owner that the plugin is going or gone: once when
// the plugin sends an HTTP/2 GOAWAY frame (a graceful stop begins; the
// plugin may still answer for a moment), and once when the connection ends
// without its owner asking: a failed read, or the HTTP/2 client closing it
// after the plugin's GOAWAY. grpc-go clients
// close their side on GOAWAY so the plugin's server can finish stopping;
// net/http's HTTP/2 client does not report GOAWAY, so the connection
// follows the frame headers it reads to see one.
type watchedConn struct {
	net.Conn
	onDisconnect func()
	owned        atomic.Bool // the owner is closing the connection
	goingAway    sync.Once
	gone         sync.Once
	frames       frameHeaders // touched only by the reading goroutine
}

func (c *watchedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.frames.sawGoAway(p[:n]) {
		c.goingAway.Do(c.onDisconnect)
	}
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

func (c *watchedConn) ended() {
	if !c.owned.Load() {
		c.gone.Do(c.onDisconnect)
	}
}

// frameHeaders follows the HTTP/2 frames a server sends (RFC 9113 section
// 4.1: a 9-byte header whose first three bytes are the payload length and
// whose fourth is the type), skipping payloads, to notice GOAWAY frames.
type frameHeaders struct {
	header [9]byte
	have   int    // bytes of the current header read so far
	skip   uint32 // payload bytes of the current frame still to skip
}

// frameGoAway is the HTTP/2 GOAWAY frame type.
const frameGoAway = 0x7

// sawGoAway consumes the next bytes read from the server and reports
// whether they complete the header of a GOAWAY frame.
func (f *frameHeaders) sawGoAway(p []byte) bool {
	goAway := false
	for len(p) > 0 {
		if f.skip > 0 {
			n := min(uint32(len(p)), f.skip)
			p = p[n:]
			f.skip -= n
			continue
		}
		n := copy(f.header[f.have:], p)
		f.have += n
		p = p[n:]
		if f.have < len(f.header) {
			break
		}
		f.have = 0
		f.skip = uint32(f.header[0])<<16 | uint32(f.header[1])<<8 | uint32(f.header[2])
		if f.header[3] == frameGoAway {
			goAway = true
		}
	}
	return goAway
}
