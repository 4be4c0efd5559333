package csiclient

import (
	"context"
	"encoding/binary"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csisupd/csisupd/internal/testutil"
	"golang.org/x/net/http2"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// echoMethod is a method no CSI plugin has; scripted plugins answer
// whatever is called.
const echoMethod = "/csiclient.test.Echo/Echo"

// pluginInfo is a marshalled GetPluginInfo reply named name.
func pluginInfo(t testing.TB, name string) []byte {
	t.Helper()
	b, err := proto.Marshal(&csi.GetPluginInfoResponse{Name: name, VendorVersion: "1"})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// disconnectCounter counts OnDisconnect calls.
type disconnectCounter struct{ n atomic.Int32 }

func (d *disconnectCounter) onDisconnect() { d.n.Add(1) }

// waitDisconnects waits until OnDisconnect was called n times.
func (d *disconnectCounter) wait(t *testing.T, n int32) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, "OnDisconnect", func() bool { return d.n.Load() >= n })
}

// infoCall calls GetPluginInfo on the supervision connection with a
// deadline and returns the name, the error and how long it took.
func infoCall(c *Client, timeout time.Duration) (string, time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	resp, err := csi.NewIdentityClient(c.Supervision()).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	return resp.GetName(), time.Since(start), err
}

// unreadBytes returns how many bytes wait unread in c's receive queue.
func unreadBytes(t testing.TB, c net.Conn) int {
	t.Helper()
	sc, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	if err := sc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); err != nil {
		t.Fatal(err)
	}
	return n
}

// A plugin that stops reading must not freeze the agent: its writes are
// bounded, the connection is given up and reported, and Close never waits
// for it.
func TestPluginThatStopsReading(t *testing.T) {
	cases := []struct {
		name string
		// grant: the plugin opens its flow-control windows wide before it
		// stops reading, so that a large request meets a full socket
		// buffer rather than a closed window.
		grant        bool
		writeTimeout time.Duration
		deadline     time.Duration
		closeClient  bool // Close while the write is blocked
		wantCode     codes.Code
		wantText     string
		wantGone     bool // OnDisconnect fires
		within       time.Duration
	}{
		{name: "silent plugin: the call ends at its deadline", writeTimeout: time.Minute, deadline: 300 * time.Millisecond,
			wantCode: codes.DeadlineExceeded, within: 2 * time.Second},
		{name: "blocked write times out", grant: true, writeTimeout: 200 * time.Millisecond, deadline: time.Minute,
			wantCode: codes.Unavailable, wantText: "stopped reading", wantGone: true, within: 5 * time.Second},
		{name: "Close while a write is blocked", grant: true, writeTimeout: time.Minute, deadline: time.Minute, closeClient: true,
			wantCode: codes.Canceled, within: 5 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(testutil.TempDir(t), "csi.sock")
			stalled := make(chan net.Conn, 1)
			release := make(chan struct{})
			startRawPlugin(t, sock, func(_ int, p *peerConn) {
				if tc.grant {
					if p.handshake(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1<<31 - 1}) != nil ||
						p.fr.WriteWindowUpdate(0, 1<<30) != nil {
						return
					}
				}
				stalled <- p.Conn
				<-release // never read again
			})
			t.Cleanup(func() { close(release) }) // runs before the plugin stops

			var gone disconnectCounter
			c := newClient(t, Config{Socket: sock, WriteTimeout: tc.writeTimeout, OnDisconnect: gone.onDisconnect})
			big := &wrapperspb.BytesValue{Value: make([]byte, 2<<20)} // far beyond a socket buffer
			done := make(chan error, 1)
			start := time.Now()
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), tc.deadline)
				defer cancel()
				done <- c.Supervision().Invoke(ctx, echoMethod, big, &wrapperspb.BytesValue{})
			}()

			if tc.closeClient {
				pc := <-stalled
				testutil.WaitFor(t, 10*time.Second, "the request to fill the plugin's socket", func() bool {
					return unreadBytes(t, pc) >= 128<<10
				})
				closeStart := time.Now()
				if err := c.Close(); err != nil {
					t.Fatalf("Close: %v", err)
				}
				if d := time.Since(closeStart); d > time.Second {
					t.Errorf("Close took %s with a write blocked on the plugin", d)
				}
			}
			var err error
			select {
			case err = <-done:
			case <-time.After(tc.within):
				t.Fatalf("the call did not return within %s", tc.within)
			}
			if elapsed := time.Since(start); elapsed > tc.within {
				t.Errorf("the call took %s, want at most %s", elapsed, tc.within)
			}
			if status.Code(err) != tc.wantCode || !strings.Contains(err.Error(), tc.wantText) {
				t.Fatalf("call: %v, want %s containing %q", err, tc.wantCode, tc.wantText)
			}
			if IsProtocolViolation(err) {
				t.Errorf("a plugin that stops reading is slow, not in violation: %v", err)
			}
			if tc.wantGone {
				gone.wait(t, 1)
			} else if n := gone.n.Load(); n != 0 {
				t.Errorf("OnDisconnect called %d times", n)
			}
		})
	}
}

