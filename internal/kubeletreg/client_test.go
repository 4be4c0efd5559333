package kubeletreg

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/csisupd/csisupd/internal/testregistrar"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// shortDir returns a directory whose paths fit in a unix socket address,
// which t.TempDir's long names may not.
func shortDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if len(dir) > 60 {
		var err error
		dir, err = os.MkdirTemp("", "kr")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	return dir
}

func startRegistrar(t *testing.T, cfg testregistrar.Config) *testregistrar.Registrar {
	t.Helper()
	cfg.Dir = shortDir(t)
	r, err := testregistrar.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r
}

func TestGetInfoAndNotify(t *testing.T) {
	r := startRegistrar(t, testregistrar.Config{Driver: "hostpath.csi.k8s.io", Endpoint: "/var/lib/kubelet/plugins/hostpath/csi.sock"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	info, err := GetInfo(ctx, r.Socket())
	if err != nil {
		t.Fatal(err)
	}
	want := Info{Type: registerapi.CSIPlugin, Name: "hostpath.csi.k8s.io", Endpoint: "/var/lib/kubelet/plugins/hostpath/csi.sock", SupportedVersions: []string{"1.0.0"}}
	if info.Type != want.Type || info.Name != want.Name || info.Endpoint != want.Endpoint || !slices.Equal(info.SupportedVersions, want.SupportedVersions) {
		t.Fatalf("GetInfo = %+v, want %+v", info, want)
	}
	if err := Check(info); err != nil {
		t.Fatalf("Check refused the sidecar's answer: %v", err)
	}

	if err := Notify(ctx, r.Socket(), true, ""); err != nil {
		t.Fatal(err)
	}
	if s, err := r.WaitStatus(ctx, 0); err != nil || !s.Registered || s.Error != "" {
		t.Fatalf("first status %+v, %v; want registered", s, err)
	}
	if err := Notify(ctx, r.Socket(), false, "driver replaced"); err != nil {
		t.Fatal(err)
	}
	if s, err := r.WaitStatus(ctx, 1); err != nil || s.Registered || s.Error != "driver replaced" {
		t.Fatalf("second status %+v, %v; want not registered with the reason", s, err)
	}
	if got := r.Statuses(); len(got) != 2 {
		t.Fatalf("registrar recorded %d statuses, want 2: %+v", len(got), got)
	}
}

// TestRefusedRegistrationIsNotified runs kubelet's sequence against
// registrars csisupd must refuse: the reason Check gives reaches them.
func TestRefusedRegistrationIsNotified(t *testing.T) {
	tests := []struct {
		name string
		cfg  testregistrar.Config
		want string
	}{
		{"DRA plugin", testregistrar.Config{Driver: "gpu.example.com", Endpoint: "/run/dra.sock", Type: registerapi.DRAPlugin},
			`unsupported plugin type "DRAPlugin": csisupd supervises CSIPlugin only`},
		{"CSI 0.x and 2.x", testregistrar.Config{Driver: "old.csi", Endpoint: "/run/csi.sock", Versions: []string{"0.3.0", "2.0.0"}},
			`no supported version in ["0.3.0" "2.0.0"]: csisupd speaks CSI 1.x`},
		{"relative endpoint", testregistrar.Config{Driver: "rel.csi", Endpoint: "csi.sock"},
			`endpoint "csi.sock" is not an absolute path`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := startRegistrar(t, tt.cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			info, err := GetInfo(ctx, r.Socket())
			if err != nil {
				t.Fatal(err)
			}
			refusal := Check(info)
			if refusal == nil || !strings.Contains(refusal.Error(), tt.want) {
				t.Fatalf("Check(%+v) = %v, want %q", info, refusal, tt.want)
			}
			if err := Notify(ctx, r.Socket(), false, refusal.Error()); err != nil {
				t.Fatal(err)
			}
			s, err := r.WaitStatus(ctx, 0)
			if err != nil || s.Registered || s.Error != refusal.Error() {
				t.Fatalf("status %+v, %v; want not registered with %q", s, err, refusal)
			}
		})
	}
}

func TestNoRegistrar(t *testing.T) {
	socket := filepath.Join(shortDir(t), "gone-reg.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := GetInfo(ctx, socket)
	if err == nil || !strings.Contains(err.Error(), socket) {
		t.Fatalf("GetInfo on a missing socket: %v, want an error naming %s", err, socket)
	}
	if ctx.Err() != nil {
		t.Fatal("GetInfo on a missing socket waited for the deadline; want it to fail at once")
	}
	err = Notify(ctx, socket, true, "")
	if err == nil || !strings.Contains(err.Error(), socket) {
		t.Fatalf("Notify on a missing socket: %v, want an error naming %s", err, socket)
	}

	long := "/" + strings.Repeat("s", 120)
	if _, err := GetInfo(ctx, long); err == nil || !strings.Contains(err.Error(), "at most 107") {
		t.Fatalf("GetInfo on a %d-byte path: %v, want the path length refused", len(long), err)
	}
}

// hostile is a registrar that misbehaves.
type hostile struct {
	registerapi.UnimplementedRegistrationServer
	getInfo func(ctx context.Context) (*registerapi.PluginInfo, error)
	entered chan struct{} // receives when GetInfo is called, if not nil
}

func (h *hostile) GetInfo(ctx context.Context, _ *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	if h.entered != nil {
		h.entered <- struct{}{}
	}
	return h.getInfo(ctx)
}

func (h *hostile) NotifyRegistrationStatus(ctx context.Context, _ *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	<-ctx.Done() // never answers
	return nil, ctx.Err()
}

func serveHostile(t *testing.T, h *hostile) string {
	t.Helper()
	socket := filepath.Join(shortDir(t), "hostile-reg.sock")
	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, h)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-served
	})
	return socket
}

