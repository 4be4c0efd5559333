package nodeclient

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/retry"
)

// serverConn is the client's connection to the server it talks to. A
// node talks to one server at a time, so it holds one connection, and
// replaces it when it fails over to another server.
type serverConn struct {
	connect retry.Policy
	// secret is the node secret every call presents.
	secret string
	opts   []grpc.DialOption
	// lost receives, without blocking the sender, when the connection to
	// the current server was lost (see watch). Buffered, size 1.
	lost chan struct{}
	// watchers counts the watch goroutines, one per connection made.
	watchers sync.WaitGroup

	mu     sync.Mutex
	addr   string
	conn   *grpc.ClientConn
	closed bool
}

// minConnectTimeout is the least time one connection attempt is given.
const minConnectTimeout = 5 * time.Second

func (s *serverConn) get(addr string) (*grpc.ClientConn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, status.Error(codes.Unavailable, "node client is shutting down")
	}
	if s.conn != nil && s.addr == addr {
		return s.conn, nil
	}
	opts := s.opts
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	// Reconnect to a restarted server within seconds, not gRPC's default
	// two minutes. Options given by the caller come later and win. Every
	// call presents the node secret.
	opts = append([]grpc.DialOption{grpc.WithConnectParams(s.connect.ConnectParams(minConnectTimeout)),
		grpc.WithChainUnaryInterceptor(s.presentSecret)}, opts...)
	c, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial server %s: %w", addr, err)
	}
	if s.conn != nil {
		_ = s.conn.Close()
	}
	s.addr, s.conn = addr, c
	s.watchers.Add(1)
	go s.watch(c)
	return c, nil
}

// newServerConn returns a serverConn without a connection yet, whose
// calls present secret, the node secret.
func newServerConn(connect retry.Policy, secret string, opts []grpc.DialOption) *serverConn {
	return &serverConn{connect: connect, secret: secret, opts: opts, lost: make(chan struct{}, 1)}
}

// presentSecret adds the node secret to a call's metadata.
func (s *serverConn) presentSecret(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return invoker(metadata.AppendToOutgoingContext(ctx, csisupdv1.NodeSecretMetadataKey, s.secret), method, req, reply, cc, opts...)
}

// watch signals lost each time conn leaves the ready state other than by
// being closed: the server went away (stopped, crashed, restarted), and
// the leader may have gone with it. A server that closes an idle
// connection signals it too, which costs one early heartbeat. It returns
// once conn is closed, which the client does when it fails over or stops.
func (s *serverConn) watch(conn *grpc.ClientConn) {
	defer s.watchers.Done()
	state := conn.GetState()
	for state != connectivity.Shutdown {
		// Close ends the wait: it moves conn to Shutdown.
		if !conn.WaitForStateChange(context.Background(), state) {
			return
		}
		next := conn.GetState()
		if state == connectivity.Ready && next != connectivity.Shutdown {
			select {
			case s.lost <- struct{}{}:
			default: // one signal pending is enough
			}
		}
		state = next
	}
}

// close closes the connection and waits for its watch to return.
func (s *serverConn) close() {
	s.mu.Lock()
	s.closed = true
	if s.conn != nil {
		_ = s.conn.Close()
		s.conn = nil
	}
	s.mu.Unlock()
	s.watchers.Wait()
}

// callCluster is callWithFailover of a Cluster call, bounded by
// RPCTimeout.
func callCluster[Resp any](ctx context.Context, c *Client, what string, call func(context.Context, csisupdv1.ClusterClient) (Resp, error)) (Resp, error) {
	return callWithFailover(ctx, c, what, c.cfg.RPCTimeout, csisupdv1.NewClusterClient, call)
}

// callWithFailover makes one call to the current server, bounded by
// timeout (and ctx), and once more to the next server when the first is
// unavailable. newClient makes the client of the service called on the
// server's connection (csisupdv1.NewClusterClient, NewControlClient):
// every call presents the node secret, which the Cluster service checks
// and the others ignore. what names the call in errors, which wrap the
// call's gRPC status: status.Code and the typed details see through them.
func callWithFailover[C, Resp any](ctx context.Context, c *Client, what string, timeout time.Duration,
	newClient func(grpc.ClientConnInterface) C, call func(context.Context, C) (Resp, error)) (Resp, error) {
	var zero Resp
	var err error
	for attempt := 0; attempt < 2; attempt++ {
		var conn *grpc.ClientConn
		var addr string
		if conn, addr, err = c.serverConn(ctx); err != nil {
			return zero, err
		}
		cctx, cancel := context.WithTimeout(ctx, timeout)
		resp, callErr := call(cctx, newClient(conn))
		cancel()
		if callErr == nil {
			return resp, nil
		}
		err = fmt.Errorf("%s on %s: %w", what, addr, callErr)
		if status.Code(callErr) != codes.Unavailable {
			return zero, err
		}
		c.failoverFrom(addr)
	}
	return zero, err
}
