package csiclient

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csisupd/csisupd/internal/testutil"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// faultyIdentity answers Probe as told and GetPluginInfo with a name.
type faultyIdentity struct {
	csi.UnimplementedIdentityServer
	probe func(ctx context.Context) (*csi.ProbeResponse, error)
}

func (f *faultyIdentity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: "faulty.example.com", VendorVersion: "9", Manifest: map[string]string{"k": "v"}}, nil
}

func (f *faultyIdentity) Probe(ctx context.Context, _ *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return f.probe(ctx)
}

func serveIdentity(t *testing.T, socket string, srv csi.IdentityServer) {
	t.Helper()
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	csi.RegisterIdentityServer(s, srv)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(l) }()
	t.Cleanup(func() { s.Stop(); <-done })
}

// The supervision connection must give callers what grpc-go would: the same
// replies, codes, messages and details.
func TestSupervisionMatchesGRPC(t *testing.T) {
	detail := &errdetails.ErrorInfo{Reason: "DISK_GONE", Domain: "faulty.example.com"}
	cases := []struct {
		name  string
		probe func(ctx context.Context) (*csi.ProbeResponse, error)
	}{
		{"ready", func(context.Context) (*csi.ProbeResponse, error) {
			return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
		}},
		{"not ready", func(context.Context) (*csi.ProbeResponse, error) {
			return &csi.ProbeResponse{Ready: wrapperspb.Bool(false)}, nil
		}},
		{"empty answer", func(context.Context) (*csi.ProbeResponse, error) { return &csi.ProbeResponse{}, nil }},
		{"error with escaped message", func(context.Context) (*csi.ProbeResponse, error) {
			return nil, status.Error(codes.FailedPrecondition, "disk 100% full: ünïcode\nnewline")
		}},
		{"error with details", func(context.Context) (*csi.ProbeResponse, error) {
			st, err := status.New(codes.Aborted, "with details").WithDetails(detail)
			if err != nil {
				panic(err)
			}
			return nil, st.Err()
		}},
	}
	sock := filepath.Join(testutil.TempDir(t), "csi.sock")
	var current func(ctx context.Context) (*csi.ProbeResponse, error)
	serveIdentity(t, sock, &faultyIdentity{probe: func(ctx context.Context) (*csi.ProbeResponse, error) { return current(ctx) }})
	c := newClient(t, Config{Socket: sock})
	full, lean := c.Identity, csi.NewIdentityClient(c.Supervision())
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			current = tc.probe
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			want, wantErr := full.Probe(ctx, &csi.ProbeRequest{})
			got, gotErr := lean.Probe(ctx, &csi.ProbeRequest{})
			if ws, gs := status.Convert(wantErr), status.Convert(gotErr); ws.Code() != gs.Code() || ws.Message() != gs.Message() ||
				len(ws.Details()) != len(gs.Details()) {
				t.Fatalf("status: supervision %v (details %v), grpc-go %v (details %v)", gs, gs.Details(), ws, ws.Details())
			}
			if wantErr == nil && (got.GetReady() == nil) != (want.GetReady() == nil) || got.GetReady().GetValue() != want.GetReady().GetValue() {
				t.Fatalf("reply: supervision %v, grpc-go %v", got, want)
			}
		})
	}

	info, err := csi.NewIdentityClient(c.Supervision()).GetPluginInfo(context.Background(), &csi.GetPluginInfoRequest{})
	if err != nil || info.GetName() != "faulty.example.com" || info.GetManifest()["k"] != "v" {
		t.Fatalf("GetPluginInfo = %v, %v", info, err)
	}
}

func TestSupervisionDeadline(t *testing.T) {
	sock := filepath.Join(testutil.TempDir(t), "csi.sock")
	serveIdentity(t, sock, &faultyIdentity{probe: func(ctx context.Context) (*csi.ProbeResponse, error) {
		<-ctx.Done() // hang until the deadline the caller sent arrives
		return nil, ctx.Err()
	}})
	c := newClient(t, Config{Socket: sock})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := csi.NewIdentityClient(c.Supervision()).Probe(ctx, &csi.ProbeRequest{})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("hanging probe: %v, want DeadlineExceeded", err)
	}
	// The connection stays usable after a call timed out.
	if name, err := supervisedName(c); err != nil || name != "faulty.example.com" {
		t.Fatalf("call after a timeout: %q, %v", name, err)
	}
}

func TestSupervisionNotGRPC(t *testing.T) {
	dir := testutil.TempDir(t)

	// An HTTP/2 server that is not gRPC.
	h2 := filepath.Join(dir, "h2.sock")
	l, err := net.Listen("unix", h2)
	if err != nil {
		t.Fatal(err)
	}
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	srv := &http.Server{Protocols: &protocols, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("hello"))
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })

	// A socket that accepts and closes at once.
	closer := filepath.Join(dir, "closer.sock")
	cl, err := net.Listen("unix", closer)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	go func() {
		for {
			c, err := cl.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()

	for _, tc := range []struct {
		socket string
		code   codes.Code
		text   string
	}{
		{h2, codes.Unknown, "not a gRPC answer"},
		{closer, codes.Unavailable, "connection error"},
		{filepath.Join(dir, "missing.sock"), codes.Unavailable, "connection error"},
	} {
		c := newClient(t, Config{Socket: tc.socket})
		_, err := supervisedName(c)
		if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("%s: %v, want %s containing %q", filepath.Base(tc.socket), err, tc.code, tc.text)
		}
	}
}

