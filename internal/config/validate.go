package config

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/csisupd/csisupd/internal/ids"
	"github.com/csisupd/csisupd/internal/safefile"
)

// Validate checks the whole configuration and returns every problem found,
// joined, or nil. Each problem names the key and, when known, where the
// value was set. Validate also adds warnings to c.Warnings.
func (c *Config) Validate() error {
	v := validator{c: c}

	if c.Name == "" {
		v.add("name", "required (the host name could not be read)")
	} else if err := ids.CheckNodeName(c.Name); err != nil {
		v.add("name", "%w", err)
	}
	switch {
	case c.DataDir == "" && !c.Dev:
		v.add("data_dir", "required")
	case c.DataDir != "" && !filepath.IsAbs(c.DataDir):
		v.add("data_dir", "%q must be an absolute path", c.DataDir)
	}
	bindOK := v.ip("bind_addr", c.BindAddr)
	// An advertise_addr copied from a bad bind_addr is reported once, above.
	if bindOK || c.AdvertiseAddr != c.BindAddr {
		if v.ip("advertise_addr", c.AdvertiseAddr) && net.ParseIP(c.AdvertiseAddr).IsUnspecified() {
			v.add("advertise_addr", "%s cannot be reached by other nodes: set advertise_addr to an address of this node", c.AdvertiseAddr)
		}
	}
	if !ValidLogLevel(c.LogLevel) {
		v.add("log_level", "%q is not one of %s", c.LogLevel, strings.Join(LogLevels(), ", "))
	}

	// Ports: in range and distinct.
	ports := []struct {
		key  string
		port int
	}{{"ports.rpc", c.Ports.RPC}, {"ports.http", c.Ports.HTTP}, {"ports.raft", c.Ports.Raft}}
	for i, p := range ports {
		if p.port < 1 || p.port > 65535 {
			v.add(p.key, "%d is not a port number (1-65535)", p.port)
			continue
		}
		for _, q := range ports[:i] {
			if q.port == p.port {
				v.add(p.key, "%d is already used by %s", p.port, q.key)
			}
		}
	}

	// Client.
	cl := c.Client
	if cl.PluginDir != "" && !filepath.IsAbs(cl.PluginDir) {
		v.add("client.plugin_dir", "%q must be an absolute path", cl.PluginDir)
	} else if cl.Enabled {
		v.pluginDir(cl.PluginDir)
	}
	c.Client.PluginOwnerUIDs = v.pluginOwners(cl.PluginOwners)
	v.allowMountFlags(cl.AllowMountFlags)
	v.positive("client.probe_interval", cl.ProbeInterval)
	if v.positive("client.probe_timeout", cl.ProbeTimeout) && cl.ProbeInterval > 0 && cl.ProbeTimeout > cl.ProbeInterval {
		v.add("client.probe_timeout", "%s must not exceed client.probe_interval (%s)", cl.ProbeTimeout, cl.ProbeInterval)
	}
	v.positive("client.fingerprint_interval", cl.FingerprintInterval)
	v.positive("client.deregister_grace", cl.DeregisterGrace)
	v.positive("client.rescan_interval", cl.RescanInterval)
	if cl.KubeletRegistrationDir != "" && !filepath.IsAbs(cl.KubeletRegistrationDir) {
		v.add("client.kubelet_registration_dir", "%q must be an absolute path (%s in a Kubernetes layout)", cl.KubeletRegistrationDir, KubeletRegistrationDir)
	}
	v.endpointDirs(cl.KubeletEndpointDirs)
	v.positive("client.rpc_timeout", cl.RPCTimeout)
	if cl.VolumeHealthInterval < 0 {
		v.add("client.volume_health_interval", "must not be negative (0 turns the agent's health reports off), got %s", cl.VolumeHealthInterval)
	}
	if cl.MaxDestructiveInFlight < 1 {
		v.add("client.max_destructive_in_flight", "must be at least 1, got %d", cl.MaxDestructiveInFlight)
	}
	const minMessage, maxMessage = 64 << 10, 64 << 20
	if cl.MaxPluginMessageSize < minMessage || cl.MaxPluginMessageSize > maxMessage {
		v.add("client.max_plugin_message_size", "must be between %d (64 KiB) and %d (64 MiB) bytes, got %d", minMessage, maxMessage, cl.MaxPluginMessageSize)
	}
	if cl.MaxEventSubscribers < 1 {
		v.add("client.max_event_subscribers", "must be at least 1, got %d", cl.MaxEventSubscribers)
	}
	if cl.MaxEventSubscribersPerConn < 1 || cl.MaxEventSubscribersPerConn > cl.MaxEventSubscribers {
		v.add("client.max_event_subscribers_per_connection", "must be between 1 and client.max_event_subscribers (%d), got %d", cl.MaxEventSubscribers, cl.MaxEventSubscribersPerConn)
	}
	v.hostPorts("client.servers", cl.Servers)
	v.docker()

	// Server.
	sv := c.Server
	switch {
	case sv.BootstrapExpect < 0:
		v.add("server.bootstrap_expect", "must be at least 1, got %d", sv.BootstrapExpect)
	case sv.Enabled && sv.BootstrapExpect == 0:
		v.add("server.bootstrap_expect", "required when the server is enabled: the number of servers in the cluster (1, 3 or 5)")
	case sv.Enabled && sv.BootstrapExpect%2 == 0:
		c.warn(fmt.Sprintf("server.bootstrap_expect = %d is even: %d servers tolerate no more failures than %d; use an odd number",
			sv.BootstrapExpect, sv.BootstrapExpect, sv.BootstrapExpect-1))
	}
	v.hostPorts("server.retry_join", sv.RetryJoin)
	if sv.Enabled && sv.BootstrapExpect > 1 && len(sv.RetryJoin) == 0 && !c.serverAutoJoin() {
		v.add("server.bootstrap_expect", "%d servers cannot find each other: set server.retry_join, or let Consul's catalog find them (consul.enabled and consul.server_auto_join)", sv.BootstrapExpect)
	}
	if sv.RaftMultiplier < 1 || sv.RaftMultiplier > 10 {
		v.add("server.raft_multiplier", "must be between 1 and 10, got %d", sv.RaftMultiplier)
	}
	v.positive("server.claim_gc_grace", sv.ClaimGCGrace)
	v.positive("server.claim_resume_timeout", sv.ClaimResumeTimeout)
	if sv.VolumeHealthInterval < 0 {
		v.add("server.volume_health_interval", "must not be negative (0 turns the health monitor off), got %s", sv.VolumeHealthInterval)
	}
	v.positive("server.heartbeat_grace", sv.HeartbeatGrace)
	minTTL := v.positive("server.min_heartbeat_ttl", sv.MinHeartbeatTTL)
	if !(sv.MaxHeartbeatsPerSecond > 0) {
		v.add("server.max_heartbeats_per_second", "must be greater than zero, got %v", sv.MaxHeartbeatsPerSecond)
	}
	if v.positive("server.failover_heartbeat_ttl", sv.FailoverHeartbeatTTL) && minTTL && sv.FailoverHeartbeatTTL < sv.MinHeartbeatTTL {
		// A new leader would give nodes less time than any later TTL, and
		// mark down in bulk the nodes that did not reach it in time.
		v.add("server.failover_heartbeat_ttl", "%s must be at least server.min_heartbeat_ttl (%s)", sv.FailoverHeartbeatTTL, sv.MinHeartbeatTTL)
	}
	v.positive("server.server_stabilization_time", sv.ServerStabilizationTime)

	// Plugin blocks.
	for _, id := range slices.Sorted(maps.Keys(c.Plugins)) {
		p := c.Plugins[id]
		key := pluginBlock + "." + id
		if p.MountDir != "" && !filepath.IsAbs(p.MountDir) {
			v.add(key+".mount_dir", "%q must be an absolute path", p.MountDir)
		}
		if p.SecretsFile != "" && !filepath.IsAbs(p.SecretsFile) {
			v.add(key+".secrets_file", "%q must be an absolute path", p.SecretsFile)
		}
		if p.PluginMountDir != "" && !filepath.IsAbs(p.PluginMountDir) {
			v.add(key+".plugin_mount_dir", "%q must be an absolute path", p.PluginMountDir)
		}
		if p.MountDir != "" && cl.PluginDir != "" && within(p.MountDir, cl.PluginDir) {
			v.add(key+".mount_dir", "%q is inside client.plugin_dir (%s): the watcher would see every mount", p.MountDir, cl.PluginDir)
		}
		v.declaration(key, p)
	}

	// Consul.
	cs := c.Consul
	if strings.TrimSpace(cs.ServiceName) == "" {
		v.add("consul.service_name", "required")
	}
	if !strings.Contains(cs.PluginServiceName, PluginIDPlaceholder) {
		v.add("consul.plugin_service_name", "%q must contain %s", cs.PluginServiceName, PluginIDPlaceholder)
	}
	for i, tag := range cs.Tags {
		if strings.TrimSpace(tag) == "" {
			v.add("consul.tags", "element %d is empty", i)
		}
	}
	v.positive("consul.sync_interval", cs.SyncInterval)
	if v.positive("consul.check_interval", cs.CheckInterval) && cs.CheckInterval < time.Second {
		v.add("consul.check_interval", "%s is below 1s, the shortest interval Consul runs a check at", cs.CheckInterval)
	}
	if strings.TrimSpace(cs.ServerServiceName) == "" {
		v.add("consul.server_service_name", "required")
	}
	if cs.DiscoveryWait < time.Second || cs.DiscoveryWait > MaxConsulDiscoveryWait {
		v.add("consul.discovery_wait", "must be between 1s and %s (the longest wait Consul serves), got %s", MaxConsulDiscoveryWait, cs.DiscoveryWait)
	}

	// TLS.
	t := c.TLS
	switch {
	case t.CertFile != "" && t.KeyFile == "":
		v.add("tls.cert_file", "is set but tls.key_file is not: set both or neither")
	case t.KeyFile != "" && t.CertFile == "":
		v.add("tls.key_file", "is set but tls.cert_file is not: set both or neither")
	}
	v.file("tls.ca_file", t.CAFile)
	v.file("tls.cert_file", t.CertFile)
	v.file("tls.key_file", t.KeyFile)
	if t.Enabled() && t.CAFile == "" {
		v.add("tls.ca_file", "is required with tls.cert_file: peers are verified against it, and roles come from the certificates it signed")
	}
	if t.VerifyNodeName && (!t.Enabled() || !t.VerifyIncoming) {
		v.add("tls.verify_node_name", "needs TLS with tls.verify_incoming = true: a node's name is read from the client certificate every caller must present")
	}
	if !validRegion(c.Region) {
		v.add("region", "%q is not a region name: use 1 to 63 lower-case letters, digits and dashes, starting with a letter or digit", c.Region)
	}

	// ACL.
	if c.ACL.Enabled && !t.Enabled() {
		v.add("acl.enabled", "needs TLS (tls.ca_file, tls.cert_file, tls.key_file): servers and agents prove their role by certificate, and tokens must not cross the network in plain text")
	}
	if c.ACL.AgentToken != "" && !c.ACL.Enabled {
		c.warn("acl.tokens.agent is set but acl.enabled is false: the token is not used")
	}

	// enable_debug.
	if ip := net.ParseIP(c.BindAddr); c.EnableDebug && ip != nil && !ip.IsLoopback() {
		c.warn(fmt.Sprintf("enable_debug = true serves /debug/pprof/ without authentication on ports.http at %s: "+
			"whoever reaches that address can profile the agent", c.BindAddr))
	}

	if !cl.Enabled && !sv.Enabled {
		v.add("client.enabled", "client and server are both disabled: enable at least one role")
	}

	return errors.Join(v.errs...)
}

