package agent

import (
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/nodeclient"
	"github.com/csisupd/csisupd/internal/nodevolumes"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/registry"
	"github.com/csisupd/csisupd/internal/secrets"
)

// This file holds the setup steps of the client role: the plugin
// registry, the node client and the node volumes. Their gRPC services are
// registered by setupServices.

// setupRegistry creates the plugin registry: the directory watcher, the
// plugins' supervisors and the registry itself. Its part runs it and
// changes the probe timing on Reload.
func (a *Agent) setupRegistry(cfg *config.Config) (*registry.Manager, part, error) {
	m, err := registry.NewManager(registry.ManagerConfig{
		PluginDir:           cfg.Client.PluginDir,
		DataDir:             cfg.DataDir,
		ProbeInterval:       cfg.Client.ProbeInterval,
		ProbeTimeout:        cfg.Client.ProbeTimeout,
		FingerprintInterval: cfg.Client.FingerprintInterval,
		DeregisterGrace:     cfg.Client.DeregisterGrace,
		RescanInterval:      cfg.Client.RescanInterval,
		// A supervisor that does not stop within this bound is abandoned,
		// so the registry stops well within the agent's 5 s.
		StopTimeout:            ShutdownTimeout / 2,
		MaxPluginMessageSize:   cfg.Client.MaxPluginMessageSize,
		PluginOwners:           cfg.Client.PluginOwnerUIDs,
		Declarations:           declarations(cfg),
		KubeletRegistrationDir: cfg.Client.KubeletRegistrationDir,
		KubeletEndpointDirs:    cfg.Client.EndpointDirs(),
		KubeletRetry:           a.retry.KubeletRegistration,
		// A plugin with volumes on this node keeps its socket. The node
		// volume manager is made after the registry and before it runs.
		InUse:                  func(id string) bool { return a.volumes != nil && len(a.volumes.List(id, "")) > 0 },
		AllowInsecurePluginDir: cfg.Client.AllowInsecurePluginDir,
		PluginRedial:           a.retry.PluginRedial,
		FingerprintRetry:       a.retry.Fingerprint,
		PluginDialOptions:      a.grpcMetrics.DialOptions(),
		Metrics:                a.registerer(),
		Watchdog:               a.watchdog,
		Logger:                 a.log.Named("registry"),
	})
	if err != nil {
		return nil, part{}, fmt.Errorf("agent: plugin registry: %w", err)
	}
	reload := func(want, applied *config.Config) ([]string, error) {
		c := want.Client
		if err := m.SetTiming(c.ProbeInterval, c.ProbeTimeout, c.FingerprintInterval); err != nil {
			return []string{"client.probe_interval", "client.probe_timeout", "client.fingerprint_interval"},
				fmt.Errorf("reload probe settings: %w", err)
		}
		applied.Client.ProbeInterval, applied.Client.ProbeTimeout = c.ProbeInterval, c.ProbeTimeout
		applied.Client.FingerprintInterval = c.FingerprintInterval
		if err := m.SetDeclarations(declarations(want)); err != nil {
			return []string{"plugin"}, fmt.Errorf("reload declared plugins: %w", err)
		}
		applied.Plugins = applyDeclarations(applied.Plugins, want.Plugins)
		return nil, nil
	}
	return m, part{name: "plugin registry", run: m.Run, reload: reload}, nil
}

// declarations are the plugins cfg declares (plugin blocks that set
// socket, type or required), for the registry.
func declarations(cfg *config.Config) map[string]registry.Declaration {
	out := make(map[string]registry.Declaration)
	for id, p := range cfg.Plugins {
		if p.Declared() {
			out[id] = registry.Declaration{Socket: p.Socket, Type: plugin.Type(p.Type), Required: p.Required, HealthTimeout: p.HealthTimeout}
		}
	}
	return out
}

// applyDeclarations returns the running plugin blocks with the declaration
// keys (socket, type, required, health_timeout) of want applied: those
// change live. The mount keys keep their running values, which only a
// restart changes; a block that only declared is dropped with its
// declaration.
func applyDeclarations(running, want map[string]config.PluginConfig) map[string]config.PluginConfig {
	out := make(map[string]config.PluginConfig, len(want))
	for id, p := range running {
		w, ok := want[id]
		if !ok && p.MountDir == "" && p.PluginMountDir == "" {
			continue
		}
		if !ok {
			w = config.PluginConfig{HealthTimeout: config.DefaultPluginHealthTimeout}
		}
		p.Socket, p.Type, p.Required, p.HealthTimeout = w.Socket, w.Type, w.Required, w.HealthTimeout
		out[id] = p
	}
	for id, w := range want {
		if _, ok := out[id]; !ok {
			out[id] = config.PluginConfig{Socket: w.Socket, Type: w.Type, Required: w.Required, HealthTimeout: w.HealthTimeout}
		}
	}
	return out
}

// setupNodeClient creates the node client, which registers the node and
// its plugins with the servers and heartbeats them, when the client has
// servers to report to (client.servers, itself as a server, or Consul
// discovery); nil otherwise. Its part runs it.
func (a *Agent) setupNodeClient(cfg *config.Config, dial dialing) (*nodeclient.Client, part, error) {
	rpcAddr := a.advertised(cfg.Ports.RPC, a.rpcLn)
	servers := a.nodeServers(cfg, rpcAddr)
	discover := a.discoverServers(cfg.ClientAutoJoin())
	if len(servers) == 0 && discover == nil {
		return nil, part{}, nil
	}
	c, err := nodeclient.New(nodeclient.Config{
		Servers:          servers,
		DiscoverServers:  nodeclient.Discover(discover),
		DiscoverInterval: config.DefaultServerDiscoverInterval,
		Node:             nodeclient.Node{ID: a.nodeID, Name: cfg.Name, Address: rpcAddr, Secret: a.nodeSecret},
		Plugins:          a.manager.Registry().Source(),
		DialOptions:      slices.Concat(dial.servers, agentTokenOption(cfg)),
		RPCTimeout:       config.DefaultNodeRPCTimeout,
		Retry:            a.retry.NodeClient,
		Connect:          a.retry.ServerConnect,
		QuietStart:       config.DefaultQuietStart,
		Watchdog:         a.watchdog,
	}, a.log)
	if err != nil {
		return nil, part{}, fmt.Errorf("agent: node registration: %w", err)
	}
	return c, part{name: "node registration", run: c.Run}, nil
}

