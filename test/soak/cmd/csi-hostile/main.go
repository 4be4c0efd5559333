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
	"context"
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
