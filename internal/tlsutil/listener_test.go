package tlsutil

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/csisupd/csisupd/internal/testutil"
)

// roleListener is a NewListener requiring RoleServer, as the raft port
// has it, with its log; certificates of every role come from ca.
type roleListener struct {
	net.Listener
	ca    *testCA
	other *testCA
	logs  *testutil.SyncBuffer
}

func newRoleListener(t *testing.T, cfg ListenerConfig) *roleListener {
	t.Helper()
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca", CAOptions{})
	other := newTestCA(t, dir, "other", CAOptions{})
	sc, sk := ca.issue(t, "server", RoleServer, 0)
	logger, logs := bufferLogger()
	srv := newConfigurator(t, Config{CAFile: ca.file, CertFile: sc, KeyFile: sk, VerifyIncoming: true}, logger)
	cfg.TLS = srv.IncomingConfig()
	cfg.Logger = logger
	return &roleListener{Listener: NewListener(listen(t), cfg), ca: ca, other: other, logs: logs}
}

// clientConfig returns a client configuration presenting a certificate of
// role issued by ca, and trusting any server.
func clientConfig(t *testing.T, ca *testCA, name string, role Role) *tls.Config {
	t.Helper()
	return presenting(ca.pair(t, name, CertOptions{Role: role}))
}

// presenting returns a client configuration that presents pair, whatever
// CAs the server asks for, and trusts any server.
func presenting(pair tls.Certificate) *tls.Config {
	return &tls.Config{InsecureSkipVerify: true, GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return &pair, nil
	}}
}

// dialRaw connects, writes data and reads until the server closes or
// sends something; it returns the client's address and what it read.
func dialRaw(t *testing.T, addr string, data []byte) (local string, got []byte, err error) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	if _, err := c.Write(data); err != nil {
		return c.LocalAddr().String(), nil, err
	}
	got, err = io.ReadAll(c)
	return c.LocalAddr().String(), got, err
}

// The raft port's matrix: only a server certificate of the cluster's CA
// gets through; everything else is closed and logged with its reason.
func TestListenerRoleMatrix(t *testing.T) {
	l := newRoleListener(t, ListenerConfig{RequireRole: RoleServer})
	serveOK(t, l)
	addr := l.Addr().String()

	srvCert, srvKey := l.ca.issue(t, "peer-server", RoleServer, 0)
	peer := newConfigurator(t, Config{CAFile: l.ca.file, CertFile: srvCert, KeyFile: srvKey, VerifyServerHostname: true}, nil)
	tests := []struct {
		name   string
		client *tls.Config // nil: plain bytes
		plain  []byte
		reason string // "" when accepted
	}{
		{"server certificate", peer.OutgoingConfig(RoleServer), nil, ""},
		{"client certificate", clientConfig(t, l.ca, "client", RoleClient), nil, "certificate role client, want server"},
		{"cli certificate", clientConfig(t, l.ca, "cli", RoleCLI), nil, "certificate role cli, want server"},
		{"server certificate of another CA", clientConfig(t, l.other, "other-server", RoleServer), nil,
			"certificate verification failed: x509: certificate signed by unknown authority"},
		{"server certificate of another region", presenting(l.ca.pair(t, "eu-server", CertOptions{Role: RoleServer, Region: "eu"})),
			nil, "certificate role cli, want server"},
		{"no certificate", &tls.Config{InsecureSkipVerify: true}, nil, "didn't provide a certificate"},
		{"plain raft bytes", nil, []byte{0x00, 0x85, 0xa4, 'T', 'e', 'r', 'm', 0x01, 0xa6}, "not TLS"},
		{"HTTP/2 preface", nil, []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), "not TLS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var local string
			var err error
			if tt.client != nil {
				res := dialTLS(addr, tt.client)
				local, err = res.local, res.err
			} else {
				var got []byte
				local, got, err = dialRaw(t, addr, tt.plain)
				if err == nil && len(got) > 0 {
					t.Errorf("the listener answered plain bytes with %q", got)
				}
				if err == nil {
					err = io.EOF // closed: refused
				}
			}
			if tt.reason == "" {
				if err != nil {
					t.Fatalf("refused: %v\nlog:\n%s", err, l.logs)
				}
				if line := logLine(l.logs.String(), "remote="+local); line != "" {
					t.Errorf("an accepted connection was logged: %s", line)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			var line string
			testutil.WaitFor(t, ioTimeout, "the refusal in the log", func() bool {
				line = logLine(l.logs.String(), "remote="+local)
				return line != ""
			})
			if !strings.Contains(line, "[WARN]") || !strings.Contains(line, "refused a connection") || !strings.Contains(line, tt.reason) {
				t.Errorf("log line %q, want a warning with the reason %q", line, tt.reason)
			}
		})
	}
}

// Without RequireRole any verified peer is accepted, and a peer without a
// certificate is not.
func TestListenerAnyRole(t *testing.T) {
	l := newRoleListener(t, ListenerConfig{})
	serveOK(t, l)
	for _, role := range []Role{RoleServer, RoleClient, RoleCLI} {
		if res := dialTLS(l.Addr().String(), clientConfig(t, l.ca, string(role), role)); res.err != nil {
			t.Errorf("%s refused: %v", role, res.err)
		}
	}
	if res := dialTLS(l.Addr().String(), &tls.Config{InsecureSkipVerify: true}); res.err == nil {
		t.Error("a peer without a certificate was accepted")
	}
}

