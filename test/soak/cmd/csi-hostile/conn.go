package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// call is one request the writer answers.
type call struct {
	stream uint32
	path   string
}

// stream is the flow-control state of one answer being sent.
type stream struct {
	window int64
	reset  bool
}

// conn is one HTTP/2 server connection of a hostile plugin.
type conn struct {
	p  *plugin
	nc net.Conn
	fr *http2.Framer // reads; writes of whole frames go through writeFrame

	wmu  sync.Mutex // one frame at a time on the wire
	enc  *hpack.Encoder
	hbuf bytes.Buffer

	mu         sync.Mutex
	cond       *sync.Cond // window grew, a stream was reset, or the connection closed
	closed     bool
	connWindow int64
	initWindow int64
	maxFrame   int
	streams    map[uint32]*stream
	paths      map[uint32]string // requests whose body is still arriving
	goAwaySent bool
	goAwayT    *time.Timer

	calls chan call // reader -> writer; closed by the reader
}

func newConn(p *plugin, nc net.Conn) *conn {
	c := &conn{
		p: p, nc: nc,
		connWindow: defaultWindow, initWindow: defaultWindow, maxFrame: defaultMaxFrame,
		streams: make(map[uint32]*stream), paths: make(map[uint32]string),
		calls: make(chan call, maxQueuedCalls),
	}
	c.cond = sync.NewCond(&c.mu)
	c.fr = http2.NewFramer(nc, bufio.NewReaderSize(nc, 4096))
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.enc = hpack.NewEncoder(&c.hbuf)
	return c
}

var errConnClosed = errors.New("connection closed")

var errStreamReset = errors.New("stream reset by the client")

// readLoop reads the client's frames until the connection ends; it starts
// the writer and, when it returns, closes the connection and stops the
// writer.
func (c *conn) readLoop() {
	defer c.p.untrack(c.nc)
	if c.p.kind != kindGoAway {
		c.p.wg.Go(c.writeLoop)
	}
	defer c.shutdown()

	settings := []http2.Setting{{ID: http2.SettingMaxConcurrentStreams, Val: 100}}
	if c.p.kind == kindMaxFrames {
		// What it will accept, not what it sends, but the largest a
		// server can claim.
		settings = append(settings, http2.Setting{ID: http2.SettingMaxFrameSize, Val: maxFrameLen})
	}
	if err := c.control(func() error { return c.fr.WriteSettings(settings...) }); err != nil {
		return
	}
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(c.nc, preface); err != nil || string(preface) != http2.ClientPreface {
		return
	}
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			c.applySettings(f)
			if c.control(c.fr.WriteSettingsAck) != nil {
				return
			}
		case *http2.PingFrame:
			if !f.IsAck() && c.control(func() error { return c.fr.WritePing(true, f.Data) }) != nil {
				return
			}
		case *http2.WindowUpdateFrame:
			c.mu.Lock()
			if f.StreamID == 0 {
				c.connWindow += int64(f.Increment)
			} else if s := c.streams[f.StreamID]; s != nil {
				s.window += int64(f.Increment)
			}
			c.cond.Broadcast()
			c.mu.Unlock()
		case *http2.MetaHeadersFrame:
			path := f.PseudoValue("path")
			if f.StreamEnded() {
				if !c.dispatch(call{stream: f.StreamID, path: path}) {
					return
				}
				continue
			}
			c.mu.Lock()
			c.paths[f.StreamID] = path
			c.mu.Unlock()
		case *http2.DataFrame:
			// Return the credit of request bodies, as any server does,
			// so the client can keep calling on this connection.
			if n := f.Length; n > 0 && c.control(func() error { return c.fr.WriteWindowUpdate(0, n) }) != nil {
				return
			}
			if f.StreamEnded() {
				c.mu.Lock()
				path, ok := c.paths[f.StreamID]
				delete(c.paths, f.StreamID)
				c.mu.Unlock()
				if ok && !c.dispatch(call{stream: f.StreamID, path: path}) {
					return
				}
			}
		case *http2.RSTStreamFrame:
			c.mu.Lock()
			if s := c.streams[f.StreamID]; s != nil {
				s.reset = true
			}
			delete(c.paths, f.StreamID)
			c.cond.Broadcast()
			c.mu.Unlock()
		case *http2.GoAwayFrame:
			return
		}
	}
}

// shutdown closes the connection and wakes and stops the writer.
func (c *conn) shutdown() {
	_ = c.nc.Close()
	c.mu.Lock()
	c.closed = true
	if c.goAwayT != nil {
		c.goAwayT.Stop()
	}
	c.cond.Broadcast()
	c.mu.Unlock()
	close(c.calls)
}

func (c *conn) applySettings(f *http2.SettingsFrame) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_ = f.ForeachSetting(func(s http2.Setting) error {
		switch s.ID {
		case http2.SettingInitialWindowSize:
			delta := int64(s.Val) - c.initWindow
			c.initWindow = int64(s.Val)
			for _, st := range c.streams {
				st.window += delta
			}
		case http2.SettingMaxFrameSize:
			c.maxFrame = int(s.Val)
		}
		return nil
	})
	c.cond.Broadcast()
}

