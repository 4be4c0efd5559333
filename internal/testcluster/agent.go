package testcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/csisupd/csisupd/internal/agent"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/rpc"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// agentStartTimeout bounds how long an agent may take to become ready.
const agentStartTimeout = 30 * time.Second

// Agent is one client-only agent of the cluster: a real agent.Agent built
// from a config file by config.Load, exactly as `csisupd agent --config`
// builds it, with client.servers listing every server of the cluster.
// Its name, directories, addresses and node id stay the same across
// restarts.
type Agent struct {
	Index int
	// Name is the agent's node name (agent-<index>).
	Name string
	// Dir holds the config file, data dir, plugin dir and plugin state. It
	// is short enough for unix socket paths, and removed by Shutdown.
	Dir        string
	ConfigFile string
	DataDir    string
	PluginDir  string
	RPCAddr    string
	HTTPAddr   string

	c *Cluster

	mu      sync.Mutex
	a       *agent.Agent
	nodeID  string
	cancel  context.CancelFunc
	done    chan struct{}
	plugins []*testplugin.Plugin

	errMu  sync.Mutex
	runErr error
}

// newAgent reserves the agent's ports and directory and writes its config
// file.
func (c *Cluster) newAgent(i int) *Agent {
	c.t.Helper()
	ports := testutil.FreePorts(c.t, 3) // rpc, http, raft (raft is unused by a client)
	dir, err := os.MkdirTemp("", "csi")
	if err != nil {
		c.t.Fatalf("testcluster: agent dir: %v", err)
	}
	a := &Agent{
		Index:      i,
		Name:       fmt.Sprintf("agent-%d", i),
		Dir:        dir,
		ConfigFile: filepath.Join(dir, "agent.hcl"),
		DataDir:    filepath.Join(dir, "data"),
		PluginDir:  filepath.Join(dir, "plugins"),
		c:          c,
	}
	a.RPCAddr = fmt.Sprintf("127.0.0.1:%d", ports[0])
	a.HTTPAddr = fmt.Sprintf("127.0.0.1:%d", ports[1])
	var servers []string
	for _, s := range c.RPCAddrs() {
		servers = append(servers, fmt.Sprintf("%q", s))
	}
	hcl := fmt.Sprintf(`name      = %q
data_dir  = %q
bind_addr = "127.0.0.1"
log_level = %q

ports {
  rpc  = %d
  http = %d
  raft = %d
}

client {
  enabled         = true
  plugin_dir      = %q
  servers         = [%s]
  probe_interval  = "1s"
  probe_timeout   = "1s"
  rescan_interval = "5s"
}

server {
  enabled = false
}

consul {
  enabled = false
}
`, a.Name, a.DataDir, logLevel(c.logger), ports[0], ports[1], ports[2], a.PluginDir, strings.Join(servers, ", "))
	if c.cfg.AgentConfig != nil {
		hcl += c.cfg.AgentConfig(i, dir)
	}
	if err := os.WriteFile(a.ConfigFile, []byte(hcl), 0o600); err != nil {
		os.RemoveAll(dir)
		c.t.Fatalf("testcluster: agent config: %v", err)
	}
	return a
}

// logLevel is the config log_level matching l's level. The agent sets its
// logger's level from the config, and hclog sub-loggers share the level of
// their parent, so the agent must not change it.
func logLevel(l hclog.Logger) string {
	switch l.GetLevel() {
	case hclog.Trace:
		return "trace"
	case hclog.Debug:
		return "debug"
	case hclog.Info:
		return "info"
	case hclog.Warn:
		return "warn"
	default:
		return "error"
	}
}

// Reload loads the agent's configuration file again and applies it, as
// SIGHUP does; it returns the reload's error.
func (a *Agent) Reload() error {
	cfg, err := config.Load(config.LoadInput{Files: []string{a.ConfigFile}, Env: func(string) string { return "" }})
	if err != nil {
		return fmt.Errorf("agent %s: %w", a.Name, err)
	}
	ag := a.Agent()
	if ag == nil {
		return fmt.Errorf("agent %s is not running", a.Name)
	}
	return ag.Reload(cfg)
}

// start loads the config file, creates the agent on the reserved ports and
// runs it until it is ready.
func (a *Agent) start() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.a != nil {
		return fmt.Errorf("agent %s is already running", a.Name)
	}
	cfg, err := config.Load(config.LoadInput{
		Files: []string{a.ConfigFile},
		Env:   func(string) string { return "" }, // no CSISUPD_* from the test's environment
	})
	if err != nil {
		return fmt.Errorf("agent %s: %w", a.Name, err)
	}
	rpcLn, err := listen(a.RPCAddr)
	if err != nil {
		return fmt.Errorf("agent %s: listen rpc %s: %w", a.Name, a.RPCAddr, err)
	}
	httpLn, err := listen(a.HTTPAddr)
	if err != nil {
		rpcLn.Close()
		return fmt.Errorf("agent %s: listen http %s: %w", a.Name, a.HTTPAddr, err)
	}
	ag, err := agent.New(agent.Config{
		Config:       cfg,
		Version:      "testcluster",
		Logger:       a.c.logger.With("agent", a.Name),
		RPCListener:  rpcLn,
		HTTPListener: httpLn,
	})
	if err != nil {
		rpcLn.Close()
		httpLn.Close()
		return fmt.Errorf("agent %s: %w", a.Name, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		err := ag.Run(ctx)
		if err != nil {
			a.c.logger.Error("agent stopped with an error", "agent", a.Name, "error", err)
		}
		a.errMu.Lock()
		a.runErr = err
		a.errMu.Unlock()
	}()
	timer := time.NewTimer(agentStartTimeout)
	defer timer.Stop()
	select {
	case <-ag.Ready():
	case <-done:
		cancel()
		return fmt.Errorf("agent %s stopped before it was ready: %w", a.Name, a.Err())
	case <-timer.C:
		cancel()
		<-done
		return fmt.Errorf("agent %s not ready within %v", a.Name, agentStartTimeout)
	}
	a.a, a.nodeID, a.cancel, a.done = ag, ag.NodeID(), cancel, done
	return nil
}