// setupLeases creates the leases the agent holds for local workloads
// (the Agent API's HoldLease and DropLease), read from data_dir, when the
// node client exists; nil otherwise. Its part renews them. A graceful
// stop keeps them in data_dir, so that the next start renews them again
// at once; until then they run out on the servers as a killed agent's do.
func (a *Agent) setupLeases(cfg *config.Config) (*nodeclient.Leases, part, error) {
	if a.nodes == nil {
		return nil, part{}, nil
	}
	l, err := nodeclient.NewLeases(nodeclient.LeasesConfig{
		Client:   a.nodes,
		DataDir:  cfg.DataDir,
		Watchdog: a.watchdog,
	}, a.log)
	if err != nil {
		return nil, part{}, fmt.Errorf("agent: held leases: %w", err)
	}
	return l, part{name: "lease renewal", run: l.Run}, nil
}

// setupSecrets reads the plugins' secrets files (plugin "<id>" {
// secrets_file = ... }): a file that cannot be used fails New, naming it.
// Its part reads them again on Reload, where a bad file keeps the
// secrets read before and a removed one drops them.
func (a *Agent) setupSecrets(cfg *config.Config) (*secrets.Store, part, error) {
	store := secrets.NewStore(a.log.Named("secrets"))
	if err := store.Load(cfg.SecretsFiles()); err != nil {
		return nil, part{}, fmt.Errorf("agent: plugin secrets: %w", err)
	}
	reload := func(want, applied *config.Config) ([]string, error) {
		files := want.SecretsFiles()
		err := store.Load(files)
		// The paths are applied even when a file failed: the next reload
		// reads the new path again, and the error names the file.
		applied.Plugins = maps.Clone(applied.Plugins) // prev's map is the running one's
		for id, p := range applied.Plugins {
			p.SecretsFile = files[id]
			applied.Plugins[id] = p
		}
		for id, path := range files {
			if _, ok := applied.Plugins[id]; !ok {
				// A block new since start: only its secrets file is live.
				if applied.Plugins == nil {
					applied.Plugins = map[string]config.PluginConfig{}
				}
				applied.Plugins[id] = config.PluginConfig{SecretsFile: path, HealthTimeout: config.DefaultPluginHealthTimeout}
			}
		}
		if err != nil {
			return nil, fmt.Errorf("reload secrets files: %w", err)
		}
		return nil, nil
	}
	return store, part{name: "plugin secrets", reload: reload}, nil
}

// setupVolumes creates the node volume manager. With servers to report
// to, it removes the cluster mounts whose claims the servers released
// while the node was away. Its part runs it.
func (a *Agent) setupVolumes(cfg *config.Config) (*nodevolumes.Manager, part, error) {
	dirs := make(map[string]nodevolumes.PluginDirs, len(cfg.Plugins))
	for id, p := range cfg.Plugins {
		dirs[id] = nodevolumes.PluginDirs{MountDir: cfg.MountDir(id), PluginMountDir: p.PluginMountDir}
	}
	vc := nodevolumes.Config{
		DataDir:    cfg.DataDir,
		Plugins:    a.manager,
		PluginDirs: dirs,
		NodeName:   cfg.Name,
		RPCTimeout: cfg.Client.RPCTimeout,
		Retry:      a.retry.ClientCSI,
		Events:     a.manager.Registry(),
		Logger:     a.log, // the manager names its logger
		QuietStart: config.DefaultQuietStart,
		Watchdog:   a.watchdog,
		Secrets:    a.secrets,
	}
	if a.nodes != nil {
		vc.Claims = a.nodes.NodeClaims
		vc.HealthReport, vc.HealthInterval = a.nodes.NodeVolumeHealth, cfg.Client.VolumeHealthInterval
	}
	m, err := nodevolumes.New(vc)
	if err != nil {
		return nil, part{}, fmt.Errorf("agent: node volumes: %w", err)
	}
	if reg := a.registerer(); reg != nil {
		err := reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "csisupd_volume_record_syncs_total",
			Help: "fsyncs of the volume mount records' journal and of its directory",
		}, func() float64 { return float64(m.RecordSyncs()) }))
		if err != nil {
			return nil, part{}, fmt.Errorf("agent: node volumes: register metrics: %w", err)
		}
	}
	return m, part{name: "node volumes", run: m.Run, close: func() { _ = m.Close() }}, nil
}

// advertised is the address other nodes reach a listener at: the
// advertise address with the listener's actual port.
func (a *Agent) advertised(port int, ln net.Listener) string {
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok {
		port = tcp.Port
	}
	return net.JoinHostPort(a.cfg.AdvertiseAddr, strconv.Itoa(port))
}

// nodeServers are the servers the client role registers its node with:
// client.servers, or this agent itself when it is a server too.
func (a *Agent) nodeServers(cfg *config.Config, self string) []string {
	if !cfg.Client.Enabled {
		return nil
	}
	if len(cfg.Client.Servers) > 0 {
		return cfg.Client.Servers
	}
	if cfg.Server.Enabled {
		return []string{self}
	}
	return nil
}