// returnsAtDeadline checks that a call bounded by a short deadline failed
// with DeadlineExceeded soon after it.
func returnsAtDeadline(t *testing.T, name string, call func(context.Context) error) {
	t.Helper()
	const deadline = 300 * time.Millisecond
	start := time.Now() // before the deadline is set, so that took cannot fall short of it
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	err := call(ctx)
	took := time.Since(start)
	if status.Code(err) != codes.DeadlineExceeded && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%s: %v, want DeadlineExceeded", name, err)
	}
	if took < deadline || took > deadline+5*time.Second {
		t.Fatalf("%s returned after %v, want at the %v deadline", name, took, deadline)
	}
}

func TestSilentRegistrar(t *testing.T) {
	h := &hostile{getInfo: func(ctx context.Context) (*registerapi.PluginInfo, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}, entered: make(chan struct{}, 1)}
	socket := serveHostile(t, h)
	returnsAtDeadline(t, "GetInfo", func(ctx context.Context) error {
		_, err := GetInfo(ctx, socket)
		return err
	})
	select {
	case <-h.entered:
	default:
		t.Fatal("the registrar's GetInfo was never called: the test did not test a silent answer")
	}
	returnsAtDeadline(t, "Notify", func(ctx context.Context) error {
		return Notify(ctx, socket, true, "")
	})
}

// TestMuteListener: a socket that accepts connections but never speaks
// HTTP/2 holds the call only until its deadline.
func TestMuteListener(t *testing.T) {
	socket := filepath.Join(shortDir(t), "mute-reg.sock")
	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	t.Cleanup(func() {
		lis.Close()
		<-done
		close(accepted)
		for c := range accepted {
			c.Close()
		}
	})
	returnsAtDeadline(t, "GetInfo", func(ctx context.Context) error {
		_, err := GetInfo(ctx, socket)
		return err
	})
}

// answering returns a registrar whose GetInfo lists one version of n bytes.
func answering(n int) *hostile {
	return &hostile{getInfo: func(context.Context) (*registerapi.PluginInfo, error) {
		return &registerapi.PluginInfo{Type: registerapi.CSIPlugin, Name: "big", Endpoint: "/run/csi.sock",
			SupportedVersions: []string{strings.Repeat("1", n)}}, nil
	}}
}

func TestOversizedReply(t *testing.T) {
	socket := serveHostile(t, answering(MaxReplySize))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := GetInfo(ctx, socket)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("GetInfo with a %d-byte reply: %v, want ResourceExhausted", MaxReplySize, err)
	}
	if !strings.Contains(err.Error(), socket) {
		t.Fatalf("error %q does not name the socket", err)
	}

	// Just under the cap is accepted: the cap is what refused it.
	if _, err := GetInfo(ctx, serveHostile(t, answering(MaxReplySize-100))); err != nil {
		t.Fatalf("GetInfo with a reply under the cap: %v", err)
	}
}

// A socket nobody listens on fails a call at once with ErrNotListening; a
// socket that accepts and answers garbage fails it without, on the one
// connection the call made.
func TestNotListeningIsTold(t *testing.T) {
	dir := shortDir(t)
	stale := filepath.Join(dir, "stale-reg.sock")
	lis, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	lis.Close() // the file stays, nobody listens

	junk := filepath.Join(dir, "junk-reg.sock")
	jl, err := net.Listen("unix", junk)
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan int, 1)
	go func() {
		n := 0
		defer func() { accepted <- n }()
		for {
			c, err := jl.Accept()
			if err != nil {
				return
			}
			n++
			_, _ = c.Write([]byte("garbage, not HTTP/2\n"))
			c.Close()
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := GetInfo(ctx, stale); !errors.Is(err, ErrNotListening) || !strings.Contains(err.Error(), stale) {
		t.Errorf("GetInfo on a stale socket: %v, want ErrNotListening naming %s", err, stale)
	}
	if _, err := GetInfo(ctx, junk); err == nil || errors.Is(err, ErrNotListening) {
		t.Errorf("GetInfo on a garbage socket: %v, want an error other than ErrNotListening", err)
	}
	if ctx.Err() != nil {
		t.Error("a call waited for its deadline; want both to fail at once")
	}
	jl.Close()
	if n := <-accepted; n != 1 {
		t.Errorf("the garbage socket was dialled %d times by one call, want once", n)
	}
}
