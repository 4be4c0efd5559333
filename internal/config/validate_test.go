package config

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestValidateErrors checks the problems found in the flags. The broken
// configuration files are in testdata/invalid (TestLoadBrokenConfigs).
func TestValidateErrors(t *testing.T) {
	tests := []struct {
		name string
		src  string
		args []string
		want string // the whole error text
	}{
		{"port clash with a flag", "ports {\n  rpc = 5000\n}", []string{"--http-port", "5000"},
			`flag --http-port: ports.http: 5000 is already used by ports.rpc`},
		{"retry_join from flag", "", []string{"--retry-join", "nohost"},
			`flag --retry-join: server.retry_join: element 0: "nohost" is not host:port: address nohost: missing port in address`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := load(t, input{files: map[string]string{"agent.hcl": tt.src}, paths: []string{"agent.hcl"}, args: tt.args})
			if err == nil {
				t.Fatalf("Load succeeded, want error:\n%s", tt.want)
			}
			if err.Error() != tt.want {
				t.Fatalf("error:\n%s\nwant:\n%s", err, tt.want)
			}
		})
	}
}

func TestValidateReportsAllProblems(t *testing.T) {
	c := Default()
	c.Name = "n"
	c.LogLevel = "loud"
	c.Ports.RPC = -1
	c.Server.RaftMultiplier = 0
	err := c.Validate()
	want := []string{
		`log_level: "loud" is not one of trace, debug, info, warn, error`,
		`ports.rpc: -1 is not a port number (1-65535)`,
		`server.raft_multiplier: must be between 1 and 10, got 0`,
	}
	if err == nil {
		t.Fatal("Validate succeeded")
	}
	assertEqual(t, "errors", strings.Split(err.Error(), "\n"), want)
}

func TestPluginDir(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "not-a-dir")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	isFile := `client.plugin_dir: "` + file + `" is a file, not a directory`
	tests := []struct {
		name string
		in   input
		want string // "" means no error
	}{
		{
			name: "from a file",
			in: input{
				files: map[string]string{"agent.hcl": "name = \"n\"\nclient {\n  plugin_dir = \"" + file + "\"\n}"},
				paths: []string{"agent.hcl"},
			},
			want: "agent.hcl:3: " + isFile,
		},
		{
			name: "from the environment",
			in:   input{env: map[string]string{EnvPluginDir: file}},
			want: "env CSISUPD_PLUGIN_DIR: " + isFile,
		},
		{
			name: "from a flag",
			in:   input{args: []string{"--plugin-dir", file}},
			want: "flag --plugin-dir: " + isFile,
		},
		{
			name: "existing directory",
			in:   input{args: []string{"--plugin-dir", dir}},
		},
		{
			name: "missing directory is created later",
			in:   input{args: []string{"--plugin-dir", filepath.Join(dir, "new")}},
		},
		{
			name: "ignored when the client is disabled",
			in: input{
				files: map[string]string{"agent.hcl": "client {\n  enabled = false\n}\nserver {\n  enabled = true\n  bootstrap_expect = 1\n}"},
				paths: []string{"agent.hcl"},
				args:  []string{"--plugin-dir", file},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := load(t, tt.in)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Load: %v", err)
			case tt.want != "" && (err == nil || err.Error() != tt.want):
				t.Fatalf("error = %v, want %q", err, tt.want)
			}
		})
	}
}

