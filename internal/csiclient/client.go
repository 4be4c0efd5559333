package csiclient

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"sync"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/csisupd/csisupd/internal/retry"
)

// DefaultMaxBackoff caps redial backoff when Config.MaxBackoff is zero.
const DefaultMaxBackoff = 5 * time.Second

// DefaultIdleTimeout is how long the full gRPC connection stays open
// without calls when Config.IdleTimeout is zero.
const DefaultIdleTimeout = time.Minute

// DefaultWriteTimeout bounds each write to the plugin on the supervision
// connection when Config.WriteTimeout is zero. A plugin that stops reading
// for this long is treated as gone: its connection is closed and reported.
const DefaultWriteTimeout = 5 * time.Second

// DefaultMaxMessageSize caps a reply on the supervision connection when
// Config.MaxMessageSize is zero; it is grpc-go's default receive limit.
const DefaultMaxMessageSize = 4 << 20

// maxSocketPath is the longest unix socket path: sun_path holds 108 bytes,
// the last of which is the terminating NUL.
const maxSocketPath = 107

// Config describes one plugin connection.
type Config struct {
	// Socket is the path of the plugin's unix socket.
	Socket string
	// MaxBackoff caps the delay between redial attempts of the full gRPC
	// connection. (The supervision connection redials at its next call.)
	MaxBackoff time.Duration
	// Redial spaces the supervision connection's dials while the socket
	// refuses connections or is missing, for calls made with
	// grpc.WaitForReady: they retry until their context ends. Required;
	// the default is config.Retry.PluginRedial.
	Redial retry.Policy
	// DialOptions are appended to the full gRPC connection's defaults.
	DialOptions []grpc.DialOption
	// OnDisconnect, when set, is called once each time the established
	// supervision connection to the plugin ends without our asking: the
	// plugin died, closed it, told it to go away (GOAWAY) or stopped
	// reading. It is called the moment that is seen, from whichever
	// goroutine sees it (usually the connection's reader, at the failed
	// read), and must not block. Watching the socket this way costs no
	// goroutine per plugin. Closing the Client is not a disconnect.
	OnDisconnect func()
	// IdleTimeout closes the full gRPC connection (Identity, Controller,
	// Node) after this long without calls; it redials on the next call.
	// Zero means DefaultIdleTimeout.
	IdleTimeout time.Duration
	// WriteTimeout bounds every write to the plugin on the supervision
	// connection, and its dial: a plugin that stops reading makes the write
	// fail after this long, and the connection closes and is reported
	// through OnDisconnect. Zero means DefaultWriteTimeout.
	WriteTimeout time.Duration
	// MaxMessageSize caps, in bytes, a reply on the supervision connection
	// (and a request, unless a call asks for less): a larger reply fails
	// with ResourceExhausted and its stream is reset. The connection's
	// HTTP/2 receive windows are derived from it. Zero means
	// DefaultMaxMessageSize.
	MaxMessageSize int
	// CheckConnected, when set, runs after every connect of the full gRPC
	// connection, before anything is sent on it; an error closes it and
	// fails the dial with it. A path names whatever socket is there now:
	// the registry uses this so that calls allowed by one plugin instance's
	// capabilities never reach an instance that replaced it. The
	// supervision connection is not checked: it must reach whoever serves
	// the path, which is how a plugin replaced in place (behind a socket
	// that stays, as with systemd socket activation) is noticed and
	// fingerprinted again.
	CheckConnected func() error
	// Transport, when set, is the supervision transport shared with other
	// Clients: it carries its own write timeout and message cap, so
	// WriteTimeout and MaxMessageSize must then be zero. Nil means the
	// Client makes its own from WriteTimeout and MaxMessageSize.
	Transport *Transport
}

// CheckSocketPath reports whether path, as it will be dialled, fits in a
// unix socket address. A longer path cannot be dialled at all; saying so
// up front keeps the failure from looking like a plugin that never
// answers.
func CheckSocketPath(path string) error {
	if len(path) > maxSocketPath {
		return fmt.Errorf("csiclient: socket path %q is %d bytes; a unix socket path may have at most %d", path, len(path), maxSocketPath)
	}
	return nil
}

// Client is a connection to one CSI plugin with its three service clients.
type Client struct {
	socket      string
	conn        *lazyConn
	supervision *supervisionConn

	// Identity, Controller and Node use the full gRPC connection: every
	// call, status detail and deadline passes through grpc-go unchanged.
	Identity   csi.IdentityClient
	Controller csi.ControllerClient
	Node       csi.NodeClient
}

