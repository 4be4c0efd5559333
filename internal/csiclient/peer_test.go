package csiclient

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
)

// peerTimeout bounds every wait of a scripted peer, so that a client bug
// fails the test instead of hanging it.
const peerTimeout = 10 * time.Second

// rawPlugin is a plugin scripted frame by frame: it accepts connections on
// a unix socket and runs serve on each, with the connection's index (0 for
// the first). Hostile behaviour that no real HTTP/2 server library would
// produce is written here by hand.
type rawPlugin struct {
	l        net.Listener
	accepted atomic.Int32

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

// startRawPlugin listens on socket; everything stops when the test ends.
func startRawPlugin(t testing.TB, socket string, serve func(i int, p *peerConn)) *rawPlugin {
	t.Helper()
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatalf("listen on %s: %v", socket, err)
	}
	rp := &rawPlugin{l: l}
	rp.wg.Add(1)
	go func() {
		defer rp.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			i := int(rp.accepted.Add(1)) - 1
			rp.mu.Lock()
			rp.conns = append(rp.conns, c)
			rp.wg.Add(1)
			rp.mu.Unlock()
			go func() {
				defer rp.wg.Done()
				defer c.Close()
				serve(i, newPeerConn(c))
			}()
		}
	}()
	t.Cleanup(rp.stop)
	return rp
}

// stop closes the listener and every connection and waits for the serve
// functions, which return once their connection is closed.
func (rp *rawPlugin) stop() {
	_ = rp.l.Close()
	rp.mu.Lock()
	for _, c := range rp.conns {
		_ = c.Close()
	}
	rp.mu.Unlock()
	rp.wg.Wait()
}

// peerConn is the plugin's end of one connection.
type peerConn struct {
	net.Conn
	fr  *http2.Framer
	hb  bytes.Buffer
	enc *hpack.Encoder

	// Flow control: what the client lets us send, on the connection and
	// per stream, and its initial stream window.
	connWindow    int64
	streamWindows map[uint32]int64
	initialWindow int64

	resets  []http2.RSTStreamFrame // RST_STREAMs the client sent
	goAways int                    // GOAWAYs the client sent
}

func newPeerConn(c net.Conn) *peerConn {
	p := &peerConn{Conn: c, connWindow: 65535, streamWindows: map[uint32]int64{}, initialWindow: 65535}
	p.fr = http2.NewFramer(c, c)
	p.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	p.fr.MaxHeaderListSize = 1 << 20
	p.enc = hpack.NewEncoder(&p.hb)
	return p
}

// request is a request as the plugin read it.
type request struct {
	id     uint32
	fields map[string]string
	body   []byte
}

// handshake reads the client preface and settings, acknowledges them and
// sends settings (none: HTTP/2 defaults).
func (p *peerConn) handshake(settings ...http2.Setting) error {
	_ = p.SetDeadline(time.Now().Add(peerTimeout))
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(p, preface); err != nil {
		return err
	}
	if string(preface) != http2.ClientPreface {
		return fmt.Errorf("bad preface %q", preface)
	}
	return p.fr.WriteSettings(settings...)
}

// readFrame reads one frame and handles the bookkeeping frames (settings,
// pings, window updates, resets, GOAWAY), which it also returns.
func (p *peerConn) readFrame() (http2.Frame, error) {
	_ = p.SetReadDeadline(time.Now().Add(peerTimeout))
	f, err := p.fr.ReadFrame()
	if err != nil {
		return nil, err
	}
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if !f.IsAck() {
			if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
				p.initialWindow = int64(v)
			}
			err = p.fr.WriteSettingsAck()
		}
	case *http2.PingFrame:
		if !f.IsAck() {
			err = p.fr.WritePing(true, f.Data)
		}
	case *http2.WindowUpdateFrame:
		if f.StreamID == 0 {
			p.connWindow += int64(f.Increment)
		} else {
			p.streamWindows[f.StreamID] += int64(f.Increment)
		}
	case *http2.RSTStreamFrame:
		p.resets = append(p.resets, *f)
	case *http2.GoAwayFrame:
		p.goAways++
	}
	return f, err
}