func TestTLS(t *testing.T) {
	dir := t.TempDir()
	cert := filepath.Join(dir, "cert.pem")
	key := filepath.Join(dir, "key.pem")
	for _, f := range []string{cert, key} {
		if err := os.WriteFile(f, []byte("pem"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	missing := filepath.Join(dir, "missing.pem")
	tests := []struct {
		name        string
		tls         TLSConfig
		want        string // "" means valid
		wantMissing bool
	}{
		{name: "none", tls: TLSConfig{}},
		{name: "cert and key", tls: TLSConfig{CertFile: cert, KeyFile: key, CAFile: cert}},
		{name: "CA only", tls: TLSConfig{CAFile: cert}},
		{name: "cert without key", tls: TLSConfig{CertFile: cert},
			want: "tls.cert_file: is set but tls.key_file is not: set both or neither"},
		{name: "key without cert", tls: TLSConfig{KeyFile: key},
			want: "tls.key_file: is set but tls.cert_file is not: set both or neither"},
		{name: "missing CA", tls: TLSConfig{CAFile: missing},
			want: "tls.ca_file: stat " + missing + ": no such file or directory", wantMissing: true},
		{name: "cert without CA", tls: TLSConfig{CertFile: cert, KeyFile: key},
			want: "tls.ca_file: is required with tls.cert_file: peers are verified against it, and roles come from the certificates it signed"},
		{name: "directory as key", tls: TLSConfig{CertFile: cert, KeyFile: dir, CAFile: cert},
			want: `tls.key_file: "` + dir + `" is not a regular file (a directory)`},
		{name: "verify_node_name with verify_incoming", tls: TLSConfig{CertFile: cert, KeyFile: key, CAFile: cert, VerifyIncoming: true, VerifyNodeName: true}},
		{name: "verify_node_name without verify_incoming", tls: TLSConfig{CertFile: cert, KeyFile: key, CAFile: cert, VerifyNodeName: true},
			want: "tls.verify_node_name: needs TLS with tls.verify_incoming = true: a node's name is read from the client certificate every caller must present"},
		{name: "verify_node_name without TLS", tls: TLSConfig{VerifyIncoming: true, VerifyNodeName: true},
			want: "tls.verify_node_name: needs TLS with tls.verify_incoming = true: a node's name is read from the client certificate every caller must present"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			c.Name = "n"
			c.Client.PluginDir = dir
			c.TLS = tt.tls
			err := c.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				assertEqual(t, "Enabled", c.TLS.Enabled(), tt.tls.CertFile != "")
				return
			}
			if err == nil || err.Error() != tt.want {
				t.Fatalf("error = %v, want %q", err, tt.want)
			}
			if tt.wantMissing && !errors.Is(err, fs.ErrNotExist) {
				t.Fatalf("error %v does not wrap fs.ErrNotExist", err)
			}
		})
	}
}

func TestBootstrapExpectWarnings(t *testing.T) {
	tests := []struct {
		expect int
		want   []string
	}{
		{1, nil},
		{2, []string{"server.bootstrap_expect = 2 is even: 2 servers tolerate no more failures than 1; use an odd number"}},
		{3, nil},
		{4, []string{"server.bootstrap_expect = 4 is even: 4 servers tolerate no more failures than 3; use an odd number"}},
	}
	for _, tt := range tests {
		c := Default()
		c.Name = "n"
		c.Client.PluginDir = t.TempDir()
		c.Server.Enabled = true
		c.Server.BootstrapExpect = tt.expect
		for range 2 { // a second Validate must not repeat warnings
			if err := c.Validate(); err != nil {
				t.Fatalf("bootstrap_expect = %d: %v", tt.expect, err)
			}
		}
		assertEqual(t, "warnings", c.Warnings, tt.want)
	}
}

// enable_debug warns when the unauthenticated /debug/pprof/ is reachable
// beyond the host.
func TestEnableDebugWarning(t *testing.T) {
	tests := []struct {
		bind  string
		debug bool
		want  []string
	}{
		{"127.0.0.1", true, nil},
		{"::1", true, nil},
		{"10.0.0.5", false, nil},
		{"10.0.0.5", true, []string{"enable_debug = true serves /debug/pprof/ without authentication on ports.http at 10.0.0.5: " +
			"whoever reaches that address can profile the agent"}},
	}
	for _, tt := range tests {
		c := Default()
		c.Name = "n"
		c.Client.PluginDir = t.TempDir()
		c.BindAddr, c.AdvertiseAddr = tt.bind, tt.bind
		c.EnableDebug = tt.debug
		if err := c.Validate(); err != nil {
			t.Fatalf("bind_addr %s: %v", tt.bind, err)
		}
		assertEqual(t, "warnings of bind_addr "+tt.bind, c.Warnings, tt.want)
	}
}
