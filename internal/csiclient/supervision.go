package csiclient

//lint:file-ignore SA1019 x/net's HTTP/2 client is deprecated for net/http's, which does not export the error types this package classifies by (see doc.go).

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/csisupd/csisupd/internal/retry"
)

// userAgent names the supervision connection in the plugin's logs.
const userAgent = "csisupd-supervision"

// supervisionConn makes unary gRPC calls over one HTTP/2 connection to the
// plugin. It exists because a grpc-go ClientConn costs about 37 KiB and
// five goroutines even while idle, too much to keep open to thousands of
// plugins just to probe them. The HTTP/2 connection is x/net's client
// connection on a socket we dial (one reader goroutine); the gRPC protocol
// on top is connect's. The socket is a watchedConn, so the plugin's death
// is reported the moment a read fails.
type supervisionConn struct {
	socket       string
	onDisconnect func()
	transport    *Transport
	// redial spaces the dials of calls that wait for the connection to be
	// ready (Config.Redial).
	redial retry.Policy

	mu      sync.Mutex
	cur     *pluginConn   // the connection calls use, if any
	dialing chan struct{} // closed when the dial in progress ends
	closed  bool

	dials atomic.Int64 // successful dials, for tests
}

func newSupervisionConn(socket string, onDisconnect func(), t *Transport, redial retry.Policy) *supervisionConn {
	if onDisconnect == nil {
		onDisconnect = func() {}
	}
	return &supervisionConn{socket: socket, onDisconnect: onDisconnect, transport: t, redial: redial}
}

var errClosed = errors.New("client closed")

// conn returns the open connection with one more call counted on it,
// dialing a new one when there is none or the old one can take no calls
// (the plugin died, closed it, or said GOAWAY). One caller dials at a time;
// the others wait for it within their own context. With waitForReady, a
// refused or missing socket is retried until ctx ends, as
// grpc.WaitForReady does: plugins bind their socket a moment before they
// listen. The retries are spaced by the redial policy, with jitter, so the
// supervisors of plugins that restarted together do not dial in step.
func (s *supervisionConn) conn(ctx context.Context, waitForReady bool) (*pluginConn, error) {
	var redial *retry.BackOff // made at the first failed dial: most calls need none
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, errClosed
		}
		if p := s.cur; p != nil && p.usable() {
			p.calls.Add(1)
			s.mu.Unlock()
			return p, nil
		}
		if wait := s.dialing; wait != nil {
			s.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		old := s.cur
		s.cur = nil
		done := make(chan struct{})
		s.dialing = done
		s.mu.Unlock()

		if old != nil {
			// The plugin ended this connection, whether or not its end
			// was seen yet (a GOAWAY on an idle connection may not have
			// been): report it, once, and let go of it.
			old.wc.ended()
			old.close()
		}
		p, err := s.dial(ctx)

		s.mu.Lock()
		s.dialing = nil
		close(done)
		if err == nil && s.closed {
			err = errClosed
		}
		if err == nil {
			p.calls.Add(1)
			s.cur = p
		}
		s.mu.Unlock()
		switch {
		case err == nil:
			return p, nil
		case errors.Is(err, errClosed):
			if p != nil {
				p.close()
			}
			return nil, err
		case !waitForReady || ctx.Err() != nil:
			return nil, err
		}
		if redial == nil {
			redial = s.redial.NewBackOff()
		}
		if retry.Wait(ctx, redial.NextBackOff()) != nil {
			return nil, err
		}
	}
}

// dial connects to the socket and starts HTTP/2 on it. Dialing is bounded
// by the write timeout even for a call without a deadline: connecting to a
// plugin whose listen backlog is full blocks.
func (s *supervisionConn) dial(ctx context.Context) (*pluginConn, error) {
	ctx, cancel := context.WithTimeout(ctx, s.transport.writeTimeout)
	defer cancel()
	// Unchecked: supervision follows whoever serves the path (see
	// Config.CheckConnected).
	nc, err := dialSocket(ctx, s.socket, nil)
	if err != nil {
		return nil, err
	}
	wc := &watchedConn{Conn: nc, onDisconnect: s.onDisconnect}
	// Writes the preface and settings, each bounded by the write timeout,
	// and starts the connection's reader goroutine.
	cc, err := s.transport.h2.NewClientConn(wc)
	if err != nil {
		return nil, err
	}
	p := &pluginConn{cc: cc, wc: wc, live: s.transport.live}
	s.transport.live.Store(cc, p)
	s.dials.Add(1)
	return p, nil
}