// validator collects the problems found by Validate.
type validator struct {
	c    *Config
	errs []error
}

// add records a problem with key, prefixed with where key was set.
func (v *validator) add(key, format string, args ...any) {
	prefix := key
	if o := v.c.Origin(key); o != "" {
		prefix = o + ": " + key
	}
	v.errs = append(v.errs, fmt.Errorf(prefix+": "+format, args...))
}

// allowableMountFlags are the values client.allow_mount_flags accepts: the
// privileged mount flags a node's operator may allow.
var allowableMountFlags = []string{"suid", "dev"}

// allowMountFlags checks client.allow_mount_flags: each value one of
// allowableMountFlags.
func (v *validator) allowMountFlags(flags []string) {
	for i, f := range flags {
		if !slices.Contains(allowableMountFlags, f) {
			v.add("client.allow_mount_flags", "element %d: %q is not one of %q", i, f, allowableMountFlags)
		}
	}
}

// positive checks that d is greater than zero.
func (v *validator) positive(key string, d time.Duration) bool {
	if d <= 0 {
		v.add(key, "must be greater than zero, got %s", d)
		return false
	}
	return true
}

// ip checks that s is an IP address.
func (v *validator) ip(key, s string) bool {
	if net.ParseIP(s) == nil {
		v.add(key, "%q is not an IP address", s)
		return false
	}
	return true
}

