package nodeclient

import (
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/csisupd/csisupd/internal/retry"
)

// serverConn is the client's connection to the server it talks to. A
// node talks to one server at a time, so it holds one connection, and
// replaces it when it fails over to another server.
type serverConn struct {
	connect retry.Policy
	opts    []grpc.DialOption

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
	// two minutes. Options given by the caller come later and win.
	opts = append([]grpc.DialOption{grpc.WithConnectParams(s.connect.ConnectParams(minConnectTimeout))}, opts...)
	c, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial server %s: %w", addr, err)
	}
	if s.conn != nil {
		_ = s.conn.Close()
	}
	s.addr, s.conn = addr, c
	return c, nil
}

func (s *serverConn) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.conn != nil {
		_ = s.conn.Close()
		s.conn = nil
	}
}
