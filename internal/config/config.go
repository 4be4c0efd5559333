package config

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Default values of the agent configuration.
const (
	DefaultDataDir   = "/var/lib/csisupd"
	DefaultPluginDir = DefaultDataDir + "/plugins"
	DefaultBindAddr  = "127.0.0.1"
	DefaultLogLevel  = "info"
	// DefaultRegion is the region of certificates' role names.
	DefaultRegion = "global"

	DefaultRPCPort  = 4780
	DefaultRaftPort = 4781
	DefaultHTTPPort = 4782

	DefaultProbeInterval          = 5 * time.Second
	DefaultProbeTimeout           = 3 * time.Second
	DefaultFingerprintInterval    = 5 * time.Minute
	DefaultDeregisterGrace        = 10 * time.Second
	DefaultRescanInterval         = 30 * time.Second
	DefaultRPCTimeout             = 2 * time.Minute
	DefaultMaxDestructiveInFlight = 1
	// DefaultMaxPluginMessageSize caps a frame or reply a plugin sends on
	// the supervision connection, as grpc-go's default receive limit.
	DefaultMaxPluginMessageSize = 4 << 20
	// DefaultPluginHealthTimeout is how long a required plugin may be
	// absent or unhealthy before plugin-missing is emitted, Nomad's
	// csi_plugin health_timeout default.
	DefaultPluginHealthTimeout = 30 * time.Second
	// DefaultReloadTimeout bounds one reload (SIGHUP): reading the
	// configuration and the files it names, and applying it. A reload
	// that overruns it is abandoned and reported: /v1/health names the
	// "config reload" loop and the systemd watchdog pings stop.
	DefaultReloadTimeout = 30 * time.Second
	// MaxConfigFileSize caps one configuration file.
	MaxConfigFileSize = 1 << 20
	// KubeletRegistrationDir is client.kubelet_registration_dir in a
	// Kubernetes layout; the setting is off (empty) by default.
	KubeletRegistrationDir = "/var/lib/kubelet/plugins_registry"
	// DefaultMaxEventSubscribers caps concurrent event streams per agent,
	// DefaultMaxEventSubscribersPerConn per client connection.
	DefaultMaxEventSubscribers        = 256
	DefaultMaxEventSubscribersPerConn = 32

	DefaultRaftMultiplier = 1
	// DefaultVolumeHealthInterval is how often the leader asks for the
	// volumes' health (server.volume_health_interval).
	DefaultVolumeHealthInterval = time.Minute
	// DefaultClaimGCGrace is how long a node may be down before the
	// servers release its volume claims through the controller alone.
	DefaultClaimGCGrace = 5 * time.Minute
	// DefaultClaimResumeTimeout is how long a claim the current leader
	// took may stay taken but unfinished (its caller is stuck) before the
	// leader's volume watcher finishes it, or releases it. A claim whose
	// leader died or lost its term is resumed by the next leader at once.
	DefaultClaimResumeTimeout = 2 * time.Minute
	// Node heartbeat defaults, Nomad's: the smallest TTL a node is given,
	// the grace added before a missed heartbeat marks it down, the rate
	// of heartbeats the leader scales TTLs to, and the TTL a new leader
	// gives every node before it has heard from it.
	DefaultMinHeartbeatTTL        = 10 * time.Second
	DefaultHeartbeatGrace         = 10 * time.Second
	DefaultMaxHeartbeatsPerSecond = 50.0
	DefaultFailoverHeartbeatTTL   = 5 * time.Minute
	// DefaultServerStabilizationTime is how long a joining server must be
	// healthy before autopilot gives it a vote, Consul's default.
	DefaultServerStabilizationTime = 10 * time.Second

	// DefaultNodeRPCTimeout bounds one call of the node client to a
	// server (registration, heartbeat, plugin update).
	DefaultNodeRPCTimeout = 10 * time.Second
	// DefaultQuietStart is how long after start a "no cluster leader"
	// answer is an expected wait, logged at debug: a new cluster elects
	// its first leader within seconds.
	DefaultQuietStart = 30 * time.Second
	// DefaultDevReadyTimeout bounds how long a dev agent waits for its
	// node and plugins to be registered with its own server before it
	// reports ready anyway (with a warning).
	DefaultDevReadyTimeout = 30 * time.Second
	// DefaultServerDiscoverInterval is how long the node client uses a
	// server list found through discovery before it looks again.
	DefaultServerDiscoverInterval = 30 * time.Second

	DefaultConsulServiceName       = "csisupd"
	DefaultConsulPluginServiceName = "csi-plugin-" + PluginIDPlaceholder
	DefaultConsulSyncInterval      = 30 * time.Second
	DefaultConsulServerServiceName = "csisupd-server"
	DefaultConsulCheckInterval     = 10 * time.Second
	// DefaultConsulCheckTimeout bounds one run of the agent's gRPC check;
	// see ConsulConfig.CheckTimeout.
	DefaultConsulCheckTimeout = 5 * time.Second
	// DefaultConsulCheckTTL is the shortest TTL of the plugins' health
	// checks; see ConsulConfig.CheckTTL.
	DefaultConsulCheckTTL = 10 * time.Minute
	// DefaultConsulDiscoveryWait is how long one blocking query of the
	// servers' catalog service may wait for a change: Consul's own default
	// wait. A change answers at once whatever the wait; the wait only
	// spaces the requests of a quiet catalog (one per agent per 5 minutes,
	// 33 a second for 10,000 agents) and bounds how long a connection that
	// died silently goes unnoticed.
	DefaultConsulDiscoveryWait = 5 * time.Minute
	// MaxConsulDiscoveryWait is the longest wait Consul serves; it cuts a
	// longer one to it.
	MaxConsulDiscoveryWait = 10 * time.Minute
)

