package csiclient

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// deadlineSlack is added to the deadline sent to the plugin.
const deadlineSlack = 100 * time.Millisecond

// maxSupervisionMessage bounds a reply on the supervision connection; CSI
// identity, capability and node-info replies are a few hundred bytes.
const maxSupervisionMessage = 4 << 20

// supervisionConn makes unary gRPC calls over one HTTP/2 connection to the
// plugin. It exists because a grpc-go ClientConn costs about 100 KiB and
// five goroutines even while idle, too much to keep open to thousands of
// plugins just to probe them; this connection costs one goroutine (its
// reader) and a few KiB, and its broken reads tell the supervisor at once
// that the plugin died. It speaks the gRPC wire protocol for unary calls
// only, one at a time: no streaming, no compression, no metadata.
type supervisionConn struct {
	socket       string
	onDisconnect func()
	dialer       net.Dialer

	mu      sync.Mutex
	cc      *h2Conn
	watched *watchedConn // cc's network connection
	closed  bool
}

func newSupervisionConn(socket string, onDisconnect func()) *supervisionConn {
	if onDisconnect == nil {
		onDisconnect = func() {}
	}
	return &supervisionConn{socket: socket, onDisconnect: onDisconnect}
}

var errClosed = errors.New("client closed")

// conn returns the open HTTP/2 connection, dialing a new one when there is
// none or the old one cannot take calls any more (broken, or told to go
// away). With waitForReady, a refused or missing socket is retried until
// ctx ends, as grpc.WaitForReady does: plugins bind their socket a moment
// before they listen.
func (s *supervisionConn) conn(ctx context.Context, waitForReady bool) (*h2Conn, error) {
	delay := 5 * time.Millisecond
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, errClosed
		}
		if s.cc != nil && s.cc.usable() {
			cc := s.cc
			s.mu.Unlock()
			return cc, nil
		}
		s.closeLocked()
		cc, err := s.dial(ctx)
		s.mu.Unlock()
		if err == nil {
			return cc, nil
		}
		if !waitForReady || ctx.Err() != nil {
			return nil, err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, err
		case <-t.C:
		}
		delay = min(2*delay, 100*time.Millisecond)
	}
}

// dial connects to the socket and starts HTTP/2; called with s.mu held.
func (s *supervisionConn) dial(ctx context.Context) (*h2Conn, error) {
	nc, err := s.dialer.DialContext(ctx, "unix", s.socket)
	if err != nil {
		return nil, err
	}
	wc := &watchedConn{Conn: nc, onDisconnect: s.onDisconnect}
	cc, err := newH2Conn(wc)
	if err != nil {
		return nil, err
	}
	s.cc, s.watched = cc, wc
	return cc, nil
}

// Close closes the connection; later calls fail with Canceled.
func (s *supervisionConn) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.closeLocked()
	return nil
}

// closeLocked closes the current connection, if any, as our own doing.
func (s *supervisionConn) closeLocked() {
	if s.cc == nil {
		return
	}
	s.watched.closeOwned()
	s.cc.close()
	s.cc, s.watched = nil, nil
}

// Invoke implements grpc.ClientConnInterface for unary calls.
func (s *supervisionConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	in, ok := args.(proto.Message)
	if !ok {
		return grpcstatus.Errorf(codes.Internal, "request %T is not a protobuf message", args)
	}
	out, ok := reply.(proto.Message)
	if !ok {
		return grpcstatus.Errorf(codes.Internal, "reply %T is not a protobuf message", reply)
	}
	payload, err := proto.Marshal(in)
	if err != nil {
		return grpcstatus.Errorf(codes.Internal, "marshal %s request: %v", method, err)
	}
	body := make([]byte, 5+len(payload))
	binary.BigEndian.PutUint32(body[1:5], uint32(len(payload)))
	copy(body[5:], payload)

	cc, err := s.conn(ctx, waitsForReady(opts))
	if err != nil {
		return callError(ctx, err)
	}
	header := http.Header{
		"Content-Type": {"application/grpc+proto"},
		"Te":           {"trailers"},
		"User-Agent":   {"csisupd-supervision"},
	}
	if deadline, ok := ctx.Deadline(); ok {
		// The plugin learns the deadline, with a little slack so that our
		// own deadline, not the plugin cancelling the stream a moment
		// earlier, decides how a timed-out call ends: DeadlineExceeded.
		header.Set("Grpc-Timeout", encodeTimeout(time.Until(deadline)+deadlineSlack))
	}
	answer, err := cc.roundTrip(ctx, method, header, body)
	if err != nil {
		return callError(ctx, err)
	}
	if code := answer.status(); code != http.StatusOK {
		return grpcstatus.Errorf(httpStatusCode(code), "not a gRPC answer: HTTP status %d", code)
	}
	if ct := answer.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/grpc") {
		return grpcstatus.Errorf(codes.Unknown, "not a gRPC answer: content-type %q", ct)
	}
	if st := answerStatus(answer.trailer, answer.header); st.Code() != codes.OK {
		return st.Err()
	}
	msg, err := unframe(answer.data)
	if err != nil {
		return grpcstatus.Errorf(codes.Internal, "%s reply: %v", method, err)
	}
	if err := proto.Unmarshal(msg, out); err != nil {
		return grpcstatus.Errorf(codes.Internal, "%s reply: %v", method, err)
	}
	return nil
}

