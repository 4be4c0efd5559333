package config

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/csisupd/csisupd/internal/config/configtest"
)

// input describes one Load call of a test. Paths are relative to a fresh
// working directory that holds files.
type input struct {
	files map[string]string // relative path -> content; a trailing "/" makes a directory
	paths []string
	env   map[string]string
	args  []string
	addrs []net.Addr
}

// load writes in.files into a new working directory, then runs Load.
func load(t *testing.T, in input) (*Config, error) {
	t.Helper()
	dir := t.TempDir()
	t.Chdir(dir)
	for name, content := range in.files {
		if strings.HasSuffix(name, "/") {
			if err := os.MkdirAll(name, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fs := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	flags := RegisterFlags(fs)
	if err := fs.Parse(in.args); err != nil {
		t.Fatalf("parse flags %v: %v", in.args, err)
	}
	return Load(LoadInput{
		Files: in.paths,
		Env:   func(k string) string { return in.env[k] },
		Flags: flags,
		InterfaceAddrs: func() ([]net.Addr, error) {
			return in.addrs, nil
		},
	})
}

// mustLoad is load that fails the test on error.
func mustLoad(t *testing.T, in input) *Config {
	t.Helper()
	c, err := load(t, in)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	return c
}

func TestDefault(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Skipf("no host name: %v", err)
	}
	want := Config{
		Name:          host,
		DataDir:       "/var/lib/csisupd",
		BindAddr:      "127.0.0.1",
		AdvertiseAddr: "127.0.0.1",
		LogLevel:      "info",
		Ports:         Ports{RPC: 4780, HTTP: 4782, Raft: 4781},
		Client: ClientConfig{
			Enabled:                    true,
			PluginDir:                  "/var/lib/csisupd/plugins",
			ProbeInterval:              5 * time.Second,
			ProbeTimeout:               3 * time.Second,
			FingerprintInterval:        5 * time.Minute,
			DeregisterGrace:            10 * time.Second,
			RescanInterval:             30 * time.Second,
			RPCTimeout:                 2 * time.Minute,
			VolumeHealthInterval:       time.Minute,
			MaxDestructiveInFlight:     1,
			MaxPluginMessageSize:       4 << 20,
			MaxEventSubscribers:        256,
			MaxEventSubscribersPerConn: 32,
		},
		Server: ServerConfig{ServerKeys: ServerKeys{RaftMultiplier: 1, ClaimGCGrace: 5 * time.Minute, ClaimResumeTimeout: 2 * time.Minute, VolumeHealthInterval: time.Minute,
			// Nomad's heartbeat defaults and Consul's stabilization time.
			HeartbeatGrace: 10 * time.Second, MinHeartbeatTTL: 10 * time.Second, MaxHeartbeatsPerSecond: 50,
			FailoverHeartbeatTTL: 5 * time.Minute, ServerStabilizationTime: 10 * time.Second}},
		Consul: ConsulConfig{
			Enabled:              true,
			ServiceName:          "csisupd",
			PluginServiceName:    "csi-plugin-{{id}}",
			DeregisterOnShutdown: true,
			SyncInterval:         30 * time.Second,
			CheckInterval:        10 * time.Second,
			ServerServiceName:    "csisupd-server",
			ServerAutoJoin:       true,
			ClientAutoJoin:       true,
			DiscoveryWait:        5 * time.Minute, // Consul's default wait
		},
		Region:    "global",
		TLS:       TLSConfig{VerifyIncoming: true, VerifyOutgoing: true, VerifyServerHostname: true},
		Telemetry: TelemetryConfig{PrometheusMetrics: true},
		Docker: DockerConfig{Socket: "/run/docker/plugins/csisupd.sock", GroupID: -1, ReconcileInterval: time.Minute,
			Lease: 30 * time.Second},
	}
	if got := Default(); !reflect.DeepEqual(got, want) {
		t.Fatalf("Default() =\n%#v\nwant\n%#v", got, want)
	}

	// Loading nothing gives the defaults, validated.
	got := mustLoad(t, input{})
	if !reflect.DeepEqual(*got, want) {
		t.Fatalf("Load() =\n%#v\nwant\n%#v", *got, want)
	}
}

func TestLoadFiles(t *testing.T) {
	full := `
name           = "node-1"
data_dir       = "/srv/csisupd"
bind_addr      = "10.0.0.5"
advertise_addr = "10.0.0.6"
log_level      = "WARN"
log_json       = true
enable_debug   = true
ports {
  rpc  = 5780
  http = 5782
  raft = 5781
}
client {
  enabled                   = true
  plugin_dir                = "/run/csi"
  probe_interval            = "7s"
  probe_timeout             = "2s"
  fingerprint_interval      = "2m"
  deregister_grace          = "15s"
  rescan_interval           = "1m"
  rpc_timeout               = "90s"
  volume_health_interval    = "30s"
  max_destructive_in_flight = 2
  max_plugin_message_size   = 1048576
  max_event_subscribers     = 100
  max_event_subscribers_per_connection = 10
  servers                   = ["10.0.0.1:4780", "[fd00::1]:4780"]
  allow_insecure_plugin_dir = true
  plugin_owners             = ["root", "65534"]
  allow_mount_flags         = ["suid", "dev"]
  kubelet_registration_dir  = "/var/lib/kubelet/plugins_registry"
  kubelet_endpoint_dirs     = ["/var/lib/kubelet/plugins", "/run/csi"]
}
server {
  enabled          = true
  bootstrap_expect = 3
  retry_join       = ["10.0.0.2:4780"]
  raft_multiplier  = 5
  claim_gc_grace   = "90s"
  claim_resume_timeout = "45s"
  volume_health_interval = "5m"
  heartbeat_grace           = "20s"
  min_heartbeat_ttl         = "15s"
  max_heartbeats_per_second = 12.5
  failover_heartbeat_ttl    = "10m"
  server_stabilization_time = "30s"
}
telemetry {
  prometheus_metrics = false
}
plugin "ebs.csi" {
  mount_dir        = "/srv/volumes/ebs"
  plugin_mount_dir = "/var/lib/kubelet/plugins"
  socket           = "/run/ebs/csi.sock"
  type             = "node"
  required         = true
  health_timeout   = "45s"
  secrets_file     = "/etc/csisupd.d/secrets/ebs.hcl"
}
consul {
  enabled                = false
  address                = "127.0.0.1:8501"
  token                  = "abc"
  service_name           = "supd"
  plugin_service_name    = "plugin-{{id}}-csi"
  tags                   = ["a", "b"]
  enable_tag_override    = true
  deregister_on_shutdown = false
  sync_interval          = "45s"
  check_interval         = "3s"
  check_tls_server_name  = "client.global.csisupd"
  server_service_name    = "supd-server"
  server_auto_join       = false
  client_auto_join       = false
  discovery_wait         = "90s"
}
region = "eu-west-1"
tls {
  verify_incoming        = false
  verify_outgoing        = false
  verify_server_hostname = false
}
acl {
  enabled = false
}
docker {
  enabled            = true
  socket             = "/run/csisupd/docker.sock"
  default_plugin     = "ebs.csi"
  group              = "0"
  engine_socket      = "/run/podman/podman.sock"
  reconcile_interval = "2m"
  lease              = "45s"
}
`
	tests := []struct {
		name  string
		in    input
		check func(t *testing.T, c *Config)
	}{
		{
			name: "every key",
			in:   input{files: map[string]string{"agent.hcl": full}, paths: []string{"agent.hcl"}},
			check: func(t *testing.T, c *Config) {
				want := Config{
					Name: "node-1", DataDir: "/srv/csisupd", BindAddr: "10.0.0.5", AdvertiseAddr: "10.0.0.6",
					LogLevel: "warn", LogJSON: true, EnableDebug: true,
					Ports: Ports{RPC: 5780, HTTP: 5782, Raft: 5781},
					Client: ClientConfig{
						Enabled: true, PluginDir: "/run/csi",
						ProbeInterval: 7 * time.Second, ProbeTimeout: 2 * time.Second,
						FingerprintInterval: 2 * time.Minute, DeregisterGrace: 15 * time.Second,
						RescanInterval: time.Minute, RPCTimeout: 90 * time.Second, VolumeHealthInterval: 30 * time.Second,
						MaxDestructiveInFlight: 2, MaxPluginMessageSize: 1 << 20,
						MaxEventSubscribers: 100, MaxEventSubscribersPerConn: 10, Servers: []string{"10.0.0.1:4780", "[fd00::1]:4780"},
						AllowInsecurePluginDir: true, PluginOwners: []string{"root", "65534"}, PluginOwnerUIDs: []uint32{0, 65534},
						AllowMountFlags: []string{"suid", "dev"}, KubeletRegistrationDir: KubeletRegistrationDir,
						KubeletEndpointDirs: []string{"/var/lib/kubelet/plugins", "/run/csi"},
					},
					Server: ServerConfig{Enabled: true, ServerKeys: ServerKeys{BootstrapExpect: 3, RetryJoin: []string{"10.0.0.2:4780"}, RaftMultiplier: 5, ClaimGCGrace: 90 * time.Second, ClaimResumeTimeout: 45 * time.Second, VolumeHealthInterval: 5 * time.Minute,
						HeartbeatGrace: 20 * time.Second, MinHeartbeatTTL: 15 * time.Second, MaxHeartbeatsPerSecond: 12.5,
						FailoverHeartbeatTTL: 10 * time.Minute, ServerStabilizationTime: 30 * time.Second}},
					Telemetry: TelemetryConfig{PrometheusMetrics: false},
					Docker: DockerConfig{Enabled: true, Socket: "/run/csisupd/docker.sock", DefaultPlugin: "ebs.csi", Group: "0", GroupID: 0,
						EngineSocket: "/run/podman/podman.sock", ReconcileInterval: 2 * time.Minute, Lease: 45 * time.Second},
					Plugins: map[string]PluginConfig{"ebs.csi": {MountDir: "/srv/volumes/ebs", PluginMountDir: "/var/lib/kubelet/plugins",
						Socket: "/run/ebs/csi.sock", Type: "node", Required: true, HealthTimeout: 45 * time.Second, SecretsFile: "/etc/csisupd.d/secrets/ebs.hcl"}},
					Consul: ConsulConfig{
						Enabled: false, Address: "127.0.0.1:8501", Token: "abc", ServiceName: "supd",
						PluginServiceName: "plugin-{{id}}-csi", Tags: []string{"a", "b"},
						EnableTagOverride: true, DeregisterOnShutdown: false, SyncInterval: 45 * time.Second,
						CheckInterval: 3 * time.Second, CheckTLSServerName: "client.global.csisupd",
						ServerServiceName: "supd-server", DiscoveryWait: 90 * time.Second,
					},
					Region:  "eu-west-1",
					Sources: []string{"agent.hcl"},
					Warnings: []string{"enable_debug = true serves /debug/pprof/ without authentication on ports.http at 10.0.0.5: " +
						"whoever reaches that address can profile the agent"},
				}
				got := *c
				got.origins = nil
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("got\n%#v\nwant\n%#v", got, want)
				}
				if o := c.Origin("client.probe_timeout"); o != "agent.hcl:18" {
					t.Errorf("origin of client.probe_timeout = %q, want agent.hcl:18", o)
				}
			},
		},
		{
			name: "later file overrides key by key, blocks merge, lists replace",
			in: input{
				files: map[string]string{
					"a.hcl": `
name = "from-a"
log_level = "debug"
client {
  probe_interval = "10s"
  servers = ["a:1", "b:2"]
}
consul { tags = ["x", "y"] }`,
					"b.hcl": `
name = "from-b"
client {
  probe_timeout = "4s"
  servers = ["c:3"]
}`,
				},
				paths: []string{"a.hcl", "b.hcl"},
			},
			check: func(t *testing.T, c *Config) {
				assertEqual(t, "name", c.Name, "from-b")
				assertEqual(t, "log_level", c.LogLevel, "debug")
				assertEqual(t, "client.probe_interval", c.Client.ProbeInterval, 10*time.Second)
				assertEqual(t, "client.probe_timeout", c.Client.ProbeTimeout, 4*time.Second)
				assertEqual(t, "client.servers", c.Client.Servers, []string{"c:3"})
				assertEqual(t, "consul.tags", c.Consul.Tags, []string{"x", "y"})
				assertEqual(t, "origin of name", c.Origin("name"), "b.hcl:2")
				assertEqual(t, "origin of log_level", c.Origin("log_level"), "a.hcl:3")
				assertEqual(t, "sources", c.Sources, []string{"a.hcl", "b.hcl"})
			},
		},
		{
			name: "directory loads *.hcl in lexical order and skips the rest",
			in: input{
				files: map[string]string{
					"conf.d/20-b.hcl":      `name = "b"` + "\nclient { probe_timeout = \"1s\" }",
					"conf.d/10-a.hcl":      `name = "a"` + "\nclient { probe_interval = \"9s\" }",
					"conf.d/.hidden.hcl":   `this is not hcl {`,
					"conf.d/notes.txt":     `neither is this {`,
					"conf.d/sub.hcl/x.hcl": `name = "sub"`,
				},
				paths: []string{"conf.d"},
			},
			check: func(t *testing.T, c *Config) {
				assertEqual(t, "name", c.Name, "b")
				assertEqual(t, "client.probe_interval", c.Client.ProbeInterval, 9*time.Second)
				assertEqual(t, "client.probe_timeout", c.Client.ProbeTimeout, time.Second)
				assertEqual(t, "sources", c.Sources, []string{"conf.d/10-a.hcl", "conf.d/20-b.hcl"})
			},
		},
		{
			name: "file after directory overrides it",
			in: input{
				files: map[string]string{
					"conf.d/a.hcl": `name = "dir"` + "\nlog_level = \"warn\"",
					"last.hcl":     `name = "last"`,
				},
				paths: []string{"conf.d", "last.hcl"},
			},
			check: func(t *testing.T, c *Config) {
				assertEqual(t, "name", c.Name, "last")
				assertEqual(t, "log_level", c.LogLevel, "warn")
			},
		},
		{
			name: "empty directory warns",
			in:   input{files: map[string]string{"empty/": ""}, paths: []string{"empty"}},
			check: func(t *testing.T, c *Config) {
				assertEqual(t, "warnings", c.Warnings, []string{"config directory empty has no *.hcl files"})
			},
		},
		{
			name: "null leaves the earlier value",
			in: input{
				files: map[string]string{"a.hcl": `name = "a"`, "b.hcl": `name = null`},
				paths: []string{"a.hcl", "b.hcl"},
			},
			check: func(t *testing.T, c *Config) {
				assertEqual(t, "name", c.Name, "a")
				assertEqual(t, "origin of name", c.Origin("name"), "a.hcl:1")
			},
		},
		{
			name: "plugin_dir follows data_dir",
			in:   input{files: map[string]string{"a.hcl": `data_dir = "/srv/x"`}, paths: []string{"a.hcl"}},
			check: func(t *testing.T, c *Config) {
				assertEqual(t, "client.plugin_dir", c.Client.PluginDir, "/srv/x/plugins")
			},
		},
		{
			name: "explicit plugin_dir does not follow data_dir",
			in: input{
				files: map[string]string{"a.hcl": "data_dir = \"/srv/x\"\nclient { plugin_dir = \"/run/csi\" }"},
				paths: []string{"a.hcl"},
			},
			check: func(t *testing.T, c *Config) {
				assertEqual(t, "client.plugin_dir", c.Client.PluginDir, "/run/csi")
			},
		},
		{
			name: "acl tokens block nested in acl, token file wins over env",
			in: input{
				files: map[string]string{"a.hcl": "acl {\n  enabled = false\n  tokens {\n    agent = \"from-file\"\n  }\n}"},
				paths: []string{"a.hcl"},
				env:   map[string]string{EnvAgentToken: "from-env"},
			},
			check: func(t *testing.T, c *Config) {
				assertEqual(t, "acl.tokens.agent", string(c.ACL.AgentToken), "from-file")
				assertEqual(t, "origin", c.Origin("acl.tokens.agent"), "a.hcl:4")
				if strings.Contains(c.String(), "from-file") {
					t.Errorf("rendered config shows the agent token:\n%s", c.String())
				}
			},
		},
		{
			name: "agent token from env",
			in:   input{env: map[string]string{EnvAgentToken: "from-env"}},
			check: func(t *testing.T, c *Config) {
				assertEqual(t, "acl.tokens.agent", string(c.ACL.AgentToken), "from-env")
				assertEqual(t, "origin", c.Origin("acl.tokens.agent"), "env "+EnvAgentToken)
				assertEqual(t, "warnings", c.Warnings, []string{"acl.tokens.agent is set but acl.enabled is false: the token is not used"})
			},
		},
		{
			name: "tls verify_node_name",
			in: input{
				files: map[string]string{"ca.pem": "pem", "cert.pem": "pem", "key.pem": "pem",
					"a.hcl": "tls {\n  ca_file = \"ca.pem\"\n  cert_file = \"cert.pem\"\n  key_file = \"key.pem\"\n  verify_node_name = true\n}"},
				paths: []string{"a.hcl"},
			},
			check: func(t *testing.T, c *Config) {
				assertEqual(t, "tls.verify_node_name", c.TLS.VerifyNodeName, true)
				assertEqual(t, "origin", c.Origin("tls.verify_node_name"), "a.hcl:5")
				if !strings.Contains(c.String(), "  verify_node_name = true\n") {
					t.Errorf("rendered config lacks verify_node_name:\n%s", c.String())
				}
			},
		},
		{
			name: "lenient primitive conversions",
			in: input{
				files: map[string]string{"a.hcl": "ports { rpc = \"6000\" }\nlog_json = \"true\""},
				paths: []string{"a.hcl"},
			},
			check: func(t *testing.T, c *Config) {
				assertEqual(t, "ports.rpc", c.Ports.RPC, 6000)
				assertEqual(t, "log_json", c.LogJSON, true)
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.check(t, mustLoad(t, tt.in))
		})
	}
}

func TestLoadPrecedence(t *testing.T) {
	file := map[string]string{"agent.hcl": `
name = "file"
data_dir = "/file"
log_level = "warn"
ports { rpc = 5000 }
client { servers = ["file:1"] }
`}
	paths := []string{"agent.hcl"}
	tests := []struct {
		name       string
		env        map[string]string
		args       []string
		wantName   string
		wantOrigin string
		wantData   string
		wantLevel  string
		wantPort   int
		wantSrv    []string
		wantSource []string
	}{
		{
			name:     "file over defaults",
			wantName: "file", wantOrigin: "agent.hcl:2", wantData: "/file", wantLevel: "warn", wantPort: 5000,
			wantSrv: []string{"file:1"}, wantSource: []string{"agent.hcl"},
		},
		{
			name:     "env over file",
			env:      map[string]string{EnvName: "env", EnvLogLevel: "error"},
			wantName: "env", wantOrigin: "env CSISUPD_NAME", wantData: "/file", wantLevel: "error", wantPort: 5000,
			wantSrv: []string{"file:1"}, wantSource: []string{"agent.hcl", "env CSISUPD_NAME", "env CSISUPD_LOG_LEVEL"},
		},
		{
			name:     "empty env is ignored",
			env:      map[string]string{EnvName: ""},
			wantName: "file", wantOrigin: "agent.hcl:2", wantData: "/file", wantLevel: "warn", wantPort: 5000,
			wantSrv: []string{"file:1"}, wantSource: []string{"agent.hcl"},
		},
		{
			name:     "flag over env",
			env:      map[string]string{EnvName: "env", EnvDataDir: "/env"},
			args:     []string{"--name", "flag", "--rpc-port=6000", "--servers", "f:1,f:2", "--servers", "f:3"},
			wantName: "flag", wantOrigin: "flag --name", wantData: "/env", wantLevel: "warn", wantPort: 6000,
			wantSrv: []string{"f:1", "f:2", "f:3"},
			wantSource: []string{"agent.hcl", "env CSISUPD_NAME", "env CSISUPD_DATA_DIR",
				"flag --name", "flag --rpc-port", "flag --servers"},
		},
		{
			name:     "flags left unset do not override",
			args:     []string{"--log-json"},
			wantName: "file", wantOrigin: "agent.hcl:2", wantData: "/file", wantLevel: "warn", wantPort: 5000,
			wantSrv: []string{"file:1"}, wantSource: []string{"agent.hcl", "flag --log-json"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustLoad(t, input{files: file, paths: paths, env: tt.env, args: tt.args})
			assertEqual(t, "name", c.Name, tt.wantName)
			assertEqual(t, "origin of name", c.Origin("name"), tt.wantOrigin)
			assertEqual(t, "data_dir", c.DataDir, tt.wantData)
			assertEqual(t, "log_level", c.LogLevel, tt.wantLevel)
			assertEqual(t, "ports.rpc", c.Ports.RPC, tt.wantPort)
			assertEqual(t, "client.servers", c.Client.Servers, tt.wantSrv)
			assertEqual(t, "sources", c.Sources, tt.wantSource)
		})
	}
}

func TestFlags(t *testing.T) {
	c := mustLoad(t, input{
		files: map[string]string{"a.hcl": `name = "a"`, "b.hcl": `name = "b"`},
		paths: []string{"a.hcl"},
		args: []string{
			"--config", "b.hcl",
			"--data-dir", "/d", "--bind-addr", "10.1.1.1", "--log-level", "trace", "--log-json",
			"--plugin-dir", "/p", "--rpc-port", "1", "--http-port", "2", "--raft-port", "3",
			"--server", "--bootstrap-expect", "5", "--retry-join", "s1:1", "--retry-join", "s2:2,s3:3",
		},
	})
	assertEqual(t, "name (--config after Files)", c.Name, "b")
	assertEqual(t, "data_dir", c.DataDir, "/d")
	assertEqual(t, "bind_addr", c.BindAddr, "10.1.1.1")
	assertEqual(t, "advertise_addr", c.AdvertiseAddr, "10.1.1.1")
	assertEqual(t, "log_level", c.LogLevel, "trace")
	assertEqual(t, "log_json", c.LogJSON, true)
	assertEqual(t, "client.plugin_dir", c.Client.PluginDir, "/p")
	assertEqual(t, "ports", c.Ports, Ports{RPC: 1, HTTP: 2, Raft: 3})
	assertEqual(t, "server.enabled", c.Server.Enabled, true)
	assertEqual(t, "server.bootstrap_expect", c.Server.BootstrapExpect, 5)
	assertEqual(t, "server.retry_join", c.Server.RetryJoin, []string{"s1:1", "s2:2", "s3:3"})
	assertEqual(t, "dev", c.Dev, false)

	fs := pflag.NewFlagSet("agent", pflag.ContinueOnError)
	f := RegisterFlags(fs)
	if err := fs.Parse([]string{"--config", "x,y.hcl", "--config", "/etc/z"}); err != nil {
		t.Fatal(err)
	}
	assertEqual(t, "ConfigPaths", f.ConfigPaths(), []string{"x,y.hcl", "/etc/z"})
}

func TestLoadMissingFile(t *testing.T) {
	for _, args := range [][]string{nil, {"--config", "missing.hcl"}} {
		var paths []string
		if args == nil {
			paths = []string{"missing.hcl"}
		}
		_, err := load(t, input{paths: paths, args: args})
		if !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("Load(%v %v) error = %v, want fs.ErrNotExist", paths, args, err)
		}
		if !strings.Contains(err.Error(), "missing.hcl") {
			t.Fatalf("error %q does not name the file", err)
		}
	}
}

