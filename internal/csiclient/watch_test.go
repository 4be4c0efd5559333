package csiclient

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csisupd/csisupd/internal/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A plugin that stops gracefully sends GOAWAY; the client reports it at
// once, and the next call closes the old connection so the plugin's
// GracefulStop can finish.
func TestGracefulStopOfPlugin(t *testing.T) {
	sock := filepath.Join(testutil.TempDir(t), "csi.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, &identityServer{name: "graceful"})
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)

	disconnects := make(chan struct{}, 5)
	c := newClient(t, Config{Socket: sock, OnDisconnect: func() { disconnects <- struct{}{} }})
	if _, err := supervisedName(c); err != nil {
		t.Fatal(err)
	}

	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-disconnects:
	case <-time.After(10 * time.Second):
		t.Fatal("no OnDisconnect after the plugin began a graceful stop")
	}
	// A draining server may still answer (it accepts streams until its
	// second GOAWAY), or the call finds it gone; either way it returns.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = csi.NewIdentityClient(c.Supervision()).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if code := status.Code(err); code != codes.OK && code != codes.Unavailable {
		t.Errorf("call to a stopping plugin: %v, want an answer or Unavailable", err)
	}
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the plugin's GracefulStop did not finish after the client let go")
	}
	// When the call above still found the plugin answering, the
	// connection's end must be reported too, or a death after a GOAWAY
	// would go unnoticed. (When it did not, the client closed the
	// connection itself and knows.)
	if err == nil {
		select {
		case <-disconnects:
		case <-time.After(10 * time.Second):
			t.Fatal("no OnDisconnect when the stopped plugin's connection closed")
		}
	}
}
