package config

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// String renders the configuration in HCL syntax with the Consul token
// redacted. Dev mode shows as a comment; warnings and sources are left out.
func (c Config) String() string {
	var b strings.Builder
	if c.Dev {
		b.WriteString("# dev mode\n")
	}
	w := func(indent, key string, v any) {
		fmt.Fprintf(&b, "%s%s = %s\n", indent, key, hclValue(v))
	}
	w("", "name", c.Name)
	w("", "data_dir", c.DataDir)
	w("", "bind_addr", c.BindAddr)
	w("", "advertise_addr", c.AdvertiseAddr)
	w("", "log_level", c.LogLevel)
	w("", "log_json", c.LogJSON)
	w("", "enable_debug", c.EnableDebug)
	w("", "region", c.Region)
	const in = "  "
	b.WriteString("ports {\n")
	w(in, "rpc", c.Ports.RPC)
	w(in, "http", c.Ports.HTTP)
	w(in, "raft", c.Ports.Raft)
	b.WriteString("}\nclient {\n")
	w(in, "enabled", c.Client.Enabled)
	w(in, "plugin_dir", c.Client.PluginDir)
	w(in, "allow_insecure_plugin_dir", c.Client.AllowInsecurePluginDir)
	w(in, "plugin_owners", c.Client.PluginOwners)
	w(in, "allow_mount_flags", c.Client.AllowMountFlags)
	w(in, "probe_interval", c.Client.ProbeInterval)
	w(in, "probe_timeout", c.Client.ProbeTimeout)
	w(in, "fingerprint_interval", c.Client.FingerprintInterval)
	w(in, "deregister_grace", c.Client.DeregisterGrace)
	w(in, "rescan_interval", c.Client.RescanInterval)
	w(in, "kubelet_registration_dir", c.Client.KubeletRegistrationDir)
	w(in, "kubelet_endpoint_dirs", c.Client.KubeletEndpointDirs)
	w(in, "rpc_timeout", c.Client.RPCTimeout)
	w(in, "volume_health_interval", c.Client.VolumeHealthInterval)
	w(in, "max_destructive_in_flight", c.Client.MaxDestructiveInFlight)
	w(in, "max_plugin_message_size", c.Client.MaxPluginMessageSize)
	w(in, "max_event_subscribers", c.Client.MaxEventSubscribers)
	w(in, "max_event_subscribers_per_connection", c.Client.MaxEventSubscribersPerConn)
	w(in, "servers", c.Client.Servers)
	b.WriteString("}\nserver {\n")
	w(in, "enabled", c.Server.Enabled)
	w(in, "bootstrap_expect", c.Server.BootstrapExpect)
	w(in, "retry_join", c.Server.RetryJoin)
	w(in, "raft_multiplier", c.Server.RaftMultiplier)
	w(in, "claim_gc_grace", c.Server.ClaimGCGrace)
	w(in, "claim_resume_timeout", c.Server.ClaimResumeTimeout)
	w(in, "volume_health_interval", c.Server.VolumeHealthInterval)
	w(in, "heartbeat_grace", c.Server.HeartbeatGrace)
	w(in, "min_heartbeat_ttl", c.Server.MinHeartbeatTTL)
	w(in, "max_heartbeats_per_second", c.Server.MaxHeartbeatsPerSecond)
	w(in, "failover_heartbeat_ttl", c.Server.FailoverHeartbeatTTL)
	w(in, "server_stabilization_time", c.Server.ServerStabilizationTime)
	b.WriteString("}\nconsul {\n")
	w(in, "enabled", c.Consul.Enabled)
	w(in, "address", c.Consul.Address)
	w(in, "token", c.Consul.Token.String())
	w(in, "service_name", c.Consul.ServiceName)
	w(in, "plugin_service_name", c.Consul.PluginServiceName)
	w(in, "tags", c.Consul.Tags)
	w(in, "enable_tag_override", c.Consul.EnableTagOverride)
	w(in, "deregister_on_shutdown", c.Consul.DeregisterOnShutdown)
	w(in, "sync_interval", c.Consul.SyncInterval)
	w(in, "check_interval", c.Consul.CheckInterval)
	w(in, "check_tls_server_name", c.Consul.CheckTLSServerName)
	w(in, "server_service_name", c.Consul.ServerServiceName)
	w(in, "server_auto_join", c.Consul.ServerAutoJoin)
	w(in, "client_auto_join", c.Consul.ClientAutoJoin)
	w(in, "discovery_wait", c.Consul.DiscoveryWait)
	b.WriteString("}\ntls {\n")
	w(in, "ca_file", c.TLS.CAFile)
	w(in, "cert_file", c.TLS.CertFile)
	w(in, "key_file", c.TLS.KeyFile)
	w(in, "verify_incoming", c.TLS.VerifyIncoming)
	w(in, "verify_outgoing", c.TLS.VerifyOutgoing)
	w(in, "verify_server_hostname", c.TLS.VerifyServerHostname)
	w(in, "verify_node_name", c.TLS.VerifyNodeName)
	b.WriteString("}\ntelemetry {\n")
	w(in, "prometheus_metrics", c.Telemetry.PrometheusMetrics)
	b.WriteString("}\ndocker {\n")
	w(in, "enabled", c.Docker.Enabled)
	w(in, "socket", c.Docker.Socket)
	w(in, "default_plugin", c.Docker.DefaultPlugin)
	w(in, "group", c.Docker.Group)
	w(in, "engine_socket", c.Docker.EngineSocket)
	w(in, "reconcile_interval", c.Docker.ReconcileInterval)
	w(in, "lease", c.Docker.Lease)
	b.WriteString("}\nacl {\n")
	w(in, "enabled", c.ACL.Enabled)
	b.WriteString(in + "tokens {\n")
	w(in+in, "agent", c.ACL.AgentToken.String())
	b.WriteString(in + "}\n}\n")
	for _, id := range slices.Sorted(maps.Keys(c.Plugins)) {
		p := c.Plugins[id]
		fmt.Fprintf(&b, "plugin %q {\n", id)
		w(in, "mount_dir", p.MountDir)
		w(in, "plugin_mount_dir", p.PluginMountDir)
		w(in, "socket", p.Socket)
		w(in, "type", p.Type)
		w(in, "required", p.Required)
		w(in, "health_timeout", p.HealthTimeout)
		b.WriteString("}\n")
	}
	return b.String()
}

// GoString implements %#v with the Consul token redacted.
func (c Config) GoString() string {
	// plain has Config's fields but not its methods, so %#v does not recurse
	// into GoString; the token still prints through Secret.GoString.
	type plain Config
	p := plain(c)
	p.origins = nil
	return "config.Config" + strings.TrimPrefix(fmt.Sprintf("%#v", p), "config.plain")
}

// hclValue formats v as an HCL literal.
func hclValue(v any) string {
	switch v := v.(type) {
	case string:
		return strconv.Quote(v)
	case time.Duration:
		return strconv.Quote(v.String())
	case float64:
		// The shortest form that reads back as the same number.
		return strconv.FormatFloat(v, 'g', -1, 64)
	case []string:
		q := make([]string, len(v))
		for i, s := range v {
			q[i] = strconv.Quote(s)
		}
		return "[" + strings.Join(q, ", ") + "]"
	default:
		return fmt.Sprint(v)
	}
}