// TestLoadRefusesAFIFO: a FIFO given as a config file, or found among a
// directory's *.hcl files, is refused before anything opens it (an open
// would block until a writer came), naming it; the other files load.
func TestLoadRefusesAFIFO(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "b.hcl")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "a.hcl"), []byte(`name = "n1"`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{fifo, dir} {
		_, err := Load(LoadInput{Files: []string{path}, Env: func(string) string { return "" }})
		if err == nil || !strings.Contains(err.Error(), "config file "+fifo+": not a regular file (a FIFO)") {
			t.Errorf("Load(%s) = %v, want the FIFO refused", path, err)
		}
	}
}

// TestLoadBrokenConfigs loads each broken configuration of testdata/invalid
// as the agent would, with no environment or flags, and compares the whole
// error with the case's .want. `csisupd validate` is checked against the
// same cases.
func TestLoadBrokenConfigs(t *testing.T) {
	for _, b := range configtest.Invalid(t, filepath.Join("testdata", "invalid")) {
		t.Run(b.Name, func(t *testing.T) {
			path := b.Lay(t)
			_, err := Load(LoadInput{Files: []string{path}, Env: func(string) string { return "" }})
			if err == nil {
				t.Fatalf("Load succeeded, want error:\n%s", b.Want)
			}
			if err.Error() != b.Want {
				t.Fatalf("error:\n%s\nwant:\n%s", err, b.Want)
			}
		})
	}
}

