package csiclient

//lint:file-ignore SA1019 x/net's HTTP/2 client is deprecated for net/http's, which does not export the error types this package classifies by (see doc.go).

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/retry"
	"github.com/csisupd/csisupd/internal/testutil"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func TestMain(m *testing.M) {
	if socket := os.Getenv(benchPluginEnv); socket != "" {
		servePluginProcess(socket)
		return
	}
	goleak.VerifyTestMain(m)
}

// identityServer answers GetPluginInfo with a fixed name.
type identityServer struct {
	csi.UnimplementedIdentityServer
	name string
}

func (s *identityServer) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: s.name, VendorVersion: "1.0.0"}, nil
}

func (s *identityServer) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}

// serve starts a CSI identity server named name on socket and returns a
// function that stops it and removes the socket. The server is also stopped
// at the end of the test.
func serve(t *testing.T, socket, name string) (stop func()) {
	t.Helper()
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatalf("listen on %s: %v", socket, err)
	}
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, &identityServer{name: name})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l)
	}()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		srv.Stop()
		<-done
		os.Remove(socket)
	}
	t.Cleanup(stop)
	return stop
}

// testRedial is the supervision connection's redial policy in tests: the
// agent's default.
var testRedial = config.DefaultRetry().PluginRedial

// newClient creates a client and closes it at the end of the test. A zero
// Redial is testRedial.
func newClient(t testing.TB, cfg Config) *Client {
	t.Helper()
	if cfg.Redial == (retry.Policy{}) {
		cfg.Redial = testRedial
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// supervisedName calls GetPluginInfo over the supervision connection.
func supervisedName(c *Client) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := csi.NewIdentityClient(c.Supervision()).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	return resp.GetName(), err
}

// pluginName calls GetPluginInfo with a short deadline.
func pluginName(c *Client) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := c.Identity.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	return resp.GetName(), err
}

func TestNew(t *testing.T) {
	dir := testutil.TempDir(t)
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name       string
		socket     string
		wantErr    string
		wantSocket string
	}{
		{name: "empty", socket: "", wantErr: "socket path is empty"},
		{name: "missing socket is fine", socket: filepath.Join(dir, "missing.sock"), wantSocket: filepath.Join(dir, "missing.sock")},
		{name: "relative path made absolute", socket: "plugin.sock", wantSocket: filepath.Join(wd, "plugin.sock")},
		{name: "path cleaned", socket: dir + "/x/../csi.sock", wantSocket: filepath.Join(dir, "csi.sock")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := New(Config{Socket: tc.socket, Redial: testRedial})
			if tc.wantErr != "" {
				if err == nil {
					c.Close()
					t.Fatalf("New(%q) succeeded, want error containing %q", tc.socket, tc.wantErr)
				}
				if !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("New(%q) error = %q, want it to contain %q", tc.socket, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("New(%q): %v", tc.socket, err)
			}
			defer c.Close()
			if got := c.Socket(); got != tc.wantSocket {
				t.Errorf("Socket() = %q, want %q", got, tc.wantSocket)
			}
			// New neither dials nor creates the grpc-go connection (whose
			// goroutines thousands of plugins would otherwise pay for).
			if c.conn.cc != nil || c.supervision.cur != nil {
				t.Errorf("New created connections: grpc %v, supervision %v", c.conn.cc, c.supervision.cur)
			}
			if c.Supervision() == nil || c.Identity == nil || c.Controller == nil || c.Node == nil {
				t.Errorf("New returned a client with nil fields: %+v", c)
			}
		})
	}
}

