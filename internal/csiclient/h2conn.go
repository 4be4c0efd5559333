package csiclient

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// h2Conn is one client HTTP/2 connection that carries one unary gRPC call
// at a time. Supervision sends a probe every few seconds and a handful of
// fingerprint calls a minute, strictly one after another, so this small
// client (one reader goroutine, a 512-byte write buffer, no header
// indexing) replaces a general one whose per-connection buffers would
// dominate the agent's memory with thousands of plugins. A 1 KiB read
// buffer lets one read take in a whole answer, and flow-control credit is
// returned in batches, so a probe costs one write and usually one read.
type h2Conn struct {
	nc  net.Conn
	fr  *http2.Framer
	bw  *bufio.Writer
	enc *hpack.Encoder
	hb  bytes.Buffer // header block being encoded, under wmu

	callMu sync.Mutex // one call at a time
	wmu    sync.Mutex // frame writes: the caller's and the reader's acks

	// unacked is the DATA credit not yet returned to the plugin, for the
	// connection and for the stream in flight; touched by the reader only.
	unacked, streamUnacked uint32

	mu     sync.Mutex
	nextID uint32
	call   *h2Call // the call in flight, if any
	err    error   // why the connection can take no more calls
	goAway bool
	done   chan struct{} // closed when the reader returns
}

// h2Call is the answer to one stream as the reader assembles it.
type h2Call struct {
	id       uint32
	header   http.Header
	trailer  http.Header
	data     []byte
	err      error
	finished chan struct{}
}

var clientPreface = []byte(http2.ClientPreface)

// errGoAway means the plugin asked this connection to go away.
var errGoAway = errors.New("plugin is going away (GOAWAY)")

// newH2Conn starts HTTP/2 on nc and the reader goroutine.
func newH2Conn(nc net.Conn) (*h2Conn, error) {
	c := &h2Conn{nc: nc, nextID: 1, done: make(chan struct{})}
	c.bw = bufio.NewWriterSize(nc, 512)
	c.fr = http2.NewFramer(c.bw, bufio.NewReaderSize(nc, 1024))
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.MaxHeaderListSize = 64 << 10
	c.enc = hpack.NewEncoder(&c.hb)
	// Index nothing: every call sends the same few small headers.
	c.enc.SetMaxDynamicTableSizeLimit(0)

	c.wmu.Lock()
	_, err := c.bw.Write(clientPreface)
	if err == nil {
		err = c.fr.WriteSettings(
			http2.Setting{ID: http2.SettingEnablePush, Val: 0},
			http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: 64 << 10},
		)
	}
	if err == nil {
		err = c.bw.Flush()
	}
	c.wmu.Unlock()
	if err != nil {
		_ = nc.Close()
		return nil, err
	}
	go c.readLoop()
	return c, nil
}

// usable reports whether a new call may start on the connection.
func (c *h2Conn) usable() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err == nil && !c.goAway
}

// close closes the connection and waits for the reader.
func (c *h2Conn) close() {
	_ = c.nc.Close()
	<-c.done
}

// roundTrip sends one request (headers, then body with END_STREAM) and
// waits for the complete answer or for ctx to end.
func (c *h2Conn) roundTrip(ctx context.Context, path string, header http.Header, body []byte) (*h2Call, error) {
	c.callMu.Lock()
	defer c.callMu.Unlock()

	c.mu.Lock()
	if c.err != nil || c.goAway {
		err := c.err
		if err == nil {
			err = errGoAway
		}
		c.mu.Unlock()
		return nil, err
	}
	call := &h2Call{id: c.nextID, finished: make(chan struct{})}
	c.nextID += 2
	c.call = call
	c.mu.Unlock()

	if err := c.writeRequest(call.id, path, header, body); err != nil {
		c.fail(err)
		return nil, err
	}
	select {
	case <-call.finished:
		return call, call.err
	case <-ctx.Done():
		c.mu.Lock()
		if c.call == call {
			c.call = nil
		}
		c.mu.Unlock()
		c.wmu.Lock()
		_ = c.fr.WriteRSTStream(call.id, http2.ErrCodeCancel)
		_ = c.bw.Flush()
		c.wmu.Unlock()
		return nil, ctx.Err()
	}
}

func (c *h2Conn) writeRequest(id uint32, path string, header http.Header, body []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.hb.Reset()
	for _, f := range []hpack.HeaderField{
		{Name: ":method", Value: "POST"},
		{Name: ":scheme", Value: "http"},
		{Name: ":path", Value: path},
		{Name: ":authority", Value: "localhost"},
	} {
		if err := c.enc.WriteField(f); err != nil {
			return err
		}
	}
	for name, values := range header {
		for _, v := range values {
			if err := c.enc.WriteField(hpack.HeaderField{Name: lower(name), Value: v}); err != nil {
				return err
			}
		}
	}
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{
		StreamID: id, BlockFragment: c.hb.Bytes(), EndHeaders: true,
	}); err != nil {
		return err
	}
	// Requests are a few hundred bytes, far below the 16 KiB frame and
	// 64 KiB window every HTTP/2 peer allows at first.
	if err := c.fr.WriteData(id, true, body); err != nil {
		return err
	}
	return c.bw.Flush()
}