// Values of the Consul sync that have no configuration key.
const (
	// DefaultConsulProbation is how long, after the agent starts, services
	// with csisupd's ID prefix that it does not know are kept in Consul,
	// so plugins being restored do not flap.
	DefaultConsulProbation = time.Minute
	// DefaultConsulRequestTimeout bounds one request to Consul.
	DefaultConsulRequestTimeout = 10 * time.Second
	// DefaultConsulDiscoveryMinInterval is the shortest time between the
	// starts of two catalog requests of the server watch, so a Consul
	// whose index keeps moving (or answers index 0) is not asked in a
	// tight loop.
	DefaultConsulDiscoveryMinInterval = time.Second
)

// PluginIDPlaceholder is replaced by the plugin ID in
// ConsulConfig.PluginServiceName.
const PluginIDPlaceholder = "{{id}}"

// Config is the complete, validated configuration of one agent.
type Config struct {
	// Name identifies this node. Default: the host name.
	Name string
	// DataDir holds the agent's persistent state. It is absolute, or empty
	// in dev mode (the agent then creates a temporary directory).
	DataDir string
	// BindAddr is the IP address the agent listens on.
	BindAddr string
	// AdvertiseAddr is the IP address other nodes use to reach this agent.
	AdvertiseAddr string
	// LogLevel is one of trace, debug, info, warn, error.
	LogLevel string
	// RaftLogLevel, when set, is the least level of the lines that raft
	// itself logs (its elections, transport and snapshots), which then do
	// not follow LogLevel below it. It has no key: dev mode sets it to warn
	// when log_level is not configured, so that raft's chatter does not
	// bury the agent's own lines. Empty follows LogLevel.
	RaftLogLevel string
	// LogJSON selects JSON log lines.
	LogJSON bool
	// EnableDebug serves Go's runtime profiles (net/http/pprof) under
	// /debug/pprof/ on ports.http, without authentication, and lets the
	// Agent API's Profile answer while ACLs are off. With ACLs on, Profile
	// needs a token with agent:write whatever this is. Default false, and
	// true in dev mode unless configured; a reload changes it.
	EnableDebug bool
	// Region names the group of servers and agents that trust each other's
	// certificates: it is part of the role names certificates carry
	// (server.<region>.csisupd, client.<region>.csisupd). Default "global".
	Region string

	Ports  Ports
	Client ClientConfig
	Server ServerConfig
	Consul ConsulConfig
	TLS    TLSConfig
	ACL    ACLConfig
	// Telemetry is the telemetry { ... } block.
	Telemetry TelemetryConfig
	// Docker is the docker { ... } block: the Docker and Podman volume
	// plugin.
	Docker DockerConfig
	// Plugins holds the settings of plugin "<id>" { ... } blocks, by
	// plugin id.
	Plugins map[string]PluginConfig

	// Dev is true when the agent runs in dev mode (--dev).
	Dev bool
	// Warnings are problems that do not stop the agent; log them at start.
	Warnings []string
	// Sources lists what the configuration was loaded from, in order:
	// config file paths, then "env NAME" and "flag --name" entries.
	Sources []string

	// origins maps a key such as "client.plugin_dir" to where its value
	// was set ("agent.hcl:7", "env CSISUPD_PLUGIN_DIR", "flag --plugin-dir").
	// Keys left at their default have no entry.
	origins map[string]string
}

