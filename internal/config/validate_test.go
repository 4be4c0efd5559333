package config

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestValidateErrors(t *testing.T) {
	tests := []struct {
		name string
		src  string
		args []string
		want string // the whole error text
	}{
		{"name", `name = "-bad name"`, nil,
			`agent.hcl:1: name: "-bad name" must start with a letter or digit and contain only letters, digits, '.', '_' and '-' (at most 253)`},
		{"data_dir relative", `data_dir = "var/lib"`, nil,
			`agent.hcl:1: data_dir: "var/lib" must be an absolute path`},
		{"data_dir empty", `data_dir = ""`, nil,
			`agent.hcl:1: data_dir: required`},
		{"bind_addr", `bind_addr = "localhost"`, nil,
			`agent.hcl:1: bind_addr: "localhost" is not an IP address`},
		{"advertise_addr not an IP", `advertise_addr = "host.example"`, nil,
			`agent.hcl:1: advertise_addr: "host.example" is not an IP address`},
		{"advertise_addr", `advertise_addr = "0.0.0.0"`, nil,
			`agent.hcl:1: advertise_addr: 0.0.0.0 cannot be reached by other nodes: set advertise_addr to an address of this node`},
		{"log_level", `log_level = "verbose"`, nil,
			`agent.hcl:1: log_level: "verbose" is not one of trace, debug, info, warn, error`},
		{"region", `region = "EU_West"`, nil,
			`agent.hcl:1: region: "EU_West" is not a region name: use 1 to 63 lower-case letters, digits and dashes, starting with a letter or digit`},
		{"acl without tls", "acl {\n  enabled = true\n}", nil,
			`agent.hcl:2: acl.enabled: needs TLS (tls.ca_file, tls.cert_file, tls.key_file): servers and agents prove their role by certificate, and tokens must not cross the network in plain text`},
		{"claim_gc_grace", "server {\n  claim_gc_grace = \"0s\"\n}", nil,
			`agent.hcl:2: server.claim_gc_grace: must be greater than zero, got 0s`},
		{"claim_resume_timeout", "server {\n  claim_resume_timeout = \"-1s\"\n}", nil,
			`agent.hcl:2: server.claim_resume_timeout: must be greater than zero, got -1s`},
		{"heartbeat durations", "server {\n  heartbeat_grace = \"0s\"\n  min_heartbeat_ttl = \"-1s\"\n  failover_heartbeat_ttl = \"0s\"\n  server_stabilization_time = \"0s\"\n}", nil,
			`agent.hcl:2: server.heartbeat_grace: must be greater than zero, got 0s` + "\n" +
				`agent.hcl:3: server.min_heartbeat_ttl: must be greater than zero, got -1s` + "\n" +
				`agent.hcl:4: server.failover_heartbeat_ttl: must be greater than zero, got 0s` + "\n" +
				`agent.hcl:5: server.server_stabilization_time: must be greater than zero, got 0s`},
		{"max_heartbeats_per_second zero", "server {\n  max_heartbeats_per_second = 0\n}", nil,
			`agent.hcl:2: server.max_heartbeats_per_second: must be greater than zero, got 0`},
		{"max_heartbeats_per_second negative", "server {\n  max_heartbeats_per_second = -2.5\n}", nil,
			`agent.hcl:2: server.max_heartbeats_per_second: must be greater than zero, got -2.5`},
		{"failover_heartbeat_ttl below min_heartbeat_ttl", "server {\n  min_heartbeat_ttl = \"1m\"\n  failover_heartbeat_ttl = \"30s\"\n}", nil,
			`agent.hcl:3: server.failover_heartbeat_ttl: 30s must be at least server.min_heartbeat_ttl (1m0s)`},
		{"failover_heartbeat_ttl below the default min_heartbeat_ttl", "server {\n  failover_heartbeat_ttl = \"5s\"\n}", nil,
			`agent.hcl:2: server.failover_heartbeat_ttl: 5s must be at least server.min_heartbeat_ttl (10s)`},
		{"docker socket relative", "docker {\n  socket = \"csisupd.sock\"\n}", nil,
			`agent.hcl:2: docker.socket: "csisupd.sock" must be an absolute path (Docker reads /run/docker/plugins)`},
		{"docker engine_socket relative", "docker {\n  engine_socket = \"docker.sock\"\n}", nil,
			`agent.hcl:2: docker.engine_socket: "docker.sock" must be an absolute path, such as /run/docker.sock or /run/podman/podman.sock`},
		{"docker default_plugin", "docker {\n  default_plugin = \"-ebs\"\n}", nil,
			`agent.hcl:2: docker.default_plugin: "-ebs" is not a plugin id (letters, digits, '.', '_' and '-', at most 128, starting with a letter or digit)`},
		{"docker lease too short", "docker {\n  lease = \"1s\"\n}", nil,
			`agent.hcl:2: docker.lease: must be between 5s and 24h0m0s (the bounds of a claim's lease), got 1s`},
		{"docker reconcile_interval", "docker {\n  reconcile_interval = \"0s\"\n}", nil,
			`agent.hcl:2: docker.reconcile_interval: must be greater than zero, got 0s`},
		{"docker group unknown", "docker {\n  group = \"no-such-group-here\"\n}", nil,
			`agent.hcl:2: docker.group: "no-such-group-here": no such group on this host (group: unknown group no-such-group-here)`},
		{"docker without the client role", "client {\n  enabled = false\n}\nserver {\n  enabled = true\n  bootstrap_expect = 1\n}\ndocker {\n  enabled = true\n}", nil,
			`agent.hcl:9: docker.enabled: the Docker volume plugin needs the client role: set client.enabled = true`},
		{"plugin mount_dir relative", "plugin \"ebs\" {\n  mount_dir = \"mnt\"\n}", nil,
			`agent.hcl:2: plugin.ebs.mount_dir: "mnt" must be an absolute path`},
		{"plugin plugin_mount_dir relative", "plugin \"ebs\" {\n  plugin_mount_dir = \"csi\"\n}", nil,
			`agent.hcl:2: plugin.ebs.plugin_mount_dir: "csi" must be an absolute path`},
		{"plugin mount_dir in plugin_dir", "client {\n  plugin_dir = \"/run/csi\"\n}\nplugin \"ebs\" {\n  mount_dir = \"/run/csi/mnt\"\n}", nil,
			`agent.hcl:5: plugin.ebs.mount_dir: "/run/csi/mnt" is inside client.plugin_dir (/run/csi): the watcher would see every mount`},
		{"plugin socket relative", "plugin \"ebs\" {\n  socket = \"csi.sock\"\n}", nil,
			`agent.hcl:2: plugin.ebs.socket: "csi.sock" must be an absolute path`},
		{"plugin socket not clean", "plugin \"ebs\" {\n  socket = \"/run/ebs/../ebs/csi.sock\"\n}", nil,
			`agent.hcl:2: plugin.ebs.socket: "/run/ebs/../ebs/csi.sock" is not a clean path: write "/run/ebs/csi.sock"`},
		{"plugin socket too long", "plugin \"ebs\" {\n  socket = \"/" + strings.Repeat("s", 107) + "\"\n}", nil,
			`agent.hcl:2: plugin.ebs.socket: "/` + strings.Repeat("s", 107) + `" is 108 bytes, over the 107-byte limit of a unix socket address`},
		{"plugin secrets_file relative", "plugin \"ebs\" {\n  secrets_file = \"secrets/ebs.hcl\"\n}", nil,
			`agent.hcl:2: plugin.ebs.secrets_file: "secrets/ebs.hcl" must be an absolute path`},
		{"plugin type", "plugin \"ebs\" {\n  type = \"both\"\n}", nil,
			`agent.hcl:2: plugin.ebs.type: "both" is not a plugin type: use node, controller or monolith`},
		{"plugin health_timeout zero", "plugin \"ebs\" {\n  type = \"node\"\n  health_timeout = \"0s\"\n}", nil,
			`agent.hcl:3: plugin.ebs.health_timeout: must be greater than zero, got 0s`},
		{"plugin required without type", "plugin \"ebs\" {\n  required = true\n}", nil,
			`agent.hcl:2: plugin.ebs.required: a required plugin needs its type (node, controller or monolith): the servers count an expected plugin by its type`},
		{"kubelet_registration_dir relative", "client {\n  kubelet_registration_dir = \"plugins_registry\"\n}", nil,
			`agent.hcl:2: client.kubelet_registration_dir: "plugins_registry" must be an absolute path (/var/lib/kubelet/plugins_registry in a Kubernetes layout)`},
		{"kubelet_endpoint_dirs", "client {\n  kubelet_endpoint_dirs = [\"/run/csi\", \"plugins\", \"/var/lib/kubelet/../kubelet\"]\n}", nil,
			`agent.hcl:2: client.kubelet_endpoint_dirs: element 1: "plugins" must be an absolute path` + "\n" +
				`agent.hcl:2: client.kubelet_endpoint_dirs: element 2: "/var/lib/kubelet/../kubelet" is not a clean path: write "/var/lib/kubelet"`},
		{"port range", "ports {\n  http = 0\n}", nil,
			`agent.hcl:2: ports.http: 0 is not a port number (1-65535)`},
		{"port clash", "ports {\n  rpc = 5000\n  raft = 5000\n}", nil,
			`agent.hcl:3: ports.raft: 5000 is already used by ports.rpc`},
		{"port clash with a flag", "ports {\n  rpc = 5000\n}", []string{"--http-port", "5000"},
			`flag --http-port: ports.http: 5000 is already used by ports.rpc`},
		{"plugin_dir relative", "client {\n  plugin_dir = \"plugins\"\n}", nil,
			`agent.hcl:2: client.plugin_dir: "plugins" must be an absolute path`},
		{"plugin_dir empty", "client {\n  plugin_dir = \"\"\n}", nil,
			`agent.hcl:2: client.plugin_dir: required when the client is enabled`},
		{"probe_timeout above probe_interval", "client {\n  probe_interval = \"2s\"\n  probe_timeout = \"3s\"\n}", nil,
			`agent.hcl:3: client.probe_timeout: 3s must not exceed client.probe_interval (2s)`},
		{"zero probe_interval", "client {\n  probe_interval = \"0s\"\n}", nil,
			`agent.hcl:2: client.probe_interval: must be greater than zero, got 0s`},
		{"negative durations", "client {\n  probe_timeout = \"-1s\"\n  fingerprint_interval = \"0s\"\n  deregister_grace = \"-5m\"\n  rescan_interval = \"0s\"\n  rpc_timeout = \"0s\"\n}\nconsul {\n  sync_interval = \"0s\"\n}", nil,
			`agent.hcl:2: client.probe_timeout: must be greater than zero, got -1s` + "\n" +
				`agent.hcl:3: client.fingerprint_interval: must be greater than zero, got 0s` + "\n" +
				`agent.hcl:4: client.deregister_grace: must be greater than zero, got -5m0s` + "\n" +
				`agent.hcl:5: client.rescan_interval: must be greater than zero, got 0s` + "\n" +
				`agent.hcl:6: client.rpc_timeout: must be greater than zero, got 0s` + "\n" +
				`agent.hcl:9: consul.sync_interval: must be greater than zero, got 0s`},
		{"allow_mount_flags", "client {\n  allow_mount_flags = [\"suid\", \"exec\", \"dev\", \"\"]\n}", nil,
			`agent.hcl:2: client.allow_mount_flags: element 1: "exec" is not one of ["suid" "dev"]` + "\n" +
				`agent.hcl:2: client.allow_mount_flags: element 3: "" is not one of ["suid" "dev"]`},
		{"max_destructive_in_flight", "client {\n  max_destructive_in_flight = 0\n}", nil,
			`agent.hcl:2: client.max_destructive_in_flight: must be at least 1, got 0`},
		{"servers", "client {\n  servers = [\"10.0.0.1\", \":4780\", \"h:99999\", \"ok:1\"]\n}", nil,
			`agent.hcl:2: client.servers: element 0: "10.0.0.1" is not host:port: address 10.0.0.1: missing port in address` + "\n" +
				`agent.hcl:2: client.servers: element 1: ":4780" has no host` + "\n" +
				`agent.hcl:2: client.servers: element 2: "h:99999" has an invalid port (1-65535)`},
		{"retry_join from flag", "", []string{"--retry-join", "nohost"},
			`flag --retry-join: server.retry_join: element 0: "nohost" is not host:port: address nohost: missing port in address`},
		{"bootstrap_expect missing", "server {\n  enabled = true\n}", nil,
			`server.bootstrap_expect: required when the server is enabled: the number of servers in the cluster (1, 3 or 5)`},
		{"bootstrap_expect negative", "server {\n  bootstrap_expect = -1\n}", nil,
			`agent.hcl:2: server.bootstrap_expect: must be at least 1, got -1`},
		{"raft_multiplier", "server {\n  raft_multiplier = 11\n}", nil,
			`agent.hcl:2: server.raft_multiplier: must be between 1 and 10, got 11`},
		{"consul names and tags", "consul {\n  service_name = \" \"\n  plugin_service_name = \"csi-{{ID}}\"\n  tags = [\"a\", \"\"]\n  server_service_name = \"\"\n  check_interval = \"0s\"\n}", nil,
			`agent.hcl:2: consul.service_name: required` + "\n" +
				`agent.hcl:3: consul.plugin_service_name: "csi-{{ID}}" must contain {{id}}` + "\n" +
				`agent.hcl:4: consul.tags: element 1 is empty` + "\n" +
				`agent.hcl:6: consul.check_interval: must be greater than zero, got 0s` + "\n" +
				`agent.hcl:5: consul.server_service_name: required`},
		{"consul discovery_wait above Consul's limit", "consul {\n  discovery_wait = \"11m\"\n}", nil,
			`agent.hcl:2: consul.discovery_wait: must be between 1s and 10m0s (the longest wait Consul serves), got 11m0s`},
		{"consul discovery_wait below 1s", "consul {\n  discovery_wait = \"500ms\"\n}", nil,
			`agent.hcl:2: consul.discovery_wait: must be between 1s and 10m0s (the longest wait Consul serves), got 500ms`},
		{"consul check interval below Consul's minimum", "consul {\n  check_interval = \"500ms\"\n}", nil,
			`agent.hcl:2: consul.check_interval: 500ms is below 1s, the shortest interval Consul runs a check at`},
		{"three servers without retry_join or Consul", "server {\n  enabled = true\n  bootstrap_expect = 3\n}\nconsul {\n  server_auto_join = false\n}", nil,
			`agent.hcl:3: server.bootstrap_expect: 3 servers cannot find each other: set server.retry_join, or let Consul's catalog find them (consul.enabled and consul.server_auto_join)`},
		{"plugin message cap", "client {\n  max_plugin_message_size = 100\n}", nil,
			`agent.hcl:2: client.max_plugin_message_size: must be between 65536 (64 KiB) and 67108864 (64 MiB) bytes, got 100`},
		{"event subscriber caps", "client {\n  max_event_subscribers = 10\n  max_event_subscribers_per_connection = 20\n}", nil,
			`agent.hcl:3: client.max_event_subscribers_per_connection: must be between 1 and client.max_event_subscribers (10), got 20`},
		{"no role", "client {\n  enabled = false\n}", nil,
			`agent.hcl:2: client.enabled: client and server are both disabled: enable at least one role`},
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
