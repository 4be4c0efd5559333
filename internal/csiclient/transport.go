package csiclient

//lint:file-ignore SA1019 x/net's HTTP/2 client is deprecated for net/http's, which does not export the error types this package classifies by (see doc.go).

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"
)

// HTTP/2 limits of the supervision connection. Supervision replies are a
// few hundred bytes, so the limits are the smallest that still carry a
// reply of Config.MaxMessageSize: whatever a plugin sends, the agent
// buffers at most one receive window per connection.
const (
	// maxFrameSize is the largest frame the plugin may send: the HTTP/2
	// minimum, so a frame never needs more than a 16 KiB buffer.
	maxFrameSize = 16 << 10
	// maxReceiveWindow is the most reply data the plugin may have in
	// flight, per stream and per connection.
	maxReceiveWindow = 256 << 10
	// minReceiveWindow keeps small message caps from making a call wait
	// for window updates every few frames; x/net requires 64 KiB per
	// connection anyway.
	minReceiveWindow = 64 << 10
	// initialWindow is HTTP/2's initial connection window, which x/net
	// adds to the connection buffer it is configured with.
	initialWindow = 65535
	// maxHeaderListSize caps the headers of a reply (and its trailers), and
	// the metadata a call sends.
	maxHeaderListSize = 64 << 10
	// headerTableSize is the HPACK table the plugin may make us keep: the
	// HTTP/2 default, which plugins expect.
	headerTableSize = 4 << 10
	// encoderTableSize is the HPACK table we keep for the headers we send:
	// none, since no entry fits in a byte (each costs 32 bytes besides its
	// name and value); x/net takes 0 for its 4 KiB default. Every request
	// carries a new grpc-timeout, so a table would only fill with those,
	// evicting the few headers worth indexing, and cost each connection a
	// few KiB of entries and index maps.
	encoderTableSize = 1
)

// receiveWindow is the per-stream and per-connection receive window for a
// message cap: enough for one whole reply, within the bounds above.
func receiveWindow(maxMessage int) int {
	return min(max(maxMessage+5, minReceiveWindow), maxReceiveWindow)
}

// TransportConfig sets the limits of a Transport. Zero values take the
// defaults (DefaultWriteTimeout, DefaultMaxMessageSize).
type TransportConfig struct {
	// WriteTimeout bounds every write to a plugin, and a dial.
	WriteTimeout time.Duration
	// MaxMessageSize caps a reply (and a request, unless a call asks for
	// less), and sizes the HTTP/2 receive windows.
	MaxMessageSize int
}

// Transport is the part of the supervision connection that does not depend
// on the plugin: the HTTP/2 settings, connect's gRPC client per method, and
// the open connections x/net reports GOAWAY for. Clients with the same
// limits share one (the registry makes one for all its plugins), so that a
// plugin costs only its connection. It is safe for concurrent use.
type Transport struct {
	writeTimeout time.Duration
	maxMessage   int
	h2           *http2.Transport
	// userAgent is every request's User-Agent header value, shared: its
	// length is its capacity, so an append to it copies.
	userAgent []string
	// live maps each open *http2.ClientConn to its pluginConn, for
	// goAwayWatcher.
	live *sync.Map

	mu      sync.Mutex
	clients map[clientKey]*connect.Client[rawMsg, rawMsg]
}

// NewTransport makes a Transport with cfg's limits.
func NewTransport(cfg TransportConfig) *Transport {
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = DefaultWriteTimeout
	}
	if cfg.MaxMessageSize <= 0 {
		cfg.MaxMessageSize = DefaultMaxMessageSize
	}
	live := &sync.Map{}
	return &Transport{
		writeTimeout: cfg.WriteTimeout,
		maxMessage:   cfg.MaxMessageSize,
		h2:           newHTTP2Transport(cfg.WriteTimeout, cfg.MaxMessageSize, live),
		userAgent:    []string{userAgent},
		live:         live,
		clients:      make(map[clientKey]*connect.Client[rawMsg, rawMsg]),
	}
}