// Ports are the TCP ports the agent listens on.
type Ports struct {
	// RPC serves every gRPC API.
	RPC int
	// HTTP serves /v1/health and /metrics.
	HTTP int
	// Raft carries raft traffic between servers.
	Raft int
}

// ClientConfig configures the client role: plugin discovery and supervision.
type ClientConfig struct {
	// Enabled turns the client role on.
	Enabled bool
	// PluginDir is the directory watched for plugin sockets. Empty only in
	// dev mode (the agent then creates a temporary directory). The agent
	// creates it with mode 0750 and refuses to start when it, or a parent,
	// can be written by users it does not trust (see
	// AllowInsecurePluginDir).
	PluginDir string
	// AllowInsecurePluginDir lets the agent start, with a warning, when
	// PluginDir is writable by its group or others, owned by a user other
	// than root and the agent's, or has a parent writable by others
	// without the sticky bit; plugin subdirectories are then not checked
	// either. Socket owners (PluginOwners) and the rule that symlinks are
	// never followed still apply.
	AllowInsecurePluginDir bool
	// PluginOwners are the users, besides root and the agent's own, that
	// may own plugin sockets and plugin subdirectories: user names or
	// numeric uids, as written in the configuration. A socket owned by
	// anyone else is ignored.
	PluginOwners []string
	// AllowMountFlags are the privileged mount flags, of "suid" and "dev",
	// that this node's agent passes to a plugin when a claim or a
	// NodeVolumes.MountVolume asks for them. By default it passes neither:
	// suid lets a set-user-id file on a volume gain root on the host, dev
	// lets a device node on it open a host device. The servers cannot know
	// a node's list, so only the node refuses these two.
	AllowMountFlags []string
	// PluginOwnerUIDs are PluginOwners resolved to uids by Validate (a
	// name through the system's user database, a number as it is). No
	// key sets it.
	PluginOwnerUIDs []uint32
	// ProbeInterval is the time between two health probes of a plugin.
	ProbeInterval time.Duration
	// ProbeTimeout bounds one probe; it never exceeds ProbeInterval.
	ProbeTimeout time.Duration
	// FingerprintInterval is the time between two fingerprints of a plugin
	// that stays connected. A plugin is also fingerprinted whenever its
	// connection is new (it may be a new process), so this only catches a
	// plugin that changes what it reports without restarting.
	FingerprintInterval time.Duration
	// DeregisterGrace is how long a socket may be gone before its plugin is
	// deregistered.
	DeregisterGrace time.Duration
	// RescanInterval is the time between periodic rescans of PluginDir, a
	// backstop for missed file system events.
	RescanInterval time.Duration
	// RPCTimeout is the deadline of ClientCSI calls that arrive without one.
	RPCTimeout time.Duration
	// VolumeHealthInterval is how often the agent asks the plugins with
	// the GET_VOLUME_HEALTH node capability for the health of its cluster
	// mounts and reports what changed to the servers; 0 turns it off.
	VolumeHealthInterval time.Duration
	// MaxDestructiveInFlight limits concurrent destructive controller RPCs
	// per plugin.
	MaxDestructiveInFlight int
	// MaxPluginMessageSize caps, in bytes, a frame or a reply a plugin
	// sends on the supervision connection (probes and fingerprints).
	MaxPluginMessageSize int
	// MaxEventSubscribers caps concurrent event streams (WatchEvents) of
	// the agent; MaxEventSubscribersPerConn caps them per client
	// connection. Beyond either a new stream gets ResourceExhausted.
	MaxEventSubscribers        int
	MaxEventSubscribersPerConn int
	// Servers are the gRPC addresses (host:port) of the servers.
	Servers []string
	// KubeletRegistrationDir, when set, turns on kubelet's plugin
	// registration protocol: drivers packaged for Kubernetes put a
	// <driver>-reg.sock there (their node-driver-registrar sidecar), and
	// the agent asks each for the driver's name and CSI endpoint and
	// supervises that endpoint. KubeletRegistrationDir is the path in a
	// Kubernetes layout. Empty (the default) turns it off.
	KubeletRegistrationDir string
	// KubeletEndpointDirs are the directories a kubelet-registered
	// endpoint may lie in; a registration naming an endpoint elsewhere is
	// refused. Empty means the plugin directory and the parent of
	// KubeletRegistrationDir (see EndpointDirs).
	KubeletEndpointDirs []string
}

