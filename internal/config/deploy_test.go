package config

import (
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The examples in deploy/ are what operators copy; they must always load.
func TestDeployExamplesLoad(t *testing.T) {
	privateAddrs := func() ([]net.Addr, error) {
		return []net.Addr{&net.IPNet{IP: net.ParseIP("10.0.0.11"), Mask: net.CIDRMask(8, 32)}}, nil
	}
	for _, files := range [][]string{
		{"agent.hcl"},
		{"agent.hcl", "server.hcl"},
	} {
		paths := deployCopies(t, files)
		c, err := Load(LoadInput{Files: paths, Env: func(string) string { return "" }, InterfaceAddrs: privateAddrs})
		if err != nil {
			t.Fatalf("%v: %v", files, err)
		}
		if c.AdvertiseAddr != "10.0.0.11" {
			t.Errorf("%v: advertise_addr = %q, want the private address", files, c.AdvertiseAddr)
		}
		if len(files) == 2 && (!c.Server.Enabled || c.Server.BootstrapExpect != 3) {
			t.Errorf("%v: server block not applied: %+v", files, c.Server)
		}
		// The examples show the secure setup.
		if !c.TLS.Enabled() || !c.TLS.VerifyIncoming || !c.TLS.VerifyServerHostname || !c.ACL.Enabled {
			t.Errorf("%v: TLS or ACLs are off: %+v %+v", files, c.TLS, c.ACL)
		}
		wantCert := "global-client-csisupd-0.pem"
		if len(files) == 2 {
			wantCert = "global-server-csisupd-0.pem"
		}
		if filepath.Base(c.TLS.CertFile) != wantCert {
			t.Errorf("%v: tls.cert_file = %s, want %s", files, c.TLS.CertFile, wantCert)
		}
	}
}

// deployTLSDir is where the examples expect the certificates.
const deployTLSDir = "/etc/csisupd.d/tls/"

// deployCopies copies the deploy examples into a temporary directory with
// their certificate paths pointing at files created there (validation
// checks that the files exist), and returns the copies' paths.
func deployCopies(t *testing.T, files []string) []string {
	t.Helper()
	dir := t.TempDir()
	tlsDir := filepath.Join(dir, "tls") + "/"
	if err := os.MkdirAll(tlsDir, 0o700); err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, f := range files {
		src, err := os.ReadFile(filepath.Join("..", "..", "deploy", f))
		if err != nil {
			t.Fatal(err)
		}
		text := string(src)
		for _, m := range regexp.MustCompile(regexp.QuoteMeta(deployTLSDir)+`[^"]+`).FindAllString(text, -1) {
			if err := os.WriteFile(filepath.Join(tlsDir, filepath.Base(m)), []byte("pem"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		dst := filepath.Join(dir, f)
		if err := os.WriteFile(dst, []byte(strings.ReplaceAll(text, deployTLSDir, tlsDir)), 0o600); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, dst)
	}
	return paths
}

// The configuration the packages install (deploy/package/agent.hcl) loads
// as it is, with no environment: a client alone, on the directories the
// packages create, without Consul.
func TestPackageConfigLoads(t *testing.T) {
	c, err := Load(LoadInput{Files: []string{filepath.Join("..", "..", "deploy", "package", "agent.hcl")}, Env: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	if !c.Client.Enabled || c.Server.Enabled || c.Consul.Enabled {
		t.Errorf("roles: client %v, server %v, consul %v; want a client alone", c.Client.Enabled, c.Server.Enabled, c.Consul.Enabled)
	}
	if c.DataDir != "/var/lib/csisupd" || c.Client.PluginDir != "/var/lib/csisupd/plugins" {
		t.Errorf("data_dir %q, plugin_dir %q; want the package's /var/lib/csisupd and /var/lib/csisupd/plugins", c.DataDir, c.Client.PluginDir)
	}
	if c.Client.AllowInsecurePluginDir {
		t.Error("the packaged configuration turns the plugin directory's trust check off")
	}
}