func TestLoadErrorsFromSeveralFiles(t *testing.T) {
	_, err := load(t, input{
		files: map[string]string{"a.hcl": `bogus = 1`, "b.hcl": `log_json = 3`},
		paths: []string{"a.hcl", "missing.hcl", "b.hcl"},
	})
	if err == nil {
		t.Fatal("Load succeeded")
	}
	lines := strings.Split(err.Error(), "\n")
	want := []string{`a.hcl:1: unsupported argument "bogus"`, "config: stat missing.hcl: no such file or directory",
		`b.hcl:1: log_json: expected a bool, got number 3`}
	assertEqual(t, "error lines", lines, want)
}

func TestDevMode(t *testing.T) {
	tests := []struct {
		name      string
		in        input
		wantData  string
		wantPlug  string
		wantLevel string
		// wantRaft is raft's own level: warn unless log_level is set.
		wantRaft string
		// wantDebug is enable_debug: on unless configured.
		wantDebug bool
		wantWarn  []string
		// wantConsul is whether Consul registration stays on: only when
		// the operator configured a consul key.
		wantConsul bool
	}{
		{
			name:      "defaults",
			in:        input{args: []string{"--dev"}},
			wantData:  "",
			wantPlug:  "",
			wantLevel: "info", wantRaft: "warn", wantDebug: true,
		},
		{
			name: "consul configured",
			in: input{
				files: map[string]string{"c.hcl": "consul {\n  address = \"127.0.0.1:8500\"\n}"},
				paths: []string{"c.hcl"},
				args:  []string{"--dev"},
			},
			wantLevel: "info", wantRaft: "warn", wantDebug: true,
			wantConsul: true,
		},
		{
			name:      "log level set",
			in:        input{args: []string{"--dev"}, env: map[string]string{EnvLogLevel: "debug"}},
			wantLevel: "debug",
			wantDebug: true,
		},
		{
			name: "enable_debug off",
			in: input{
				files: map[string]string{"d.hcl": "enable_debug = false\n"},
				paths: []string{"d.hcl"},
				args:  []string{"--dev"},
			},
			wantLevel: "info", wantRaft: "warn",
		},
		{
			name:      "data dir set",
			in:        input{args: []string{"--dev", "--data-dir", "/srv/dev"}},
			wantData:  "/srv/dev",
			wantPlug:  "/srv/dev/plugins",
			wantLevel: "info", wantRaft: "warn", wantDebug: true,
		},
		{
			name: "explicit roles and bootstrap_expect are overridden",
			in: input{
				files: map[string]string{"a.hcl": "client { enabled = false }\nserver {\n  enabled = false\n  bootstrap_expect = 3\n}"},
				paths: []string{"a.hcl"},
				args:  []string{"--dev"},
			},
			wantLevel: "info", wantRaft: "warn", wantDebug: true,
			wantWarn: []string{
				"dev mode: client.enabled = false (a.hcl:1) ignored, the client is enabled",
				"dev mode: server.enabled = false (a.hcl:3) ignored, the server is enabled",
				"dev mode: server.bootstrap_expect = 3 (a.hcl:4) ignored, using 1",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustLoad(t, tt.in)
			assertEqual(t, "dev", c.Dev, true)
			assertEqual(t, "client.enabled", c.Client.Enabled, true)
			assertEqual(t, "server.enabled", c.Server.Enabled, true)
			assertEqual(t, "server.bootstrap_expect", c.Server.BootstrapExpect, 1)
			assertEqual(t, "data_dir", c.DataDir, tt.wantData)
			assertEqual(t, "client.plugin_dir", c.Client.PluginDir, tt.wantPlug)
			assertEqual(t, "log_level", c.LogLevel, tt.wantLevel)
			assertEqual(t, "raft log level", c.RaftLogLevel, tt.wantRaft)
			assertEqual(t, "enable_debug", c.EnableDebug, tt.wantDebug)
			assertEqual(t, "warnings", c.Warnings, tt.wantWarn)
			assertEqual(t, "consul.enabled", c.Consul.Enabled, tt.wantConsul)
		})
	}
}

