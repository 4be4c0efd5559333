// Command csi-hostile serves hostile CSI "plugins" on unix sockets, for the
// soak tests of csisupd's supervision: each speaks just enough HTTP/2 and
// gRPC to be dialled as a CSI plugin and then misbehaves in one way. It is
// test-only code.
//
// Usage:
//
//	csi-hostile --dir DIR --kind KIND --count N
//
// Plugins h-<kind>-0000, h-<kind>-0001, ... listen on DIR/<id>/csi.sock.
// Once all listen the command prints "csi-hostile: serving N" to standard
// output; on SIGTERM or SIGINT it closes everything, removes the sockets and
// exits 0. Usage errors exit 2, other errors 1.
//
// Kinds:
//
//   - maxframes: answers every call with DATA frames of 16 MiB - 1 bytes,
//     the largest an HTTP/2 frame header can claim, whatever the client's
//     SETTINGS_MAX_FRAME_SIZE and flow-control window, until the client
//     goes away.
//   - huge: answers every call with a well-formed gRPC reply of 100 MiB (a
//     length prefix of 100 MiB and that many bytes, a protobuf message
//     holding one unknown field), streamed within flow control.
//   - padded: answers the CSI calls a supervisor makes correctly
//     (GetPluginInfo, GetPluginCapabilities, Probe ready=true, NodeGetInfo,
//     NodeGetCapabilities, ControllerGetCapabilities) but sends every reply
//     as DATA frames of one byte each with 255 bytes of padding; the padding
//     counts against flow control, so a client that returns credit only for
//     the data bytes soon stalls.
//   - goaway: takes a call, then sends GOAWAY with a last stream id below
//     the call's (the call was "never processed"; alternately NO_ERROR and
//     ENHANCE_YOUR_CALM) and closes the connection 50 ms later. A new
//     connection gets the same.
//   - stall: accepts connections and never reads from or writes to them,
//     so a client's writes eventually block.
//
// Every connection costs at most two goroutines (a reader and a writer that
// answers calls one by one), writes block until the socket accepts more
// (nothing spins), and a plugin keeps at most maxConns connections.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Exit statuses.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2
)

// Kinds of hostile plugins.
const (
	kindMaxFrames = "maxframes"
	kindHuge      = "huge"
	kindPadded    = "padded"
	kindGoAway    = "goaway"
	kindStall     = "stall"
)

var kinds = []string{kindMaxFrames, kindHuge, kindPadded, kindGoAway, kindStall}

const (
	// maxFrameLen is the largest length a frame header can carry (24 bits).
	maxFrameLen = 1<<24 - 1
	// hugeMessage is the size of the huge kind's reply message.
	hugeMessage = 100 << 20
	// padLen is the padding of every padded DATA frame, the most its one
	// length byte allows.
	padLen = 255
	// padChunk is the data carried by one padded frame.
	padChunk = 1
	// goAwayClose is how long a goaway connection stays open after its
	// GOAWAY: long enough for the client to read it, short enough that
	// the client meets a closed connection at its next call.
	goAwayClose = 50 * time.Millisecond
	// maxConns bounds the open connections of one plugin; a client that
	// keeps dialling has its newest connections closed at once.
	maxConns = 32
	// maxQueuedCalls bounds calls waiting for a connection's writer;
	// beyond it a call is refused with RST_STREAM.
	maxQueuedCalls = 8
	// defaultWindow and defaultMaxFrame are HTTP/2's initial settings.
	defaultWindow   = 65535
	defaultMaxFrame = 16384
)

// zeros is the payload of maxframes and the bulk of huge replies; shared
// and never written, so its pages stay the kernel's zero page.
var zeros = make([]byte, maxFrameLen)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

type options struct {
	dir   string
	kind  string
	count int
}

func parse(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("csi-hostile", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.dir, "dir", "", "serve the plugins at DIR/<id>/csi.sock")
	fs.StringVar(&o.kind, "kind", "", fmt.Sprintf("kind of hostility: one of %v", kinds))
	fs.IntVar(&o.count, "count", 1, "number of plugins")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case o.dir == "":
		return o, errors.New("--dir is required")
	case o.count < 1 || o.count > 10000:
		return o, fmt.Errorf("--count %d is not between 1 and 10000", o.count)
	}
	for _, k := range kinds {
		if o.kind == k {
			return o, nil
		}
	}
	return o, fmt.Errorf("--kind %q is not one of %v", o.kind, kinds)
}

// run serves until ctx ends, then closes every plugin and waits for all
// their goroutines.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parse(args, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "csi-hostile: %v\n", err)
		return exitUsage
	}
	var plugins []*plugin
	defer func() {
		for _, p := range plugins {
			p.close()
		}
	}()
	for i := range o.count {
		id := fmt.Sprintf("h-%s-%04d", o.kind, i)
		p, err := listen(id, o.kind, filepath.Join(o.dir, id, "csi.sock"), stderr)
		if err != nil {
			fmt.Fprintf(stderr, "csi-hostile: %v\n", err)
			return exitError
		}
		plugins = append(plugins, p)
	}
	fmt.Fprintf(stdout, "csi-hostile: serving %d\n", len(plugins))
	<-ctx.Done()
	return exitOK
}