// hostPorts checks that every address is host:port.
func (v *validator) hostPorts(key string, addrs []string) {
	for i, a := range addrs {
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			v.add(key, "element %d: %q is not host:port: %w", i, a, err)
			continue
		}
		if host == "" {
			v.add(key, "element %d: %q has no host", i, a)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			v.add(key, "element %d: %q has an invalid port (1-65535)", i, a)
		}
	}
}

// endpointDirs checks client.kubelet_endpoint_dirs: each an absolute, clean
// path.
func (v *validator) endpointDirs(dirs []string) {
	const key = "client.kubelet_endpoint_dirs"
	for i, d := range dirs {
		switch {
		case !filepath.IsAbs(d):
			v.add(key, "element %d: %q must be an absolute path", i, d)
		case filepath.Clean(d) != d:
			v.add(key, "element %d: %q is not a clean path: write %q", i, d, filepath.Clean(d))
		}
	}
}

// maxSocketPath is the longest path a unix socket address holds: sun_path
// is 108 bytes on Linux, the last one a NUL.
const maxSocketPath = 107

// declaration checks what a plugin block declares about the plugin itself
// (socket, type, required, health_timeout).
func (v *validator) declaration(key string, p PluginConfig) {
	switch {
	case p.Socket == "":
	case !filepath.IsAbs(p.Socket):
		v.add(key+".socket", "%q must be an absolute path", p.Socket)
	case filepath.Clean(p.Socket) != p.Socket:
		v.add(key+".socket", "%q is not a clean path: write %q", p.Socket, filepath.Clean(p.Socket))
	case len(p.Socket) > maxSocketPath:
		v.add(key+".socket", "%q is %d bytes, over the %d-byte limit of a unix socket address", p.Socket, len(p.Socket), maxSocketPath)
	}
	switch p.Type {
	case "", "node", "controller", "monolith":
	default:
		v.add(key+".type", "%q is not a plugin type: use node, controller or monolith", p.Type)
	}
	v.positive(key+".health_timeout", p.HealthTimeout)
	if p.Required && p.Type == "" {
		v.add(key+".required", "a required plugin needs its type (node, controller or monolith): the servers count an expected plugin by its type")
	}
}