func TestAdvertiseAddr(t *testing.T) {
	cidr := func(s string) net.Addr {
		ip, ipn, err := net.ParseCIDR(s)
		if err != nil {
			t.Fatal(err)
		}
		ipn.IP = ip
		return ipn
	}
	tests := []struct {
		name    string
		in      input
		want    string
		wantErr string
	}{
		{
			name: "follows bind_addr",
			in:   input{env: map[string]string{EnvBindAddr: "10.9.9.9"}},
			want: "10.9.9.9",
		},
		{
			name: "first private IPv4 when binding all addresses",
			in: input{
				env:   map[string]string{EnvBindAddr: "0.0.0.0"},
				addrs: []net.Addr{cidr("127.0.0.1/8"), cidr("fd00::5/64"), cidr("8.8.8.8/32"), cidr("192.168.1.7/24"), cidr("10.0.0.3/8")},
			},
			want: "192.168.1.7",
		},
		{
			name: "private IPv6 when there is no private IPv4",
			in: input{
				env:   map[string]string{EnvBindAddr: "::"},
				addrs: []net.Addr{cidr("127.0.0.1/8"), cidr("fd00::5/64")},
			},
			want: "fd00::5",
		},
		{
			name: "explicit advertise_addr wins",
			in: input{
				files: map[string]string{"a.hcl": `advertise_addr = "10.1.1.1"`},
				paths: []string{"a.hcl"},
				env:   map[string]string{EnvBindAddr: "0.0.0.0"},
				addrs: []net.Addr{cidr("10.0.0.3/8")},
			},
			want: "10.1.1.1",
		},
		{
			name: "no private address",
			in: input{
				env:   map[string]string{EnvBindAddr: "0.0.0.0"},
				addrs: []net.Addr{cidr("127.0.0.1/8"), cidr("8.8.8.8/32")},
			},
			wantErr: "advertise_addr: 0.0.0.0 cannot be reached by other nodes: set advertise_addr to an address of this node",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := load(t, tt.in)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			assertEqual(t, "advertise_addr", c.AdvertiseAddr, tt.want)
		})
	}
}