// EndpointDirs returns the directories a kubelet-registered endpoint may
// lie in: KubeletEndpointDirs, or by default the plugin directory and the
// parent of the registration directory (/var/lib/kubelet/plugins_registry
// gives /var/lib/kubelet, under which drivers put their sockets). Nil when
// the registration protocol is off.
func (c ClientConfig) EndpointDirs() []string {
	if c.KubeletRegistrationDir == "" {
		return nil
	}
	if len(c.KubeletEndpointDirs) > 0 {
		return slices.Clone(c.KubeletEndpointDirs)
	}
	return []string{c.PluginDir, filepath.Dir(c.KubeletRegistrationDir)}
}

// ServerConfig configures the server role: the raft cluster.
type ServerConfig struct {
	// Enabled turns the server role on.
	Enabled bool
	// ServerKeys are the other keys of the server block; with
	// DefaultServerTuning they make the server's settings
	// (Config.ServerSettings).
	ServerKeys
}

// PluginConfig is one plugin "<id>" { ... } block: the settings of one
// plugin on this node.
type PluginConfig struct {
	// MountDir is the root under which the agent stages and publishes the
	// plugin's volumes. Empty means <data_dir>/volumes/<id>
	// (Config.MountDir).
	MountDir string
	// PluginMountDir is the path at which the plugin sees MountDir, when
	// it runs with another view of the file system (in a container).
	// Empty means the same path.
	PluginMountDir string

	// Socket declares the plugin: it is supervised at this socket path,
	// which may lie outside the plugin directory, with the same identity,
	// trust and health rules as a socket found there. A declared socket
	// wins over a socket of the same id found in the plugin directory or
	// registered through kubelet's registration protocol when they meet,
	// but never takes the id from a plugin in use (healthy, or with
	// volumes on the node) at another socket.
	Socket string
	// Type is the plugin's expected type (node, controller or monolith).
	// A plugin whose fingerprint says otherwise is unhealthy. Empty
	// expects nothing.
	Type string
	// Required makes an absent or unhealthy plugin an alert: after
	// HealthTimeout it emits plugin-missing, and the agent reports it to
	// the servers as expected but not healthy, even before its socket
	// ever existed.
	Required bool
	// HealthTimeout is how long a required plugin may be absent or
	// unhealthy before plugin-missing (DefaultPluginHealthTimeout).
	HealthTimeout time.Duration
	// SecretsFile is the plugin's CSI secrets file (package secrets),
	// merged into every CSI call the agent makes to the plugin and read
	// again on SIGHUP. Empty means none.
	SecretsFile string
}

// Declared reports whether the block states anything about the plugin
// itself (its socket, its type or that it is required) rather than only
// where its volumes are mounted.
func (p PluginConfig) Declared() bool { return p.Socket != "" || p.Type != "" || p.Required }

