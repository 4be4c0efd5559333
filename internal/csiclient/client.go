package csiclient

import (
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
)

// DefaultMaxBackoff caps redial backoff when Config.MaxBackoff is zero.
const DefaultMaxBackoff = 5 * time.Second

// Config describes one plugin connection.
type Config struct {
	// Socket is the path of the plugin's unix socket.
	Socket string
	// MaxBackoff caps the delay between redial attempts. Keep it at or below
	// the probe interval so a recovered plugin is seen by the next probe.
	MaxBackoff time.Duration
	// DialOptions are appended to the defaults (tests add interceptors).
	DialOptions []grpc.DialOption
	// OnDisconnect, when set, is called once each time an established
	// connection to the plugin breaks (the plugin died or closed it), from
	// gRPC's reader goroutine, the moment the read fails. It must not block.
	// Watching the socket this way costs no goroutine per plugin.
	OnDisconnect func()
}

// Client is a connection to one CSI plugin with its three service clients.
type Client struct {
	socket string
	conn   *grpc.ClientConn

	Identity   csi.IdentityClient
	Controller csi.ControllerClient
	Node       csi.NodeClient
}

// New creates a client for cfg.Socket. It does not dial: the first RPC or
// Connect does, and a missing socket is not an error here.
func New(cfg Config) (*Client, error) {
	if cfg.Socket == "" {
		return nil, errors.New("csiclient: socket path is empty")
	}
	abs, err := filepath.Abs(cfg.Socket)
	if err != nil {
		return nil, fmt.Errorf("csiclient: socket %q: %w", cfg.Socket, err)
	}
	maxBackoff := cfg.MaxBackoff
	if maxBackoff <= 0 {
		maxBackoff = DefaultMaxBackoff
	}
	bc := backoff.Config{
		// Plugins bind their socket a moment before they listen; a short
		// first delay keeps discovery in the millisecond range.
		BaseDelay:  10 * time.Millisecond,
		Multiplier: 1.6,
		Jitter:     0.2,
		MaxDelay:   maxBackoff,
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bc, MinConnectTimeout: time.Second}),
		grpc.WithDisableServiceConfig(),
		// Probe traffic is tiny; small buffers keep thousands of idle
		// plugin connections cheap.
		grpc.WithReadBufferSize(4 << 10),
		grpc.WithWriteBufferSize(4 << 10),
		grpc.WithSharedWriteBuffer(true),
		grpc.WithIdleTimeout(0),
		// Fixed windows turn off BDP estimation, whose pings would double
		// the packets of every probe for no gain on tiny messages.
		grpc.WithInitialWindowSize(64 << 10),
		grpc.WithInitialConnWindowSize(64 << 10),
	}
	if cfg.OnDisconnect != nil {
		opts = append(opts, grpc.WithContextDialer(watchedDialer(cfg.OnDisconnect)))
	}
	opts = append(opts, cfg.DialOptions...)
	// Build the target as a URL so that characters such as '#', '?' or '%'
	// in the path are escaped; the unix resolver unescapes them again.
	target := (&url.URL{Scheme: "unix", Path: abs}).String()
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		return nil, fmt.Errorf("csiclient: socket %q: %w", abs, err)
	}
	return &Client{
		socket:     abs,
		conn:       conn,
		Identity:   csi.NewIdentityClient(conn),
		Controller: csi.NewControllerClient(conn),
		Node:       csi.NewNodeClient(conn),
	}, nil
}

// Socket returns the absolute socket path.
func (c *Client) Socket() string { return c.socket }

// Conn returns the underlying connection, for state watching.
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// State returns the connection's current state.
func (c *Client) State() connectivity.State { return c.conn.GetState() }

// Connect asks an idle connection to dial now.
func (c *Client) Connect() { c.conn.Connect() }

// Close closes the connection. Pending RPCs fail with Canceled.
func (c *Client) Close() error { return c.conn.Close() }