func assertEqual[T any](t *testing.T, what string, got, want T) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s = %#v, want %#v", what, got, want)
	}
}

func TestPluginBlocks(t *testing.T) {
	c := mustLoad(t, input{
		files: map[string]string{
			"a.hcl": "data_dir = \"/var/lib/csisupd\"\nplugin \"ebs\" {\n  mount_dir = \"/mnt/ebs\"\n}\nplugin \"nfs\" {\n  plugin_mount_dir = \"/csi\"\n}\n",
			"b.hcl": "plugin \"ebs\" {\n  plugin_mount_dir = \"/plugin/mnt\"\n}\n",
		},
		paths: []string{"a.hcl", "b.hcl"},
	})
	want := map[string]PluginConfig{
		"ebs": {MountDir: "/mnt/ebs", PluginMountDir: "/plugin/mnt", HealthTimeout: DefaultPluginHealthTimeout},
		"nfs": {PluginMountDir: "/csi", HealthTimeout: DefaultPluginHealthTimeout},
	}
	if !reflect.DeepEqual(c.Plugins, want) {
		t.Errorf("Plugins = %+v, want %+v", c.Plugins, want)
	}
	for id, dir := range map[string]string{"ebs": "/mnt/ebs", "nfs": "/var/lib/csisupd/volumes/nfs", "other": "/var/lib/csisupd/volumes/other"} {
		if got := c.MountDir(id); got != dir {
			t.Errorf("MountDir(%q) = %q, want %q", id, got, dir)
		}
	}
	if got := c.Origin("plugin.ebs.plugin_mount_dir"); got != "b.hcl:2" {
		t.Errorf("origin of plugin.ebs.plugin_mount_dir = %q, want b.hcl:2", got)
	}
	if c.Server.ClaimGCGrace != DefaultClaimGCGrace {
		t.Errorf("server.claim_gc_grace = %s, want the default %s", c.Server.ClaimGCGrace, DefaultClaimGCGrace)
	}
	// The printed form loads back to the same plugin settings.
	again := mustLoad(t, input{files: map[string]string{"c.hcl": c.String()}, paths: []string{"c.hcl"}})
	if !reflect.DeepEqual(again.Plugins, want) {
		t.Errorf("printed config loads back as %+v, want %+v", again.Plugins, want)
	}
}