// writeFrameHeader writes a raw frame header, whatever its length.
func writeFrameHeader(p *peerConn, length uint32, typ http2.FrameType, id uint32) error {
	var h [9]byte
	h[0], h[1], h[2] = byte(length>>16), byte(length>>8), byte(length)
	h[3] = byte(typ)
	binary.BigEndian.PutUint32(h[5:], id)
	_ = p.SetWriteDeadline(time.Now().Add(peerTimeout))
	_, err := p.Write(h[:])
	return err
}

// Frames up to the 16 KiB we allow carry any reply; a larger one breaks
// the connection before the agent buffers it.
func TestFrameSizeLimit(t *testing.T) {
	longName := strings.Repeat("n", 100<<10)
	cases := []struct {
		name      string
		reply     func(p *peerConn, id uint32) error
		violation bool
	}{
		{name: "16 KiB frames, the largest allowed", reply: func(p *peerConn, id uint32) error {
			body := grpcFrame(pluginInfo(t, longName))
			if err := p.writeHeaders(id, false, ":status", "200", "content-type", "application/grpc"); err != nil {
				return err
			}
			for len(body) > 0 {
				n := min(len(body), 16<<10)
				if err := p.writeData(id, false, body[:n], 0); err != nil {
					return err
				}
				body = body[n:]
			}
			return p.writeHeaders(id, true, "grpc-status", "0")
		}},
		{name: "a 16 MiB frame", violation: true, reply: func(p *peerConn, id uint32) error {
			if err := p.writeHeaders(id, false, ":status", "200", "content-type", "application/grpc"); err != nil {
				return err
			}
			if err := writeFrameHeader(p, 1<<24-1, http2.FrameData, id); err != nil {
				return err
			}
			_, err := p.Write(make([]byte, 1<<20)) // the client closes long before 16 MiB
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(testutil.TempDir(t), "csi.sock")
			startRawPlugin(t, sock, func(i int, p *peerConn) {
				if p.handshake() != nil {
					return
				}
				if i == 0 {
					r, err := p.readRequest()
					if err != nil || tc.reply(p, r.id) != nil {
						return
					}
				}
				p.serveUntilClosed(pluginInfo(t, "healthy"))
			})
			var gone disconnectCounter
			c := newClient(t, Config{Socket: sock, OnDisconnect: gone.onDisconnect})
			name, took, err := infoCall(c, 5*time.Second)
			if tc.violation {
				if status.Code(err) != codes.Internal || !IsProtocolViolation(err) || !strings.Contains(err.Error(), "frame larger") {
					t.Fatalf("reply with a 16 MiB frame: %v, want an Internal protocol violation about the frame size", err)
				}
				if took > 2*time.Second {
					t.Errorf("the oversized frame took %s to refuse", took)
				}
				gone.wait(t, 1) // the connection is broken
			} else if err != nil || name != longName {
				t.Fatalf("reply in 16 KiB frames: %d-byte name, %v", len(name), err)
			}
			// The plugin behaves again: the next call works, over a new
			// connection if the old one broke.
			if name, _, err := infoCall(c, 5*time.Second); err != nil || (tc.violation && name != "healthy") {
				t.Fatalf("next call: %q, %v", name, err)
			}
		})
	}
}

