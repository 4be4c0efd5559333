package tlsutil

import (
	"crypto/tls"
	"crypto/x509"
	"net/url"
	"strings"
	"testing"
)

func TestCertNodeName(t *testing.T) {
	uri := func(s string) *url.URL {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	leaf := func(uris ...string) *x509.Certificate {
		c := &x509.Certificate{DNSNames: []string{"client.global.csisupd"}}
		for _, s := range uris {
			c.URIs = append(c.URIs, uri(s))
		}
		return c
	}
	tests := []struct {
		name    string
		cert    *x509.Certificate
		region  string
		want    string
		wantErr string
	}{
		{"no URI", leaf(), "global", "", ""},
		{"one node", leaf("csisupd://global/node/node-1"), "global", "node-1", ""},
		{"region defaults to global", leaf("csisupd://global/node/node-1"), "", "node-1", ""},
		{"region compares without case", leaf("csisupd://GLOBAL/node/node-1"), "global", "node-1", ""},
		{"the name compares with case", leaf("csisupd://global/node/Node_1"), "global", "Node_1", ""},
		{"an escaped name", leaf("csisupd://global/node/a%20b"), "global", "a b", ""},
		{"another region", leaf("csisupd://eu/node/node-1"), "global", "", ""},
		{"another scheme", leaf("spiffe://global/node/node-1"), "global", "", ""},
		{"another path", leaf("csisupd://global/server/node-1"), "global", "", ""},
		{"a nested path", leaf("csisupd://global/node/a/b"), "global", "", ""},
		{"an empty name", leaf("csisupd://global/node/"), "global", "", ""},
		{"a query", leaf("csisupd://global/node/node-1?x=1"), "global", "", ""},
		{"a user", leaf("csisupd://u@global/node/node-1"), "global", "", ""},
		{"the same node twice", leaf("csisupd://global/node/node-1", "csisupd://global/node/node-1"), "global", "node-1", ""},
		{"two nodes", leaf("csisupd://global/node/node-1", "csisupd://global/node/node-2"), "global", "",
			"names 2 nodes (node-1, node-2)"},
		{"two nodes of two regions", leaf("csisupd://global/node/node-1", "csisupd://eu/node/node-2"), "eu", "node-2", ""},
		{"a role name is no node name", &x509.Certificate{DNSNames: []string{"node-1.node.global.csisupd", "server.global.csisupd"}}, "global", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := CertNodeName(tt.cert, tt.region)
			if got != tt.want {
				t.Errorf("CertNodeName = %q, want %q", got, tt.want)
			}
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("error %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("error %v, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}

func TestGenerateCertNodeName(t *testing.T) {
	ca := newTestCA(t, t.TempDir(), "ca", CAOptions{})
	gen := func(opts CertOptions) (*x509.Certificate, error) {
		opts.CACertPEM, opts.CAKeyPEM = ca.certPEM, ca.keyPEM
		certPEM, _, err := GenerateCert(opts)
		if err != nil {
			return nil, err
		}
		return parsePEM(t, certPEM), nil
	}
	tests := []struct {
		name    string
		opts    CertOptions
		wantURI string
		wantErr string
	}{
		{"client of a node", CertOptions{Role: RoleClient, NodeName: "node-1"}, "csisupd://global/node/node-1", ""},
		{"client of a node in a region", CertOptions{Role: RoleClient, Region: "eu", NodeName: "Node_1.a"}, "csisupd://eu/node/Node_1.a", ""},
		{"client without a node", CertOptions{Role: RoleClient}, "", ""},
		{"server with a node", CertOptions{Role: RoleServer, NodeName: "node-1"}, "", "only a client certificate names a node, not a server one"},
		{"cli with a node", CertOptions{Role: RoleCLI, NodeName: "node-1"}, "", "not a cli one"},
		{"a name with a slash", CertOptions{Role: RoleClient, NodeName: "a/b"}, "", `node name "a/b": cannot be carried`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cert, err := gen(tt.opts)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("GenerateCert = %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var uris []string
			for _, u := range cert.URIs {
				uris = append(uris, u.String())
			}
			if strings.Join(uris, ",") != tt.wantURI {
				t.Fatalf("URI SANs %v, want %q", uris, tt.wantURI)
			}
			// The role is still read from the DNS SANs alone.
			if role, _ := PeerRole(tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert}}}, tt.opts.Region); role != RoleClient {
				t.Errorf("role %q, want client", role)
			}
			if got, err := CertNodeName(cert, tt.opts.Region); err != nil || got != tt.opts.NodeName {
				t.Errorf("CertNodeName = %q, %v; want %q", got, err, tt.opts.NodeName)
			}
		})
	}
}

// TestPeerNodeNameOverTLS makes node certificates with GenerateCert and
// reads their names back on the server's side of real TLS handshakes over
// loopback, with the CA's name constraints in force: only a verified
// chain gives a name.
func TestPeerNodeNameOverTLS(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca", CAOptions{})
	sc, sk := ca.issue(t, "server", RoleServer, 0)
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	presentingPair := func(pair tls.Certificate) *tls.Config {
		return &tls.Config{RootCAs: roots, ServerName: "localhost",
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }}
	}
	tests := []struct {
		name     string
		opts     CertOptions
		verify   bool
		wantName string
	}{
		{"node-1's certificate", CertOptions{Role: RoleClient, NodeName: "node-1"}, true, "node-1"},
		{"a name DNS could not carry", CertOptions{Role: RoleClient, NodeName: "rack_7." + strings.Repeat("n", 70)}, true, "rack_7." + strings.Repeat("n", 70)},
		{"a client certificate without a node", CertOptions{Role: RoleClient}, true, ""},
		{"not verified: no name", CertOptions{Role: RoleClient, NodeName: "node-1"}, false, ""},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newConfigurator(t, Config{CAFile: ca.file, CertFile: sc, KeyFile: sk, VerifyIncoming: true}, nil)
			cfg := srv.IncomingConfig()
			if !tt.verify {
				// A configuration that takes any certificate without
				// verifying it: PeerNodeName must not read it.
				cfg = &tls.Config{Certificates: []tls.Certificate{keyPair(t, sc, sk)}, ClientAuth: tls.RequireAnyClientCert}
			}
			ln := tls.NewListener(listen(t), cfg)
			defer ln.Close()
			states := acceptState(t, ln)
			pair := ca.pair(t, "client-"+string(rune('a'+i)), tt.opts)
			if res := dialTLS(ln.Addr().String(), presentingPair(pair)); res.err != nil {
				t.Fatalf("dial: %v", res.err)
			}
			st := <-states
			if st == nil {
				t.Fatal("the server did not complete the handshake")
			}
			if len(st.PeerCertificates) == 0 || len(st.PeerCertificates[0].URIs) != len(pair.Leaf.URIs) {
				t.Fatalf("the server did not see the client's certificate")
			}
			got, err := PeerNodeName(*st, "")
			if err != nil || got != tt.wantName {
				t.Errorf("PeerNodeName = %q, %v; want %q", got, err, tt.wantName)
			}
		})
	}
}

