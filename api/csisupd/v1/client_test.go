package csisupdv1_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// nodeWithoutPlugins answers every ClientCSI call as an agent without
// plugins does: NotFound with the typed PluginNotFound detail. The test
// serves it from this package alone, so that the API's tests depend on
// nothing but the API (the real service's answers are tested in rpc).
type nodeWithoutPlugins struct {
	csisupdv1.UnimplementedClientCSIServer
}

func (nodeWithoutPlugins) ControllerListVolumes(_ context.Context, req *csisupdv1.ControllerListVolumesRequest) (*csisupdv1.ControllerListVolumesResponse, error) {
	return nil, csisupdv1.NewPluginNotFoundError(req.GetPluginId(), "node-1")
}

// ControllerGetCapabilities answers Unavailable without details, as a
// plugin that restarts may.
func (nodeWithoutPlugins) ControllerGetCapabilities(context.Context, *csisupdv1.ControllerGetCapabilitiesRequest) (*csisupdv1.ControllerGetCapabilitiesResponse, error) {
	return nil, status.Error(codes.Unavailable, "controller restarting")
}

// serveAgent serves ClientCSI on a unix socket and returns its address.
func serveAgent(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "csi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	csisupdv1.RegisterClientCSIServer(srv, nodeWithoutPlugins{})
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(l)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-served
	})
	return "unix://" + sock
}

func TestDialTypedErrors(t *testing.T) {
	c, err := csisupdv1.Dial(csisupdv1.ClientConfig{Address: serveAgent(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = c.ClientCSI.ControllerListVolumes(ctx, &csisupdv1.ControllerListVolumesRequest{PluginId: "ebs"})
	if status.Code(err) != codes.NotFound || !csisupdv1.IsPluginNotFound(err) || !csisupdv1.IsRetryable(err) {
		t.Fatalf("error = %v, want NotFound with PluginNotFound and Retryable", err)
	}
	d, ok := csisupdv1.ErrorDetail[*csisupdv1.PluginNotFound](err)
	if !ok || d.GetPluginId() != "ebs" || d.GetNode() != "node-1" {
		t.Errorf("PluginNotFound = %v, want plugin ebs on node-1", d)
	}
	// An agent that answers Unavailable was reached.
	_, err = c.ClientCSI.ControllerGetCapabilities(ctx, &csisupdv1.ControllerGetCapabilitiesRequest{PluginId: "ebs"})
	if status.Code(err) != codes.Unavailable || csisupdv1.NotReached(err) {
		t.Errorf("error of an answered Unavailable = %v (not reached: %v), want Unavailable, reached", err, csisupdv1.NotReached(err))
	}
}

func TestDialUnreachableAgent(t *testing.T) {
	dir, err := os.MkdirTemp("", "csi")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	c, err := csisupdv1.Dial(csisupdv1.ClientConfig{Address: "unix://" + filepath.Join(dir, "nobody.sock")})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = c.ClientCSI.ControllerListVolumes(ctx, &csisupdv1.ControllerListVolumesRequest{PluginId: "ebs"})
	if status.Code(err) != codes.Unavailable || csisupdv1.IsPluginNotFound(err) || !csisupdv1.NotReached(err) {
		t.Errorf("error = %v, want Unavailable without PluginNotFound, marked not reached", err)
	}
	// Opening a stream to nobody is marked too.
	_, err = c.Agent.WatchEvents(ctx, &csisupdv1.WatchEventsRequest{})
	if status.Code(err) != codes.Unavailable || !csisupdv1.NotReached(err) {
		t.Errorf("WatchEvents error = %v, want Unavailable, marked not reached", err)
	}
}

func TestDialBadAddress(t *testing.T) {
	_, err := csisupdv1.Dial(csisupdv1.ClientConfig{Address: "%zz"})
	if err == nil || !strings.Contains(err.Error(), `"%zz"`) {
		t.Errorf("error = %v, want one naming the address", err)
	}
}

func TestTLSFiles(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("nope"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		files   csisupdv1.TLSFiles
		wantErr string
	}{
		{"system roots", csisupdv1.TLSFiles{ServerName: "agent"}, ""},
		{"missing CA", csisupdv1.TLSFiles{CAFile: filepath.Join(dir, "nope.pem")}, "nope.pem"},
		{"CA not PEM", csisupdv1.TLSFiles{CAFile: garbage}, "no PEM certificate"},
		{"key without cert", csisupdv1.TLSFiles{KeyFile: garbage}, "cert_file and key_file"},
		{"unreadable pair", csisupdv1.TLSFiles{CertFile: garbage, KeyFile: garbage}, "garbage.pem"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tc, err := tt.files.ClientConfig()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if tc.ServerName != tt.files.ServerName || tc.RootCAs != nil {
					t.Errorf("config = %+v", tc)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

// ControllerDeleteVolume fails as a leader does, naming itself in the
// trailer: a name far past the cap, with invalid UTF-8 at the cut.
func (nodeWithoutPlugins) ControllerDeleteVolume(ctx context.Context, _ *csisupdv1.ControllerDeleteVolumeRequest) (*csisupdv1.ControllerDeleteVolumeResponse, error) {
	_ = grpc.SetTrailer(ctx, metadata.Pairs(csisupdv1.LeaderTrailerKey, strings.Repeat("l", 255)+"é"+strings.Repeat("x", 1000)))
	return nil, status.Error(codes.NotFound, "volume not found")
}

func TestLeaderInterceptor(t *testing.T) {
	conn, err := grpc.NewClient(serveAgent(t), grpc.WithTransportCredentials(insecure.NewCredentials()), csisupdv1.LeaderInterceptor())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cl := csisupdv1.NewClientCSIClient(conn)
	_, err = cl.ControllerDeleteVolume(ctx, &csisupdv1.ControllerDeleteVolumeRequest{PluginId: "ebs"})
	leader, ok := csisupdv1.AnsweringLeader(err)
	if !ok || leader != strings.Repeat("l", 255)+"..." {
		t.Errorf("leader = %q, %v; want 255 l's and ...", leader, ok)
	}
	if status.Code(err) != codes.NotFound || status.Convert(err).Message() != "volume not found" {
		t.Errorf("error = %v, want the call's NotFound", err)
	}
	// A call without the trailer names no leader.
	_, err = cl.ControllerListVolumes(ctx, &csisupdv1.ControllerListVolumesRequest{PluginId: "ebs"})
	if _, ok := csisupdv1.AnsweringLeader(err); ok || !csisupdv1.IsPluginNotFound(err) {
		t.Errorf("error without a trailer = %v, leader %v", err, ok)
	}
}