// pluginDir checks the plugin directory of an enabled client: required
// outside dev mode, and a directory if it exists.
func (v *validator) pluginDir(dir string) {
	const key = "client.plugin_dir"
	if dir == "" {
		if !v.c.Dev {
			v.add(key, "required when the client is enabled")
		}
		return
	}
	info, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// The agent creates it.
	case err != nil:
		v.add(key, "%w", err)
	case info.Mode().IsRegular():
		v.add(key, "%q is a file, not a directory", dir)
	case !info.IsDir():
		v.add(key, "%q is not a directory", dir)
	}
}

// file checks that path, when set, is an existing regular file.
func (v *validator) file(key, path string) {
	if path == "" {
		return
	}
	info, err := os.Stat(path)
	switch {
	case err != nil:
		v.add(key, "%w", err)
	case !info.Mode().IsRegular():
		v.add(key, "%q is not a regular file (%s)", path, safefile.Describe(info.Mode()))
	}
}

// validRegion reports whether r can be a label of a certificate's DNS
// name: 1 to 63 of a-z, 0-9 and '-', not starting with '-'.
func validRegion(r string) bool {
	if r == "" || len(r) > 63 || r[0] == '-' {
		return false
	}
	for _, ch := range r {
		if (ch < 'a' || ch > 'z') && (ch < '0' || ch > '9') && ch != '-' {
			return false
		}
	}
	return true
}

// within reports whether path is dir or below it, comparing cleaned paths.
func within(path, dir string) bool {
	rel, err := filepath.Rel(filepath.Clean(dir), filepath.Clean(path))
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}