// A plugin answering with 100 MB: refused as soon as the reply is larger
// than the cap, without reading the rest, and the stream is reset.
func TestHugeReply(t *testing.T) {
	const declared = 100 << 20
	sock := filepath.Join(testutil.TempDir(t), "csi.sock")
	type result struct {
		sent  int64
		reset http2.ErrCode
		err   error
	}
	results := make(chan result, 1)
	startRawPlugin(t, sock, func(i int, p *peerConn) {
		if p.handshake() != nil {
			return
		}
		if i == 0 {
			r, err := p.readRequest()
			if err != nil {
				results <- result{err: err}
				return
			}
			var prefix [5]byte
			binary.BigEndian.PutUint32(prefix[1:], declared)
			if err := p.writeHeaders(r.id, false, ":status", "200", "content-type", "application/grpc"); err != nil {
				results <- result{err: err}
				return
			}
			sent := int64(0)
			err = p.writeData(r.id, false, prefix[:], 0)
			chunk := make([]byte, 16<<10)
			for err == nil && sent < declared {
				if err = p.writeData(r.id, false, chunk, 0); err == nil {
					sent += int64(len(chunk))
				}
			}
			res := result{sent: sent, err: err}
			if err == errReset {
				res.err = nil
				for _, f := range p.resets {
					if f.StreamID == r.id {
						res.reset = f.ErrCode
					}
				}
			}
			results <- res
		}
		p.serveUntilClosed(pluginInfo(t, "healthy"))
	})

	c := newClient(t, Config{Socket: sock})
	_, took, err := infoCall(c, 30*time.Second)
	if status.Code(err) != codes.ResourceExhausted || !IsProtocolViolation(err) || !strings.Contains(err.Error(), "cap") {
		t.Fatalf("100 MB reply: %v, want a ResourceExhausted protocol violation naming the cap", err)
	}
	if took > 5*time.Second {
		t.Errorf("refusing the 100 MB reply took %s", took)
	}
	var res result
	select {
	case res = <-results:
	case <-time.After(peerTimeout):
		t.Fatal("the plugin never saw the stream end")
	}
	if res.err != nil {
		t.Fatalf("plugin: %v", res.err)
	}
	// The agent reads at most the cap (4 MiB) and the plugin may have one
	// receive window more in flight.
	if limit := int64(DefaultMaxMessageSize + 2*maxReceiveWindow); res.sent > limit {
		t.Errorf("the plugin sent %d bytes before the stream ended, want at most %d", res.sent, limit)
	}
	if res.reset != http2.ErrCodeCancel {
		t.Errorf("the plugin saw the stream end with %v, want a RST_STREAM CANCEL", res.reset)
	}
	// A stream-level refusal costs the connection nothing.
	if name, _, err := infoCall(c, 5*time.Second); err != nil || name != "healthy" {
		t.Fatalf("next call: %q, %v", name, err)
	}
	if n := c.supervision.dials.Load(); n != 1 {
		t.Errorf("%d dials, want 1: the connection should survive a refused reply", n)
	}
}

// Padding counts against flow control like data. A client that returned
// only the data's share would run out of connection window after a few
// hundred padded replies, and the plugin could no longer answer.
func TestPaddedReplies(t *testing.T) {
	const calls, framesPerReply, pad = 500, 4, 255
	sock := filepath.Join(testutil.TempDir(t), "csi.sock")
	startRawPlugin(t, sock, func(_ int, p *peerConn) {
		if p.handshake() != nil {
			return
		}
		body := grpcFrame(pluginInfo(t, "padded"))
		for {
			r, err := p.readRequest()
			if err != nil {
				return
			}
			if p.writeHeaders(r.id, false, ":status", "200", "content-type", "application/grpc") != nil {
				return
			}
			per := (len(body) + framesPerReply - 1) / framesPerReply
			for rest := body; len(rest) > 0; rest = rest[min(per, len(rest)):] {
				if p.writeData(r.id, false, rest[:min(per, len(rest))], pad) != nil {
					return
				}
			}
			if p.writeHeaders(r.id, true, "grpc-status", "0") != nil {
				return
			}
		}
	})
	c := newClient(t, Config{Socket: sock})
	// 500 replies carry 500 KiB of padding, twice the connection window.
	for i := range calls {
		if name, _, err := infoCall(c, 5*time.Second); err != nil || name != "padded" {
			t.Fatalf("call %d: %q, %v", i, name, err)
		}
	}
	if n := c.supervision.dials.Load(); n != 1 {
		t.Errorf("%d dials for %d calls, want 1", n, calls)
	}
}