// TestConfiguratorNodeName refuses, with Config.NodeName, a client
// certificate naming another node or none, at New and at Reload (which
// keeps the certificate it had); server certificates are not checked.
func TestConfiguratorNodeName(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca", CAOptions{})
	issue := func(opts CertOptions) (string, string) { return ca.issueOpts(t, "agent", opts) }
	tests := []struct {
		name    string
		opts    CertOptions
		node    string
		wantErr string
	}{
		{"its own node", CertOptions{Role: RoleClient, NodeName: "node-1"}, "node-1", ""},
		{"another node", CertOptions{Role: RoleClient, NodeName: "node-2"}, "node-1",
			`agent.pem: the certificate names node "node-2", but this agent's name is "node-1" (tls.verify_node_name is on)`},
		{"no node", CertOptions{Role: RoleClient}, "node-1", "the client certificate names no node"},
		{"not checked without a node name", CertOptions{Role: RoleClient, NodeName: "node-2"}, "", ""},
		{"a server certificate is not checked", CertOptions{Role: RoleServer}, "node-1", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cf, kf := issue(tt.opts)
			_, err := New(Config{CAFile: ca.file, CertFile: cf, KeyFile: kf, NodeName: tt.node}, nil)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("New: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("New = %v, want an error containing %q", err, tt.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), "tls.cert_file "+cf) {
				t.Errorf("the error %q does not name the file", err)
			}
		})
	}

	cf, kf := issue(CertOptions{Role: RoleClient, NodeName: "node-1"})
	c := newConfigurator(t, Config{CAFile: ca.file, CertFile: cf, KeyFile: kf, NodeName: "node-1"}, nil)
	issue(CertOptions{Role: RoleClient, NodeName: "node-2"})
	if err := c.Reload(); err == nil || !strings.Contains(err.Error(), `names node "node-2"`) {
		t.Fatalf("Reload = %v, want a refusal of node-2's certificate", err)
	}
	if got, _ := CertNodeName(c.Certificate(), ""); got != "node-1" {
		t.Fatalf("after a refused reload the certificate names %q, want node-1's kept", got)
	}
}
