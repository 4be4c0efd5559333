package config

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/csisupd/csisupd/internal/safefile"
)

// Environment variables read by Load. Empty values are ignored.
const (
	EnvName      = "CSISUPD_NAME"
	EnvDataDir   = "CSISUPD_DATA_DIR"
	EnvBindAddr  = "CSISUPD_BIND_ADDR"
	EnvLogLevel  = "CSISUPD_LOG_LEVEL"
	EnvPluginDir = "CSISUPD_PLUGIN_DIR"
	// EnvAgentToken is the token the agent presents to the servers when
	// acl.tokens.agent is not set.
	EnvAgentToken = "CSISUPD_AGENT_TOKEN"
)

// LoadInput is what Load reads.
type LoadInput struct {
	// Files are config files or directories, loaded in order before the
	// --config paths of Flags.
	Files []string
	// Env looks up an environment variable; nil means os.Getenv.
	Env func(string) string
	// Flags are the parsed agent flags; nil means none.
	Flags *Flags
	// InterfaceAddrs lists this host's addresses; advertise_addr is picked
	// from them when bind_addr is 0.0.0.0 or ::. Nil means
	// net.InterfaceAddrs.
	InterfaceAddrs func() ([]net.Addr, error)
}

// Load builds the agent configuration: defaults, then files, then the
// environment, then flags, then dev mode and derived values. It returns
// the validated Config, or an error listing every problem found.
func Load(in LoadInput) (*Config, error) {
	c := Default()

	paths := append([]string(nil), in.Files...)
	if in.Flags != nil {
		paths = append(paths, in.Flags.configs...)
	}
	if err := c.loadPaths(paths); err != nil {
		return nil, err
	}

	env := in.Env
	if env == nil {
		env = os.Getenv
	}
	c.applyEnv(env)

	if in.Flags != nil {
		in.Flags.apply(&c)
	}

	addrs := in.InterfaceAddrs
	if addrs == nil {
		addrs = net.InterfaceAddrs
	}
	c.finish(addrs)

	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// loadPaths applies every config file in paths, expanding directories. It
// reports the problems of all files together.
func (c *Config) loadPaths(paths []string) error {
	var errs []error
	for _, p := range paths {
		files, err := c.expand(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, f := range files {
			src, err := safefile.Read(context.Background(), f, safefile.Spec{What: "config file", MaxSize: MaxConfigFileSize})
			if err != nil {
				errs = append(errs, fmt.Errorf("config: %w", err))
				continue
			}
			if err := c.decodeFile(f, src); err != nil {
				errs = append(errs, err)
				continue
			}
			c.Sources = append(c.Sources, f)
		}
	}
	return errors.Join(errs...)
}

// expand returns path itself for a file, or the *.hcl files of a directory
// in lexical order, skipping names that start with a dot.
func (c *Config) expand(path string) ([]string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if !info.IsDir() {
		return []string{path}, nil
	}
	entries, err := os.ReadDir(path) // sorted by name
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	var files []string
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || strings.HasPrefix(name, ".") || filepath.Ext(name) != ".hcl" {
			continue
		}
		files = append(files, filepath.Join(path, name))
	}
	if len(files) == 0 {
		c.warn(fmt.Sprintf("config directory %s has no *.hcl files", path))
	}
	return files, nil
}

// applyEnv applies the non-empty environment variables of the documented set.
func (c *Config) applyEnv(env func(string) string) {
	vars := []struct {
		name string
		key  string
		dst  *string
	}{
		{EnvName, "name", &c.Name},
		{EnvDataDir, "data_dir", &c.DataDir},
		{EnvBindAddr, "bind_addr", &c.BindAddr},
		{EnvLogLevel, "log_level", &c.LogLevel},
		{EnvPluginDir, "client.plugin_dir", &c.Client.PluginDir},
	}
	for _, v := range vars {
		val := env(v.name)
		if val == "" {
			continue
		}
		*v.dst = val
		c.setOrigin(v.key, "env "+v.name)
		c.Sources = append(c.Sources, "env "+v.name)
	}
	// The agent token in a file wins over the environment, as consul.token
	// does over CONSUL_HTTP_TOKEN.
	if val := env(EnvAgentToken); val != "" && !c.isSet("acl.tokens.agent") {
		c.ACL.AgentToken = Secret(val)
		c.setOrigin("acl.tokens.agent", "env "+EnvAgentToken)
		c.Sources = append(c.Sources, "env "+EnvAgentToken)
	}
}

// finish applies dev mode and computes derived values.
func (c *Config) finish(interfaceAddrs func() ([]net.Addr, error)) {
	if c.Dev {
		c.applyDev()
	}
	c.LogLevel = strings.ToLower(strings.TrimSpace(c.LogLevel))

	// The plugin directory follows a configured data directory unless it
	// was configured itself.
	if !c.isSet("client.plugin_dir") && c.isSet("data_dir") && filepath.IsAbs(c.DataDir) {
		c.Client.PluginDir = filepath.Join(c.DataDir, "plugins")
	}

	if !c.isSet("advertise_addr") {
		c.AdvertiseAddr = c.BindAddr
		if ip := net.ParseIP(c.BindAddr); ip != nil && ip.IsUnspecified() {
			ip, err := privateIP(interfaceAddrs)
			switch {
			case err != nil:
				c.warn(fmt.Sprintf("advertise_addr: listing interface addresses: %v", err))
			case ip != nil:
				c.AdvertiseAddr = ip.String()
			}
		}
	}
}

// anySet reports whether any key starting with prefix was configured.
func (c *Config) anySet(prefix string) bool {
	for k := range c.origins {
		if strings.HasPrefix(k, prefix) {
			return true
		}
	}
	return false
}

// applyDev turns on both roles with a single-server cluster, logs at
// info (raft at warn) and turns enable_debug on unless they are
// configured, and leaves unset directories empty so the agent creates
// temporary ones.
func (c *Config) applyDev() {
	if c.isSet("client.enabled") && !c.Client.Enabled {
		c.warn(fmt.Sprintf("dev mode: client.enabled = false (%s) ignored, the client is enabled", c.Origin("client.enabled")))
	}
	c.Client.Enabled = true
	if c.isSet("server.enabled") && !c.Server.Enabled {
		c.warn(fmt.Sprintf("dev mode: server.enabled = false (%s) ignored, the server is enabled", c.Origin("server.enabled")))
	}
	c.Server.Enabled = true
	if c.isSet("server.bootstrap_expect") && c.Server.BootstrapExpect != 1 {
		c.warn(fmt.Sprintf("dev mode: server.bootstrap_expect = %d (%s) ignored, using 1",
			c.Server.BootstrapExpect, c.Origin("server.bootstrap_expect")))
	}
	c.Server.BootstrapExpect = 1
	// Info for the agent's own lines, warn for raft's: a newcomer reads
	// what the agent does, not raft's elections. A configured log_level
	// applies to both.
	if !c.isSet("log_level") {
		c.LogLevel = "info"
		c.RaftLogLevel = "warn"
	}
	// `csisupd operator debug` takes profiles of a dev agent: it has no
	// ACLs and listens on loopback unless told otherwise.
	if !c.isSet("enable_debug") {
		c.EnableDebug = true
	}
	// A dev machine rarely runs Consul: register only when asked to.
	if !c.anySet("consul.") {
		c.Consul.Enabled = false
	}
	if !c.isSet("data_dir") {
		c.DataDir = ""
	}
	if !c.isSet("client.plugin_dir") {
		c.Client.PluginDir = ""
	}
}

// privateIP returns the first private IPv4 address, else the first private
// IPv6 address, else nil.
func privateIP(interfaceAddrs func() ([]net.Addr, error)) (net.IP, error) {
	addrs, err := interfaceAddrs()
	if err != nil {
		return nil, err
	}
	var v6 net.IP
	for _, a := range addrs {
		ipn, ok := a.(*net.IPNet)
		if !ok || !ipn.IP.IsPrivate() {
			continue
		}
		if ip4 := ipn.IP.To4(); ip4 != nil {
			return ip4, nil
		}
		if v6 == nil {
			v6 = ipn.IP
		}
	}
	return v6, nil
}

// isSet reports whether key was set by a file, the environment or a flag.
func (c *Config) isSet(key string) bool {
	_, ok := c.origins[key]
	return ok
}

// warn adds msg to c.Warnings unless it is already there.
func (c *Config) warn(msg string) {
	for _, w := range c.Warnings {
		if w == msg {
			return
		}
	}
	c.Warnings = append(c.Warnings, msg)
}