// NewStream implements grpc.ClientConnInterface; the supervision connection
// carries unary calls only.
func (s *supervisionConn) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, grpcstatus.Error(codes.Unimplemented, "streaming calls are not supported on the supervision connection")
}

// waitsForReady reports whether opts hold grpc.WaitForReady(true).
func waitsForReady(opts []grpc.CallOption) bool {
	wait := false
	for _, o := range opts {
		if ff, ok := o.(grpc.FailFastCallOption); ok {
			wait = !ff.FailFast
		}
	}
	return wait
}

// callError turns a transport error into a gRPC status, as grpc-go does:
// the caller's context decides first, anything else is Unavailable.
func callError(ctx context.Context, err error) error {
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return grpcstatus.Error(codes.DeadlineExceeded, ctx.Err().Error())
	case errors.Is(ctx.Err(), context.Canceled), errors.Is(err, errClosed):
		return grpcstatus.Error(codes.Canceled, err.Error())
	}
	return grpcstatus.Errorf(codes.Unavailable, "connection error: %v", err)
}

// answerStatus reads grpc-status, grpc-message and grpc-status-details-bin
// from the trailers, or from the headers of a trailers-only answer.
func answerStatus(trailer, header http.Header) *grpcstatus.Status {
	h := trailer
	if h.Get("Grpc-Status") == "" {
		h = header
	}
	raw := h.Get("Grpc-Status")
	if raw == "" {
		return grpcstatus.New(codes.Internal, "answer carries no grpc-status")
	}
	code, err := strconv.ParseUint(raw, 10, 32)
	if err != nil {
		return grpcstatus.Newf(codes.Internal, "malformed grpc-status %q", raw)
	}
	msg, err := url.PathUnescape(h.Get("Grpc-Message"))
	if err != nil {
		msg = h.Get("Grpc-Message")
	}
	if bin := h.Get("Grpc-Status-Details-Bin"); bin != "" && codes.Code(code) != codes.OK {
		if raw, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(bin, "=")); err == nil {
			var sp status.Status
			if proto.Unmarshal(raw, &sp) == nil && sp.GetCode() == int32(code) {
				return grpcstatus.FromProto(&sp)
			}
		}
	}
	return grpcstatus.New(codes.Code(code), msg)
}

// unframe returns the one uncompressed message of a unary gRPC answer.
func unframe(data []byte) ([]byte, error) {
	if len(data) < 5 {
		return nil, fmt.Errorf("short message frame (%d bytes)", len(data))
	}
	if data[0] != 0 {
		return nil, errors.New("compressed message, but no compression was asked for")
	}
	n := binary.BigEndian.Uint32(data[1:5])
	if n > maxSupervisionMessage || int(n) != len(data)-5 {
		return nil, fmt.Errorf("message frame of %d bytes holds %d", n, len(data)-5)
	}
	return data[5:], nil
}

// encodeTimeout formats d as a grpc-timeout header value: at most eight
// digits and a unit.
func encodeTimeout(d time.Duration) string {
	if d <= 0 {
		return "1n"
	}
	for _, u := range []struct {
		unit string
		size time.Duration
	}{{"n", time.Nanosecond}, {"u", time.Microsecond}, {"m", time.Millisecond}, {"S", time.Second}, {"M", time.Minute}} {
		if v := (d + u.size - 1) / u.size; v < 1e8 {
			return strconv.FormatInt(int64(v), 10) + u.unit
		}
	}
	return strconv.FormatInt(int64((d+time.Hour-1)/time.Hour), 10) + "H"
}

// httpStatusCode maps a non-200 HTTP status to a gRPC code as the gRPC
// HTTP/2 protocol document does.
func httpStatusCode(code int) codes.Code {
	switch code {
	case http.StatusBadRequest:
		return codes.Internal
	case http.StatusUnauthorized:
		return codes.Unauthenticated
	case http.StatusForbidden:
		return codes.PermissionDenied
	case http.StatusNotFound:
		return codes.Unimplemented
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return codes.Unavailable
	}
	return codes.Unknown
}