// Close closes the connection, without waiting on the plugin; later calls
// fail with Canceled.
func (s *supervisionConn) Close() error {
	s.mu.Lock()
	s.closed = true
	p := s.cur
	s.cur = nil
	s.mu.Unlock()
	if p != nil {
		p.close()
	}
	return nil
}

func (s *supervisionConn) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// callOptions are the grpc.CallOptions the supervision connection honours.
type callOptions struct {
	waitForReady     bool
	header, trailer  *metadata.MD
	maxRecv, maxSend int // -1: not set
}

// parseCallOptions reads opts, refusing any option it would otherwise
// have to ignore: a caller relying on one must not get a call that
// silently behaves differently.
func parseCallOptions(opts []grpc.CallOption) (callOptions, error) {
	co := callOptions{maxRecv: -1, maxSend: -1}
	for _, o := range opts {
		switch o := o.(type) {
		case grpc.FailFastCallOption:
			co.waitForReady = !o.FailFast
		case grpc.HeaderCallOption:
			co.header = o.HeaderAddr
		case grpc.TrailerCallOption:
			co.trailer = o.TrailerAddr
		case grpc.MaxRecvMsgSizeCallOption:
			co.maxRecv = max(o.MaxRecvMsgSize, 0)
		case grpc.MaxSendMsgSizeCallOption:
			co.maxSend = max(o.MaxSendMsgSize, 0)
		case grpc.StaticMethodCallOption, grpc.EmptyCallOption:
			// StaticMethod only labels grpc-go's own metrics (generated
			// code adds it); an EmptyCallOption changes nothing by
			// definition.
		default:
			return co, status.Errorf(codes.InvalidArgument, "call option %T is not supported on the supervision connection", o)
		}
	}
	return co, nil
}

// Invoke implements grpc.ClientConnInterface for unary calls.
func (s *supervisionConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	co, err := parseCallOptions(opts)
	if err != nil {
		return err
	}
	in, ok := args.(proto.Message)
	if !ok {
		return status.Errorf(codes.Internal, "request %T is not a protobuf message", args)
	}
	out, ok := reply.(proto.Message)
	if !ok {
		return status.Errorf(codes.Internal, "reply %T is not a protobuf message", reply)
	}
	if !validMethod(method) {
		return status.Errorf(codes.Internal, "malformed method name %q", method)
	}
	if err := contextErr(ctx); err != nil {
		return contextStatus(err)
	}
	payload, err := proto.Marshal(in)
	if err != nil {
		return status.Errorf(codes.Internal, "marshal %s request: %v", method, err)
	}
	sendLimit, recvLimit := s.transport.maxMessage, s.transport.maxMessage
	if co.maxSend >= 0 {
		sendLimit = co.maxSend
	}
	if co.maxRecv >= 0 {
		// A call may ask for less than the connection's cap, not more:
		// the cap is what protects the agent.
		recvLimit = min(recvLimit, co.maxRecv)
	}
	if len(payload) > sendLimit {
		return status.Errorf(codes.ResourceExhausted, "grpc: trying to send message larger than max (%d vs. %d)", len(payload), sendLimit)
	}
	req := connect.NewRequest(&rawMsg{b: payload})
	if err := setOutgoingHeader(ctx, req.Header(), s.transport.userAgent); err != nil {
		return err
	}

	p, err := s.conn(ctx, co.waitForReady)
	if err != nil {
		return connError(ctx, err)
	}
	defer p.release()

	c := &call{conn: p, recvLimit: recvLimit}
	resp, err := s.transport.connectClient(method, recvLimit).CallUnary(withCall(ctx, c), req)
	if mdErr := c.fillMetadata(co); mdErr != nil && err == nil {
		return mdErr
	}
	if err != nil {
		if s.isClosed() && !connect.IsWireError(err) {
			// Close cut the call short, as grpc-go reports it.
			return status.Error(codes.Canceled, "grpc: the client connection is closing")
		}
		return c.statusError(ctx, method, err)
	}
	if err := proto.Unmarshal(resp.Msg.b, out); err != nil {
		return violationf(codes.Internal, "the reply to %s is not a valid %T: %v", method, out, err)
	}
	return nil
}