// stop cancels the agent's run and waits for its graceful stop.
func (a *Agent) stop() {
	a.mu.Lock()
	cancel, done := a.cancel, a.done
	a.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
	a.mu.Lock()
	a.a, a.cancel, a.done = nil, nil, nil
	a.mu.Unlock()
}

// Agent returns the running agent, or nil when it is stopped.
func (a *Agent) Agent() *agent.Agent {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.a
}

// Running reports whether the agent runs.
func (a *Agent) Running() bool { return a.Agent() != nil }

// NodeID is the agent's node id in the cluster, kept in its data dir.
func (a *Agent) NodeID() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.nodeID
}

// Err returns the error the agent's last run stopped with, if any.
func (a *Agent) Err() error {
	a.errMu.Lock()
	defer a.errMu.Unlock()
	return a.runErr
}

// StartPlugin starts a test plugin serving <PluginDir>/<id>/csi.sock, where
// the agent discovers it as plugin id. Zero fields of cfg get: Socket that
// path, StateDir a directory of the agent's, NodeID the agent's name,
// KnownNodeIDs testplugin.AnyNode (so a controller on one node publishes
// to the others), and ForeignVolumes is set unless cfg.NodeLocal is (so a
// node stages what another node's controller created). The plugin is stopped at cleanup,
// after the agents.
func (a *Agent) StartPlugin(id string, cfg testplugin.Config) *testplugin.Plugin {
	t := a.c.t
	t.Helper()
	if cfg.Socket == "" {
		cfg.Socket = filepath.Join(a.PluginDir, id, "csi.sock")
	}
	if cfg.StateDir == "" {
		cfg.StateDir = filepath.Join(a.Dir, "plugin-state", id)
	}
	if cfg.NodeID == "" {
		cfg.NodeID = a.Name
	}
	if cfg.KnownNodeIDs == nil {
		cfg.KnownNodeIDs = []string{testplugin.AnyNode}
	}
	// Each agent's instance has a state directory of its own: its node
	// service must stage volumes the other instances' controllers made,
	// unless it is node-local and serves only its own.
	cfg.ForeignVolumes = !cfg.NodeLocal
	p, err := testplugin.New(cfg)
	if err != nil {
		t.Fatalf("testcluster: plugin %s on %s: %v", id, a.Name, err)
	}
	if err := p.Start(); err != nil {
		t.Fatalf("testcluster: plugin %s on %s: %v", id, a.Name, err)
	}
	a.mu.Lock()
	a.plugins = append(a.plugins, p)
	a.mu.Unlock()
	return p
}

// stopPlugins stops every plugin started with StartPlugin.
func (a *Agent) stopPlugins() {
	a.mu.Lock()
	ps := a.plugins
	a.plugins = nil
	a.mu.Unlock()
	for _, p := range ps {
		p.Stop()
	}
}

// Agents returns every agent, running or not, in index order.
func (c *Cluster) Agents() []*Agent {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Agent(nil), c.agents...)
}

// Agent returns agent i.
func (c *Cluster) Agent(i int) *Agent { return c.Agents()[i] }

// AddAgent starts one more client-only agent and returns it.
func (c *Cluster) AddAgent() *Agent {
	c.t.Helper()
	c.mu.Lock()
	i := len(c.agents)
	c.mu.Unlock()
	a := c.newAgent(i)
	c.mu.Lock()
	c.agents = append(c.agents, a)
	c.mu.Unlock()
	if err := a.start(); err != nil {
		c.t.Fatalf("testcluster: add agent: %v", err)
	}
	return a
}

// StopAgent stops agent i gracefully. Its plugins keep running; its node
// stays registered until the servers mark it down after its heartbeat TTL.
func (c *Cluster) StopAgent(i int) { c.Agent(i).stop() }

// RestartAgent starts a stopped agent again with the same config file,
// directories, addresses and node id.
func (c *Cluster) RestartAgent(i int) {
	c.t.Helper()
	if err := c.Agent(i).start(); err != nil {
		c.t.Fatalf("testcluster: restart agent: %v", err)
	}
}

// AgentServerOptions returns, for Config.ServerOptions, the options an
// agent's gRPC server has that act on every call (rpc.ServerOptions):
// its metrics, each server's in a registry of its own, its limits,
// stream workers and windows, and its authorizer with ACLs and
// TLS off. Benchmarks of the servers use them, so that they measure what
// a real server spends on a call.
func AgentServerOptions(t testing.TB) func(i int) []grpc.ServerOption {
	return func(int) []grpc.ServerOption {
		m, err := rpc.NewGRPCMetrics(prometheus.NewRegistry(), config.LatencyBuckets())
		if err != nil {
			t.Fatal(err)
		}
		auth, err := rpc.NewAuthorizer(rpc.AuthConfig{})
		if err != nil {
			t.Fatal(err)
		}
		return rpc.ServerOptions(m, auth)
	}
}