// GOAWAY: an in-flight call ends with a clear status, the departure is
// reported, and the next call reaches the plugin over a new connection.
func TestGoAway(t *testing.T) {
	cases := []struct {
		name string
		// first serves the plugin's first connection after the handshake.
		first     func(p *peerConn) error
		wantCode  codes.Code
		wantText  string
		violation bool
		// clientCloses: the plugin waits for the client to close the
		// connection, which it must do for the plugin to finish.
		clientCloses bool
	}{
		{name: "before answering, connection left open", clientCloses: true, wantCode: codes.Unavailable, wantText: "GOAWAY",
			first: func(p *peerConn) error {
				if _, err := p.readRequest(); err != nil {
					return err
				}
				return p.fr.WriteGoAway(0, http2.ErrCodeNo, []byte("restarting"))
			}},
		{name: "then closed before answering", wantCode: codes.Unavailable, wantText: "GOAWAY",
			first: func(p *peerConn) error {
				r, err := p.readRequest()
				if err != nil {
					return err
				}
				return p.fr.WriteGoAway(r.id, http2.ErrCodeNo, []byte("restarting"))
			}},
		{name: "then the answer", clientCloses: true, wantCode: codes.OK,
			first: func(p *peerConn) error {
				r, err := p.readRequest()
				if err != nil {
					return err
				}
				if err := p.fr.WriteGoAway(r.id, http2.ErrCodeNo, nil); err != nil {
					return err
				}
				return p.answer(r.id, pluginInfo(t, "draining"), codes.OK)
			}},
		{name: "with PROTOCOL_ERROR", wantCode: codes.Unavailable, wantText: "PROTOCOL_ERROR", violation: true,
			first: func(p *peerConn) error {
				r, err := p.readRequest()
				if err != nil {
					return err
				}
				return p.fr.WriteGoAway(r.id, http2.ErrCodeProtocol, []byte("you broke it"))
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(testutil.TempDir(t), "csi.sock")
			closedByClient := make(chan error, 1)
			startRawPlugin(t, sock, func(i int, p *peerConn) {
				if p.handshake() != nil {
					return
				}
				if i > 0 {
					p.serveUntilClosed(pluginInfo(t, "healthy"))
					return
				}
				if err := tc.first(p); err != nil {
					closedByClient <- err
					return
				}
				if tc.clientCloses {
					closedByClient <- p.drain()
				}
			})
			var gone disconnectCounter
			c := newClient(t, Config{Socket: sock, OnDisconnect: gone.onDisconnect})
			_, _, err := infoCall(c, 5*time.Second)
			if status.Code(err) != tc.wantCode || err != nil && !strings.Contains(err.Error(), tc.wantText) {
				t.Fatalf("call during GOAWAY: %v, want %s containing %q", err, tc.wantCode, tc.wantText)
			}
			if IsProtocolViolation(err) != tc.violation {
				t.Errorf("IsProtocolViolation(%v) = %v, want %v", err, !tc.violation, tc.violation)
			}
			gone.wait(t, 1)
			if tc.clientCloses {
				select {
				case err := <-closedByClient:
					if err != nil {
						t.Fatalf("waiting for the client to close the connection: %v", err)
					}
				case <-time.After(peerTimeout):
					t.Fatal("the client kept the connection the plugin told to go away")
				}
			}
			if name, _, err := infoCall(c, 5*time.Second); err != nil || name != "healthy" {
				t.Fatalf("call after GOAWAY: %q, %v", name, err)
			}
			if n := c.supervision.dials.Load(); n != 2 {
				t.Errorf("%d dials, want 2", n)
			}
			if n := gone.n.Load(); n != 1 {
				t.Errorf("OnDisconnect called %d times for one connection", n)
			}
		})
	}
}

