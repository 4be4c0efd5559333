package tlsutil

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"

	"github.com/csisupd/csisupd/internal/testutil"
)

func TestNewErrors(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca", CAOptions{})
	other := newTestCA(t, dir, "other", CAOptions{})
	cert, key := ca.issue(t, "server", RoleServer, 0)
	otherCert, otherKey := other.issue(t, "other-server", RoleServer, 0)
	garbage := filepath.Join(dir, "garbage.pem")
	writeFile(t, garbage, []byte("not PEM at all"))
	missing := filepath.Join(dir, "missing.pem")
	fifo := filepath.Join(dir, "fifo.pem")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		// A FIFO nobody writes to: an open without O_NONBLOCK would block.
		{"ca_file a FIFO", Config{CAFile: fifo, CertFile: cert, KeyFile: key}, "tls.ca_file " + fifo + ": not a regular file (a FIFO)"},
		{"cert_file a FIFO", Config{CAFile: ca.file, CertFile: fifo, KeyFile: key}, "tls.cert_file " + fifo + ": not a regular file (a FIFO)"},
		{"key_file a FIFO", Config{CAFile: ca.file, CertFile: cert, KeyFile: fifo}, "tls.key_file " + fifo + ": not a regular file (a FIFO)"},
		{"key_file a directory", Config{CAFile: ca.file, CertFile: cert, KeyFile: dir}, "tls.key_file " + dir + ": not a regular file (a directory)"},
		{"no ca_file", Config{CertFile: cert, KeyFile: key}, "tls.ca_file: required"},
		{"no cert_file", Config{CAFile: ca.file, KeyFile: key}, "tls.cert_file: required"},
		{"no key_file", Config{CAFile: ca.file, CertFile: cert}, "tls.key_file: required"},
		{"missing ca_file", Config{CAFile: missing, CertFile: cert, KeyFile: key}, "tls.ca_file " + missing + ": no such file"},
		{"missing cert_file", Config{CAFile: ca.file, CertFile: missing, KeyFile: key}, "tls.cert_file " + missing + ": no such file"},
		{"missing key_file", Config{CAFile: ca.file, CertFile: cert, KeyFile: missing}, "tls.key_file " + missing + ": no such file"},
		{"ca_file not PEM", Config{CAFile: garbage, CertFile: cert, KeyFile: key}, "tls.ca_file " + garbage + ": no PEM CERTIFICATE"},
		{"ca_file holds a leaf", Config{CAFile: cert, CertFile: cert, KeyFile: key}, "tls.ca_file " + cert + `: certificate "CN=server.global.csisupd" is not a CA`},
		{"cert_file not PEM", Config{CAFile: ca.file, CertFile: garbage, KeyFile: key}, "tls.cert_file " + garbage + ": no PEM CERTIFICATE"},
		{"key_file not PEM", Config{CAFile: ca.file, CertFile: cert, KeyFile: garbage}, "tls.key_file " + garbage + ": no PEM private key"},
		{"key of another certificate", Config{CAFile: ca.file, CertFile: cert, KeyFile: otherKey}, "tls.key_file " + otherKey + ": not the key of tls.cert_file " + cert},
		{"certificate of another CA", Config{CAFile: ca.file, CertFile: otherCert, KeyFile: otherKey}, "tls.cert_file " + otherCert + ": not signed by a CA of tls.ca_file " + ca.file},
		{"bad region", Config{CAFile: ca.file, CertFile: cert, KeyFile: key, Region: "eu.west"}, `region "eu.west"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := New(tt.cfg, nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New = %v, %v; want an error containing %q", c, err, tt.want)
			}
		})
	}
	c := newConfigurator(t, Config{CAFile: ca.file, CertFile: cert, KeyFile: key}, nil)
	if c.Region() != DefaultRegion || !strings.Contains(c.Certificate().Subject.CommonName, "server.global.csisupd") {
		t.Errorf("Region %q, leaf %q", c.Region(), c.Certificate().Subject)
	}
}

// A certificate signed by an intermediate that follows it in cert_file
// loads, and its handshakes send the intermediate so that peers who trust
// only the root verify it.
func TestNewWithIntermediate(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca", CAOptions{})
	root, rootKey, err := parseCA(ca.certPEM, ca.keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := randomSerial()
	imTmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: "intermediate"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	imKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	imKeyPEM, err := encodeKey(imKey)
	if err != nil {
		t.Fatal(err)
	}
	imDER, err := x509.CreateCertificate(rand.Reader, imTmpl, root, &imKey.PublicKey, rootKey)
	if err != nil {
		t.Fatal(err)
	}
	imPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: imDER})
	leafPEM, leafKeyPEM, err := GenerateCert(CertOptions{CACertPEM: imPEM, CAKeyPEM: imKeyPEM, Role: RoleServer})
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "chain.pem"), filepath.Join(dir, "chain-key.pem")
	writeFile(t, certFile, append(leafPEM, imPEM...))
	writeFile(t, keyFile, leafKeyPEM)
	srv := newConfigurator(t, Config{CAFile: ca.file, CertFile: certFile, KeyFile: keyFile}, nil)

	// Without the intermediate the leaf does not chain to ca_file.
	leafOnly := filepath.Join(dir, "leaf.pem")
	writeFile(t, leafOnly, leafPEM)
	if _, err := New(Config{CAFile: ca.file, CertFile: leafOnly, KeyFile: keyFile}, nil); err == nil ||
		!strings.Contains(err.Error(), "not signed by a CA") {
		t.Errorf("New with the leaf alone = %v", err)
	}

	ln := tls.NewListener(listen(t), srv.IncomingConfig())
	serveOK(t, ln)
	cliCert, cliKey := ca.issue(t, "client", RoleClient, 0)
	cli := newConfigurator(t, Config{CAFile: ca.file, CertFile: cliCert, KeyFile: cliKey, VerifyServerHostname: true}, nil)
	if res := dialTLS(ln.Addr().String(), cli.OutgoingConfig(RoleServer)); res.err != nil {
		t.Fatalf("dial a server with an intermediate: %v", res.err)
	}
}

// OutgoingConfig verifies the server's chain against the CA and, with
// VerifyServerHostname, the role name of the peer dialed, whatever
// ServerName says (gRPC sets it to the dialed host).
func TestOutgoingConfig(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca", CAOptions{})
	other := newTestCA(t, dir, "other", CAOptions{})
	// Servers: role server, role client, a server of region eu, and a
	// server whose certificate another CA signed (it trusts both CAs, so
	// that it accepts our client).
	serve := func(cfg Config) string {
		srv := newConfigurator(t, cfg, nil)
		ln := tls.NewListener(listen(t), srv.IncomingConfig())
		serveOK(t, ln)
		return ln.Addr().String()
	}
	sc, sk := ca.issue(t, "server", RoleServer, 0)
	serverAddr := serve(Config{CAFile: ca.file, CertFile: sc, KeyFile: sk, VerifyIncoming: true})
	cc, ck := ca.issue(t, "client-as-server", RoleClient, 0)
	clientAddr := serve(Config{CAFile: ca.file, CertFile: cc, KeyFile: ck, VerifyIncoming: true})
	ec, ek := ca.issueOpts(t, "eu-server", CertOptions{Role: RoleServer, Region: "eu"})
	euAddr := serve(Config{CAFile: ca.file, CertFile: ec, KeyFile: ek, VerifyIncoming: true})
	both := filepath.Join(dir, "both.pem")
	bundle(t, both, other, ca)
	oc, ok := other.issue(t, "other-server", RoleServer, 0)
	otherAddr := serve(Config{CAFile: both, CertFile: oc, KeyFile: ok, VerifyIncoming: true})

	mine, mineKey := ca.issue(t, "me", RoleClient, 0)
	client := func(verifyOutgoing, verifyHostname bool) *Configurator {
		return newConfigurator(t, Config{CAFile: ca.file, CertFile: mine, KeyFile: mineKey,
			VerifyOutgoing: verifyOutgoing, VerifyServerHostname: verifyHostname}, nil)
	}
	tests := []struct {
		name       string
		addr       string
		client     *Configurator
		serverName string // replaces ServerName when set, as gRPC does
		wantErr    string // "" for success
	}{
		{"server role", serverAddr, client(true, true), "", ""},
		{"server role, ServerName the address", serverAddr, client(true, true), "127.0.0.1", ""},
		{"client role on a server address", clientAddr, client(true, true), "", "server.global.csisupd"},
		{"client role, ServerName the address", clientAddr, client(true, true), "127.0.0.1", "server.global.csisupd"},
		{"client role, ServerName the role name", clientAddr, client(true, true), "server.global.csisupd", "server.global.csisupd"},
		{"server of another region", euAddr, client(true, true), "", "server.global.csisupd"},
		{"client role without hostname check", clientAddr, client(true, false), "", ""},
		{"hostname check implies the chain check", otherAddr, client(false, true), "", "unknown authority"},
		{"another CA", otherAddr, client(true, false), "", "unknown authority"},
		{"another CA without verification", otherAddr, client(false, false), "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.client.OutgoingConfig(RoleServer)
			if cfg.ServerName != "server.global.csisupd" {
				t.Errorf("ServerName = %q", cfg.ServerName)
			}
			if tt.serverName != "" {
				cfg = cfg.Clone()
				cfg.ServerName = tt.serverName
			}
			res := dialTLS(tt.addr, cfg)
			switch {
			case tt.wantErr == "" && res.err != nil:
				t.Errorf("dial: %v", res.err)
			case tt.wantErr != "" && (res.err == nil || !strings.Contains(res.err.Error(), tt.wantErr)):
				t.Errorf("dial = %v, want an error containing %q", res.err, tt.wantErr)
			}
		})
	}
}

// OutgoingConfig without a role (servers calling agents) verifies the
// chain only: an agent with a server or a client certificate is reached,
// one whose certificate another CA signed is not.
func TestOutgoingConfigAnyRole(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca", CAOptions{})
	other := newTestCA(t, dir, "other", CAOptions{})
	serve := func(cfg Config) string {
		srv := newConfigurator(t, cfg, nil)
		ln := tls.NewListener(listen(t), srv.IncomingConfig())
		serveOK(t, ln)
		return ln.Addr().String()
	}
	both := filepath.Join(dir, "both.pem")
	bundle(t, both, other, ca)
	sc, sk := ca.issue(t, "server", RoleServer, 0)
	cc, ck := ca.issue(t, "client", RoleClient, 0)
	oc, ok := other.issue(t, "other", RoleClient, 0)
	mine, mineKey := ca.issue(t, "me", RoleServer, 0)
	dialer := newConfigurator(t, Config{CAFile: ca.file, CertFile: mine, KeyFile: mineKey,
		VerifyOutgoing: true, VerifyServerHostname: true}, nil)
	for _, tt := range []struct {
		name, addr, wantErr string
	}{
		{"agent with a server certificate", serve(Config{CAFile: ca.file, CertFile: sc, KeyFile: sk, VerifyIncoming: true}), ""},
		{"agent with a client certificate", serve(Config{CAFile: ca.file, CertFile: cc, KeyFile: ck, VerifyIncoming: true}), ""},
		{"agent of another CA", serve(Config{CAFile: both, CertFile: oc, KeyFile: ok, VerifyIncoming: true}), "unknown authority"},
	} {
		cfg := dialer.OutgoingConfig("")
		if cfg.ServerName != "" {
			t.Errorf("ServerName = %q, want none", cfg.ServerName)
		}
		res := dialTLS(tt.addr, cfg)
		switch {
		case tt.wantErr == "" && res.err != nil:
			t.Errorf("%s: dial: %v", tt.name, res.err)
		case tt.wantErr != "" && (res.err == nil || !strings.Contains(res.err.Error(), tt.wantErr)):
			t.Errorf("%s: dial = %v, want an error containing %q", tt.name, res.err, tt.wantErr)
		}
	}
}

// acceptState accepts one connection of ln, handshakes it and sends its
// state (or nothing when the handshake failed) on the returned channel.
func acceptState(t *testing.T, ln net.Listener) <-chan *tls.ConnectionState {
	t.Helper()
	ch := make(chan *tls.ConnectionState, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			ch <- nil
			return
		}
		defer c.Close()
		tc := c.(*tls.Conn)
		_ = tc.SetDeadline(time.Now().Add(ioTimeout))
		if err := tc.Handshake(); err != nil {
			ch <- nil
			return
		}
		_, _ = tc.Write([]byte("ok\n"))
		st := tc.ConnectionState()
		ch <- &st
		_, _ = tc.Read(make([]byte, 1))
	}()
	return ch
}

// IncomingConfig requires a client certificate with VerifyIncoming, and
// otherwise verifies one when it is sent; either way the verified chain
// is what PeerRole reads.
func TestIncomingConfig(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca", CAOptions{})
	other := newTestCA(t, dir, "other", CAOptions{})
	sc, sk := ca.issue(t, "server", RoleServer, 0)
	cc, ck := ca.issue(t, "client", RoleClient, 0)
	oc, ok := other.issue(t, "other", RoleClient, 0)
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	// GetClientCertificate sends the certificate even when its CA is not
	// one the server asks for (with Certificates crypto/tls would send
	// none).
	withCert := func(c, k string) *tls.Config {
		pair := keyPair(t, c, k)
		return &tls.Config{RootCAs: roots, ServerName: "localhost",
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }}
	}
	noCert := &tls.Config{RootCAs: roots, ServerName: "localhost"}
	tests := []struct {
		name           string
		verifyIncoming bool
		client         *tls.Config
		wantOK         bool
		wantRole       Role // "" when no verified certificate
	}{
		{"verify incoming, client certificate", true, withCert(cc, ck), true, RoleClient},
		{"verify incoming, no certificate", true, noCert, false, ""},
		{"verify incoming, certificate of another CA", true, withCert(oc, ok), false, ""},
		{"no verify incoming, client certificate", false, withCert(cc, ck), true, RoleClient},
		{"no verify incoming, no certificate", false, noCert, true, ""},
		{"no verify incoming, certificate of another CA", false, withCert(oc, ok), false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newConfigurator(t, Config{CAFile: ca.file, CertFile: sc, KeyFile: sk, VerifyIncoming: tt.verifyIncoming}, nil)
			cfg := srv.IncomingConfig()
			if cfg.MinVersion != tls.VersionTLS12 {
				t.Errorf("MinVersion %x", cfg.MinVersion)
			}
			ln := tls.NewListener(listen(t), cfg)
			defer ln.Close()
			states := acceptState(t, ln)
			res := dialTLS(ln.Addr().String(), tt.client)
			if (res.err == nil) != tt.wantOK {
				t.Fatalf("dial = %v, want success %v", res.err, tt.wantOK)
			}
			st := <-states
			if !tt.wantOK {
				if st != nil {
					t.Errorf("the server completed a handshake it should have refused")
				}
				return
			}
			role, verified := PeerRole(*st, "")
			if role != tt.wantRole || verified != (tt.wantRole != "") {
				t.Errorf("PeerRole = %q, %v; want %q", role, verified, tt.wantRole)
			}
		})
	}
}

// The configurations work with gRPC's credentials.NewTLS on both sides:
// ALPN is negotiated through GetConfigForClient, the client checks the
// server's role although gRPC sets ServerName to the dialed host, and the
// server reads the client's role from the peer's AuthInfo.
func TestGRPC(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca", CAOptions{})
	sc, sk := ca.issue(t, "server", RoleServer, 0)
	cc, ck := ca.issue(t, "client", RoleClient, 0)
	srvConf := newConfigurator(t, Config{CAFile: ca.file, CertFile: sc, KeyFile: sk, VerifyIncoming: true}, nil)
	cliConf := newConfigurator(t, Config{CAFile: ca.file, CertFile: cc, KeyFile: ck, VerifyServerHostname: true}, nil)

	var seen atomic.Value // Role
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(srvConf.IncomingConfig())),
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if p, ok := peer.FromContext(ctx); ok {
				if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
					if role, ok := PeerRole(info.State, srvConf.Region()); ok {
						seen.Store(role)
					}
				}
			}
			return h(ctx, req)
		}))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln := listen(t)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	defer func() {
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()

	call := func(conf *Configurator) error {
		conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(conf.OutgoingConfig(RoleServer))))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
		defer cancel()
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	if err := call(cliConf); err != nil {
		t.Fatalf("health check over TLS: %v", err)
	}
	if got, _ := seen.Load().(Role); got != RoleClient {
		t.Errorf("the server saw role %q, want client", got)
	}

	// A client that dials it as a client-role peer refuses the server.
	c2 := newConfigurator(t, Config{CAFile: ca.file, CertFile: cc, KeyFile: ck, VerifyServerHostname: true}, nil)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(c2.OutgoingConfig(RoleClient))))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err == nil ||
		!strings.Contains(err.Error(), "client.global.csisupd") {
		t.Errorf("health check of a server dialed as a client = %v, want a refusal naming client.global.csisupd", err)
	}
}

// Handshakes go on while the certificate is replaced and reloaded: none
// fails, and the new leaf is served once Reload returned.
func TestReloadWhileHandshaking(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca", CAOptions{})
	sc, sk := ca.issue(t, "server", RoleServer, 0)
	cc, ck := ca.issue(t, "client", RoleClient, 0)
	logger, logs := bufferLogger()
	srv := newConfigurator(t, Config{CAFile: ca.file, CertFile: sc, KeyFile: sk, VerifyIncoming: true}, logger)
	cli := newConfigurator(t, Config{CAFile: ca.file, CertFile: cc, KeyFile: ck, VerifyServerHostname: true}, nil)
	ln := NewListener(listen(t), ListenerConfig{TLS: srv.IncomingConfig(), RequireRole: RoleClient, Logger: logger})
	serveOK(t, ln)
	oldSerial := srv.Certificate().SerialNumber

	// Four clients handshake in loops, sharing one configuration.
	var handshakes, failures atomic.Int64
	var lastSerial atomic.Value // string
	var firstErr atomic.Value   // error
	stop := make(chan struct{})
	var loops sync.WaitGroup
	cfg := cli.OutgoingConfig(RoleServer)
	for range 4 {
		loops.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				res := dialTLS(ln.Addr().String(), cfg)
				if res.err != nil {
					failures.Add(1)
					firstErr.CompareAndSwap(nil, res.err)
					continue
				}
				lastSerial.Store(res.state.PeerCertificates[0].SerialNumber.String())
				handshakes.Add(1)
			}
		})
	}
	defer func() {
		close(stop)
		loops.Wait()
	}()
	testutil.WaitFor(t, ioTimeout, "handshakes with the first certificate", func() bool { return handshakes.Load() >= 5 })
	if got := lastSerial.Load(); got != oldSerial.String() {
		t.Fatalf("served serial %v, want %v", got, oldSerial)
	}

	for round := range 3 {
		ca.issue(t, "server", RoleServer, 0) // replaces the files
		if err := srv.Reload(); err != nil {
			t.Fatalf("Reload: %v", err)
		}
		newSerial := srv.Certificate().SerialNumber.String()
		if newSerial == oldSerial.String() {
			t.Fatal("Reload did not load the new certificate")
		}
		after := handshakes.Load()
		testutil.WaitFor(t, ioTimeout, "handshakes with the new certificate", func() bool {
			return handshakes.Load() >= after+3 && lastSerial.Load() == newSerial
		})
		t.Logf("round %d: %d handshakes", round, handshakes.Load())
		oldSerial = srv.Certificate().SerialNumber
	}
	if n := failures.Load(); n != 0 {
		t.Fatalf("%d handshakes failed during reloads; first: %v", n, firstErr.Load())
	}
	if !strings.Contains(logs.String(), "reloaded TLS certificates") {
		t.Errorf("no reload in the log:\n%s", logs)
	}
}

// A Reload that fails keeps the certificates loaded before and names the
// file; a later Reload with good files takes them.
func TestReloadKeepsCertificatesOnError(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca", CAOptions{})
	other := newTestCA(t, dir, "other", CAOptions{})
	sc, sk := ca.issue(t, "server", RoleServer, 0)
	goodCert, _ := os.ReadFile(sc)
	goodKey, _ := os.ReadFile(sk)
	srv := newConfigurator(t, Config{CAFile: ca.file, CertFile: sc, KeyFile: sk}, nil)
	ln := tls.NewListener(listen(t), srv.IncomingConfig())
	serveOK(t, ln)
	serial := srv.Certificate().SerialNumber.String()
	served := func() string {
		t.Helper()
		res := dialTLS(ln.Addr().String(), &tls.Config{InsecureSkipVerify: true})
		if res.err != nil {
			t.Fatalf("dial: %v", res.err)
		}
		return res.state.PeerCertificates[0].SerialNumber.String()
	}
	oc, ok := other.issue(t, "other", RoleServer, 0)
	otherCert, _ := os.ReadFile(oc)
	otherKey, _ := os.ReadFile(ok)
	_, freshKey := ca.issue(t, "fresh", RoleServer, 0)
	freshKeyPEM, _ := os.ReadFile(freshKey)
	tests := []struct {
		name          string
		ca, cert, key []byte
		want          string
	}{
		{"cert_file not PEM", ca.certPEM, []byte("garbage"), goodKey, "tls.cert_file " + sc},
		{"key_file not PEM", ca.certPEM, goodCert, []byte("garbage"), "tls.key_file " + sk},
		{"key of another certificate", ca.certPEM, goodCert, freshKeyPEM, "tls.key_file " + sk},
		{"ca_file not PEM", []byte("garbage"), goodCert, goodKey, "tls.ca_file " + ca.file},
		{"certificate of another CA", ca.certPEM, otherCert, otherKey, "tls.cert_file " + sc + ": not signed"},
		{"half-written certificate", ca.certPEM, goodCert[:len(goodCert)/2], goodKey, "tls.cert_file " + sc},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			writeFile(t, ca.file, tt.ca)
			writeFile(t, sc, tt.cert)
			writeFile(t, sk, tt.key)
			err := srv.Reload()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Reload = %v, want an error containing %q", err, tt.want)
			}
			if got := srv.Certificate().SerialNumber.String(); got != serial {
				t.Errorf("Certificate serial %s after a failed Reload, want %s", got, serial)
			}
			if got := served(); got != serial {
				t.Errorf("served serial %s after a failed Reload, want %s", got, serial)
			}
		})
	}
	// A FIFO in the key's place fails the reload at once, naming it.
	writeFile(t, ca.file, ca.certPEM)
	writeFile(t, sc, goodCert)
	if err := os.Remove(sk); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(sk, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := srv.Reload(); err == nil || !strings.Contains(err.Error(), "tls.key_file "+sk+": not a regular file (a FIFO)") {
		t.Fatalf("Reload with a FIFO as key_file = %v", err)
	}
	if got := served(); got != serial {
		t.Errorf("served serial %s after a failed Reload, want %s", got, serial)
	}
	if err := os.Remove(sk); err != nil {
		t.Fatal(err)
	}
	writeFile(t, ca.file, ca.certPEM)
	ca.issue(t, "server", RoleServer, 0)
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := served(); got == serial || got != srv.Certificate().SerialNumber.String() {
		t.Errorf("served serial %s after a good Reload; before %s, loaded %s", got, serial, srv.Certificate().SerialNumber)
	}
}

// A CA rotation by bundles: both CAs in every ca_file, then certificates of
// the new CA, then the old CA removed. Every step keeps server and client
// talking; at the end a certificate of the old CA is refused.
func TestCARotation(t *testing.T) {
	dir := t.TempDir()
	oldCA := newTestCA(t, dir, "old-ca", CAOptions{})
	newCA := newTestCA(t, dir, "new-ca", CAOptions{})
	srvCA, cliCA := filepath.Join(dir, "server-ca.pem"), filepath.Join(dir, "client-ca.pem")
	bundle(t, srvCA, oldCA)
	bundle(t, cliCA, oldCA)
	sc, sk := oldCA.issue(t, "server", RoleServer, 0)
	cc, ck := oldCA.issue(t, "client", RoleClient, 0)
	srv := newConfigurator(t, Config{CAFile: srvCA, CertFile: sc, KeyFile: sk, VerifyIncoming: true}, nil)
	cli := newConfigurator(t, Config{CAFile: cliCA, CertFile: cc, KeyFile: ck, VerifyServerHostname: true}, nil)
	ln := NewListener(listen(t), ListenerConfig{TLS: srv.IncomingConfig(), RequireRole: RoleClient})
	serveOK(t, ln)
	out := cli.OutgoingConfig(RoleServer) // made once: it follows the reloads
	check := func(step string) {
		t.Helper()
		if res := dialTLS(ln.Addr().String(), out); res.err != nil {
			t.Fatalf("%s: %v", step, res.err)
		}
	}
	reload := func(c *Configurator) {
		t.Helper()
		if err := c.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	check("before the rotation")

	// A certificate of the new CA is refused until its CA is in ca_file.
	newCA.issue(t, "server", RoleServer, 0)
	if err := srv.Reload(); err == nil || !strings.Contains(err.Error(), "not signed by a CA of tls.ca_file") {
		t.Fatalf("Reload of a new-CA certificate before the bundle = %v", err)
	}
	bundle(t, srvCA, oldCA, newCA)
	bundle(t, cliCA, newCA, oldCA)
	reload(srv)
	reload(cli)
	check("both CAs, server certificate of the new CA")

	newCA.issue(t, "client", RoleClient, 0)
	reload(cli)
	check("both CAs, both certificates of the new CA")

	bundle(t, srvCA, newCA)
	bundle(t, cliCA, newCA)
	reload(srv)
	reload(cli)
	check("the new CA only")

	// A client still holding a certificate of the old CA is refused now.
	oc, ok := oldCA.issue(t, "late-client", RoleClient, 0)
	roots := x509.NewCertPool()
	roots.AddCert(newCA.cert)
	late := &tls.Config{RootCAs: roots, ServerName: "localhost", Certificates: []tls.Certificate{keyPair(t, oc, ok)}}
	if res := dialTLS(ln.Addr().String(), late); res.err == nil {
		t.Fatal("a certificate of the removed CA was accepted")
	}
}

func TestCheckExpiry(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca", CAOptions{})
	shortCert, shortKey := ca.issue(t, "short", RoleServer, 2)
	longCert, longKey := ca.issue(t, "long", RoleServer, 365)

	logger, logs := bufferLogger()
	short := newConfigurator(t, Config{CAFile: ca.file, CertFile: shortCert, KeyFile: shortKey}, logger)
	line := logLine(logs.String(), "expires soon")
	for _, want := range []string{"file=" + shortCert, "subject=CN=server.global.csisupd", "not_after=", "days_left=2"} {
		if !strings.Contains(line, want) {
			t.Errorf("New's warning %q lacks %q; log:\n%s", line, want, logs)
		}
	}
	msgs := short.CheckExpiry(time.Now())
	if len(msgs) != 1 {
		t.Fatalf("CheckExpiry of a 2-day certificate = %q, want one message", msgs)
	}
	for _, want := range []string{"tls.cert_file " + shortCert, `"CN=server.global.csisupd"`, "(2 days left)",
		short.Certificate().NotAfter.UTC().Format(time.RFC3339)} {
		if !strings.Contains(msgs[0], want) {
			t.Errorf("message %q lacks %q", msgs[0], want)
		}
	}

	logger2, logs2 := bufferLogger()
	long := newConfigurator(t, Config{CAFile: ca.file, CertFile: longCert, KeyFile: longKey}, logger2)
	if msgs := long.CheckExpiry(time.Now()); len(msgs) != 0 {
		t.Errorf("CheckExpiry of a 365-day certificate = %q, want none", msgs)
	}
	if strings.Contains(logs2.String(), "[WARN]") {
		t.Errorf("New warned about a 365-day certificate:\n%s", logs2)
	}
	// Later the certificate has expired, and later still the CA expires
	// soon.
	msgs = long.CheckExpiry(time.Now().AddDate(0, 0, 370))
	if len(msgs) != 1 || !strings.Contains(msgs[0], "expired at") || !strings.Contains(msgs[0], "(5 days ago)") {
		t.Errorf("CheckExpiry 370 days on = %q, want the certificate expired 5 days ago", msgs)
	}
	msgs = long.CheckExpiry(time.Now().AddDate(0, 0, 1820))
	if len(msgs) != 2 || !strings.Contains(msgs[0], "tls.ca_file "+ca.file) || !strings.Contains(msgs[0], "days left") {
		t.Errorf("CheckExpiry 1820 days on = %q, want the CA expiring and the certificate expired", msgs)
	}
	if !strings.Contains(logs2.String(), "TLS certificate has expired") {
		t.Errorf("no warning about the expired certificate:\n%s", logs2)
	}
}

// NextProtos set on the configuration IncomingConfig returned reach every
// handshake, though each runs on a configuration of its own.
func TestIncomingConfigCarriesFields(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca", CAOptions{})
	sc, sk := ca.issue(t, "server", RoleServer, 0)
	srv := newConfigurator(t, Config{CAFile: ca.file, CertFile: sc, KeyFile: sk}, nil)
	cfg := srv.IncomingConfig()
	cfg.NextProtos = []string{"csisupd-test"}
	ln := tls.NewListener(listen(t), cfg)
	serveOK(t, ln)
	res := dialTLS(ln.Addr().String(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"other", "csisupd-test"}})
	if res.err != nil {
		t.Fatal(res.err)
	}
	if res.state.NegotiatedProtocol != "csisupd-test" {
		t.Errorf("negotiated %q, want csisupd-test", res.state.NegotiatedProtocol)
	}
}

// Sessions are never resumed: every connection is verified against the
// CA pool of its own handshake.
func TestIncomingConfigNoResumption(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca", CAOptions{})
	sc, sk := ca.issue(t, "server", RoleServer, 0)
	cc, ck := ca.issue(t, "client", RoleClient, 0)
	srv := newConfigurator(t, Config{CAFile: ca.file, CertFile: sc, KeyFile: sk, VerifyIncoming: true}, nil)
	ln := tls.NewListener(listen(t), srv.IncomingConfig())
	serveOK(t, ln)
	pair := keyPair(t, cc, ck)
	cfg := &tls.Config{InsecureSkipVerify: true, Certificates: []tls.Certificate{pair}, ClientSessionCache: tls.NewLRUClientSessionCache(4)}
	for i := range 3 {
		res := dialTLS(ln.Addr().String(), cfg)
		if res.err != nil {
			t.Fatal(res.err)
		}
		if res.state.DidResume {
			t.Errorf("connection %d resumed a session", i)
		}
	}
}
