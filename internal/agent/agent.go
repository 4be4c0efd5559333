package agent

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/consulsync"
	"github.com/csisupd/csisupd/internal/dockerplugin"
	"github.com/csisupd/csisupd/internal/nodeclient"
	"github.com/csisupd/csisupd/internal/nodevolumes"
	"github.com/csisupd/csisupd/internal/registry"
	"github.com/csisupd/csisupd/internal/rpc"
	"github.com/csisupd/csisupd/internal/secrets"
	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/tlsutil"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// ShutdownTimeout bounds the graceful part of a stop; the agent must exit
// within 5 s of SIGTERM.
const ShutdownTimeout = 4 * time.Second

// Config is what New needs.
type Config struct {
	// Config is the validated agent configuration. Required.
	Config *config.Config
	// Version is printed by status and registered in Consul.
	Version string
	// Logger is the root logger. Its level follows Config.LogLevel and is
	// changed on Reload. An hclog.InterceptLogger (hclog.NewInterceptLogger)
	// lets the Agent API's Monitor stream the agent's logs at a level of
	// the caller's; with another logger Monitor is refused. Optional: the
	// default is an InterceptLogger on stderr.
	Logger hclog.Logger
	// RPCListener and HTTPListener, when set, replace the listeners New would
	// open from the configured ports (tests pass ":0" listeners).
	RPCListener  net.Listener
	HTTPListener net.Listener
	// ReloadTimeout bounds one reload of RequestReload; zero is
	// config.DefaultReloadTimeout. Tests shorten it.
	ReloadTimeout time.Duration
}

// Agent is one running csisupd daemon.
type Agent struct {
	cfg *config.Config // replaced by Reload; read only under mu
	log hclog.Logger
	// Fixed at New (dev mode picks the directories), safe to read anywhere.
	name, dataDir, pluginDir string
	version                  string
	startedAt                time.Time
	tempDir                  string // dev mode: removed at shutdown
	// retry holds the backoff policies of the components' retry loops:
	// the config package's, which no key changes.
	retry config.Retry

	rpcLn   net.Listener
	httpLn  net.Listener
	grpc    *grpc.Server
	health  *health.Server
	http    *http.Server
	manager *registry.Manager
	consul  *consulsync.Syncer
	secrets *secrets.Store       // the plugins' secrets files, for every CSI call of this node
	volumes *nodevolumes.Manager // stages and publishes volumes on this node
	server  *server.Server       // nil unless the server role is enabled
	nodes   *nodeclient.Client   // nil unless the client has servers to report to
	leases  *nodeclient.Leases   // the leases held for local workloads; nil with nodes
	// localClaims makes the claims of local workloads (the Agent API's
	// ClaimVolume, the Docker plugin); nil with nodes.
	localClaims *nodeclient.LocalClaims
	docker      *dockerplugin.Server // nil unless docker.enabled
	nodeID      string
	// nodeSecret is presented on every call of the Cluster service; never
	// logged or shown.
	nodeSecret string
	ready      chan struct{}
	parts      []part     // what New set up, in order, for Run, Reload and Close
	ran        bool       // Run was called; it releases everything itself
	mu         sync.Mutex // guards cfg on Reload
	stopOnce   sync.Once

	// agentService serves WatchEvents; Reload changes its stream caps.
	agentService *rpc.AgentService
	// tls holds the certificates of every port; nil without TLS. Reload
	// re-reads its files.
	tls *tlsutil.Configurator
	// metrics is the agent's Prometheus registry: every component
	// registers its collectors here, /metrics serves it.
	metrics *prometheus.Registry
	// grpcMetrics measure the gRPC server and the agent's clients.
	grpcMetrics *rpc.GRPCMetrics
	// watchdog tracks the liveness of the agent's loops and pings
	// systemd's watchdog while they all turn.
	watchdog *watchdog.Monitor
	// debug is enable_debug, which Reload changes: /debug/pprof/ and, with
	// ACLs off, the Agent API's Profile answer only while it is set.
	debug atomic.Bool
	// reloads holds the reload RequestReload asks for until the reload
	// loop runs it; reloadTimeout bounds each.
	reloads       chan LoadFunc
	reloadTimeout time.Duration
}