// A GOAWAY on an idle connection is reported at once and the connection
// closed, so the plugin can finish stopping without waiting for a call.
func TestGoAwayWhileIdle(t *testing.T) {
	sock := filepath.Join(testutil.TempDir(t), "csi.sock")
	closedByClient := make(chan error, 1)
	// The plugin says GOAWAY only once the call has returned, when the
	// connection has no stream whose end would close it.
	idle := make(chan struct{})
	startRawPlugin(t, sock, func(i int, p *peerConn) {
		if p.handshake() != nil {
			return
		}
		if i > 0 {
			p.serveUntilClosed(pluginInfo(t, "healthy"))
			return
		}
		r, err := p.readRequest()
		if err == nil {
			err = p.answer(r.id, pluginInfo(t, "first"), codes.OK)
		}
		if err == nil {
			select {
			case <-idle:
			case <-time.After(peerTimeout):
			}
			err = p.fr.WriteGoAway(r.id, http2.ErrCodeNo, nil)
		}
		if err == nil {
			err = p.drain()
		}
		closedByClient <- err
	})
	var gone disconnectCounter
	c := newClient(t, Config{Socket: sock, OnDisconnect: gone.onDisconnect})
	if name, _, err := infoCall(c, 5*time.Second); err != nil || name != "first" {
		t.Fatalf("first call: %q, %v", name, err)
	}
	close(idle)
	gone.wait(t, 1)
	select {
	case err := <-closedByClient:
		if err != nil {
			t.Fatalf("waiting for the client to close the connection: %v", err)
		}
	case <-time.After(peerTimeout):
		t.Fatal("the client kept an idle connection the plugin told to go away")
	}
	if name, _, err := infoCall(c, 5*time.Second); err != nil || name != "healthy" {
		t.Fatalf("call after GOAWAY: %q, %v", name, err)
	}
	if n := gone.n.Load(); n != 1 {
		t.Errorf("OnDisconnect called %d times for one connection", n)
	}
}

// RST_STREAM from the plugin ends the call with the code grpc-go gives
// it; codes saying HTTP/2 itself went wrong are protocol violations.
func TestResetStreamCodes(t *testing.T) {
	cases := []struct {
		code      http2.ErrCode
		want      codes.Code
		violation bool
	}{
		{http2.ErrCodeNo, codes.Internal, false},
		{http2.ErrCodeProtocol, codes.Internal, true},
		{http2.ErrCodeInternal, codes.Internal, false},
		{http2.ErrCodeFlowControl, codes.ResourceExhausted, true},
		{http2.ErrCodeSettingsTimeout, codes.Internal, true},
		{http2.ErrCodeStreamClosed, codes.Internal, true},
		{http2.ErrCodeFrameSize, codes.Internal, true},
		{http2.ErrCodeRefusedStream, codes.Unavailable, false},
		{http2.ErrCodeCancel, codes.Canceled, false},
		{http2.ErrCodeCompression, codes.Internal, true},
		{http2.ErrCodeConnect, codes.Internal, false},
		{http2.ErrCodeEnhanceYourCalm, codes.ResourceExhausted, false},
		{http2.ErrCodeInadequateSecurity, codes.PermissionDenied, false},
		{http2.ErrCodeHTTP11Required, codes.Internal, true},
	}
	for _, afterHeaders := range []bool{false, true} {
		for _, tc := range cases {
			t.Run(tc.code.String()+map[bool]string{false: " before headers", true: " after headers"}[afterHeaders], func(t *testing.T) {
				sock := filepath.Join(testutil.TempDir(t), "csi.sock")
				startRawPlugin(t, sock, func(i int, p *peerConn) {
					if p.handshake() != nil {
						return
					}
					if i == 0 {
						r, err := p.readRequest()
						if err != nil {
							return
						}
						if afterHeaders && p.writeHeaders(r.id, false, ":status", "200", "content-type", "application/grpc") != nil {
							return
						}
						if p.fr.WriteRSTStream(r.id, tc.code) != nil {
							return
						}
					}
					p.serveUntilClosed(pluginInfo(t, "healthy"))
				})
				c := newClient(t, Config{Socket: sock})
				_, _, err := infoCall(c, 5*time.Second)
				if status.Code(err) != tc.want || !strings.Contains(err.Error(), tc.code.String()) {
					t.Fatalf("RST_STREAM %v: %v, want %s naming the code", tc.code, err, tc.want)
				}
				if IsProtocolViolation(err) != tc.violation {
					t.Errorf("IsProtocolViolation(%v) = %v, want %v", err, !tc.violation, tc.violation)
				}
				if name, _, err := infoCall(c, 5*time.Second); err != nil || name != "healthy" {
					t.Fatalf("call after the reset: %q, %v", name, err)
				}
			})
		}
	}
}