// SecretsFiles returns the secrets file of each plugin block that names
// one, by plugin id.
func (c *Config) SecretsFiles() map[string]string {
	out := map[string]string{}
	for id, p := range c.Plugins {
		if p.SecretsFile != "" {
			out[id] = p.SecretsFile
		}
	}
	return out
}

// MountDir returns the mount root of plugin id: its plugin block's
// mount_dir, else <data_dir>/volumes/<id>.
func (c *Config) MountDir(id string) string {
	if d := c.Plugins[id].MountDir; d != "" {
		return d
	}
	return filepath.Join(c.DataDir, "volumes", id)
}

// ConsulConfig configures the registration of the agent and its plugins in
// Consul.
type ConsulConfig struct {
	// Enabled turns Consul registration on.
	Enabled bool
	// Address of the Consul agent. Empty means the consul/api default
	// (CONSUL_HTTP_ADDR, else localhost:8500).
	Address string
	// Token is the ACL token. Empty means the consul/api default (the
	// file named by CONSUL_HTTP_TOKEN_FILE, else CONSUL_HTTP_TOKEN). Never
	// printed.
	Token Secret
	// ServiceName is the Consul service of the agent itself.
	ServiceName string
	// PluginServiceName is the service name template of plugins; it
	// contains PluginIDPlaceholder. See ConsulConfig.PluginService.
	PluginServiceName string
	// Tags are added to every service.
	Tags []string
	// EnableTagOverride lets tags changed in Consul's catalog survive
	// periodic re-syncs.
	EnableTagOverride bool
	// DeregisterOnShutdown removes the services when the agent stops.
	DeregisterOnShutdown bool
	// SyncInterval is the time between two anti-entropy syncs.
	SyncInterval time.Duration
	// CheckInterval is how often Consul runs the agent's gRPC health
	// check. A killed agent's services turn critical within this interval
	// plus the check's timeout (ConsulConfig.CheckTimeout).
	CheckInterval time.Duration
	// CheckTLSServerName is the name Consul verifies in the agent's
	// certificate when the gRPC port serves TLS. Empty means the first DNS
	// name of tls.cert_file, else the address Consul dials.
	CheckTLSServerName string
	// ServerServiceName is the Consul service servers register (with the
	// rpc port) and are found by.
	ServerServiceName string
	// ServerAutoJoin lets a server with an empty server.retry_join find the
	// other servers through Consul's catalog.
	ServerAutoJoin bool
	// ClientAutoJoin lets an agent with an empty client.servers find the
	// servers through Consul's catalog.
	ClientAutoJoin bool
	// DiscoveryWait is the wait of the blocking query that watches the
	// servers' catalog service (consul.discovery_wait): one request per
	// wait while nothing changes, an answer at once when something does.
	DiscoveryWait time.Duration
}

// PluginService returns the Consul service name of the plugin with the
// given ID: PluginServiceName with every PluginIDPlaceholder replaced by
// the ID.
func (c ConsulConfig) PluginService(pluginID string) string {
	return strings.ReplaceAll(c.PluginServiceName, PluginIDPlaceholder, pluginID)
}

// CheckTimeout is the timeout of the agent's gRPC check:
// DefaultConsulCheckTimeout, or CheckInterval when that is shorter.
func (c ConsulConfig) CheckTimeout() time.Duration {
	return min(DefaultConsulCheckTimeout, c.CheckInterval)
}

// CheckTTL is the TTL of the plugins' health checks:
// DefaultConsulCheckTTL, or four sync intervals when that is longer, so a
// check never expires between two passes that refresh it.
func (c ConsulConfig) CheckTTL() time.Duration {
	return max(DefaultConsulCheckTTL, 4*c.SyncInterval)
}

