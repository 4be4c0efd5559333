package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/csisupd/csisupd/internal/tlsutil"
)

// readCert parses the one certificate of a PEM file.
func readCert(t *testing.T, file string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "CERTIFICATE" {
		t.Fatalf("%s: no CERTIFICATE block", file)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// checkKey checks that file is a PKCS#8 ECDSA P-256 key of mode 0600.
func checkKey(t *testing.T, file string) {
	t.Helper()
	info, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o600 {
		t.Errorf("%s: mode %v, want 0600", file, info.Mode().Perm())
	}
	b, _ := os.ReadFile(file)
	block, _ := pem.Decode(b)
	if block == nil || block.Type != "PRIVATE KEY" {
		t.Fatalf("%s: no PRIVATE KEY block", file)
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if k, ok := key.(*ecdsa.PrivateKey); !ok || k.Curve != elliptic.P256() {
		t.Errorf("%s: key %T, want ECDSA P-256", file, key)
	}
}

// checkCertMode checks that a certificate file has mode 0644.
func checkCertMode(t *testing.T, file string) {
	t.Helper()
	info, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o644 {
		t.Errorf("%s: mode %v, want 0644", file, info.Mode().Perm())
	}
}

// A CA, three servers, a client and a CLI certificate in one directory:
// names, SANs, key usages, keys and modes, and the certificates work with
// tlsutil.
func TestTLSCreate(t *testing.T) {
	dir := t.TempDir()
	out, err := execute(t, "tls", "ca", "create", "--dir", dir, "--days", "30")
	if err != nil {
		t.Fatal(err)
	}
	caFile, caKey := filepath.Join(dir, "csisupd-agent-ca.pem"), filepath.Join(dir, "csisupd-agent-ca-key.pem")
	if want := "==> Saved " + caFile + "\n==> Saved " + caKey + "\n"; out != want {
		t.Errorf("ca create printed\n%s\nwant\n%s", out, want)
	}
	ca := readCert(t, caFile)
	if !ca.IsCA || !slices.Equal(ca.PermittedDNSDomains, []string{"csisupd", "localhost"}) {
		t.Errorf("CA: IsCA %v, name constraints %v", ca.IsCA, ca.PermittedDNSDomains)
	}
	if days := ca.NotAfter.Sub(ca.NotBefore).Hours() / 24; days < 30 || days > 31 {
		t.Errorf("CA valid for %.1f days, want 30", days)
	}
	checkCertMode(t, caFile)
	checkKey(t, caKey)

	both := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	tests := []struct {
		args      []string
		file      string
		wantDNS   []string
		wantIPs   []string
		wantUsage []x509.ExtKeyUsage
	}{
		{[]string{"--server"}, "global-server-csisupd-0", []string{"server.global.csisupd", "localhost"}, []string{"127.0.0.1"}, both},
		{[]string{"--server", "--additional-dnsname", "node1.csisupd", "--additional-ipaddress", "10.0.0.2,::1"}, "global-server-csisupd-1",
			[]string{"server.global.csisupd", "localhost", "node1.csisupd"}, []string{"127.0.0.1", "10.0.0.2", "::1"}, both},
		{[]string{"--server", "--additional-ipaddress", "10.0.0.3", "--additional-ipaddress", "10.0.0.4"}, "global-server-csisupd-2",
			[]string{"server.global.csisupd", "localhost"}, []string{"127.0.0.1", "10.0.0.3", "10.0.0.4"}, both},
		{[]string{"--client"}, "global-client-csisupd-0", []string{"client.global.csisupd", "localhost"}, []string{"127.0.0.1"}, both},
		{[]string{"--cli"}, "global-cli-csisupd-0", []string{"cli.global.csisupd", "localhost"}, nil, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}},
		{[]string{"--server", "--region", "eu-west", "--days", "10"}, "eu-west-server-csisupd-0", []string{"server.eu-west.csisupd", "localhost"}, []string{"127.0.0.1"}, both},
	}
	serials := map[string]bool{}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			out, err := execute(t, append([]string{"tls", "cert", "create", "--dir", dir}, tt.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			certFile, keyFile := filepath.Join(dir, tt.file+".pem"), filepath.Join(dir, tt.file+"-key.pem")
			want := "==> Using " + caFile + " and " + caKey + "\n==> Saved " + certFile + "\n==> Saved " + keyFile + "\n"
			if out != want {
				t.Errorf("cert create printed\n%s\nwant\n%s", out, want)
			}
			c := readCert(t, certFile)
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
			if serials[c.SerialNumber.String()] {
				t.Errorf("serial %v repeats", c.SerialNumber)
			}
			serials[c.SerialNumber.String()] = true
			if err := c.CheckSignatureFrom(ca); err != nil {
				t.Errorf("not signed by the CA: %v", err)
			}
			checkCertMode(t, certFile)
			checkKey(t, keyFile)
			region := strings.SplitN(tt.wantDNS[0], ".", 3)[1]
			conf, err := tlsutil.New(tlsutil.Config{CAFile: caFile, CertFile: certFile, KeyFile: keyFile, Region: region}, nil)
			if err != nil {
				t.Fatalf("tlsutil.New with the files: %v", err)
			}
			if conf.Certificate().SerialNumber.Cmp(c.SerialNumber) != 0 {
				t.Errorf("tlsutil loaded serial %v", conf.Certificate().SerialNumber)
			}
		})
	}
}

// --dir defaults to the current directory, and --ca/--key name the CA
// files anywhere.
func TestTLSCreateDefaultDir(t *testing.T) {
	caDir, certDir := t.TempDir(), t.TempDir()
	t.Chdir(caDir)
	out, err := execute(t, "tls", "ca", "create")
	if err != nil {
		t.Fatal(err)
	}
	if out != "==> Saved csisupd-agent-ca.pem\n==> Saved csisupd-agent-ca-key.pem\n" {
		t.Errorf("ca create printed %q", out)
	}
	t.Chdir(certDir)
	ca, key := filepath.Join(caDir, "csisupd-agent-ca.pem"), filepath.Join(caDir, "csisupd-agent-ca-key.pem")
	if _, err := execute(t, "tls", "cert", "create", "--client"); err == nil || !strings.Contains(err.Error(), "--ca") {
		t.Errorf("cert create without CA files here = %v, want an error naming --ca", err)
	}
	out, err = execute(t, "tls", "cert", "create", "--client", "--ca", ca, "--key", key)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "==> Saved global-client-csisupd-0.pem\n==> Saved global-client-csisupd-0-key.pem\n") {
		t.Errorf("cert create printed %q", out)
	}
	if _, err := os.Stat(filepath.Join(certDir, "global-client-csisupd-0-key.pem")); err != nil {
		t.Error(err)
	}
}

