package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/consulsync"
	"github.com/csisupd/csisupd/internal/nodeclient"
	"github.com/csisupd/csisupd/internal/registry"
	"github.com/csisupd/csisupd/internal/rpc"
	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/tlsutil"
	"github.com/csisupd/csisupd/internal/volumes"
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

	rpcLn    net.Listener
	httpLn   net.Listener
	grpc     *grpc.Server
	health   *health.Server
	http     *http.Server
	manager  *registry.Manager
	consul   *consulsync.Syncer
	volumes  *volumes.Manager   // stages and publishes volumes on this node
	server   *server.Server     // nil unless the server role is enabled
	nodes    *nodeclient.Client // nil unless the client has servers to report to
	nodeID   string
	ready    chan struct{}
	closers  []func()   // release what New opened, for Close
	ran      bool       // Run was called; it releases everything itself
	mu       sync.Mutex // guards cfg on Reload
	stopOnce sync.Once

	// agentService serves WatchEvents; Reload changes its stream caps.
	agentService *rpc.AgentService
	// tls holds the certificates of every port; nil without TLS. Reload
	// re-reads its files.
	tls *tlsutil.Configurator
	// tokens resolves ACL tokens on an agent without the server role.
	tokens *rpc.TokenCache
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
}

// New validates what it needs, creates directories and opens listeners, but
// starts nothing: when New fails, nothing runs and nothing is left open.
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
		ready: make(chan struct{}), metrics: prometheus.NewRegistry()}
	a.debug.Store(cfg.EnableDebug)
	// The closers undo what New opened when it fails. They capture the
	// values, not a: a failing return sets the named result a to nil.
	var closers []func()
	defer func() {
		if err != nil {
			release(closers)
			return
		}
		a.closers = closers
	}()

	err = a.prepareDirs()
	// A dev mode directory goes when New fails, even in prepareDirs.
	if tempDir := a.tempDir; tempDir != "" {
		closers = append(closers, func() { _ = os.RemoveAll(tempDir) })
	}
	if err != nil {
		return nil, err
	}
	a.name, a.dataDir, a.pluginDir = cfg.Name, cfg.DataDir, cfg.Client.PluginDir

	a.rpcLn = c.RPCListener
	if a.rpcLn == nil {
		if a.rpcLn, err = listen("ports.rpc", cfg.BindAddr, cfg.Ports.RPC); err != nil {
			return nil, err
		}
	}
	rpcLn := a.rpcLn
	closers = append(closers, func() { _ = rpcLn.Close() })
	a.httpLn = c.HTTPListener
	if a.httpLn == nil {
		if a.httpLn, err = listen("ports.http", cfg.BindAddr, cfg.Ports.HTTP); err != nil {
			return nil, err
		}
	}
	httpLn := a.httpLn
	closers = append(closers, func() { _ = httpLn.Close() })

	if a.watchdog, err = a.newWatchdog(); err != nil {
		return nil, err
	}
	if cfg.Telemetry.PrometheusMetrics {
		if a.grpcMetrics, err = rpc.NewGRPCMetrics(a.metrics, config.LatencyBuckets()); err != nil {
			return nil, fmt.Errorf("agent: %w", err)
		}
	}
	// Metrics first, so that refused calls are counted with their code.
	opts := append(a.grpcMetrics.ServerOptions(), serverOptions()...)
	if cfg.TLS.Enabled() {
		if a.tls, err = tlsutil.New(tlsConfig(&cfg), log.Named("tls")); err != nil {
			return nil, fmt.Errorf("agent: %w", err)
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(a.tls.IncomingConfig())))
	}
	auth, err := rpc.NewAuthorizer(rpc.AuthConfig{
		TLS:      a.tls != nil,
		Region:   cfg.Region,
		ACL:      cfg.ACL.Enabled,
		Resolver: rpc.TokenResolverFunc(a.resolveToken),
		Logger:   log.Named("auth"),
	})
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	opts = append(opts, auth.ServerOptions()...)
	opts = append(opts, grpc.ChainUnaryInterceptor(a.startGateUnary), grpc.ChainStreamInterceptor(a.startGateStream))
	a.grpc = grpc.NewServer(opts...)
	a.health = health.NewServer()
	a.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(a.grpc, a.health)
	// With ACLs on, reflection answers only callers with a valid token
	// (its rule in package acl).
	reflection.Register(a.grpc)

	a.manager, err = registry.NewManager(registry.ManagerConfig{
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
		AllowInsecurePluginDir: cfg.Client.AllowInsecurePluginDir,
		PluginRedial:           a.retry.PluginRedial,
		FingerprintRetry:       a.retry.Fingerprint,
		PluginDialOptions:      a.grpcMetrics.DialOptions(),
		Metrics:                a.registerer(),
		Watchdog:               a.watchdog,
		Logger:                 log.Named("registry"),
	})
	if err != nil {
		return nil, fmt.Errorf("agent: plugin registry: %w", err)
	}
	a.agentService, err = rpc.NewAgentService(rpc.AgentServiceConfig{
		Plugins:               a.manager.Registry().Source(),
		Events:                a.manager.Registry().EventLog(),
		Name:                  cfg.Name,
		Version:               c.Version,
		PluginDir:             cfg.Client.PluginDir,
		StartedAt:             a.startedAt,
		Cluster:               a.clusterSummary,
		Mounts:                func() []*csisupdv1.Mount { return a.volumes.List("", "") },
		Logger:                log.Named("rpc"),
		MaxSubscribers:        cfg.Client.MaxEventSubscribers,
		MaxSubscribersPerConn: cfg.Client.MaxEventSubscribersPerConn,
		Metrics:               a.registerer(),
		Logs:                  logSinks(log),
		LogLevels:             config.LogLevels(),
		Gatherer:              a.metrics,
		Config:                a.configString,
		EnableDebug:           a.debug.Load,
		ACL:                   cfg.ACL.Enabled,
	})
	if err != nil {
		return nil, fmt.Errorf("agent: Agent API: %w", err)
	}
	a.agentService.Register(a.grpc)

	clientCSI, err := rpc.NewClientCSI(rpc.ClientCSIConfig{
		Plugins:                a.manager,
		NodeName:               cfg.Name,
		RPCTimeout:             cfg.Client.RPCTimeout,
		MaxDestructiveInFlight: cfg.Client.MaxDestructiveInFlight,
		Retry:                  a.retry.ClientCSI,
		Logger:                 log.Named("clientcsi"),
	})
	if err != nil {
		return nil, fmt.Errorf("agent: ClientCSI: %w", err)
	}
	clientCSI.Register(a.grpc)

	if a.nodeID, err = loadNodeID(cfg.DataDir); err != nil {
		return nil, err
	}
	if cfg.Consul.Enabled {
		consulCfg, err := a.consulConfig(&cfg)
		if err != nil {
			return nil, err
		}
		if a.consul, err = consulsync.New(consulCfg); err != nil {
			return nil, fmt.Errorf("agent: consul: %w", err)
		}
	}
	rpcAddr := a.advertised(cfg.Ports.RPC, a.rpcLn)
	// Connections to servers prove that the peer is a server; connections
	// a server makes to agents prove the chain only (an agent that is also
	// a server has a server certificate).
	serverCreds, agentCreds := insecure.NewCredentials(), insecure.NewCredentials()
	if a.tls != nil {
		serverCreds = credentials.NewTLS(a.tls.OutgoingConfig(tlsutil.RoleServer))
		agentCreds = credentials.NewTLS(a.tls.OutgoingConfig(""))
	}
	dialOpts := append(a.grpcMetrics.DialOptions(), grpc.WithTransportCredentials(serverCreds))
	agentDialOpts := append(a.grpcMetrics.DialOptions(), grpc.WithTransportCredentials(agentCreds))
	if cfg.Server.Enabled {
		a.server, err = server.New(server.Config{
			ID:               a.nodeID,
			Name:             cfg.Name,
			DataDir:          ServerDataDir(cfg.DataDir),
			RaftAddr:         net.JoinHostPort(cfg.AdvertiseAddr, strconv.Itoa(cfg.Ports.Raft)),
			RPCAddr:          rpcAddr,
			BootstrapExpect:  cfg.Server.BootstrapExpect,
			RetryJoin:        cfg.Server.RetryJoin,
			DiscoverServers:  a.discoverServers(cfg.ServerAutoJoin()),
			RaftMultiplier:   cfg.Server.RaftMultiplier,
			Join:             a.retry.ServerJoin,
			Connect:          a.retry.ServerConnect,
			ServerTuning:     serverTuning(&cfg),
			DialOptions:      dialOpts,
			AgentDialOptions: agentDialOpts,
			TLS:              a.tls,
			Metrics:          a.registerer(),
			Watchdog:         a.watchdog,
		}, log)
		if err != nil {
			return nil, fmt.Errorf("agent: server role: %w", err)
		}
		srv := a.server
		closers = append(closers, func() { _ = srv.Shutdown(context.Background()) })
		a.server.Register(a.grpc)
	}
	servers := a.nodeServers(&cfg, rpcAddr)
	if discover := a.discoverServers(cfg.ClientAutoJoin()); len(servers) > 0 || discover != nil {
		a.nodes, err = nodeclient.New(nodeclient.Config{
			Servers:          servers,
			DiscoverServers:  nodeclient.Discover(discover),
			DiscoverInterval: config.DefaultServerDiscoverInterval,
			Node:             nodeclient.Node{ID: a.nodeID, Name: cfg.Name, Address: rpcAddr},
			Plugins:          a.manager.Registry().Source(),
			DialOptions:      slices.Concat(dialOpts, agentTokenOption(&cfg)),
			RPCTimeout:       config.DefaultNodeRPCTimeout,
			Retry:            a.retry.NodeClient,
			Connect:          a.retry.ServerConnect,
			QuietStart:       config.DefaultQuietStart,
			Watchdog:         a.watchdog,
		}, log)
		if err != nil {
			return nil, fmt.Errorf("agent: node registration: %w", err)
		}
	}

	if err := a.setupVolumes(&cfg); err != nil {
		return nil, err
	}

	if cfg.ACL.Enabled {
		if err := a.setupTokenResolver(); err != nil {
			return nil, err
		}
	}

	a.http = &http.Server{
		Handler:           a.newHTTPHandler(),
		ReadHeaderTimeout: 5 * time.Second,
	}
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

