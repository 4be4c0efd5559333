package tlsutil

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/goleak"

	"github.com/csisupd/csisupd/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// ioTimeout bounds every network wait of the tests.
const ioTimeout = 10 * time.Second

// testCA is a CA made with GenerateCA, its files in dir.
type testCA struct {
	certPEM, keyPEM []byte
	file            string // the CA certificate
	dir             string
	cert            *x509.Certificate
}

// newTestCA generates a CA and writes its certificate to dir/name.pem.
func newTestCA(t *testing.T, dir, name string, opts CAOptions) *testCA {
	t.Helper()
	certPEM, keyPEM, err := GenerateCA(opts)
	if err != nil {
		t.Fatalf("GenerateCA: %v", err)
	}
	ca := &testCA{certPEM: certPEM, keyPEM: keyPEM, file: filepath.Join(dir, name+".pem"), dir: dir, cert: parsePEM(t, certPEM)}
	writeFile(t, ca.file, certPEM)
	return ca
}

// issue generates a certificate of role (in DefaultRegion, valid for days)
// and writes it and its key to dir/name.pem and dir/name-key.pem,
// replacing files of that name.
func (ca *testCA) issue(t *testing.T, name string, role Role, days int) (certFile, keyFile string) {
	t.Helper()
	return ca.issueOpts(t, name, CertOptions{Role: role, Days: days})
}

// issueOpts is issue with every option of GenerateCert.
func (ca *testCA) issueOpts(t *testing.T, name string, opts CertOptions) (certFile, keyFile string) {
	t.Helper()
	opts.CACertPEM, opts.CAKeyPEM = ca.certPEM, ca.keyPEM
	certPEM, keyPEM, err := GenerateCert(opts)
	if err != nil {
		t.Fatalf("GenerateCert %s: %v", name, err)
	}
	certFile = filepath.Join(ca.dir, name+".pem")
	keyFile = filepath.Join(ca.dir, name+"-key.pem")
	writeFile(t, certFile, certPEM)
	writeFile(t, keyFile, keyPEM)
	return certFile, keyFile
}

// pair issues a certificate as issueOpts does and loads it.
func (ca *testCA) pair(t *testing.T, name string, opts CertOptions) tls.Certificate {
	t.Helper()
	certFile, keyFile := ca.issueOpts(t, name, opts)
	return keyPair(t, certFile, keyFile)
}

// keyPair loads a certificate and key written by issue.
func keyPair(t *testing.T, certFile, keyFile string) tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// writeFile replaces file with data (tests rewrite certificates in place
// to rotate them).
func writeFile(t *testing.T, file string, data []byte) {
	t.Helper()
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// bundle writes the concatenation of the CAs' certificates to file.
func bundle(t *testing.T, file string, cas ...*testCA) {
	t.Helper()
	var b []byte
	for _, ca := range cas {
		b = append(b, ca.certPEM...)
	}
	writeFile(t, file, b)
}

// parsePEM parses the first certificate of a PEM file's contents.
func parsePEM(t *testing.T, data []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("no PEM block in %q", data)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// newConfigurator calls New and fails the test on an error.
func newConfigurator(t *testing.T, cfg Config, logger hclog.Logger) *Configurator {
	t.Helper()
	c, err := New(cfg, logger)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

// bufferLogger returns a logger writing into a buffer safe to read while
// other goroutines log.
func bufferLogger() (hclog.Logger, *testutil.SyncBuffer) {
	buf := &testutil.SyncBuffer{}
	return hclog.New(&hclog.LoggerOptions{Level: hclog.Debug, Output: buf}), buf
}

// logLine returns the line of the log that contains s, or "".
func logLine(log, s string) string {
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}

// listen returns a loopback TCP listener on a port the kernel chose.
func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// serveOK accepts connections of ln until it is closed and writes "ok\n"
// to each, after its handshake when it is a *tls.Conn. Connections made
// with plain tls.NewListener are handshaken here. The test's cleanup
// closes ln and waits for the goroutines.
func serveOK(t *testing.T, ln net.Listener) {
	t.Helper()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(ioTimeout))
				if tc, ok := c.(*tls.Conn); ok {
					if err := tc.Handshake(); err != nil {
						return
					}
				}
				_, _ = c.Write([]byte("ok\n"))
				// Wait for the client to hang up, so that it reads "ok"
				// before the close.
				_, _ = c.Read(make([]byte, 1))
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
}

// result is what a client saw of one connection.
type result struct {
	err   error               // the handshake's or the read's
	local string              // the client's address, as the server logs it
	state tls.ConnectionState // after the handshake
}

// dialTLS handshakes with addr and reads the server's "ok\n". A server
// that refuses the client's certificate is seen at the read under TLS 1.3
// (the client finishes its handshake first), so both count.
func dialTLS(addr string, cfg *tls.Config) result {
	raw, err := net.DialTimeout("tcp", addr, ioTimeout)
	if err != nil {
		return result{err: err}
	}
	defer raw.Close()
	res := result{local: raw.LocalAddr().String()}
	_ = raw.SetDeadline(time.Now().Add(ioTimeout))
	c := tls.Client(raw, cfg)
	if err := c.Handshake(); err != nil {
		res.err = err
		return res
	}
	res.state = c.ConnectionState()
	line, err := bufio.NewReader(c).ReadString('\n')
	if err == nil && line != "ok\n" {
		err = &net.OpError{Op: "read", Err: os.ErrInvalid}
	}
	res.err = err
	return res
}
