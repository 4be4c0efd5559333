package rpc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/testutil"
)

// serveTLS serves ClientCSI (over no plugins) with tc on a loopback port
// and returns its address.
func serveTLS(t *testing.T, tc *tls.Config) string {
	t.Helper()
	svc, err := NewClientCSI(ClientCSIConfig{Plugins: newFixedPlugins(), NodeName: "tls-node", Retry: shortRetry,
		RPCTimeout: config.DefaultRPCTimeout, MaxDestructiveInFlight: config.DefaultMaxDestructiveInFlight})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(tc)))
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
	return l.Addr().String()
}

func TestTLSMutual(t *testing.T) {
	dir := t.TempDir()
	ca := testutil.NewCA(t, dir, "ca")
	other := testutil.NewCA(t, dir, "other-ca")
	serverCert, serverKey := ca.Issue(t, "agent.test", x509.ExtKeyUsageServerAuth)
	clientCert, clientKey := ca.Issue(t, "client.test", x509.ExtKeyUsageClientAuth)
	strangerCert, strangerKey := other.Issue(t, "stranger.test", x509.ExtKeyUsageClientAuth)

	stc, err := ServerTLSConfig(config.TLSConfig{CAFile: ca.File, CertFile: serverCert, KeyFile: serverKey})
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, stc)

	tests := []struct {
		name     string
		files    config.TLSConfig
		wantCode codes.Code
	}{
		{"trusted client certificate", config.TLSConfig{CAFile: ca.File, CertFile: clientCert, KeyFile: clientKey}, codes.NotFound},
		{"no client certificate", config.TLSConfig{CAFile: ca.File}, codes.Unavailable},
		{"client certificate of another CA", config.TLSConfig{CAFile: ca.File, CertFile: strangerCert, KeyFile: strangerKey}, codes.Unavailable},
		{"server not trusted", config.TLSConfig{CAFile: other.File, CertFile: clientCert, KeyFile: clientKey}, codes.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctc, err := ClientTLSConfig(tt.files, "agent.test")
			if err != nil {
				t.Fatal(err)
			}
			c, err := csisupdv1.Dial(csisupdv1.ClientConfig{Address: addr, TLS: ctc})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err = c.ClientCSI.ControllerGetCapabilities(ctx, &csisupdv1.ControllerGetCapabilitiesRequest{PluginId: "p"})
			if got := status.Code(err); got != tt.wantCode {
				t.Fatalf("code = %s, want %s (error %v)", got, tt.wantCode, err)
			}
			if tt.wantCode == codes.NotFound && !csisupdv1.IsPluginNotFound(err) {
				t.Errorf("error %v does not carry PluginNotFound", err)
			}
		})
	}
}

func TestTLSConfigErrors(t *testing.T) {
	dir := t.TempDir()
	ca := testutil.NewCA(t, dir, "ca")
	cert, key := ca.Issue(t, "agent.test", x509.ExtKeyUsageServerAuth)
	notPEM := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")

	tests := []struct {
		name       string
		cfg        config.TLSConfig
		serverErr  string // "" = no error
		clientErr  string
		serverNil  bool // no TLS at all
		clientAuth tls.ClientAuthType
	}{
		{name: "no files", cfg: config.TLSConfig{}, serverNil: true},
		{name: "server without CA", cfg: config.TLSConfig{CertFile: cert, KeyFile: key}, clientAuth: tls.NoClientCert},
		{name: "server with CA", cfg: config.TLSConfig{CAFile: ca.File, CertFile: cert, KeyFile: key}, clientAuth: tls.RequireAndVerifyClientCert},
		{name: "cert without key", cfg: config.TLSConfig{CertFile: cert}, serverErr: "cert_file and key_file", clientErr: "cert_file and key_file"},
		{name: "CA only", cfg: config.TLSConfig{CAFile: ca.File}, serverErr: "cert_file and key_file"},
		{name: "missing cert", cfg: config.TLSConfig{CertFile: missing, KeyFile: key}, serverErr: missing, clientErr: missing},
		{name: "CA not PEM", cfg: config.TLSConfig{CAFile: notPEM, CertFile: cert, KeyFile: key}, serverErr: notPEM, clientErr: notPEM},
		{name: "CA missing", cfg: config.TLSConfig{CAFile: missing, CertFile: cert, KeyFile: key}, serverErr: missing, clientErr: missing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stc, err := ServerTLSConfig(tt.cfg)
			switch {
			case tt.serverErr != "":
				if err == nil || !strings.Contains(err.Error(), tt.serverErr) {
					t.Errorf("ServerTLSConfig error = %v, want one naming %q", err, tt.serverErr)
				}
			case err != nil:
				t.Errorf("ServerTLSConfig: %v", err)
			case tt.serverNil != (stc == nil):
				t.Errorf("ServerTLSConfig = %v, want nil: %t", stc, tt.serverNil)
			case stc != nil && stc.ClientAuth != tt.clientAuth:
				t.Errorf("ClientAuth = %v, want %v", stc.ClientAuth, tt.clientAuth)
			}
			_, err = ClientTLSConfig(tt.cfg, "")
			switch {
			case tt.clientErr != "":
				if err == nil || !strings.Contains(err.Error(), tt.clientErr) {
					t.Errorf("ClientTLSConfig error = %v, want one naming %q", err, tt.clientErr)
				}
			case err != nil:
				t.Errorf("ClientTLSConfig: %v", err)
			}
		})
	}
}