// New creates a client for cfg.Socket. It does not dial: each connection's
// first call does, and a missing socket is not an error here. A socket path
// too long for a unix socket address is (see CheckSocketPath).
func New(cfg Config) (*Client, error) {
	if cfg.Socket == "" {
		return nil, errors.New("csiclient: socket path is empty")
	}
	abs, err := filepath.Abs(cfg.Socket)
	if err != nil {
		return nil, fmt.Errorf("csiclient: socket %q: %w", cfg.Socket, err)
	}
	// Both connections dial abs, so that is the path that must fit.
	if err := CheckSocketPath(abs); err != nil {
		return nil, err
	}
	if err := cfg.Redial.Validate(); err != nil {
		return nil, fmt.Errorf("csiclient: Config.Redial: %w", err)
	}
	transport := cfg.Transport
	switch {
	case transport == nil:
		transport = NewTransport(TransportConfig{WriteTimeout: cfg.WriteTimeout, MaxMessageSize: cfg.MaxMessageSize})
	case cfg.WriteTimeout != 0 || cfg.MaxMessageSize != 0:
		return nil, errors.New("csiclient: set either Transport or WriteTimeout and MaxMessageSize, not both: a Transport carries its own limits")
	}
	maxBackoff := cfg.MaxBackoff
	if maxBackoff <= 0 {
		maxBackoff = DefaultMaxBackoff
	}
	bc := backoff.Config{
		// A restarting plugin is back within milliseconds; a short first
		// delay lets a mediated call waiting for it find it at once.
		BaseDelay:  10 * time.Millisecond,
		Multiplier: 1.6,
		Jitter:     0.2,
		MaxDelay:   maxBackoff,
	}
	idle := cfg.IdleTimeout
	if idle <= 0 {
		idle = DefaultIdleTimeout
	}
	opts := []grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return dialSocket(ctx, abs, cfg.CheckConnected)
		}),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bc, MinConnectTimeout: time.Second}),
		grpc.WithDisableServiceConfig(),
		// Controller messages are small; small buffers keep the open
		// connections of a busy node cheap.
		grpc.WithReadBufferSize(4 << 10),
		grpc.WithWriteBufferSize(4 << 10),
		// An idle grpc-go connection releases its transport and goroutines;
		// mediation traffic is bursty and the supervision connection keeps
		// watching the plugin meanwhile.
		grpc.WithIdleTimeout(idle),
		// Fixed windows turn off BDP estimation, whose pings would double
		// the packets of small calls for no gain.
		grpc.WithInitialWindowSize(64 << 10),
		grpc.WithInitialConnWindowSize(64 << 10),
	}

	opts = append(opts, cfg.DialOptions...)
	// Build the target as a URL so that characters such as '#', '?' or '%'
	// in the path are escaped; the unix resolver unescapes them again.
	target := (&url.URL{Scheme: "unix", Path: abs}).String()
	conn := &lazyConn{target: target, opts: opts}
	return &Client{
		socket:      abs,
		conn:        conn,
		supervision: newSupervisionConn(abs, cfg.OnDisconnect, transport, cfg.Redial),
		Identity:    csi.NewIdentityClient(conn),
		Controller:  csi.NewControllerClient(conn),
		Node:        csi.NewNodeClient(conn),
	}, nil
}

// dialSocket connects to the unix socket at path and runs check, if set,
// before the new connection is used.
func dialSocket(ctx context.Context, path string, check func() error) (net.Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil || check == nil {
		return nc, err
	}
	if err := check(); err != nil {
		_ = nc.Close()
		return nil, err
	}
	return nc, nil
}

// Socket returns the absolute socket path.
func (c *Client) Socket() string { return c.socket }

// Close closes both connections without waiting on the plugin. Pending
// RPCs fail with Canceled.
func (c *Client) Close() error {
	return errors.Join(c.supervision.Close(), c.conn.Close())
}

// Supervision returns the supervision connection: unary calls only, over
// one long-lived HTTP/2 connection that costs a goroutine and about 17 KiB,
// whose loss is reported through Config.OnDisconnect. Probes and
// fingerprints use it; it redials on the next call after a loss. Calls made
// with grpc.WaitForReady(true) wait, within their deadline, for a socket
// that refuses connections to start listening, redialing as Config.Redial
// says. Besides WaitForReady, calls honour grpc.Header, grpc.Trailer,
// grpc.MaxCallRecvMsgSize (up to Config.MaxMessageSize) and
// grpc.MaxCallSendMsgSize; any other call option fails the call with
// InvalidArgument. Errors are gRPC status errors; those for which
// IsProtocolViolation is true mean the plugin broke the protocol.
func (c *Client) Supervision() grpc.ClientConnInterface { return c.supervision }

// lazyConn creates its grpc-go connection at the first call: even an unused
// grpc.ClientConn runs three goroutines, which a node with thousands of
// plugins that ClientCSI never calls should not pay for.
type lazyConn struct {
	target string
	opts   []grpc.DialOption

	mu     sync.Mutex
	cc     *grpc.ClientConn
	closed bool
}

func (l *lazyConn) get() (*grpc.ClientConn, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, status.Error(codes.Canceled, "grpc: the client connection is closing")
	}
	if l.cc == nil {
		cc, err := grpc.NewClient(l.target, l.opts...)
		if err != nil {
			return nil, status.Errorf(codes.Internal, "connection to %s: %v", l.target, err)
		}
		l.cc = cc
	}
	return l.cc, nil
}

// Invoke implements grpc.ClientConnInterface.
func (l *lazyConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	cc, err := l.get()
	if err != nil {
		return err
	}
	return cc.Invoke(ctx, method, args, reply, opts...)
}

// NewStream implements grpc.ClientConnInterface.
func (l *lazyConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cc, err := l.get()
	if err != nil {
		return nil, err
	}
	return cc.NewStream(ctx, desc, method, opts...)
}

// Close closes the connection if it was ever created.
func (l *lazyConn) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.cc == nil {
		return nil
	}
	return l.cc.Close()
}