// Default returns the default configuration: a client-only agent with
// Consul registration. Name is the host name, or empty when it cannot be
// read.
func Default() Config {
	name, _ := os.Hostname()
	return Config{
		Name:          name,
		DataDir:       DefaultDataDir,
		BindAddr:      DefaultBindAddr,
		AdvertiseAddr: DefaultBindAddr,
		LogLevel:      DefaultLogLevel,
		Region:        DefaultRegion,
		Ports: Ports{
			RPC:  DefaultRPCPort,
			HTTP: DefaultHTTPPort,
			Raft: DefaultRaftPort,
		},
		Client: ClientConfig{
			Enabled:                    true,
			PluginDir:                  DefaultPluginDir,
			ProbeInterval:              DefaultProbeInterval,
			ProbeTimeout:               DefaultProbeTimeout,
			FingerprintInterval:        DefaultFingerprintInterval,
			DeregisterGrace:            DefaultDeregisterGrace,
			RescanInterval:             DefaultRescanInterval,
			RPCTimeout:                 DefaultRPCTimeout,
			VolumeHealthInterval:       DefaultVolumeHealthInterval,
			MaxDestructiveInFlight:     DefaultMaxDestructiveInFlight,
			MaxPluginMessageSize:       DefaultMaxPluginMessageSize,
			MaxEventSubscribers:        DefaultMaxEventSubscribers,
			MaxEventSubscribersPerConn: DefaultMaxEventSubscribersPerConn,
		},
		Server: ServerConfig{ServerKeys: DefaultServerSettings().ServerKeys},
		Consul: ConsulConfig{
			Enabled:              true,
			ServiceName:          DefaultConsulServiceName,
			PluginServiceName:    DefaultConsulPluginServiceName,
			DeregisterOnShutdown: true,
			SyncInterval:         DefaultConsulSyncInterval,
			CheckInterval:        DefaultConsulCheckInterval,
			ServerServiceName:    DefaultConsulServerServiceName,
			ServerAutoJoin:       true,
			ClientAutoJoin:       true,
			DiscoveryWait:        DefaultConsulDiscoveryWait,
		},
		TLS: TLSConfig{
			VerifyIncoming:       true,
			VerifyOutgoing:       true,
			VerifyServerHostname: true,
		},
		Telemetry: TelemetryConfig{PrometheusMetrics: true},
		Docker:    defaultDocker(),
	}
}

// LogLevels are the values log_level takes, from the most verbose.
func LogLevels() []string { return []string{"trace", "debug", "info", "warn", "error"} }

// ValidLogLevel reports whether level is one of LogLevels.
func ValidLogLevel(level string) bool { return slices.Contains(LogLevels(), level) }

// LatencyBuckets are the histogram buckets, in seconds, of the latencies
// csisupd measures (gRPC calls, fingerprints, scans, Consul passes): from
// half a millisecond (a local plugin answering at once) to ten seconds
// (beyond any call timeout worth having). A new slice each call: the
// client library keeps what it is given.
func LatencyBuckets() []float64 {
	return []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}
}

// TelemetryConfig is the telemetry { ... } block.
type TelemetryConfig struct {
	// PrometheusMetrics serves /metrics (default true). Off, the agent
	// registers no collector and /metrics answers 404; the supervision
	// loops still count what they observe, which costs next to nothing.
	// A change takes effect at the next start.
	PrometheusMetrics bool
}

// ServerAutoJoin reports whether a server finds the other servers through
// Consul: Consul registration is on, server_auto_join is set and
// server.retry_join is empty.
func (c *Config) ServerAutoJoin() bool {
	return c.Server.Enabled && len(c.Server.RetryJoin) == 0 && c.serverAutoJoin()
}

func (c *Config) serverAutoJoin() bool { return c.Consul.Enabled && c.Consul.ServerAutoJoin }

// ClientAutoJoin reports whether the client role finds the servers through
// Consul: Consul registration is on, client_auto_join is set, client.servers
// is empty and this agent is not a server itself (a server registers its
// node with itself).
func (c *Config) ClientAutoJoin() bool {
	return c.Client.Enabled && !c.Server.Enabled && len(c.Client.Servers) == 0 &&
		c.Consul.Enabled && c.Consul.ClientAutoJoin
}

// Origin returns where the value of key (for example "client.plugin_dir")
// was set: "FILE:LINE", "env NAME" or "flag --name". It returns "" for a
// value left at its default.
func (c *Config) Origin(key string) string {
	return c.origins[key]
}

// setOrigin records where key was set.
func (c *Config) setOrigin(key, origin string) {
	if c.origins == nil {
		c.origins = make(map[string]string)
	}
	c.origins[key] = origin
}