// readLoop reads frames until the connection fails, answering SETTINGS and
// PING, and hands headers and data to the call in flight.
func (c *h2Conn) readLoop() {
	defer close(c.done)
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.fail(err)
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				c.write(func() error { return c.fr.WriteSettingsAck() })
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				c.write(func() error { return c.fr.WritePing(true, f.Data) })
			}
		case *http2.GoAwayFrame:
			c.mu.Lock()
			c.goAway = true
			idle := c.call == nil
			c.mu.Unlock()
			if idle {
				// Like grpc-go, let a plugin that stops gracefully finish
				// at once rather than wait for us.
				_ = c.nc.Close()
			}
		case *http2.MetaHeadersFrame:
			c.onHeaders(f)
		case *http2.DataFrame:
			c.onData(f)
		case *http2.RSTStreamFrame:
			c.finish(f.StreamID, fmt.Errorf("stream reset by the plugin: %v", f.ErrCode))
		}
	}
}

func (c *h2Conn) onHeaders(f *http2.MetaHeadersFrame) {
	c.mu.Lock()
	call := c.call
	c.mu.Unlock()
	if call == nil || call.id != f.StreamID {
		return // a call we gave up on
	}
	h := make(http.Header, len(f.Fields))
	for _, hf := range f.RegularFields() {
		h.Add(hf.Name, hf.Value)
	}
	if call.header == nil {
		call.header = h
		if s := f.PseudoValue("status"); s != "" {
			call.header.Set(":status", s)
		}
	} else {
		call.trailer = h
	}
	if f.StreamEnded() {
		c.finish(f.StreamID, nil)
	}
}

// windowBatch is how much DATA credit is returned at once; a quarter of
// the 64 KiB initial window, so the plugin never waits for credit.
const windowBatch = 16 << 10

func (c *h2Conn) onData(f *http2.DataFrame) {
	n := uint32(len(f.Data()))
	// Answers are read completely, and a connection lives for millions of
	// them: return the credit, in batches to save a write per call. A
	// stream's own window matters only for answers above 16 KiB.
	c.unacked += n
	c.streamUnacked += n
	if f.StreamEnded() {
		c.streamUnacked = 0
	}
	if c.unacked >= windowBatch || c.streamUnacked >= windowBatch {
		connCredit, streamCredit := c.unacked, c.streamUnacked
		c.unacked, c.streamUnacked = 0, 0
		c.write(func() error {
			if err := c.fr.WriteWindowUpdate(0, connCredit); err != nil {
				return err
			}
			if streamCredit == 0 {
				return nil
			}
			return c.fr.WriteWindowUpdate(f.StreamID, streamCredit)
		})
	}
	c.mu.Lock()
	call := c.call
	c.mu.Unlock()
	if call == nil || call.id != f.StreamID {
		return
	}
	if len(call.data)+int(n) > maxSupervisionMessage+5 {
		c.finish(f.StreamID, fmt.Errorf("answer larger than %d bytes", maxSupervisionMessage))
		return
	}
	call.data = append(call.data, f.Data()...)
	if f.StreamEnded() {
		c.finish(f.StreamID, nil)
	}
}

// finish completes the call on stream id, if it is the one in flight.
func (c *h2Conn) finish(id uint32, err error) {
	c.mu.Lock()
	call := c.call
	if call == nil || call.id != id {
		c.mu.Unlock()
		return
	}
	c.call = nil
	closeNow := c.goAway
	c.mu.Unlock()
	call.err = err
	close(call.finished)
	if closeNow {
		_ = c.nc.Close()
	}
}

// fail makes the connection unusable and fails the call in flight.
func (c *h2Conn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	call := c.call
	c.call = nil
	c.mu.Unlock()
	_ = c.nc.Close()
	if call != nil {
		call.err = err
		close(call.finished)
	}
}

// write sends frames from the reader goroutine.
func (c *h2Conn) write(frames func() error) {
	c.wmu.Lock()
	err := frames()
	if err == nil {
		err = c.bw.Flush()
	}
	c.wmu.Unlock()
	if err != nil {
		c.fail(err)
	}
}

// status returns the HTTP status of an answer.
func (call *h2Call) status() int {
	s, _ := strconv.Atoi(call.header.Get(":status"))
	return s
}

// lower returns the lower-case form HTTP/2 requires of header names.
func lower(name string) string {
	return string(bytes.ToLower([]byte(name)))
}