func TestMissingSocketFailsUnavailable(t *testing.T) {
	dir := testutil.TempDir(t)
	c := newClient(t, Config{Socket: filepath.Join(dir, "csi.sock")})

	// The deadline is generous: a client that waited for the socket instead
	// of failing would end with DeadlineExceeded, not Unavailable.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.Identity.Probe(ctx, &csi.ProbeRequest{})
	if got := status.Code(err); got != codes.Unavailable {
		t.Fatalf("Probe on a missing socket: code %s (%v), want Unavailable", got, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("Probe on a missing socket used up the whole deadline: %v", err)
	}
}

func TestSocketAppearsLater(t *testing.T) {
	dir := testutil.TempDir(t)
	socket := filepath.Join(dir, "csi.sock")
	c := newClient(t, Config{Socket: socket, MaxBackoff: 50 * time.Millisecond})

	if _, err := pluginName(c); status.Code(err) != codes.Unavailable {
		t.Fatalf("GetPluginInfo before the plugin started: %v, want Unavailable", err)
	}

	serve(t, socket, "late.example.com")
	var name string
	testutil.WaitFor(t, 10*time.Second, "GetPluginInfo to succeed after the socket appeared", func() bool {
		var err error
		name, err = pluginName(c)
		return err == nil
	})
	if name != "late.example.com" {
		t.Fatalf("GetPluginInfo name = %q, want %q", name, "late.example.com")
	}
}

func TestPluginRestartOnSamePath(t *testing.T) {
	dir := testutil.TempDir(t)
	socket := filepath.Join(dir, "csi.sock")
	c := newClient(t, Config{Socket: socket, MaxBackoff: 50 * time.Millisecond})

	stop := serve(t, socket, "first.example.com")
	testutil.WaitFor(t, 10*time.Second, "the first plugin to answer", func() bool {
		name, err := pluginName(c)
		return err == nil && name == "first.example.com"
	})

	stop()
	testutil.WaitFor(t, 10*time.Second, "calls to fail after the plugin stopped", func() bool {
		_, err := pluginName(c)
		return status.Code(err) == codes.Unavailable
	})

	serve(t, socket, "second.example.com")
	testutil.WaitFor(t, 10*time.Second, "the restarted plugin to answer", func() bool {
		name, err := pluginName(c)
		return err == nil && name == "second.example.com"
	})
}

func TestSocketPathNeedingEscape(t *testing.T) {
	// A plugin directory may contain characters that mean something in a
	// URL; the client must still dial the exact path.
	base := testutil.TempDir(t)
	for _, sub := range []string{"a#b", "a?b", "a%41b", "a b"} {
		t.Run(sub, func(t *testing.T) {
			dir := filepath.Join(base, sub)
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			socket := filepath.Join(dir, "csi.sock")
			serve(t, socket, "escaped.example.com")
			// Both dial paths: gRPC's own dialer, and ours that watches
			// for disconnects.
			for _, cfg := range []Config{
				{Socket: socket},
				{Socket: socket, OnDisconnect: func() {}},
			} {
				c := newClient(t, cfg)
				if got := c.Socket(); got != socket {
					t.Errorf("Socket() = %q, want %q", got, socket)
				}
				name, err := pluginName(c)
				if err != nil {
					t.Fatalf("GetPluginInfo via %q (watched %v): %v", socket, cfg.OnDisconnect != nil, err)
				}
				if name != "escaped.example.com" {
					t.Fatalf("name = %q, want escaped.example.com", name)
				}
			}
		})
	}
}

func TestDialOptionsApplied(t *testing.T) {
	dir := testutil.TempDir(t)
	socket := filepath.Join(dir, "csi.sock")
	serve(t, socket, "opts.example.com")

	var calls atomic.Int32
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		calls.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	c := newClient(t, Config{Socket: socket, DialOptions: []grpc.DialOption{grpc.WithUnaryInterceptor(count)}})
	if _, err := pluginName(c); err != nil {
		t.Fatalf("GetPluginInfo: %v", err)
	}
	if got := calls.Load(); got != 1 {
		t.Fatalf("interceptor saw %d calls, want 1", got)
	}
}

func TestCloseEndsBothConnections(t *testing.T) {
	dir := testutil.TempDir(t)
	socket := filepath.Join(dir, "csi.sock")
	serve(t, socket, "close.example.com")

	c, err := New(Config{Socket: socket, Redial: testRedial})
	if err != nil {
		t.Fatal(err)
	}
	if name, err := pluginName(c); err != nil || name != "close.example.com" {
		t.Fatalf("full connection: %q, %v", name, err)
	}
	if name, err := supervisedName(c); err != nil || name != "close.example.com" {
		t.Fatalf("supervision connection: %q, %v", name, err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := pluginName(c); status.Code(err) != codes.Canceled {
		t.Errorf("GetPluginInfo after Close: %v, want Canceled", err)
	}
	if _, err := supervisedName(c); status.Code(err) != codes.Canceled {
		t.Errorf("supervised GetPluginInfo after Close: %v, want Canceled", err)
	}
}

func TestOnDisconnect(t *testing.T) {
	sock := filepath.Join(testutil.TempDir(t), "csi.sock")
	stop := serve(t, sock, "first")

	disconnects := make(chan struct{}, 10)
	c := newClient(t, Config{Socket: sock, OnDisconnect: func() { disconnects <- struct{}{} }})
	if name, err := supervisedName(c); err != nil || name != "first" {
		t.Fatalf("first call: name %q, err %v", name, err)
	}
	select {
	case <-disconnects:
		t.Fatal("OnDisconnect called while the plugin serves")
	default:
	}

	stop() // the plugin goes away: the established connection breaks
	select {
	case <-disconnects:
	case <-time.After(10 * time.Second):
		t.Fatal("OnDisconnect not called within 10s of the plugin stopping")
	}

	// A new plugin on the same path: the client redials, and a second loss
	// is reported again.
	stop = serve(t, sock, "second")
	testutil.WaitFor(t, 10*time.Second, "call to the restarted plugin", func() bool {
		name, err := supervisedName(c)
		return err == nil && name == "second"
	})
	stop()
	select {
	case <-disconnects:
	case <-time.After(10 * time.Second):
		t.Fatal("OnDisconnect not called after the second plugin stopped")
	}

	// Closing the client ourselves is not a disconnect of the plugin.
	stop = serve(t, sock, "third")
	defer stop()
	testutil.WaitFor(t, 10*time.Second, "call to the third plugin", func() bool {
		name, err := supervisedName(c)
		return err == nil && name == "third"
	})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// Close is synchronous for the transport's reader; a spurious callback
	// would already be queued.
	select {
	case <-disconnects:
		t.Fatal("OnDisconnect called for our own Close")
	default:
	}
}

// A connection the plugin closed before its first call is not usable,
// although x/net says it can take a request (which would only fail with
// "client conn could not be established", every time).
func TestConnectionClosedBeforeFirstCallIsNotReused(t *testing.T) {
	socket := filepath.Join(testutil.TempDir(t), "csi.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ours, err := net.Dial("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	tr := NewTransport(TransportConfig{})
	cc, err := tr.h2.NewClientConn(&watchedConn{Conn: ours, onDisconnect: func() {}})
	if err != nil {
		t.Fatal(err)
	}
	_ = theirs.Close() // the plugin hangs up before any call
	p := &pluginConn{cc: cc, wc: &watchedConn{Conn: ours}, live: tr.live}
	defer p.close()
	testutil.WaitFor(t, 5*time.Second, "x/net to see the connection closed", func() bool { return cc.State().Closed })
	if !cc.CanTakeNewRequest() {
		t.Log("x/net no longer offers a closed, unused connection for a request")
	}
	if p.usable() {
		t.Fatal("a connection closed before its first call is reported usable")
	}
}

// A socket whose first listener hangs up at once (not a gRPC server) and is
// then replaced by a real plugin: the supervision connection dials again
// instead of reusing the connection that never got established.
func TestSupervisionRecoversFromHangUpListener(t *testing.T) {
	socket := filepath.Join(testutil.TempDir(t), "csi.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	c := newClient(t, Config{Socket: socket})
	for range 3 {
		if _, err := supervisedName(c); status.Code(err) != codes.Unavailable {
			t.Fatalf("call to a listener that hangs up: %v, want Unavailable", err)
		}
	}
	_ = l.Close()
	<-done
	_ = os.Remove(socket)
	serve(t, socket, "real.example.com")
	testutil.WaitFor(t, 5*time.Second, "a call to the real plugin", func() bool {
		name, err := supervisedName(c)
		return err == nil && name == "real.example.com"
	})
}

// TestCheckConnectedGuardsTheFullConnection refuses every connection of
// the full gRPC connection while the check fails: its calls fail with
// Unavailable naming the check's error and never reach the plugin, while
// the supervision connection, which is not checked, keeps answering. Once
// the check passes, the full connection redials and answers.
func TestCheckConnectedGuardsTheFullConnection(t *testing.T) {
	socket := filepath.Join(testutil.TempDir(t), "csi.sock")
	serve(t, socket, "plugin.example.com")
	var refuse atomic.Bool
	refuse.Store(true)
	var checks atomic.Int64
	c := newClient(t, Config{Socket: socket, MaxBackoff: 50 * time.Millisecond, CheckConnected: func() error {
		checks.Add(1)
		if refuse.Load() {
			return errors.New("socket replaced by another plugin instance")
		}
		return nil
	}})

	_, err := pluginName(c)
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "socket replaced by another plugin instance") {
		t.Fatalf("call with the check failing: %v, want Unavailable naming the check's error", err)
	}
	if name, err := supervisedName(c); err != nil || name != "plugin.example.com" {
		t.Errorf("supervision call = %q, %v; want the plugin's answer: it is not checked", name, err)
	}
	if checks.Load() == 0 {
		t.Fatal("CheckConnected never ran")
	}

	refuse.Store(false)
	testutil.WaitFor(t, 10*time.Second, "the full connection to answer once the check passes", func() bool {
		name, err := pluginName(c)
		return err == nil && name == "plugin.example.com"
	})
}
