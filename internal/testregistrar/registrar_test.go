package testregistrar

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "tr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// client returns a Registration client for socket, as kubelet dials it.
func client(t *testing.T, socket string) registerapi.RegistrationClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return registerapi.NewRegistrationClient(conn)
}

func start(t *testing.T, cfg Config) *Registrar {
	t.Helper()
	r, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Stop)
	return r
}

func TestGetInfo(t *testing.T) {
	dir := shortDir(t)
	tests := []struct {
		name     string
		cfg      Config
		typ      string
		versions []string
	}{
		{"sidecar defaults", Config{Dir: dir, Driver: "a.csi", Endpoint: "/run/a/csi.sock"}, registerapi.CSIPlugin, []string{"1.0.0"}},
		{"DRA plugin", Config{Dir: dir, Driver: "b.dra", Endpoint: "/run/b.sock", Type: registerapi.DRAPlugin}, registerapi.DRAPlugin, []string{"1.0.0"}},
		{"other versions", Config{Dir: dir, Driver: "c.csi", Endpoint: "/run/c.sock", Versions: []string{"0.3.0", "2.0.0"}}, registerapi.CSIPlugin, []string{"0.3.0", "2.0.0"}},
		{"no versions", Config{Dir: dir, Driver: "d.csi", Endpoint: "/run/d.sock", Versions: []string{}}, registerapi.CSIPlugin, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := start(t, tt.cfg)
			if want := filepath.Join(dir, tt.cfg.Driver+"-reg.sock"); r.Socket() != want {
				t.Fatalf("Socket() = %q, want %q", r.Socket(), want)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			info, err := client(t, r.Socket()).GetInfo(ctx, &registerapi.InfoRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if info.GetType() != tt.typ || info.GetName() != tt.cfg.Driver || info.GetEndpoint() != tt.cfg.Endpoint ||
				!slices.Equal(info.GetSupportedVersions(), tt.versions) {
				t.Fatalf("GetInfo = %v, want type %s, name %s, endpoint %s, versions %q", info, tt.typ, tt.cfg.Driver, tt.cfg.Endpoint, tt.versions)
			}
		})
	}
}

func TestSocketFile(t *testing.T) {
	dir := shortDir(t)
	socket := filepath.Join(dir, "x.csi-reg.sock")
	// A stale file at the path, as a crashed registrar leaves, is replaced.
	if err := os.WriteFile(socket, []byte("stale"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := start(t, Config{Dir: dir, Driver: "x.csi", Endpoint: "/run/x.sock"})
	fi, err := os.Lstat(socket)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("%s is %v, want a socket", socket, fi.Mode())
	}
	if perm := fi.Mode().Perm(); perm != 0o600 {
		t.Fatalf("socket mode %v, want 0600 as the sidecar makes it", perm)
	}
	r.Stop()
	if _, err := os.Lstat(socket); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket after Stop: %v, want it removed", err)
	}
	r.Stop() // idempotent
}

// TestStopLeavesSuccessor: a registrar replaced at its path (the new one
// removed its socket as stale) leaves its successor's socket when stopped.
func TestStopLeavesSuccessor(t *testing.T) {
	dir := shortDir(t)
	first := start(t, Config{Dir: dir, Driver: "y.csi", Endpoint: "/run/y.sock"})
	second := start(t, Config{Dir: dir, Driver: "y.csi", Endpoint: "/run/y2.sock"})
	first.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := client(t, second.Socket()).GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatalf("successor after the first stopped: %v", err)
	}
	if info.GetEndpoint() != "/run/y2.sock" {
		t.Fatalf("endpoint %q, want the successor's", info.GetEndpoint())
	}
}

func TestStatuses(t *testing.T) {
	r := start(t, Config{Dir: shortDir(t), Driver: "z.csi", Endpoint: "/run/z.sock"})
	c := client(t, r.Socket())

	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if s, err := r.WaitStatus(short, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitStatus before any status = %+v, %v; want the deadline", s, err)
	}
	if _, err := r.WaitStatus(context.Background(), -1); err == nil {
		t.Fatal("WaitStatus(-1) succeeded")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// A waiter blocked before the status arrives is woken by it.
	got := make(chan Status, 1)
	waitErr := make(chan error, 1)
	go func() {
		s, err := r.WaitStatus(ctx, 1)
		got <- s
		waitErr <- err
	}()
	want := []Status{{Registered: true}, {Registered: false, Error: "refused"}}
	for _, s := range want {
		if _, err := c.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: s.Registered, Error: s.Error}); err != nil {
			t.Fatal(err)
		}
	}
	if s, err := <-got, <-waitErr; err != nil || s != want[1] {
		t.Fatalf("WaitStatus(1) = %+v, %v; want %+v", s, err, want[1])
	}
	if s, err := r.WaitStatus(ctx, 0); err != nil || s != want[0] {
		t.Fatalf("WaitStatus(0) = %+v, %v; want %+v", s, err, want[0])
	}
	if all := r.Statuses(); !slices.Equal(all, want) {
		t.Fatalf("Statuses() = %+v, want %+v", all, want)
	}
}

func TestStatusCap(t *testing.T) {
	r := start(t, Config{Dir: shortDir(t), Driver: "cap.csi", Endpoint: "/run/cap.sock"})
	c := client(t, r.Socket())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range MaxStatuses {
		if _, err := c.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
			t.Fatalf("status %d: %v", i, err)
		}
	}
	if _, err := c.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{}); err == nil {
		t.Fatalf("status %d was accepted, want the cap to refuse it", MaxStatuses+1)
	}
	if n := len(r.Statuses()); n != MaxStatuses {
		t.Fatalf("%d statuses recorded, want %d", n, MaxStatuses)
	}
}

func TestStartErrors(t *testing.T) {
	dir := shortDir(t)
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no dir", Config{Driver: "a"}, "Config.Dir is empty"},
		{"no driver", Config{Dir: dir}, "Config.Driver is empty"},
		{"slash in driver", Config{Dir: dir, Driver: "a/b"}, "cannot name a socket file"},
		{"path too long", Config{Dir: dir, Driver: strings.Repeat("d", 110)}, "at most 107"},
		{"missing dir", Config{Dir: filepath.Join(dir, "nope"), Driver: "a"}, "listen"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Start(tt.cfg)
			if err == nil {
				r.Stop()
				t.Fatalf("Start(%+v) succeeded", tt.cfg)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Start(%+v) = %q, want it to contain %q", tt.cfg, err, tt.want)
			}
		})
	}
}