// Nothing is ever overwritten: a second CA in the same directory is
// refused (exit code 1) and the first stays; certificate numbers skip
// names taken by either file.
func TestTLSRefusesToOverwrite(t *testing.T) {
	dir := t.TempDir()
	if _, err := execute(t, "tls", "ca", "create", "--dir", dir); err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "csisupd-agent-ca.pem")
	before, _ := os.ReadFile(caFile)
	_, err := execute(t, "tls", "ca", "create", "--dir", dir)
	if !errors.Is(err, fs.ErrExist) || !strings.Contains(err.Error(), caFile) || !strings.Contains(err.Error(), "refusing to overwrite") {
		t.Errorf("second ca create = %v, want a refusal naming %s", err, caFile)
	}
	if errors.As(err, new(usageError)) {
		t.Error("the refusal is a usage error")
	}
	if code := run([]string{"tls", "ca", "create", "--dir", dir}); code != exitError {
		t.Errorf("exit code %d, want %d", code, exitError)
	}
	if after, _ := os.ReadFile(caFile); string(after) != string(before) {
		t.Error("the CA file changed")
	}

	// A stray key file takes number 0: the certificate gets number 1.
	if err := os.WriteFile(filepath.Join(dir, "global-server-csisupd-0-key.pem"), []byte("stray"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := execute(t, "tls", "cert", "create", "--server", "--dir", dir)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "global-server-csisupd-1.pem") {
		t.Errorf("cert create printed %q, want number 1", out)
	}
	if _, err := os.Stat(filepath.Join(dir, "global-server-csisupd-0.pem")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a certificate was written beside the stray key: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "global-server-csisupd-0-key.pem")); string(b) != "stray" {
		t.Error("the stray key was overwritten")
	}
}

func TestTLSUsageErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := execute(t, "tls", "ca", "create", "--dir", dir); err != nil {
		t.Fatal(err)
	}
	cert := []string{"tls", "cert", "create", "--dir", dir}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no role", cert, "exactly one of --server, --client and --cli"},
		{"two roles", append(slices.Clone(cert), "--server", "--client"), "exactly one of --server, --client and --cli"},
		{"three roles", append(slices.Clone(cert), "--server", "--client", "--cli"), "(got 3)"},
		{"bad IP", append(slices.Clone(cert), "--server", "--additional-ipaddress", "10.0.0.300"), `--additional-ipaddress "10.0.0.300": not an IP address`},
		{"bad region", append(slices.Clone(cert), "--server", "--region", "eu.west"), `--region "eu.west"`},
		{"empty region", append(slices.Clone(cert), "--server", "--region", ""), `--region ""`},
		{"zero days", append(slices.Clone(cert), "--cli", "--days", "0"), "--days 0: must be positive"},
		{"days not a number", append(slices.Clone(cert), "--cli", "--days", "many"), "--days"},
		{"unknown flag", append(slices.Clone(cert), "--cli", "--wildcard"), "--wildcard"},
		{"argument", append(slices.Clone(cert), "--cli", "extra"), "received 1"},
		{"node of a server", append(slices.Clone(cert), "--server", "--node", "node-1"), `--node "node-1": only a --client certificate names a node`},
		{"node of a cli", append(slices.Clone(cert), "--cli", "--node", "node-1"), `--node "node-1": only a --client certificate names a node`},
		{"bad node name", append(slices.Clone(cert), "--client", "--node", "node/1"), `--node "node/1" must start with a letter or digit`},
		{"ca negative days", []string{"tls", "ca", "create", "--dir", dir, "--days", "-1"}, "--days -1"},
		{"ca empty domain", []string{"tls", "ca", "create", "--dir", dir, "--domain", ""}, "--domain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := execute(t, tt.args...)
			if !errors.As(err, new(usageError)) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%v = %v, want a usage error containing %q", tt.args, err, tt.want)
			}
		})
	}
	if code := run(append(slices.Clone(cert), "--server", "--cli")); code != exitUsage {
		t.Errorf("exit code of two roles %d, want %d", code, exitUsage)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("usage errors wrote files: %v", entries)
	}

	// A name the CA may not sign is an error, not a usage error.
	_, err := execute(t, append(slices.Clone(cert), "--server", "--additional-dnsname", "db.example.com")...)
	if err == nil || errors.As(err, new(usageError)) || !strings.Contains(err.Error(), "not permitted") {
		t.Errorf("a name outside the CA's constraints = %v", err)
	}
}

// --client --node puts the node's name in the certificate, where tlsutil
// reads it back; a certificate without --node names none.
func TestTLSCertCreateNode(t *testing.T) {
	dir := t.TempDir()
	if _, err := execute(t, "tls", "ca", "create", "--dir", dir); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args     []string
		file     string
		wantURIs string
		wantNode string
	}{
		{[]string{"--client", "--node", "node-1"}, "global-client-csisupd-0", "csisupd://global/node/node-1", "node-1"},
		{[]string{"--client", "--node", "rack_2.node-7", "--region", "eu"}, "eu-client-csisupd-0", "csisupd://eu/node/rack_2.node-7", "rack_2.node-7"},
		{[]string{"--client"}, "global-client-csisupd-1", "", ""},
	} {
		if _, err := execute(t, append([]string{"tls", "cert", "create", "--dir", dir}, tt.args...)...); err != nil {
			t.Fatal(err)
		}
		c := readCert(t, filepath.Join(dir, tt.file+".pem"))
		var uris []string
		for _, u := range c.URIs {
			uris = append(uris, u.String())
		}
		if strings.Join(uris, ",") != tt.wantURIs {
			t.Errorf("%v: URI SANs %v, want %q", tt.args, uris, tt.wantURIs)
		}
		region := strings.SplitN(c.DNSNames[0], ".", 3)[1]
		if got, err := tlsutil.CertNodeName(c, region); err != nil || got != tt.wantNode {
			t.Errorf("%v: CertNodeName = %q, %v; want %q", tt.args, got, err, tt.wantNode)
		}
	}
}

// --domain and --additional-name-constraint widen the CA's constraints.
func TestTLSCADomain(t *testing.T) {
	dir := t.TempDir()
	if _, err := execute(t, "tls", "ca", "create", "--dir", dir, "--domain", "example.com", "--additional-name-constraint", "corp.internal"); err != nil {
		t.Fatal(err)
	}
	ca := readCert(t, filepath.Join(dir, "csisupd-agent-ca.pem"))
	if want := []string{"example.com", "csisupd", "localhost", "corp.internal"}; !slices.Equal(ca.PermittedDNSDomains, want) {
		t.Errorf("name constraints %v, want %v", ca.PermittedDNSDomains, want)
	}
	if _, err := execute(t, "tls", "cert", "create", "--dir", dir, "--server", "--additional-dnsname", "db.example.com,git.corp.internal"); err != nil {
		t.Fatal(err)
	}
	if c := readCert(t, filepath.Join(dir, "global-server-csisupd-0.pem")); !slices.Contains(c.DNSNames, "git.corp.internal") {
		t.Errorf("DNS SANs %v", c.DNSNames)
	}
}
