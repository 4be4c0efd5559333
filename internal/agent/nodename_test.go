package agent

import (
	"cmp"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/csisupd/csisupd/internal/testutil"
	"github.com/csisupd/csisupd/internal/tlsutil"
)

// TestNewRefusesCertificateOfAnotherNode starts agents named test-node
// with client certificates made for a node: with tls.verify_node_name an
// agent refuses to start with one naming another node (or none), naming
// the certificate file, the certificate's node and its own name; without
// it, and with its own node's certificate, it starts.
func TestNewRefusesCertificateOfAnotherNode(t *testing.T) {
	dir := testutil.TempDir(t)
	caCert, caKey, err := tlsutil.GenerateCA(tlsutil.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.pem")
	write := func(name string, data []byte) string {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	write("ca.pem", caCert)
	issue := func(node string) (certFile, keyFile string) {
		t.Helper()
		c, k, err := tlsutil.GenerateCert(tlsutil.CertOptions{CACertPEM: caCert, CAKeyPEM: caKey, Role: tlsutil.RoleClient, NodeName: node})
		if err != nil {
			t.Fatal(err)
		}
		name := "client-" + cmp.Or(node, "none")
		return write(name+".pem", c), write(name+"-key.pem", k)
	}
	tests := []struct {
		name    string
		node    string // the certificate's node; "" names none
		verify  bool
		wantErr []string
	}{
		{"another node", "node-2", true, []string{"client-node-2.pem", `the certificate names node "node-2", but this agent's name is "test-node"`,
			"csisupd tls cert create --client --node test-node"}},
		{"no node", "", true, []string{"client-none.pem", "the client certificate names no node"}},
		{"its own node", "test-node", true, nil},
		{"another node without verify_node_name", "node-2", false, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.TLS.CAFile = caFile
			cfg.TLS.CertFile, cfg.TLS.KeyFile = issue(tt.node)
			cfg.TLS.VerifyNodeName = tt.verify
			a, err := New(Config{Config: cfg, Logger: hclog.NewNullLogger()})
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				a.Close()
				return
			}
			if err == nil {
				a.Close()
				t.Fatal("New started an agent with a certificate of another node")
			}
			for _, want := range tt.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}
