package config

import (
	"github.com/spf13/pflag"
)

// Flags holds the agent's command line flags. Create it with RegisterFlags
// and pass it to Load after the flag set is parsed; only flags the user set
// override the configuration.
type Flags struct {
	fs *pflag.FlagSet

	configs         []string
	name            string
	dataDir         string
	bindAddr        string
	logLevel        string
	logJSON         bool
	pluginDir       string
	rpcPort         int
	httpPort        int
	raftPort        int
	dev             bool
	server          bool
	bootstrapExpect int
	retryJoin       []string
	servers         []string
}

// RegisterFlags defines the agent flags on fs.
func RegisterFlags(fs *pflag.FlagSet) *Flags {
	f := &Flags{fs: fs}
	fs.StringArrayVar(&f.configs, "config", nil, "config file or directory of *.hcl files; repeatable, later ones override earlier ones")
	fs.StringVar(&f.name, "name", "", "node name (default: the host name)")
	fs.StringVar(&f.dataDir, "data-dir", DefaultDataDir, "directory of persistent state")
	fs.StringVar(&f.bindAddr, "bind-addr", DefaultBindAddr, "IP address to listen on")
	fs.StringVar(&f.logLevel, "log-level", DefaultLogLevel, "log level: trace, debug, info, warn or error")
	fs.BoolVar(&f.logJSON, "log-json", false, "write logs as JSON")
	fs.StringVar(&f.pluginDir, "plugin-dir", DefaultPluginDir, "directory watched for CSI plugin sockets")
	fs.IntVar(&f.rpcPort, "rpc-port", DefaultRPCPort, "gRPC port")
	fs.IntVar(&f.httpPort, "http-port", DefaultHTTPPort, "HTTP port for /v1/health and /metrics")
	fs.IntVar(&f.raftPort, "raft-port", DefaultRaftPort, "raft port")
	fs.BoolVar(&f.dev, "dev", false, "dev mode: client and server in one process, bootstrap_expect = 1, temporary directories")
	fs.BoolVar(&f.server, "server", false, "enable the server role")
	fs.IntVar(&f.bootstrapExpect, "bootstrap-expect", 0, "number of servers that form the cluster")
	fs.StringSliceVar(&f.retryJoin, "retry-join", nil, "address (host:port) of a server to join; repeatable")
	fs.StringSliceVar(&f.servers, "servers", nil, "address (host:port) of a server for the client role; repeatable")
	return f
}

// ConfigPaths returns the --config paths, in the order given.
func (f *Flags) ConfigPaths() []string {
	return append([]string(nil), f.configs...)
}

// apply copies the flags the user set into c and records them as origins
// and sources.
func (f *Flags) apply(c *Config) {
	set := func(flag, key string, assign func()) {
		if !f.fs.Changed(flag) {
			return
		}
		assign()
		if key != "" {
			c.setOrigin(key, "flag --"+flag)
		}
		c.Sources = append(c.Sources, "flag --"+flag)
	}
	set("name", "name", func() { c.Name = f.name })
	set("data-dir", "data_dir", func() { c.DataDir = f.dataDir })
	set("bind-addr", "bind_addr", func() { c.BindAddr = f.bindAddr })
	set("log-level", "log_level", func() { c.LogLevel = f.logLevel })
	set("log-json", "log_json", func() { c.LogJSON = f.logJSON })
	set("plugin-dir", "client.plugin_dir", func() { c.Client.PluginDir = f.pluginDir })
	set("rpc-port", "ports.rpc", func() { c.Ports.RPC = f.rpcPort })
	set("http-port", "ports.http", func() { c.Ports.HTTP = f.httpPort })
	set("raft-port", "ports.raft", func() { c.Ports.Raft = f.raftPort })
	set("dev", "", func() { c.Dev = f.dev })
	set("server", "server.enabled", func() { c.Server.Enabled = f.server })
	set("bootstrap-expect", "server.bootstrap_expect", func() { c.Server.BootstrapExpect = f.bootstrapExpect })
	set("retry-join", "server.retry_join", func() { c.Server.RetryJoin = append([]string(nil), f.retryJoin...) })
	set("servers", "client.servers", func() { c.Client.Servers = append([]string(nil), f.servers...) })
}