// NewStream implements grpc.ClientConnInterface; the supervision connection
// carries unary calls only.
func (s *supervisionConn) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, status.Error(codes.Unimplemented, "streaming calls are not supported on the supervision connection")
}

// validMethod reports whether method is a gRPC method path
// ("/package.Service/Method") that needs no escaping in a URL.
func validMethod(method string) bool {
	if len(method) < 3 || method[0] != '/' || strings.Count(method, "/") != 2 {
		return false
	}
	for _, r := range method {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '/':
		default:
			return false
		}
	}
	return true
}

// isReservedHeader reports whether a header belongs to gRPC or HTTP/2
// rather than to the call's metadata; grpc-go neither sends such metadata
// nor shows such headers as metadata.
func isReservedHeader(name string) bool {
	if strings.HasPrefix(name, ":") {
		return true
	}
	switch name {
	case "content-type", "user-agent", "grpc-message-type", "grpc-encoding",
		"grpc-message", "grpc-status", "grpc-timeout", "te":
		return true
	}
	return false
}

// setOutgoingHeader adds the call's outgoing metadata to the request
// headers h, refusing what grpc-go refuses and capping its size: the
// plugin may refuse a larger header list, and the caller should learn why.
// It writes into connect's own header map, so a call without metadata (a
// probe) allocates no header map of its own, and ua, the Transport's
// User-Agent value, which the header only reads.
func setOutgoingHeader(ctx context.Context, h http.Header, ua []string) error {
	h["User-Agent"] = ua
	md, ok := metadata.FromOutgoingContext(ctx)
	if !ok {
		return nil
	}
	size := 0
	for k, vs := range md {
		if err := validMetadataKey(k); err != nil {
			return err
		}
		if isReservedHeader(k) {
			continue
		}
		bin := strings.HasSuffix(k, "-bin")
		name := http.CanonicalHeaderKey(k)
		for _, v := range vs {
			if bin {
				v = connect.EncodeBinaryHeader([]byte(v))
			} else if !printableASCII(v) {
				return status.Errorf(codes.Internal, "header key %q contains value with non-printable ASCII characters", k)
			}
			// HTTP/2 counts 32 bytes of overhead per field.
			size += len(k) + len(v) + 32
			h[name] = append(h[name], v)
		}
	}
	if size > maxHeaderListSize {
		return status.Errorf(codes.ResourceExhausted, "outgoing metadata of %d bytes exceeds the %d-byte limit", size, maxHeaderListSize)
	}
	return nil
}

// validMetadataKey checks a metadata key as grpc-go does.
func validMetadataKey(k string) error {
	if k == "" {
		return status.Error(codes.Internal, "there is an empty key in the header")
	}
	for i := range len(k) {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || i == 0 && c == ':') {
			return status.Errorf(codes.Internal, "header key %q contains illegal characters not in [0-9a-z-_.]", k)
		}
	}
	return nil
}

func printableASCII(s string) bool {
	for i := range len(s) {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// fillMetadata hands the answer's header and trailer metadata to the
// grpc.Header and grpc.Trailer options, as grpc-go shows them: reserved
// headers left out, binary values decoded, and a trailers-only answer's
// headers shown as trailers.
func (c *call) fillMetadata(co callOptions) error {
	if co.header == nil && co.trailer == nil || c.resp == nil {
		return nil
	}
	header, trailer := c.resp.Header, c.resp.Trailer
	if trailer.Get("Grpc-Status") == "" && header.Get("Grpc-Status") != "" {
		header, trailer = nil, header // trailers-only
	}
	var err error
	if co.header != nil {
		if *co.header, err = toMetadata(header); err != nil {
			return err
		}
	}
	if co.trailer != nil {
		*co.trailer, err = toMetadata(trailer)
	}
	return err
}

// toMetadata converts answer headers to metadata as grpc-go does.
func toMetadata(h http.Header) (metadata.MD, error) {
	md := make(metadata.MD, len(h))
	for k, vs := range h {
		k = strings.ToLower(k)
		if isReservedHeader(k) && k != "content-type" && k != "user-agent" {
			continue
		}
		for _, v := range vs {
			if strings.HasSuffix(k, "-bin") {
				b, err := connect.DecodeBinaryHeader(v)
				if err != nil {
					return nil, violationf(codes.Internal, "malformed binary metadata %s: %v", k, err)
				}
				v = string(b)
			}
			md[k] = append(md[k], v)
		}
	}
	return md, nil
}