// serverTuning is the production tuning of the server role with what the
// configuration sets of it.
func serverTuning(cfg *config.Config) config.ServerTuning {
	t := config.DefaultServerTuning()
	t.ClaimGCGrace = cfg.Server.ClaimGCGrace
	t.HeartbeatGrace = cfg.Server.HeartbeatGrace
	t.MinHeartbeatTTL = cfg.Server.MinHeartbeatTTL
	t.MaxHeartbeatsPerSecond = cfg.Server.MaxHeartbeatsPerSecond
	t.FailoverHeartbeatTTL = cfg.Server.FailoverHeartbeatTTL
	t.ServerStabilizationTime = cfg.Server.ServerStabilizationTime
	return t
}

// setupVolumes creates the node volume manager and adds its NodeVolumes
// service. With servers to report to, it removes the cluster mounts whose
// claims the servers released while the node was away.
func (a *Agent) setupVolumes(cfg *config.Config) error {
	dirs := make(map[string]volumes.PluginDirs, len(cfg.Plugins))
	for id, p := range cfg.Plugins {
		dirs[id] = volumes.PluginDirs{MountDir: cfg.MountDir(id), PluginMountDir: p.PluginMountDir}
	}
	vc := volumes.Config{
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
	}
	if a.nodes != nil {
		vc.Claims = a.nodes.NodeClaims
	}
	var err error
	if a.volumes, err = volumes.New(vc); err != nil {
		return fmt.Errorf("agent: node volumes: %w", err)
	}
	a.volumes.Register(a.grpc)
	return nil
}