// newTransport configures an x/net HTTP/2 transport. The HTTP/1 transport
// exists only to carry http.HTTP2Config: x/net v0.60.0 takes the receive
// windows (MaxReceiveBufferPer*) from there and has no field of its own
// for them. No request ever goes through either transport: each plugin's
// ClientConn is made with NewClientConn on a connection we dialled.
func newHTTP2Transport(writeTimeout time.Duration, maxMessage int, live *sync.Map) *http2.Transport {
	window := receiveWindow(maxMessage)
	t1 := &http.Transport{HTTP2: &http.HTTP2Config{
		// Calls beyond the plugin's MAX_CONCURRENT_STREAMS wait for a
		// stream (within their deadline) instead of failing.
		StrictMaxConcurrentRequests: true,
		MaxReadFrameSize:            maxFrameSize,
		// x/net adds the 64 KiB initial window to the connection's.
		MaxReceiveBufferPerConnection: max(window-initialWindow, initialWindow),
		MaxReceiveBufferPerStream:     window,
		MaxDecoderHeaderTableSize:     headerTableSize,
		MaxEncoderHeaderTableSize:     encoderTableSize,
		WriteByteTimeout:              writeTimeout,
	}}
	t2, err := http2.ConfigureTransports(t1)
	if err != nil {
		// Only a transport that already speaks HTTP/2 is refused, and t1
		// is new.
		panic("csiclient: configuring a new HTTP/2 transport: " + err.Error())
	}
	t2.MaxHeaderListSize = maxHeaderListSize
	// Otherwise x/net asks for gzip-encoded HTTP bodies; gRPC compresses
	// per message, and we offer no compression at all.
	t2.DisableCompression = true
	// The pool is never asked for connections (NewClientConn makes them);
	// it is how the transport tells us a plugin said GOAWAY.
	t2.ConnPool = goAwayWatcher{live: live}
	return t2
}

// pluginConn is one HTTP/2 connection to a plugin.
type pluginConn struct {
	cc   *http2.ClientConn
	wc   *watchedConn
	live *sync.Map // the Transport's open connections
	// calls counts the calls in flight on the connection.
	calls atomic.Int32
	// goneAway is set when x/net says the connection can take no more
	// calls (see goAwayWatcher).
	goneAway atomic.Bool
}

// usable reports whether the connection can carry another call. x/net says
// a connection closed before its first request can take one (so that the
// request reports the early error); that request fails with "client conn
// could not be established" every time, so a closed connection is never
// reused here: the next call dials. Nor is one whose read failed: x/net
// learns of that a moment after OnDisconnect has already been told.
func (p *pluginConn) usable() bool {
	if p.wc.isBroken() {
		return false
	}
	st := p.cc.State()
	return !st.Closed && !st.Closing && p.cc.CanTakeNewRequest()
}

// release ends a call counted by supervisionConn.conn. The last call on a
// connection told to go away closes it (see goAwayWatcher); with MarkDead
// setting goneAway before it reads calls, one of the two sees the other.
func (p *pluginConn) release() {
	if p.calls.Add(-1) == 0 && p.goneAway.Load() {
		_ = p.cc.Close()
	}
}

// close closes the connection as our own doing: no OnDisconnect. It does
// not wait on the plugin: x/net closes the socket under a short lock, and
// a write blocked on a plugin that stopped reading fails at once.
func (p *pluginConn) close() {
	p.live.Delete(p.cc)
	p.wc.closeOwned()
	_ = p.cc.Close()
}

// goAwayWatcher is the transport's connection pool. x/net never asks it for
// a connection here, but calls MarkDead when a connection can take no more
// requests: when the plugin sends GOAWAY, and when the connection ends.
//
// x/net closes a connection told to go away once its last stream ends, and
// that close reports the plugin's departure. A connection without streams
// has no last one, so it is closed here (or by the call finishing right
// now, see pluginConn.release), as grpc-go does: the plugin's graceful stop
// can finish, and the supervisor learns of it now instead of at the next
// probe. (The next call would close and report it too; see
// supervisionConn.conn.)
type goAwayWatcher struct{ live *sync.Map }

