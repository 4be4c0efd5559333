package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/tlsutil"
)

// clientTLSFiles writes a CA, a server certificate and a CLI certificate
// into dir and returns the server's TLS configuration, which demands a
// client certificate of the CA.
func clientTLSFiles(t *testing.T, dir string) *tls.Config {
	t.Helper()
	caPEM, caKey, err := tlsutil.GenerateCA(tlsutil.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srvPEM, srvKey, err := tlsutil.GenerateCert(tlsutil.CertOptions{CACertPEM: caPEM, CAKeyPEM: caKey, Role: tlsutil.RoleServer})
	if err != nil {
		t.Fatal(err)
	}
	cliPEM, cliKey, err := tlsutil.GenerateCert(tlsutil.CertOptions{CACertPEM: caPEM, CAKeyPEM: caKey, Role: tlsutil.RoleCLI})
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"ca.pem": caPEM, "cli.pem": cliPEM, "cli-key.pem": cliKey} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pair, err := tls.X509KeyPair(srvPEM, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
}

// The TLS settings come from CSISUPD_CACERT, CSISUPD_CLIENT_CERT,
// CSISUPD_CLIENT_KEY and CSISUPD_TLS_SERVER_NAME when their flags are not
// given, and make a mutual TLS handshake with a server of the same CA.
func TestClientTLSFromEnv(t *testing.T) {
	dir := t.TempDir()
	serverConf := clientTLSFiles(t, dir)
	env := map[string]string{
		EnvCACert:        filepath.Join(dir, "ca.pem"),
		EnvClientCert:    filepath.Join(dir, "cli.pem"),
		EnvClientKey:     filepath.Join(dir, "cli-key.pem"),
		EnvTLSServerName: tlsutil.RoleName(tlsutil.RoleServer, ""),
	}
	o := &clientOptions{}
	tc, err := o.clientTLS(func(k string) string { return env[k] })
	if err != nil || tc == nil {
		t.Fatalf("clientTLS from the environment: %v, %v", tc, err)
	}
	if tc.ServerName != env[EnvTLSServerName] || len(tc.Certificates) != 1 || tc.RootCAs == nil {
		t.Fatalf("TLS config: server name %q, %d certificates, roots %v", tc.ServerName, len(tc.Certificates), tc.RootCAs)
	}

	ln, err := tls.Listen("tcp", "127.0.0.1:0", serverConf)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			accepted <- err
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		accepted <- c.(*tls.Conn).Handshake()
	}()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", ln.Addr().String(), tc)
	if err != nil {
		t.Fatalf("handshake with the environment's settings: %v", err)
	}
	_ = conn.Close()
	select {
	case err := <-accepted:
		if err != nil {
			t.Fatalf("server side of the handshake: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the server saw no handshake within 10s")
	}
}

// Flags win over the environment, and every error names the flag or the
// variable the bad value came from.
func TestClientTLSSources(t *testing.T) {
	dir := t.TempDir()
	clientTLSFiles(t, dir)
	ca := filepath.Join(dir, "ca.pem")
	missing := filepath.Join(dir, "missing.pem")
	tests := []struct {
		name       string
		opts       clientOptions
		env        map[string]string
		wantErr    string
		wantTLS    bool
		serverName string
	}{
		{name: "nothing: plain"},
		{name: "env CA", env: map[string]string{EnvCACert: ca}, wantTLS: true},
		{name: "env CA missing", env: map[string]string{EnvCACert: missing}, wantErr: EnvCACert + " " + missing},
		{name: "flag wins over env", opts: clientOptions{caFile: missing}, env: map[string]string{EnvCACert: ca}, wantErr: "--ca-file " + missing},
		{name: "flag wins, env broken", opts: clientOptions{caFile: ca}, env: map[string]string{EnvCACert: missing}, wantTLS: true},
		{name: "server name flag wins", opts: clientOptions{caFile: ca, serverName: "flag.example"},
			env: map[string]string{EnvTLSServerName: "env.example"}, wantTLS: true, serverName: "flag.example"},
		{name: "env not a CA", env: map[string]string{EnvCACert: filepath.Join(dir, "cli-key.pem")}, wantErr: EnvCACert + " " + filepath.Join(dir, "cli-key.pem") + ": no certificate found"},
		{name: "env key without cert", env: map[string]string{EnvClientKey: filepath.Join(dir, "cli-key.pem")}, wantErr: EnvClientKey + " is set without a client certificate"},
		{name: "env cert without key", env: map[string]string{EnvClientCert: filepath.Join(dir, "cli.pem")}, wantErr: "go together: set both"},
		{name: "env cert missing", env: map[string]string{EnvClientCert: missing, EnvClientKey: filepath.Join(dir, "cli-key.pem")}, wantErr: EnvClientCert + " " + missing},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := tt.opts
			tc, err := o.clientTLS(func(k string) string { return tt.env[k] })
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || (tc != nil) != tt.wantTLS {
				t.Fatalf("clientTLS = %v, %v; want TLS %v", tc, err, tt.wantTLS)
			}
			if tc != nil && tc.ServerName != tt.serverName {
				t.Errorf("server name %q, want %q", tc.ServerName, tt.serverName)
			}
		})
	}
}

// With a CA from the environment a token may be sent: the connection has
// TLS.
func TestTokenWithEnvCA(t *testing.T) {
	dir := t.TempDir()
	clientTLSFiles(t, dir)
	t.Setenv(EnvCACert, filepath.Join(dir, "ca.pem"))
	o := &clientOptions{address: "127.0.0.1:1", token: "secret-value"}
	conn, err := o.dial()
	if errors.As(err, new(usageError)) {
		t.Fatalf("dial with a token and %s: %v", EnvCACert, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.Close()
}
