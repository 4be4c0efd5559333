package testutil

import (
	"net"
	"testing"

	"google.golang.org/grpc"
)

// ListenUnix listens on a unix socket at path, failing t when it cannot.
func ListenUnix(t testing.TB, path string) net.Listener {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// ServeGRPC serves srv on l until the test ends, when it stops srv and
// waits for Serve to return.
func ServeGRPC(t testing.TB, l net.Listener, srv *grpc.Server) {
	t.Helper()
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(l)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-served
	})
}

// DialGRPC returns a client connection to target made with opts (which
// carry the transport credentials), closed when the test ends.
func DialGRPC(t testing.TB, target string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}