// A call that times out or is cancelled ends with the caller's code, not
// Unavailable, and resets its stream so the plugin can stop working on it.
func TestCallEndResetsStream(t *testing.T) {
	cases := []struct {
		name string
		// cancelAfterRequest cancels the call once the plugin has it;
		// otherwise its deadline ends it.
		cancelAfterRequest bool
		// resetAtDeadline: the plugin itself resets the stream with
		// CANCEL when the deadline it was sent passes.
		resetAtDeadline bool
		want            codes.Code
	}{
		{name: "deadline", want: codes.DeadlineExceeded},
		{name: "deadline, and the plugin resets at its deadline too", resetAtDeadline: true, want: codes.DeadlineExceeded},
		{name: "cancel", cancelAfterRequest: true, want: codes.Canceled},
	}
	const deadline = 300 * time.Millisecond
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sock := filepath.Join(testutil.TempDir(t), "csi.sock")
			type seen struct {
				timeout time.Duration
				reset   http2.ErrCode
				err     error
			}
			gotRequest := make(chan struct{}, 1)
			results := make(chan seen, 1)
			startRawPlugin(t, sock, func(i int, p *peerConn) {
				if p.handshake() != nil {
					return
				}
				if i > 0 {
					p.serveUntilClosed(pluginInfo(t, "healthy"))
					return
				}
				r, err := p.readRequest()
				if err != nil {
					results <- seen{err: err}
					return
				}
				gotRequest <- struct{}{}
				s := seen{timeout: -1}
				if v, ok := r.fields["grpc-timeout"]; ok {
					s.timeout = parseTimeout(t, v)
				}
				if tc.resetAtDeadline {
					// The plugin's own deadline timer (what it was told),
					// not synchronisation with the test.
					<-time.After(s.timeout)
					s.err = p.fr.WriteRSTStream(r.id, http2.ErrCodeCancel)
					results <- s
					p.serveUntilClosed(pluginInfo(t, "healthy"))
					return
				}
				for !p.wasReset(r.id) {
					if _, err := p.readFrame(); err != nil {
						results <- seen{err: err}
						return
					}
				}
				for _, f := range p.resets {
					if f.StreamID == r.id {
						s.reset = f.ErrCode
					}
				}
				results <- s
				p.serveUntilClosed(pluginInfo(t, "healthy"))
			})
			c := newClient(t, Config{Socket: sock})
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			if tc.cancelAfterRequest {
				ctx, cancel = context.WithCancel(context.Background())
				defer cancel()
				go func() {
					<-gotRequest
					cancel()
				}()
			}
			_, err := csi.NewIdentityClient(c.Supervision()).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
			if status.Code(err) != tc.want || IsProtocolViolation(err) {
				t.Fatalf("call: %v, want %s", err, tc.want)
			}
			var s seen
			select {
			case s = <-results:
			case <-time.After(peerTimeout):
				t.Fatal("the plugin saw no end of the stream")
			}
			if s.err != nil {
				t.Fatalf("plugin: %v", s.err)
			}
			if !tc.resetAtDeadline && s.reset != http2.ErrCodeCancel {
				t.Errorf("the plugin saw the stream end with %v, want RST_STREAM CANCEL", s.reset)
			}
			if !tc.cancelAfterRequest && (s.timeout <= 0 || s.timeout > deadline) {
				t.Errorf("grpc-timeout sent: %s, want within (0, %s]", s.timeout, deadline)
			}
			if tc.cancelAfterRequest && s.timeout != -1 {
				t.Errorf("grpc-timeout %s sent for a call without deadline", s.timeout)
			}
			if name, _, err := infoCall(c, 5*time.Second); err != nil || name != "healthy" {
				t.Fatalf("next call: %q, %v", name, err)
			}
		})
	}
}

// parseTimeout reads a grpc-timeout header value.
func parseTimeout(t testing.TB, v string) time.Duration {
	t.Helper()
	units := map[byte]time.Duration{'H': time.Hour, 'M': time.Minute, 'S': time.Second, 'm': time.Millisecond, 'u': time.Microsecond, 'n': time.Nanosecond}
	if len(v) < 2 || len(v) > 9 {
		t.Errorf("malformed grpc-timeout %q", v)
		return 0
	}
	n, err := strconv.ParseInt(v[:len(v)-1], 10, 64)
	u, ok := units[v[len(v)-1]]
	if err != nil || !ok {
		t.Errorf("malformed grpc-timeout %q", v)
		return 0
	}
	return time.Duration(n) * u
}