// Accept returns *tls.Conn with the handshake done, so the role can be read
// at once.
func TestListenerReturnsTLSConns(t *testing.T) {
	l := newRoleListener(t, ListenerConfig{RequireRole: RoleClient})
	defer l.Close()
	done := make(chan result, 1)
	go func() { done <- dialTLS(l.Addr().String(), clientConfig(t, l.ca, "client", RoleClient)) }()
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	tc, ok := c.(*tls.Conn)
	if !ok {
		t.Fatalf("Accept returned a %T", c)
	}
	st := tc.ConnectionState()
	if role, ok := PeerRole(st, ""); !st.HandshakeComplete || !ok || role != RoleClient {
		t.Errorf("handshake complete %v, role %q %v", st.HandshakeComplete, role, ok)
	}
	if _, err := tc.Write([]byte("ok\n")); err != nil {
		t.Fatal(err)
	}
	if res := <-done; res.err != nil {
		t.Errorf("client: %v", res.err)
	}
	tc.Close()
}

// A peer that connects and says nothing is closed after HandshakeTimeout;
// meanwhile other peers get through.
func TestListenerHandshakeTimeout(t *testing.T) {
	l := newRoleListener(t, ListenerConfig{RequireRole: RoleServer, HandshakeTimeout: 300 * time.Millisecond})
	serveOK(t, l)
	silent, err := net.DialTimeout("tcp", l.Addr().String(), ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	if res := dialTLS(l.Addr().String(), clientConfig(t, l.ca, "server2", RoleServer)); res.err != nil {
		t.Fatalf("a server was held up by a silent peer: %v", res.err)
	}
	_ = silent.SetDeadline(time.Now().Add(ioTimeout))
	start := time.Now()
	if _, err := silent.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("read of the silent connection = %v, want EOF", err)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Errorf("closed after %v", waited)
	}
	var line string
	testutil.WaitFor(t, ioTimeout, "the timeout in the log", func() bool {
		line = logLine(l.logs.String(), "remote="+silent.LocalAddr().String())
		return line != ""
	})
	if !strings.Contains(line, "handshake timed out after 300ms") {
		t.Errorf("log line %q", line)
	}
}

// Beyond MaxPending handshakes a new connection is closed at once and
// logged; once a slot is free, connections get through again.
func TestListenerMaxPending(t *testing.T) {
	l := newRoleListener(t, ListenerConfig{RequireRole: RoleServer, MaxPending: 1})
	serveOK(t, l)
	addr := l.Addr().String()
	silent, err := net.DialTimeout("tcp", addr, ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	// The listener accepts in order: the silent connection holds the only
	// slot when the next one arrives.
	local, _, err := dialRaw(t, addr, nil)
	if err != nil {
		t.Fatalf("read of the connection beyond the limit = %v, want EOF", err)
	}
	var line string
	testutil.WaitFor(t, ioTimeout, "the refusal in the log", func() bool {
		line = logLine(l.logs.String(), "remote="+local)
		return line != ""
	})
	if !strings.Contains(line, "too many pending TLS handshakes (max_pending 1)") {
		t.Errorf("log line %q", line)
	}
	silent.Close()
	cfg := clientConfig(t, l.ca, "server2", RoleServer)
	testutil.WaitFor(t, ioTimeout, "a handshake once the slot is free", func() bool {
		return dialTLS(addr, cfg).err == nil
	})
}

// Close ends every goroutine, closes connections in a handshake, and makes
// Accept return net.ErrClosed.
func TestListenerClose(t *testing.T) {
	before := goleak.IgnoreCurrent()
	l := newRoleListener(t, ListenerConfig{RequireRole: RoleServer})
	accepted := make(chan error, 1)
	go func() {
		_, err := l.Accept()
		accepted <- err
	}()
	// One connection in a handshake, one handshaken and waiting (nobody
	// accepts it after the first Accept returns).
	silent, err := net.DialTimeout("tcp", l.Addr().String(), ioTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	// In a handshake once the listener took it from the kernel's queue:
	// closing the inner listener before that resets it there instead,
	// which is not the close this test is about.
	testutil.WaitFor(t, ioTimeout, "the silent connection in a handshake", func() bool {
		return len(l.Listener.(*listener).slots) == 1
	})
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-accepted:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept after Close = %v, want net.ErrClosed", err)
		}
	case <-time.After(ioTimeout):
		t.Fatal("Accept did not return after Close")
	}
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("second Accept = %v", err)
	}
	_ = silent.SetDeadline(time.Now().Add(ioTimeout))
	if _, err := silent.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("read of the connection in a handshake after Close = %v, want EOF", err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	goleak.VerifyNone(t, before)
}

// When the inner listener is closed under it, Accept reports that.
func TestListenerInnerClosed(t *testing.T) {
	inner := listen(t)
	ca := newTestCA(t, t.TempDir(), "ca", CAOptions{})
	sc, sk := ca.issue(t, "server", RoleServer, 0)
	srv := newConfigurator(t, Config{CAFile: ca.file, CertFile: sc, KeyFile: sk}, nil)
	l := NewListener(inner, ListenerConfig{TLS: srv.IncomingConfig()})
	defer l.Close()
	inner.Close()
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) || !strings.Contains(err.Error(), inner.Addr().String()) {
		t.Errorf("Accept = %v, want net.ErrClosed naming the address", err)
	}
}