// Limits of the gRPC server. ports.rpc is reachable by whatever can reach
// the node, so no client may make the agent hold more than these:
//
//   - MaxConcurrentStreams 1024: streams open at a time on one connection
//     (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS). A well-behaved client
//     queues beyond it; the event stream caps (client.max_event_subscribers
//     and _per_connection) are far lower and apply on top.
//   - Keepalive enforcement, MinTime 10s, PermitWithoutStream: a client may
//     ping, with or without open streams, at most every 10 s; one that
//     pings more often gets GOAWAY (too_many_pings) instead of costing a
//     reply per ping.
//   - Keepalive, Time 1m, Timeout 20s: the agent pings a connection that
//     was silent for a minute and closes it when no answer comes in 20 s,
//     so streams of a client that vanished (host gone, cable pulled) and
//     the event stream slots they hold are freed within about 80 s rather
//     than when TCP gives up, minutes to hours later.
//   - MaxConnectionIdle 15m: a connection without a stream for 15 minutes
//     is closed with GOAWAY; gRPC clients reconnect on their next call.
//   - MaxRecvMsgSize 4 MiB: the largest request the agent reads (gRPC's
//     default, stated so that it stays a decision); larger ones fail with
//     ResourceExhausted before they are buffered whole.
const (
	maxConcurrentStreams = 1024
	keepaliveMinTime     = 10 * time.Second
	keepaliveTime        = time.Minute
	keepaliveTimeout     = 20 * time.Second
	maxConnectionIdle    = 15 * time.Minute
	maxRecvMsgSize       = 4 << 20
)