func TestSupervisionWaitForReady(t *testing.T) {
	sock := filepath.Join(testutil.TempDir(t), "csi.sock")
	c := newClient(t, Config{Socket: sock})
	lean := csi.NewIdentityClient(c.Supervision())

	// Without WaitForReady a missing socket fails at once.
	if _, err := lean.GetPluginInfo(context.Background(), &csi.GetPluginInfoRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("missing socket: %v, want Unavailable", err)
	}

	// With it, the call waits for the plugin to start listening.
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := lean.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{}, grpc.WaitForReady(true))
		done <- err
	}()
	serveIdentity(t, sock, &faultyIdentity{})
	if err := <-done; err != nil {
		t.Fatalf("waiting call: %v", err)
	}

	// Closed clients refuse calls.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := lean.GetPluginInfo(context.Background(), &csi.GetPluginInfoRequest{}); status.Code(err) != codes.Canceled {
		t.Fatalf("closed client: %v, want Canceled", err)
	}
	_ = os.Remove(sock)
}

// A supervision connection lives for days: far more answer bytes than one
// HTTP/2 flow-control window (64 KiB) must flow, and callers from several
// goroutines share it.
func TestSupervisionLongLivedConnection(t *testing.T) {
	sock := filepath.Join(testutil.TempDir(t), "csi.sock")
	serveIdentity(t, sock, &faultyIdentity{})
	var disconnects atomic.Int32
	c := newClient(t, Config{Socket: sock, OnDisconnect: func() { disconnects.Add(1) }})
	lean := csi.NewIdentityClient(c.Supervision())

	// Each answer carries ~60 bytes: 3,000 calls move ~180 KiB.
	const calls, callers = 3000, 4
	errs := make(chan error, callers)
	for range callers {
		go func() {
			for range calls / callers {
				info, err := lean.GetPluginInfo(context.Background(), &csi.GetPluginInfoRequest{})
				if err == nil && info.GetName() != "faulty.example.com" {
					err = status.Errorf(codes.Internal, "wrong answer %v", info)
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range callers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := c.supervision.dials.Load(); n != 1 {
		t.Errorf("%d connections dialled for %d calls, want 1: the calls did not share one connection", n, calls)
	}
	if n := disconnects.Load(); n != 0 {
		t.Errorf("%d disconnects on a healthy plugin", n)
	}
}

// namedIdentity answers GetPluginInfo with its name.
type namedIdentity struct {
	csi.UnimplementedIdentityServer
	name string
}

func (n namedIdentity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: n.name, VendorVersion: "1"}, nil
}

// A call made the moment the connection is reported lost (the supervisor
// probes at once) must dial the plugin that now serves the path, not go out
// on the dead connection that x/net has not seen fail yet. It once failed
// with "write: broken pipe" (1 run in 15-40 of the supervisor's test), which
// made a plugin replaced in place look unhealthy for a probe.
func TestSupervisionCallOnDisconnectUsesANewConnection(t *testing.T) {
	dir := testutil.TempDir(t)
	sock := filepath.Join(dir, "csi.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	// The old plugin must not remove the socket its successor took over.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	old := grpc.NewServer()
	csi.RegisterIdentityServer(old, namedIdentity{name: "old.example.com"})
	oldDone := make(chan struct{})
	go func() { defer close(oldDone); _ = old.Serve(l) }()
	t.Cleanup(func() { old.Stop(); <-oldDone })

	var once atomic.Bool
	got := make(chan error, 1)
	var c *Client
	c = newClient(t, Config{Socket: sock, OnDisconnect: func() {
		if !once.CompareAndSwap(false, true) {
			return
		}
		// As the supervisor's ProbeNow: the call starts at once, on
		// another goroutine, while the failed read is still on its way
		// back to x/net.
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			info, err := csi.NewIdentityClient(c.Supervision()).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
			if err == nil && info.GetName() != "new.example.com" {
				err = status.Errorf(codes.Internal, "answered by %q, want new.example.com", info.GetName())
			}
			got <- err
		}()
	}})
	lean := csi.NewIdentityClient(c.Supervision())
	if _, err := lean.GetPluginInfo(context.Background(), &csi.GetPluginInfoRequest{}); err != nil {
		t.Fatalf("call to the old plugin: %v", err)
	}

	// The new plugin listens first and takes the path over; then the old
	// one dies.
	next := filepath.Join(dir, "next.sock")
	serveIdentity(t, next, namedIdentity{name: "new.example.com"})
	if err := os.Rename(next, sock); err != nil {
		t.Fatal(err)
	}
	old.Stop()

	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("call made on disconnect: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no disconnect reported within 10s of the plugin's stop")
	}
	if n := c.supervision.dials.Load(); n != 2 {
		t.Errorf("%d connections dialled, want 2 (the old plugin's, then the new one's)", n)
	}
}