// plugin is one hostile socket.
type plugin struct {
	id, kind string
	ln       *net.UnixListener
	stderr   io.Writer
	wg       sync.WaitGroup // the accept loop and every connection's goroutines
	goAways  atomic.Uint64  // connections sent GOAWAY, to alternate the code

	mu     sync.Mutex
	conns  map[net.Conn]bool
	closed bool
}

// listen removes a stale socket, listens and starts accepting.
func listen(id, kind, socket string, stderr io.Writer) (*plugin, error) {
	if err := os.MkdirAll(filepath.Dir(socket), 0o755); err != nil {
		return nil, err
	}
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return nil, err
	}
	p := &plugin{id: id, kind: kind, ln: ln, stderr: stderr, conns: make(map[net.Conn]bool)}
	p.wg.Go(p.accept)
	return p, nil
}

// close stops accepting, removes the socket, closes every connection and
// waits for their goroutines.
func (p *plugin) close() {
	p.mu.Lock()
	p.closed = true
	for nc := range p.conns {
		_ = nc.Close()
	}
	p.mu.Unlock()
	_ = p.ln.Close() // unlinks the socket
	p.wg.Wait()
}

func (p *plugin) accept() {
	for {
		nc, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		if !p.track(nc) {
			_ = nc.Close()
			continue
		}
		if p.kind == kindStall {
			// Held open, never read: the connection stays in p.conns
			// (which also keeps the garbage collector from closing it)
			// until the plugin closes.
			continue
		}
		c := newConn(p, nc)
		p.wg.Go(c.readLoop)
	}
}

// track records nc unless the plugin is closed or at maxConns.
func (p *plugin) track(nc net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || len(p.conns) >= maxConns {
		return false
	}
	p.conns[nc] = true
	return true
}

func (p *plugin) untrack(nc net.Conn) {
	p.mu.Lock()
	delete(p.conns, nc)
	p.mu.Unlock()
}

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

// answerMaxFrames sends 16 MiB - 1 byte DATA frames on the call's stream
// until writing fails, ignoring the client's frame size, window and reset.
func (c *conn) answerMaxFrames(cl call) error {
	if err := c.writeHeaders(cl.stream, false, grpcHeaders()); err != nil {
		return err
	}
	for {
		if err := c.writeFrame(http2.FrameData, 0, cl.stream, zeros); err != nil {
			return err
		}
	}
}

// answerHuge sends a valid gRPC message of hugeMessage bytes: one unknown
// length-delimited protobuf field (number 15) of zeros, so it parses as any
// CSI reply.
func (c *conn) answerHuge(cl call) error {
	if err := c.writeHeaders(cl.stream, false, grpcHeaders()); err != nil {
		return err
	}
	const tag = 15<<3 | 2
	// The field's length plus its tag and length varint make the message.
	field := int64(hugeMessage - 2)
	for 1+len(binary.AppendUvarint(nil, uint64(field)))+int(field) > hugeMessage {
		field--
	}
	head := make([]byte, 0, 16)
	head = append(head, 0)
	head = binary.BigEndian.AppendUint32(head, hugeMessage)
	head = append(head, tag)
	head = binary.AppendUvarint(head, uint64(field))
	if err := c.sendData(cl.stream, head, false); err != nil {
		return err
	}
	for left := field; left > 0; {
		chunk := zeros[:min(left, int64(len(zeros)))]
		if err := c.sendData(cl.stream, chunk, false); err != nil {
			return err
		}
		left -= int64(len(chunk))
	}
	return c.writeHeaders(cl.stream, true, grpcTrailers(0, ""))
}

// answerPadded answers a CSI call correctly, its reply split into one-byte
// DATA frames with maximum padding.
func (c *conn) answerPadded(cl call) error {
	msg, ok := paddedReply(c.p.id, cl.path)
	if !ok {
		return c.writeHeaders(cl.stream, true, append(grpcHeaders(), grpcTrailers(12, "csi-hostile: unimplemented "+cl.path)...))
	}
	body, err := proto.Marshal(msg)
	if err != nil {
		return err
	}
	framed := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(body)))
	framed = append(framed, body...)
	if err := c.writeHeaders(cl.stream, false, grpcHeaders()); err != nil {
		return err
	}
	if err := c.sendData(cl.stream, framed, true); err != nil {
		return err
	}
	return c.writeHeaders(cl.stream, true, grpcTrailers(0, ""))
}

// paddedReply is the correct reply of a node plugin to the calls a
// supervisor makes.
func paddedReply(id, path string) (proto.Message, bool) {
	switch path {
	case "/csi.v1.Identity/GetPluginInfo":
		return &csi.GetPluginInfoResponse{Name: id + ".hostile", VendorVersion: "1.0.0"}, true
	case "/csi.v1.Identity/GetPluginCapabilities":
		return &csi.GetPluginCapabilitiesResponse{}, true
	case "/csi.v1.Identity/Probe":
		return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, true
	case "/csi.v1.Node/NodeGetInfo":
		return &csi.NodeGetInfoResponse{NodeId: "hostile-node"}, true
	case "/csi.v1.Node/NodeGetCapabilities":
		return &csi.NodeGetCapabilitiesResponse{}, true
	case "/csi.v1.Controller/ControllerGetCapabilities":
		return &csi.ControllerGetCapabilitiesResponse{}, true
	}
	return nil, false
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