// readRequest reads frames until a request is complete.
func (p *peerConn) readRequest() (*request, error) {
	var r *request
	for {
		f, err := p.readFrame()
		if err != nil {
			return nil, err
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			r = &request{id: f.StreamID, fields: map[string]string{}}
			p.streamWindows[f.StreamID] += p.initialWindow
			for _, hf := range f.Fields {
				r.fields[hf.Name] = hf.Value
			}
			if f.StreamEnded() {
				return r, nil
			}
		case *http2.DataFrame:
			if r == nil || f.StreamID != r.id {
				return nil, fmt.Errorf("DATA on unexpected stream %d", f.StreamID)
			}
			r.body = append(r.body, f.Data()...)
			if f.StreamEnded() {
				return r, nil
			}
		}
	}
}

// writeHeaders sends a header block; fields are name, value pairs.
func (p *peerConn) writeHeaders(id uint32, endStream bool, fields ...string) error {
	p.hb.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		if err := p.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]}); err != nil {
			return err
		}
	}
	_ = p.SetWriteDeadline(time.Now().Add(peerTimeout))
	// Blocks beyond the 16 KiB frame size continue in CONTINUATION frames.
	block := p.hb.Bytes()
	first := block[:min(len(block), 16<<10)]
	block = block[len(first):]
	if err := p.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndStream: endStream, EndHeaders: len(block) == 0}); err != nil {
		return err
	}
	for len(block) > 0 {
		n := min(len(block), 16<<10)
		if err := p.fr.WriteContinuation(id, n == len(block), block[:n]); err != nil {
			return err
		}
		block = block[n:]
	}
	return nil
}

// awaitWindow reads frames until the client allows n more bytes on stream
// id, or the stream is reset (errReset).
func (p *peerConn) awaitWindow(id uint32, n int64) error {
	for p.connWindow < n || p.streamWindows[id] < n {
		if p.wasReset(id) {
			return errReset
		}
		if _, err := p.readFrame(); err != nil {
			return fmt.Errorf("waiting for %d bytes of flow-control window (connection %d, stream %d): %w", n, p.connWindow, p.streamWindows[id], err)
		}
	}
	return nil
}

var errReset = errors.New("stream reset by the client")

// wasReset reports whether the client reset stream id.
func (p *peerConn) wasReset(id uint32) bool {
	for _, r := range p.resets {
		if r.StreamID == id {
			return true
		}
	}
	return false
}

// writeData sends data on stream id in one DATA frame with padLen bytes
// of padding, within the client's flow-control windows.
func (p *peerConn) writeData(id uint32, endStream bool, data []byte, padLen int) error {
	n := int64(len(data))
	if padLen > 0 {
		n += int64(padLen) + 1 // the pad length byte counts too
	}
	if err := p.awaitWindow(id, n); err != nil {
		return err
	}
	p.connWindow -= n
	p.streamWindows[id] -= n
	_ = p.SetWriteDeadline(time.Now().Add(peerTimeout))
	if padLen > 0 {
		return p.fr.WriteDataPadded(id, endStream, data, make([]byte, padLen))
	}
	return p.fr.WriteData(id, endStream, data)
}

// grpcFrame returns msg with its gRPC length prefix.
func grpcFrame(msg []byte) []byte {
	b := make([]byte, 5+len(msg))
	binary.BigEndian.PutUint32(b[1:5], uint32(len(msg)))
	copy(b[5:], msg)
	return b
}

// answer replies to a unary call with msg and status code.
func (p *peerConn) answer(id uint32, msg []byte, code codes.Code) error {
	if err := p.writeHeaders(id, false, ":status", "200", "content-type", "application/grpc"); err != nil {
		return err
	}
	if err := p.writeData(id, false, grpcFrame(msg), 0); err != nil {
		return err
	}
	return p.writeHeaders(id, true, "grpc-status", strconv.Itoa(int(code)))
}

// serveUntilClosed answers every call on the connection with msg.
func (p *peerConn) serveUntilClosed(msg []byte) {
	for {
		r, err := p.readRequest()
		if err != nil {
			return
		}
		if err := p.answer(r.id, msg, codes.OK); err != nil {
			return
		}
	}
}

// drain reads frames until the client closes the connection or the peer
// timeout passes, and reports which.
func (p *peerConn) drain() error {
	for {
		if _, err := p.readFrame(); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
	}
}