// New validates what it needs, creates directories and opens listeners, but
// starts nothing: when New fails, nothing runs and nothing is left open.
//
// It sets the agent up one step at a time, each building one component
// from the configuration and the components of the steps before it, in
// this order: directories and listeners, the watchdog, TLS and the gRPC
// metrics, the plugin registry, the Consul sync, the server role, the node
// client, the held leases, the local claims and the Docker volume plugin, the plugins' secrets files, the node volumes, the token resolver, the gRPC server and its
// services, the HTTP server, the reload loop (RequestReload). A step returns its component and its
// part (what Run runs of it, what releases it, how Reload changes it); no
// step reads a component that a later one builds.
func New(c Config) (a *Agent, err error) {
	if c.Config == nil {
		return nil, errors.New("agent: Config is required")
	}
	cfg := *c.Config
	log := c.Logger
	if log == nil {
		log = hclog.NewInterceptLogger(&hclog.LoggerOptions{Name: "csisupd"})
	}
	log.SetLevel(hclog.LevelFromString(cfg.LogLevel))

	a = &Agent{cfg: &cfg, log: log, version: c.Version, startedAt: time.Now(), retry: config.DefaultRetry(),
		ready: make(chan struct{}), metrics: prometheus.NewRegistry(),
		reloads: make(chan LoadFunc, 1), reloadTimeout: c.ReloadTimeout}
	if a.reloadTimeout <= 0 {
		a.reloadTimeout = config.DefaultReloadTimeout
	}
	a.debug.Store(cfg.EnableDebug)
	// The parts' closers undo what New opened when it fails. They capture
	// values, not a: a failing return sets the named result a to nil.
	var parts []part
	add := func(p part) { parts = append(parts, p) }
	defer func() {
		if err != nil {
			closeParts(parts)
			return
		}
		a.parts = parts
	}()

	p, err := a.setupDirs()
	add(p) // a dev mode directory goes when New fails, even in setupDirs
	if err != nil {
		return nil, err
	}
	a.name, a.dataDir, a.pluginDir = cfg.Name, cfg.DataDir, cfg.Client.PluginDir
	if a.rpcLn, p, err = listenOn(c.RPCListener, "ports.rpc", cfg.BindAddr, cfg.Ports.RPC); err != nil {
		return nil, err
	}
	add(p)
	// Event streams are counted per connection (rpc.TagConns).
	a.rpcLn = rpc.TagConns(a.rpcLn)
	if a.httpLn, p, err = listenOn(c.HTTPListener, "ports.http", cfg.BindAddr, cfg.Ports.HTTP); err != nil {
		return nil, err
	}
	add(p)
	if a.watchdog, p, err = a.setupWatchdog(); err != nil {
		return nil, err
	}
	add(p)
	if a.tls, p, err = a.setupTLS(&cfg); err != nil {
		return nil, err
	}
	add(p)
	if a.grpcMetrics, err = a.setupGRPCMetrics(&cfg); err != nil {
		return nil, err
	}
	if a.nodeID, err = loadNodeID(cfg.DataDir); err != nil {
		return nil, err
	}
	if a.nodeSecret, err = loadNodeSecret(cfg.DataDir); err != nil {
		return nil, err
	}
	if a.manager, p, err = a.setupRegistry(&cfg); err != nil {
		return nil, err
	}
	add(p)
	if a.consul, p, err = a.setupConsul(&cfg); err != nil {
		return nil, err
	}
	add(p)
	dial := a.dialOptions()
	if a.server, p, err = a.setupServer(&cfg, dial); err != nil {
		return nil, err
	}
	add(p)
	if a.nodes, p, err = a.setupNodeClient(&cfg, dial); err != nil {
		return nil, err
	}
	add(p)
	if a.leases, p, err = a.setupLeases(&cfg); err != nil {
		return nil, err
	}
	add(p)
	if a.localClaims, err = a.setupLocalClaims(); err != nil {
		return nil, err
	}
	if a.docker, p, err = a.setupDocker(&cfg); err != nil {
		return nil, err
	}
	add(p)
	if a.secrets, p, err = a.setupSecrets(&cfg); err != nil {
		return nil, err
	}
	add(p)
	if a.volumes, p, err = a.setupVolumes(&cfg); err != nil {
		return nil, err
	}
	add(p)
	resolver, err := a.setupTokenResolver(&cfg)
	if err != nil {
		return nil, err
	}
	if a.grpc, a.health, err = a.setupGRPC(&cfg, resolver); err != nil {
		return nil, err
	}
	// Run stops the gRPC server; unrun, its stream workers end here.
	add(part{name: "gRPC server", close: a.grpc.Stop})
	if a.agentService, p, err = a.setupServices(&cfg, a.grpc); err != nil {
		return nil, err
	}
	add(p)
	a.http = a.setupHTTP()
	add(part{name: "systemd status", run: func(ctx context.Context) error { a.runSystemdStatus(ctx); return nil }})
	add(part{name: reloadLoopName, run: a.runReloads})

	for _, w := range cfg.Warnings {
		log.Warn("configuration", "warning", w)
	}
	return a, nil
}