// serverOptions are the options of the agent's gRPC server, without TLS.
// The ConnTagger lets the Agent service count event streams per
// transport connection.
func serverOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(maxConcurrentStreams),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             keepaliveMinTime,
			PermitWithoutStream: true,
		}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time:              keepaliveTime,
			Timeout:           keepaliveTimeout,
			MaxConnectionIdle: maxConnectionIdle,
		}),
		grpc.MaxRecvMsgSize(maxRecvMsgSize),
		grpc.StatsHandler(&rpc.ConnTagger{}),
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
	release(a.closers)
}

// release runs closers in reverse order.
func release(closers []func()) {
	for i := len(closers) - 1; i >= 0; i-- {
		closers[i]()
	}
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

// Ready is closed once the agent serves and its first directory scan is
// reconciled.
func (a *Agent) Ready() <-chan struct{} { return a.ready }

// Run serves until ctx ends, then stops gracefully. It returns the first
// error of a component that failed on its own.
func (a *Agent) Run(ctx context.Context) error {
	a.mu.Lock()
	if a.ran {
		a.mu.Unlock()
		return errors.New("agent: Run called twice or after Close")
	}
	a.ran = true
	a.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// workers stop when ctx ends; listeners stop when stopServers is called,
	// after the workers, so Consul deregistration and the last registry
	// write happen while the agent still answers.
	var workers, listeners sync.WaitGroup
	errs := make(chan error, 8)
	start := func(wg *sync.WaitGroup, name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil {
				errs <- fmt.Errorf("%s: %w", name, err)
				cancel()
			}
		}()
	}
	run := func(name string, f func() error) { start(&workers, name, f) }
	serve := func(name string, f func() error) { start(&listeners, name, f) }

	run("plugin registry", func() error { return a.manager.Run(ctx) })
	run("node volumes", func() error { return a.volumes.Run(ctx) })
	serve("grpc server", func() error {
		if err := a.grpc.Serve(a.rpcLn); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return err
		}
		return nil
	})
	serve("http server", func() error {
		if err := a.http.Serve(a.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	if a.consul != nil {
		run("consul sync", func() error { return a.consul.Run(ctx) })
	}
	if a.server != nil {
		if err := a.server.Start(ctx); err != nil {
			cancel()
			errs <- fmt.Errorf("server role: %w", err)
		}
	}
	if a.nodes != nil {
		run("node registration", func() error { return a.nodes.Run(ctx) })
	}
	if a.tls != nil {
		run("certificate expiry", func() error { return a.watchExpiry(ctx) })
	}
	run("watchdog", func() error { a.watchdog.Run(ctx); return nil })
	run("systemd status", func() error { a.runSystemdStatus(ctx); return nil })

	if a.waitReady(ctx) {
		// Logged before Ready closes, so whoever waits on Ready sees the line
		// in the log, not in a monitor it attaches afterwards.
		a.log.Info("agent serving", "name", a.name, "rpc", a.RPCAddr().String(),
			"http", a.HTTPAddr().String(), "plugin_dir", a.pluginDir, "data_dir", a.dataDir)
		a.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
		close(a.ready)
	}

	<-ctx.Done()
	a.notify(daemon.SdNotifyStopping)
	a.log.Info("agent stopping")
	a.health.Shutdown()
	workers.Wait() // registry persisted, Consul deregistered, node client stopped
	if a.server != nil {
		sctx, scancel := context.WithTimeout(context.Background(), ShutdownTimeout/2)
		if err := a.server.Shutdown(sctx); err != nil {
			errs <- fmt.Errorf("server role: %w", err)
		}
		scancel()
	}
	a.stopServers()
	listeners.Wait()
	if a.tempDir != "" {
		_ = os.RemoveAll(a.tempDir)
	}
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	if err := errors.Join(all...); err != nil {
		a.log.Error("agent stopped with errors", "error", err)
		return err
	}
	a.log.Info("agent stopped")
	return nil
}

// stopServers stops the gRPC and HTTP servers, gracefully first.
func (a *Agent) stopServers() {
	a.stopOnce.Do(func() {
		done := make(chan struct{})
		go func() {
			a.grpc.GracefulStop()
			close(done)
		}()
		timer := time.NewTimer(ShutdownTimeout / 2)
		defer timer.Stop()
		select {
		case <-done:
		case <-timer.C:
			a.grpc.Stop() // long streams such as WatchEvents end here
			<-done
		}
		sctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout/2)
		defer cancel()
		_ = a.http.Shutdown(sctx)
	})
}

// consulShutdownTimeout bounds the Consul deregistration at shutdown, so an
// unreachable Consul leaves time for the rest of a stop within 5 s.
const consulShutdownTimeout = ShutdownTimeout / 2

// consulConfig builds the Consul sync's configuration from cfg, which
// holds every default: consulsync has none of its own.
func (a *Agent) consulConfig(cfg *config.Config) (consulsync.Config, error) {
	port := cfg.Ports.RPC
	if tcp, ok := a.rpcLn.Addr().(*net.TCPAddr); ok {
		port = tcp.Port
	}
	cs := cfg.Consul
	c := consulsync.Config{
		Plugins:              a.manager.Registry().Source(),
		Address:              cs.Address,
		Token:                string(cs.Token),
		ServiceName:          cs.ServiceName,
		PluginServiceName:    cs.PluginService,
		ServerService:        cfg.Server.Enabled,
		ServerServiceName:    cs.ServerServiceName,
		DiscoveryWait:        cs.DiscoveryWait,
		DiscoveryMinInterval: config.DefaultConsulDiscoveryMinInterval,
		Tags:                 cs.Tags,
		EnableTagOverride:    cs.EnableTagOverride,
		DeregisterOnShutdown: cs.DeregisterOnShutdown,
		NodeName:             cfg.Name,
		ServiceAddress:       cfg.AdvertiseAddr,
		ServicePort:          port,
		GRPCCheck:            net.JoinHostPort(cfg.AdvertiseAddr, strconv.Itoa(port)),
		GRPCCheckInterval:    cs.CheckInterval,
		GRPCCheckTimeout:     cs.CheckTimeout(),
		SyncInterval:         cs.SyncInterval,
		CheckTTL:             cs.CheckTTL(),
		Probation:            config.DefaultConsulProbation,
		RequestTimeout:       config.DefaultConsulRequestTimeout,
		ShutdownTimeout:      consulShutdownTimeout,
		Retry:                a.retry.ConsulSync,
		Logger:               a.log.Named("consul"),
		Metrics:              a.registerer(),
		Watchdog:             a.watchdog,
	}
	if a.tls != nil {
		c.GRPCCheckTLS, c.GRPCCheckTLSServerName = true, a.checkTLSServerName(cfg)
	}
	return c, nil
}

// checkTLSServerName is the name Consul's gRPC check verifies in the agent's
// certificate: consul.check_tls_server_name, else the first DNS name of the
// certificate the agent serves (the role name of a `csisupd tls` one), else
// "" (the address Consul dials).
func (a *Agent) checkTLSServerName(cfg *config.Config) string {
	if cfg.Consul.CheckTLSServerName != "" {
		return cfg.Consul.CheckTLSServerName
	}
	if names := a.tls.Certificate().DNSNames; len(names) > 0 {
		return names[0]
	}
	return ""
}

// discoverServers returns the servers as the Consul sync's one watch of
// the catalog last saw them when on is set and Consul registration runs,
// else nil.
func (a *Agent) discoverServers(on bool) server.Discover {
	if !on || a.consul == nil {
		return nil
	}
	return a.consul.Servers
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

// clusterSummary is the agent's place in the control cluster, for status.
// a.server and a.nodes are set once in New, before anything serves.
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

// prepareDirs creates the data and plugin directories; in dev mode they are
// temporary.
func (a *Agent) prepareDirs() error {
	cfg := a.cfg
	if cfg.Dev && cfg.DataDir == "" {
		dir, err := os.MkdirTemp("", "csisupd-dev-")
		if err != nil {
			return fmt.Errorf("agent: dev data dir: %w", err)
		}
		a.tempDir = dir
		cfg.DataDir = dir
	}
	if cfg.Dev && cfg.Client.PluginDir == "" {
		cfg.Client.PluginDir = filepath.Join(cfg.DataDir, "plugins")
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("agent: data_dir %q: %w", cfg.DataDir, err)
	}
	if cfg.Client.Enabled {
		if err := os.MkdirAll(cfg.Client.PluginDir, 0o750); err != nil {
			return fmt.Errorf("agent: client.plugin_dir %q: %w", cfg.Client.PluginDir, err)
		}
		if err := a.checkPluginDir(); err != nil {
			return err
		}
	}
	return nil
}

// checkPluginDir refuses a plugin directory that users the agent does not
// trust can write to (registry.CheckPluginDir): a socket there is trusted
// with volume secrets. With client.allow_insecure_plugin_dir it logs a
// warning instead.
func (a *Agent) checkPluginDir() error {
	cl := a.cfg.Client
	err := registry.CheckPluginDir(cl.PluginDir)
	var untrusted *registry.UntrustedDirError
	switch {
	case err == nil:
		return nil
	case !errors.As(err, &untrusted):
		return fmt.Errorf("agent: client.plugin_dir %q: %w", cl.PluginDir, err)
	case cl.AllowInsecurePluginDir:
		a.log.Warn("client.plugin_dir can be written by users the agent does not trust; "+
			"starting anyway because client.allow_insecure_plugin_dir = true: any socket there is trusted with volume secrets",
			"plugin_dir", cl.PluginDir, "problem", err.Error())
		return nil
	default:
		return fmt.Errorf("agent: client.plugin_dir %q is not safe for plugin sockets, which are trusted with volume secrets: %w "+
			"(or set client.allow_insecure_plugin_dir = true to start anyway)", cl.PluginDir, err)
	}
}

func listen(key, host string, port int) (net.Listener, error) {
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("agent: %s: listen on %s: %w", key, addr, err)
	}
	return ln, nil
}
