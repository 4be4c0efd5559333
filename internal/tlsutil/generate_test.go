package tlsutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestGenerateCA(t *testing.T) {
	certPEM, keyPEM, err := GenerateCA(CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ca := parsePEM(t, certPEM)
	if !ca.IsCA || !ca.BasicConstraintsValid {
		t.Errorf("IsCA %v, BasicConstraintsValid %v: want a CA", ca.IsCA, ca.BasicConstraintsValid)
	}
	if want := x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature; ca.KeyUsage != want {
		t.Errorf("KeyUsage = %b, want %b", ca.KeyUsage, want)
	}
	if !ca.PermittedDNSDomainsCritical || !slices.Equal(ca.PermittedDNSDomains, []string{"csisupd", "localhost"}) {
		t.Errorf("name constraints %v (critical %v), want csisupd and localhost, critical", ca.PermittedDNSDomains, ca.PermittedDNSDomainsCritical)
	}
	if len(ca.PermittedIPRanges) != 0 || len(ca.ExcludedIPRanges) != 0 {
		t.Errorf("IP constraints %v / %v, want none", ca.PermittedIPRanges, ca.ExcludedIPRanges)
	}
	if !strings.HasPrefix(ca.Subject.CommonName, "csisupd Agent CA ") {
		t.Errorf("CommonName = %q", ca.Subject.CommonName)
	}
	if days := ca.NotAfter.Sub(ca.NotBefore).Hours() / 24; days < 1825 || days > 1826 {
		t.Errorf("valid for %.2f days, want 1825", days)
	}
	if ca.SerialNumber.Sign() <= 0 || ca.SerialNumber.BitLen() > 128 || ca.SerialNumber.BitLen() < 64 {
		t.Errorf("serial %v (%d bits), want a random 128-bit number", ca.SerialNumber, ca.SerialNumber.BitLen())
	}
	pub, ok := ca.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		t.Errorf("public key %T, want ECDSA P-256", ca.PublicKey)
	}
	block, _ := pem.Decode(keyPEM)
	if block == nil || block.Type != "PRIVATE KEY" {
		t.Fatalf("key PEM %q, want a PRIVATE KEY block", keyPEM)
	}
	if _, err := x509.ParsePKCS8PrivateKey(block.Bytes); err != nil {
		t.Errorf("key is not PKCS#8: %v", err)
	}
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Errorf("tls.X509KeyPair: %v", err)
	}

	other, _, err := GenerateCA(CAOptions{Days: 10, Domain: "example.com", AdditionalConstraints: []string{"corp.internal"}, CommonName: "Test CA"})
	if err != nil {
		t.Fatal(err)
	}
	o := parsePEM(t, other)
	if o.Subject.CommonName != "Test CA" || o.SerialNumber.Cmp(ca.SerialNumber) == 0 {
		t.Errorf("CommonName %q, serial %v (first CA's %v)", o.Subject.CommonName, o.SerialNumber, ca.SerialNumber)
	}
	if !slices.Equal(o.PermittedDNSDomains, []string{"example.com", "csisupd", "localhost", "corp.internal"}) {
		t.Errorf("name constraints %v", o.PermittedDNSDomains)
	}
	if days := o.NotAfter.Sub(o.NotBefore).Hours() / 24; days < 10 || days > 10.1 {
		t.Errorf("valid for %.2f days, want 10", days)
	}
	if _, _, err := GenerateCA(CAOptions{Days: -1}); err == nil {
		t.Error("GenerateCA with -1 days succeeded")
	}
}

func TestGenerateCert(t *testing.T) {
	caPEM, caKey, err := GenerateCA(CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ca := parsePEM(t, caPEM)
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	both := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	tests := []struct {
		name      string
		opts      CertOptions
		wantDNS   []string
		wantIPs   []string
		wantUsage []x509.ExtKeyUsage
	}{
		{"server", CertOptions{Role: RoleServer}, []string{"server.global.csisupd", "localhost"}, []string{"127.0.0.1"}, both},
		{"client in a region", CertOptions{Role: RoleClient, Region: "eu"}, []string{"client.eu.csisupd", "localhost"}, []string{"127.0.0.1"}, both},
		{"cli", CertOptions{Role: RoleCLI}, []string{"cli.global.csisupd", "localhost"}, nil, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
		{"server with additional names", CertOptions{Role: RoleServer, DNSNames: []string{"node1.csisupd", "localhost"},
			IPAddresses: []net.IP{net.ParseIP("10.0.0.5"), net.ParseIP("::1"), net.ParseIP("127.0.0.1")}},
			[]string{"server.global.csisupd", "localhost", "node1.csisupd"}, []string{"127.0.0.1", "10.0.0.5", "::1"}, both},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := tt.opts
			opts.CACertPEM, opts.CAKeyPEM = caPEM, caKey
			certPEM, keyPEM, err := GenerateCert(opts)
			if err != nil {
				t.Fatal(err)
			}
			c := parsePEM(t, certPEM)
			if !slices.Equal(c.DNSNames, tt.wantDNS) {
				t.Errorf("DNS SANs %v, want %v", c.DNSNames, tt.wantDNS)
			}
			var ips []string
			for _, ip := range c.IPAddresses {
				ips = append(ips, ip.String())
			}
			if !slices.Equal(ips, tt.wantIPs) {
				t.Errorf("IP SANs %v, want %v", ips, tt.wantIPs)
			}
			if !slices.Equal(c.ExtKeyUsage, tt.wantUsage) {
				t.Errorf("ExtKeyUsage %v, want %v", c.ExtKeyUsage, tt.wantUsage)
			}
			if c.IsCA || c.Subject.CommonName != tt.wantDNS[0] {
				t.Errorf("IsCA %v, CommonName %q", c.IsCA, c.Subject.CommonName)
			}
			if days := c.NotAfter.Sub(c.NotBefore).Hours() / 24; days < 365 || days > 366 {
				t.Errorf("valid for %.2f days, want 365", days)
			}
			if pub, ok := c.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
				t.Errorf("public key %T, want ECDSA P-256", c.PublicKey)
			}
			if c.SerialNumber.BitLen() > 128 || c.SerialNumber.Sign() <= 0 {
				t.Errorf("serial %v", c.SerialNumber)
			}
			if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
				t.Errorf("tls.X509KeyPair: %v", err)
			}
			// Every SAN verifies under the CA's name constraints, IP SANs
			// included (Verify matches an IP given as DNSName against the
			// IP SANs).
			for _, name := range append(slices.Clone(tt.wantDNS), tt.wantIPs...) {
				if _, err := c.Verify(x509.VerifyOptions{Roots: roots, DNSName: name, KeyUsages: tt.wantUsage}); err != nil {
					t.Errorf("verify as %s: %v", name, err)
				}
			}
		})
	}
}

