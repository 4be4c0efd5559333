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
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/registry"
	"github.com/csisupd/csisupd/internal/rpc"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// noPlugins is a node without plugins.
type noPlugins struct{}

func (noPlugins) Lookup(string) (registry.Plugin, *csiclient.Client, bool) {
	return registry.Plugin{}, nil, false
}

// serveAgent serves the real ClientCSI service on a unix socket and returns
// its address.
func serveAgent(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "csi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	svc, err := rpc.NewClientCSI(rpc.ClientCSIConfig{Plugins: noPlugins{}, NodeName: "node-1", Retry: config.DefaultRetry().ClientCSI})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "agent.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	svc.Register(srv)
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
	if status.Code(err) != codes.Unavailable || csisupdv1.IsPluginNotFound(err) {
		t.Errorf("error = %v, want Unavailable without PluginNotFound", err)
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
