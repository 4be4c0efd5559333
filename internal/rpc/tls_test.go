package rpc

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
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
)

// testCA is a certificate authority that writes PEM files for tests.
type testCA struct {
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string // the CA certificate's PEM file
}

func newTestCA(t *testing.T, dir, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &testCA{dir: dir, cert: cert, key: key, file: filepath.Join(dir, name+".pem")}
	writePEM(t, ca.file, "CERTIFICATE", der)
	return ca
}

// issue writes a certificate and key for name (also valid for 127.0.0.1)
// and returns their files.
func (ca *testCA) issue(t *testing.T, name string, usage x509.ExtKeyUsage) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile = filepath.Join(ca.dir, name+".crt")
	keyFile = filepath.Join(ca.dir, name+".key")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", kder)
	return certFile, keyFile
}

func writePEM(t *testing.T, file, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// serveTLS serves ClientCSI (over no plugins) with tc on a loopback port
// and returns its address.
func serveTLS(t *testing.T, tc *tls.Config) string {
	t.Helper()
	svc, err := NewClientCSI(ClientCSIConfig{Plugins: newFixedPlugins(), NodeName: "tls-node"})
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
	ca := newTestCA(t, dir, "ca")
	other := newTestCA(t, dir, "other-ca")
	serverCert, serverKey := ca.issue(t, "agent.test", x509.ExtKeyUsageServerAuth)
	clientCert, clientKey := ca.issue(t, "client.test", x509.ExtKeyUsageClientAuth)
	strangerCert, strangerKey := other.issue(t, "stranger.test", x509.ExtKeyUsageClientAuth)

	stc, err := ServerTLSConfig(config.TLSConfig{CAFile: ca.file, CertFile: serverCert, KeyFile: serverKey})
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, stc)

	tests := []struct {
		name     string
		files    config.TLSConfig
		wantCode codes.Code
	}{
		{"trusted client certificate", config.TLSConfig{CAFile: ca.file, CertFile: clientCert, KeyFile: clientKey}, codes.NotFound},
		{"no client certificate", config.TLSConfig{CAFile: ca.file}, codes.Unavailable},
		{"client certificate of another CA", config.TLSConfig{CAFile: ca.file, CertFile: strangerCert, KeyFile: strangerKey}, codes.Unavailable},
		{"server not trusted", config.TLSConfig{CAFile: other.file, CertFile: clientCert, KeyFile: clientKey}, codes.Unavailable},
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
	ca := newTestCA(t, dir, "ca")
	cert, key := ca.issue(t, "agent.test", x509.ExtKeyUsageServerAuth)
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
		{name: "server with CA", cfg: config.TLSConfig{CAFile: ca.file, CertFile: cert, KeyFile: key}, clientAuth: tls.RequireAndVerifyClientCert},
		{name: "cert without key", cfg: config.TLSConfig{CertFile: cert}, serverErr: "cert_file and key_file", clientErr: "cert_file and key_file"},
		{name: "CA only", cfg: config.TLSConfig{CAFile: ca.file}, serverErr: "cert_file and key_file"},
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