func TestGenerateCertErrors(t *testing.T) {
	caPEM, caKey, err := GenerateCA(CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, otherKey, err := GenerateCA(CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	leafPEM, leafKey, err := GenerateCert(CertOptions{CACertPEM: caPEM, CAKeyPEM: caKey, Role: RoleServer})
	if err != nil {
		t.Fatal(err)
	}
	expiredCA, expiredKey := selfSignedCA(t, time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour))
	tests := []struct {
		name string
		opts CertOptions
		want string
	}{
		{"unknown role", CertOptions{CACertPEM: caPEM, CAKeyPEM: caKey, Role: "admin"}, `role "admin"`},
		{"bad region", CertOptions{CACertPEM: caPEM, CAKeyPEM: caKey, Role: RoleServer, Region: "a.b"}, `region "a.b"`},
		{"negative days", CertOptions{CACertPEM: caPEM, CAKeyPEM: caKey, Role: RoleServer, Days: -3}, "-3 days"},
		{"no CA", CertOptions{CAKeyPEM: caKey, Role: RoleServer}, "CA certificate: no PEM CERTIFICATE"},
		{"no CA key", CertOptions{CACertPEM: caPEM, Role: RoleServer}, "CA key: no PEM private key"},
		{"key of another CA", CertOptions{CACertPEM: caPEM, CAKeyPEM: otherKey, Role: RoleServer}, "not the key of the CA"},
		{"a leaf is not a CA", CertOptions{CACertPEM: leafPEM, CAKeyPEM: leafKey, Role: RoleServer}, "not a CA"},
		{"name outside the constraints", CertOptions{CACertPEM: caPEM, CAKeyPEM: caKey, Role: RoleServer, DNSNames: []string{"db.example.com"}},
			`"db.example.com" is not permitted`},
		{"expired CA", CertOptions{CACertPEM: expiredCA, CAKeyPEM: expiredKey, Role: RoleServer}, "does not verify against the CA"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := GenerateCert(tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("GenerateCert = %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// A CA with another domain and additional constraints signs role
// certificates and names in its domains; a key in SEC 1 form ("EC PRIVATE
// KEY") signs as well as PKCS#8.
func TestGenerateCertConstraints(t *testing.T) {
	caPEM, caKey, err := GenerateCA(CAOptions{Domain: "example.com", AdditionalConstraints: []string{"corp.internal"}})
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(caKey)
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalECPrivateKey(k.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	ecKey := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
	for _, key := range [][]byte{caKey, ecKey} {
		certPEM, _, err := GenerateCert(CertOptions{CACertPEM: caPEM, CAKeyPEM: key, Role: RoleClient,
			DNSNames: []string{"node1.example.com", "git.corp.internal"}})
		if err != nil {
			t.Fatalf("GenerateCert: %v", err)
		}
		if c := parsePEM(t, certPEM); !slices.Contains(c.DNSNames, "client.global.csisupd") {
			t.Errorf("DNS SANs %v", c.DNSNames)
		}
	}
	if _, _, err := GenerateCert(CertOptions{CACertPEM: caPEM, CAKeyPEM: caKey, Role: RoleClient, DNSNames: []string{"example.org"}}); err == nil {
		t.Error("a name outside every constraint was signed")
	}
}

// A TLS client that verifies the standard way (RootCAs, ServerName
// 127.0.0.1) accepts a server certificate under a name-constrained CA by
// its IP SAN.
func TestIPSANVerifiesInAHandshake(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca", CAOptions{})
	certFile, keyFile := ca.issue(t, "server", RoleServer, 0)
	ln := tls.NewListener(listen(t), &tls.Config{Certificates: []tls.Certificate{keyPair(t, certFile, keyFile)}, MinVersion: tls.VersionTLS12})
	serveOK(t, ln)
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	for _, name := range []string{"127.0.0.1", "localhost", "server.global.csisupd"} {
		res := dialTLS(ln.Addr().String(), &tls.Config{RootCAs: roots, ServerName: name, MinVersion: tls.VersionTLS12})
		if res.err != nil {
			t.Errorf("dial as %s: %v", name, res.err)
		}
	}
	res := dialTLS(ln.Addr().String(), &tls.Config{RootCAs: roots, ServerName: "10.9.9.9", MinVersion: tls.VersionTLS12})
	if res.err == nil {
		t.Error("a server name that is not in the certificate was accepted")
	}
}

// selfSignedCA returns a CA valid from notBefore to notAfter.
func selfSignedCA(t *testing.T, notBefore, notAfter time.Time) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := randomSerial()
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: serial, NotBefore: notBefore, NotAfter: notAfter, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err = encodeKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM
}