// dispatch handles a fully received request: the goaway kind answers with
// GOAWAY itself, the others queue it for the writer. It returns false when
// the connection is to end.
func (c *conn) dispatch(cl call) bool {
	if c.p.kind == kindGoAway {
		return c.goAway(cl)
	}
	c.mu.Lock()
	c.streams[cl.stream] = &stream{window: c.initWindow}
	c.mu.Unlock()
	select {
	case c.calls <- cl:
		return true
	default:
		c.endStream(cl.stream)
		return c.control(func() error { return c.fr.WriteRSTStream(cl.stream, http2.ErrCodeRefusedStream) }) == nil
	}
}

// goAway tells the client, in the middle of its call, that the call's
// stream was never processed, and closes the connection a moment later.
func (c *conn) goAway(cl call) bool {
	c.mu.Lock()
	sent := c.goAwaySent
	c.goAwaySent = true
	c.mu.Unlock()
	if sent {
		return true // later calls on a connection already going away: ignored
	}
	last := uint32(0)
	if cl.stream > 2 {
		last = cl.stream - 2
	}
	code, debug := http2.ErrCodeNo, []byte(nil)
	if c.p.goAways.Add(1)%2 == 0 {
		code, debug = http2.ErrCodeEnhanceYourCalm, []byte("csi-hostile: go away")
	}
	if c.control(func() error { return c.fr.WriteGoAway(last, code, debug) }) != nil {
		return false
	}
	c.mu.Lock()
	if !c.closed {
		c.goAwayT = time.AfterFunc(goAwayClose, func() { _ = c.nc.Close() })
	}
	c.mu.Unlock()
	return true
}

func (c *conn) endStream(id uint32) {
	c.mu.Lock()
	delete(c.streams, id)
	c.mu.Unlock()
}

// writeLoop answers the queued calls one after another.
func (c *conn) writeLoop() {
	for cl := range c.calls {
		var err error
		switch c.p.kind {
		case kindMaxFrames:
			err = c.answerMaxFrames(cl)
		case kindHuge:
			err = c.answerHuge(cl)
		case kindPadded:
			err = c.answerPadded(cl)
		}
		c.endStream(cl.stream)
		if errors.Is(err, errStreamReset) {
			continue
		}
		if err != nil {
			_ = c.nc.Close() // the reader sees it and ends the connection
		}
	}
}

// sendData sends data on a stream within the flow-control windows and the
// client's maximum frame size. With padded, every frame carries padChunk
// bytes and padLen bytes of padding, which count against the windows too.
func (c *conn) sendData(id uint32, data []byte, padded bool) error {
	for len(data) > 0 {
		if padded {
			chunk := data[:min(padChunk, len(data))]
			if _, err := c.acquire(id, 1+len(chunk)+padLen, true); err != nil {
				return err
			}
			if err := c.writeFrame(http2.FrameData, http2.FlagDataPadded, id, []byte{padLen}, chunk, zeros[:padLen]); err != nil {
				return err
			}
			data = data[len(chunk):]
			continue
		}
		n, err := c.acquire(id, len(data), false)
		if err != nil {
			return err
		}
		if err := c.writeFrame(http2.FrameData, 0, id, data[:n]); err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

// acquire waits until the windows allow sending on stream id and takes up
// to want bytes of them (exactly want with exact), at most one frame's
// worth. It fails when the stream is reset or the connection closes.
func (c *conn) acquire(id uint32, want int, exact bool) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if c.closed {
			return 0, errConnClosed
		}
		s := c.streams[id]
		if s == nil || s.reset {
			return 0, errStreamReset
		}
		avail := min(int64(want), int64(c.maxFrame), c.connWindow, s.window)
		if avail > 0 && (!exact || avail == int64(want)) {
			c.connWindow -= avail
			s.window -= avail
			return int(avail), nil
		}
		c.cond.Wait()
	}
}

// control writes one frame with the framer.
func (c *conn) control(write func() error) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return write()
}

// writeFrame writes one frame whose payload is the concatenation of parts,
// without copying them. It blocks for as long as the socket does.
func (c *conn) writeFrame(typ http2.FrameType, flags http2.Flags, id uint32, parts ...[]byte) error {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	hdr := [9]byte{byte(n >> 16), byte(n >> 8), byte(n), byte(typ), byte(flags)}
	binary.BigEndian.PutUint32(hdr[5:], id)
	bufs := make(net.Buffers, 0, 1+len(parts))
	bufs = append(bufs, hdr[:])
	bufs = append(bufs, parts...)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := bufs.WriteTo(c.nc)
	return err
}

// writeHeaders writes one HEADERS frame (the header block always fits:
// a few short fields).
func (c *conn) writeHeaders(id uint32, end bool, fields []hpack.HeaderField) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.hbuf.Reset()
	for _, f := range fields {
		if err := c.enc.WriteField(f); err != nil {
			return err
		}
	}
	return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndStream: end, EndHeaders: true})
}

func grpcHeaders() []hpack.HeaderField {
	return []hpack.HeaderField{{Name: ":status", Value: "200"}, {Name: "content-type", Value: "application/grpc"}}
}

func grpcTrailers(code int, msg string) []hpack.HeaderField {
	f := []hpack.HeaderField{{Name: "grpc-status", Value: fmt.Sprint(code)}}
	if msg != "" {
		f = append(f, hpack.HeaderField{Name: "grpc-message", Value: msg})
	}
	return f
}