var errNoPool = errors.New("csiclient: the supervision transport has no connection pool")

func (goAwayWatcher) GetClientConn(*http.Request, string) (*http2.ClientConn, error) {
	return nil, errNoPool
}

func (w goAwayWatcher) MarkDead(cc *http2.ClientConn) {
	v, ok := w.live.Load(cc)
	if !ok {
		return // closed by us, or not yet registered
	}
	p := v.(*pluginConn)
	p.goneAway.Store(true)
	if p.calls.Load() == 0 {
		// Not our doing: the close reports the plugin's departure.
		_ = p.cc.Close()
	}
}

// callKey carries a call's *call through connect to callRouter.
type callKey struct{}

// call is the state of one unary call as the transport saw it. connect
// makes unary requests synchronously on the caller's goroutine and reads
// the reply there too, so no lock is needed.
type call struct {
	conn *pluginConn
	// recvLimit is the largest reply message the call accepts.
	recvLimit int

	resp         *http.Response // the plugin's answer, once headers came
	transportErr error          // RoundTrip's error, if it failed
	bodyErr      error          // the first error reading the reply body
	bodyEOF      bool           // the reply body ended cleanly
	overCap      bool           // the reply body outgrew recvLimit
}

// callRouter is the connect.HTTPClient of every connect client of a
// Transport: it sends each request on the ClientConn of the call it belongs
// to, and records what came back. Sharing one connect client per method
// across plugins keeps a plugin's cost at its connection. It hands the
// request straight to x/net rather than through an http.Client, whose
// redirect, cookie and timeout handling a gRPC call never needs (a plugin
// answering 3xx is not speaking gRPC; its answer fails the call), and which
// costs every probe.
type callRouter struct{}

var errNoCall = errors.New("csiclient: request outside a supervision call")

// Do implements connect.HTTPClient.
func (callRouter) Do(req *http.Request) (*http.Response, error) {
	c, ok := req.Context().Value(callKey{}).(*call)
	if !ok {
		return nil, errNoCall
	}
	resp, err := c.conn.cc.RoundTrip(req)
	if err != nil {
		c.transportErr = err
		return nil, err
	}
	c.resp = resp
	// One gRPC message: its 5-byte prefix and at most recvLimit bytes.
	resp.Body = &replyBody{body: resp.Body, c: c, left: int64(c.recvLimit) + 5}
	return resp, nil
}

// errReplyTooLarge ends the read of a reply body larger than the call
// accepts.
var errReplyTooLarge = errors.New("reply larger than the message size cap")

// replyBody caps a reply body and records how its reading ended. connect
// checks the declared message length against its own cap, but then reads
// and discards the whole message; the cap here stops the read once the
// body holds more than one message of the largest accepted size, so a
// plugin sending 100 MB costs the agent at most that much reading. connect
// then closes the body, which resets the stream.
type replyBody struct {
	body   io.ReadCloser
	c      *call
	left   int64
	closed bool // by connect: later read errors are its own doing
}

func (b *replyBody) Read(p []byte) (int, error) {
	if b.c.overCap {
		return 0, errReplyTooLarge
	}
	// Ask for one byte more than allowed, to tell "exactly at the cap"
	// from "over it".
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.body.Read(p)
	if int64(n) > b.left {
		b.c.overCap = true
		n = int(b.left)
		b.left = 0
		return n, errReplyTooLarge
	}
	b.left -= int64(n)
	switch {
	case errors.Is(err, io.EOF):
		b.c.bodyEOF = true
	case err != nil && b.c.bodyErr == nil && !b.closed:
		b.c.bodyErr = err
	}
	return n, err
}

// Close resets the stream if the reply is not complete.
func (b *replyBody) Close() error {
	b.closed = true
	return b.body.Close()
}

// withCall returns ctx carrying c for callRouter.
func withCall(ctx context.Context, c *call) context.Context {
	return context.WithValue(ctx, callKey{}, c)
}