// registerer is where components register their collectors: the agent's
// registry, or nil (register nothing) with telemetry.prometheus_metrics
// off.
func (a *Agent) registerer() prometheus.Registerer {
	if !a.cfg.Telemetry.PrometheusMetrics {
		return nil
	}
	return a.metrics
}

// logSinks is log as the Agent service's Monitor needs it, or nil when
// log is no InterceptLogger.
func logSinks(log hclog.Logger) rpc.LogSinks {
	if il, ok := log.(hclog.InterceptLogger); ok {
		return il
	}
	return nil
}

// configString renders the running configuration with its secrets
// redacted, for the Agent service's Config.
func (a *Agent) configString() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cfg.String()
}

// part is what one setup step of New adds to the agent's lifecycle besides
// its component. Every field may be nil.
type part struct {
	// name names the part in Run's errors ("plugin registry: ...").
	name string
	// run runs the part until ctx ends. Run starts the parts in the order
	// New set them up, once the gRPC and HTTP servers serve and the server
	// role has started, and ends them together when it stops.
	run func(ctx context.Context) error
	// close releases what the step opened, for an agent whose Run never
	// starts (New failing, Close). Run releases it in its own way.
	close func()
	// reload applies the live part of a new configuration (Reload).
	reload reloadHook
}

// reloadHook applies what its component changes live of want, the new
// configuration, and copies each value it applied into applied, the
// running one. On failure it returns the error, naming what failed, and
// the keys it left as they run (a prefix such as "consul." names a block).
type reloadHook func(want, applied *config.Config) (failed []string, err error)

// closeParts runs the parts' closers in reverse order.
func closeParts(parts []part) {
	for i := len(parts) - 1; i >= 0; i-- {
		if parts[i].close != nil {
			parts[i].close()
		}
	}
}

// Close releases what New opened (listeners, raft, a dev temp directory)
// for an agent whose Run is never called, for example when the caller
// fails to start something else. After Run it does nothing.
func (a *Agent) Close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ran {
		return
	}
	a.ran = true
	closeParts(a.parts)
}

// RPCAddr is the address the gRPC APIs listen on.
func (a *Agent) RPCAddr() net.Addr { return a.rpcLn.Addr() }

// HTTPAddr is the address of /v1/health and /metrics.
func (a *Agent) HTTPAddr() net.Addr { return a.httpLn.Addr() }

// PluginDir is the watched plugin directory (a temporary one in dev mode).
func (a *Agent) PluginDir() string { return a.pluginDir }

// DataDir is the agent's data directory (a temporary one in dev mode).
func (a *Agent) DataDir() string { return a.dataDir }

// NodeID is the node's stable id: its name in the cluster and, with the
// server role, its raft server id.
func (a *Agent) NodeID() string { return a.nodeID }

// Registry is the node's plugin registry.
func (a *Agent) Registry() *registry.Registry { return a.manager.Registry() }

// VolumeRecordSyncs is the number of fsyncs the node's volume mount
// records made since the agent started (the metric
// csisupd_volume_record_syncs_total).
func (a *Agent) VolumeRecordSyncs() uint64 { return a.volumes.RecordSyncs() }

// Ready is closed once the agent serves and its first directory scan is
// reconciled.
func (a *Agent) Ready() <-chan struct{} { return a.ready }

// clusterSummary is the agent's place in the control cluster, for status.
// a.server and a.nodes are set once in New, before the Agent service that
// calls it is built.
func (a *Agent) clusterSummary() *csisupdv1.ClusterSummary {
	c := &csisupdv1.ClusterSummary{NodeId: a.nodeID, Server: a.server != nil}
	if a.nodes != nil {
		c.Servers = a.nodes.Servers()
		c.NodeRegistered = a.nodes.Registered()
	}
	if a.server == nil {
		return c
	}
	c.Leader = a.server.Leader()
	if conf, err := a.server.Configuration(); err == nil {
		c.RaftPeers = int32(len(conf.Servers))
	}
	for _, n := range a.server.State().Nodes() {
		c.Nodes++
		if n.GetStatus() == "ready" {
			c.NodesReady++
		}
	}
	return c
}
