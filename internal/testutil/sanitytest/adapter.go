package sanitytest

import (
	"context"
	"path/filepath"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/csisupd/csisupd/internal/testutil"
)

// IgnoreGinkgo is the goleak option for the signal handler Ginkgo
// registers for the whole process when a suite runs.
func IgnoreGinkgo() goleak.Option {
	return goleak.IgnoreTopFunction("github.com/onsi/ginkgo/v2/internal/interrupt_handler.(*InterruptHandler).registerForInterrupts.func2")
}

// ServeAdapter serves, on the unix socket adapter.sock in dir until the
// test ends, the CSI endpoint csi-sanity tests a mediated path through:
// register adds the mediated service to the server, given a connection to
// the plugin at pluginSocket, and the Identity service is the plugin's
// own (IdentityForwarder), since csi-sanity asks every endpoint who it is.
// It returns the socket.
func ServeAdapter(t testing.TB, dir, pluginSocket string, opts []grpc.ServerOption, register func(srv *grpc.Server, plugin *grpc.ClientConn)) string {
	t.Helper()
	pconn := testutil.DialGRPC(t, "unix://"+pluginSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	sock := filepath.Join(dir, "adapter.sock")
	l := testutil.ListenUnix(t, sock)
	srv := grpc.NewServer(opts...)
	register(srv, pconn)
	csi.RegisterIdentityServer(srv, &IdentityForwarder{Plugin: csi.NewIdentityClient(pconn)})
	testutil.ServeGRPC(t, l, srv)
	return sock
}

// IdentityForwarder answers the CSI Identity service with the plugin's
// own answers.
type IdentityForwarder struct {
	csi.UnimplementedIdentityServer
	Plugin csi.IdentityClient
}

// GetPluginInfo is the plugin's.
func (f *IdentityForwarder) GetPluginInfo(ctx context.Context, r *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return f.Plugin.GetPluginInfo(ctx, r)
}

// GetPluginCapabilities is the plugin's.
func (f *IdentityForwarder) GetPluginCapabilities(ctx context.Context, r *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return f.Plugin.GetPluginCapabilities(ctx, r)
}

// Probe is the plugin's.
func (f *IdentityForwarder) Probe(ctx context.Context, r *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return f.Plugin.Probe(ctx, r)
}
