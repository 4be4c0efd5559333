package agent

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/nodeclient"
	"github.com/csisupd/csisupd/internal/registry"
	"github.com/csisupd/csisupd/internal/rpc"
	"github.com/csisupd/csisupd/internal/tlsutil"
)

// This file holds the setup steps of the agent as a whole: its
// directories and listeners, the gRPC transport and services, the HTTP
// server. The roles' steps are in client.go, consul.go and serverrole.go.

// setupDirs creates the data and plugin directories, temporary ones in dev
// mode; its part removes a dev mode directory, also when setupDirs fails.
func (a *Agent) setupDirs() (part, error) {
	err := a.prepareDirs()
	var p part
	if tempDir := a.tempDir; tempDir != "" {
		p.close = func() { _ = os.RemoveAll(tempDir) }
	}
	return p, err
}

// listenOn returns ln, or a new listener on host:port (config key key)
// when ln is nil; its part closes it.
func listenOn(ln net.Listener, key, host string, port int) (net.Listener, part, error) {
	if ln == nil {
		var err error
		if ln, err = listen(key, host, port); err != nil {
			return nil, part{}, err
		}
	}
	return ln, part{close: func() { _ = ln.Close() }}, nil
}

// setupGRPCMetrics creates the metrics of the gRPC server and the agent's
// clients with telemetry.prometheus_metrics; nil (measuring nothing)
// without.
func (a *Agent) setupGRPCMetrics(cfg *config.Config) (*rpc.GRPCMetrics, error) {
	if !cfg.Telemetry.PrometheusMetrics {
		return nil, nil
	}
	m, err := rpc.NewGRPCMetrics(a.metrics, config.LatencyBuckets())
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	return m, nil
}

// dialing holds the dial options of the agent's gRPC clients of other
// csisupd nodes, with their metrics and credentials.
type dialing struct {
	// servers is for calls to servers, which must prove that they are
	// servers (their certificate's role).
	servers []grpc.DialOption
	// agents is for the calls a server makes to agents, which prove the
	// chain only (an agent that is also a server has a server
	// certificate).
	agents []grpc.DialOption
}

// dialOptions builds the dial options of the agent's clients from its TLS
// and gRPC metrics.
func (a *Agent) dialOptions() dialing {
	serverCreds, agentCreds := insecure.NewCredentials(), insecure.NewCredentials()
	if a.tls != nil {
		serverCreds = credentials.NewTLS(a.tls.OutgoingConfig(tlsutil.RoleServer))
		agentCreds = credentials.NewTLS(a.tls.OutgoingConfig(""))
	}
	return dialing{
		servers: append(a.grpcMetrics.DialOptions(), grpc.WithTransportCredentials(serverCreds)),
		agents:  append(a.grpcMetrics.DialOptions(), grpc.WithTransportCredentials(agentCreds)),
	}
}

// setupGRPC creates the agent's gRPC server (metrics, limits, TLS, the
// authorizer with resolver, the start gate) with its health service,
// reporting NOT_SERVING until Run is ready, and reflection.
func (a *Agent) setupGRPC(cfg *config.Config, resolver rpc.TokenResolver) (*grpc.Server, *health.Server, error) {
	auth, err := rpc.NewAuthorizer(rpc.AuthConfig{
		TLS:            a.tls != nil,
		Region:         cfg.Region,
		ACL:            cfg.ACL.Enabled,
		Resolver:       resolver,
		VerifyNodeName: a.tls != nil && cfg.TLS.VerifyNodeName,
		Logger:         a.log.Named("auth"),
	})
	if err != nil {
		return nil, nil, fmt.Errorf("agent: %w", err)
	}
	opts := rpc.ServerOptions(a.grpcMetrics, auth)
	if a.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(a.tls.IncomingConfig())))
	}
	opts = append(opts, grpc.ChainUnaryInterceptor(a.startGateUnary), grpc.ChainStreamInterceptor(a.startGateStream))
	g := grpc.NewServer(opts...)
	h := health.NewServer()
	h.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(g, h)
	// With ACLs on, reflection answers only callers with a valid token
	// (its rule in package acl).
	reflection.Register(g)
	return g, h, nil
}

// setupServices creates the Agent and ClientCSI services and registers
// them, the server role's and the node volumes' services on g. Its part
// changes the event stream caps on Reload.
func (a *Agent) setupServices(cfg *config.Config, g *grpc.Server) (*rpc.AgentService, part, error) {
	vols := a.volumes
	agentService, err := rpc.NewAgentService(rpc.AgentServiceConfig{
		Plugins:               a.manager.Registry().Source(),
		Events:                a.manager.Registry().EventLog(),
		Name:                  cfg.Name,
		Version:               a.version,
		PluginDir:             cfg.Client.PluginDir,
		StartedAt:             a.startedAt,
		Cluster:               a.clusterSummary,
		Mounts:                func() []*csisupdv1.Mount { return vols.List("", "") },
		Logger:                a.log.Named("rpc"),
		MaxSubscribers:        cfg.Client.MaxEventSubscribers,
		MaxSubscribersPerConn: cfg.Client.MaxEventSubscribersPerConn,
		Metrics:               a.registerer(),
		Logs:                  logSinks(a.log),
		LogLevels:             config.LogLevels(),
		Gatherer:              a.metrics,
		Config:                a.configString,
		EnableDebug:           a.debug.Load,
		ACL:                   cfg.ACL.Enabled,
		Leases:                leasesOf(a.leases),
		LocalClaims:           localClaimsOf(a.localClaims),
	})
	if err != nil {
		return nil, part{}, fmt.Errorf("agent: Agent API: %w", err)
	}
	agentService.Register(g)

	clientCSI, err := rpc.NewClientCSI(rpc.ClientCSIConfig{
		Plugins:                a.manager,
		NodeName:               cfg.Name,
		RPCTimeout:             cfg.Client.RPCTimeout,
		MaxDestructiveInFlight: cfg.Client.MaxDestructiveInFlight,
		Retry:                  a.retry.ClientCSI,
		Logger:                 a.log.Named("clientcsi"),
		Secrets:                a.secrets,
	})
	if err != nil {
		return nil, part{}, fmt.Errorf("agent: ClientCSI: %w", err)
	}
	clientCSI.Register(g)
	if a.server != nil {
		a.server.Register(g)
	}
	vols.Register(g, cfg.Client.AllowMountFlags...)

	reload := func(want, applied *config.Config) ([]string, error) {
		c := want.Client
		// The configuration is validated: the caps are positive.
		if err := agentService.SetSubscriberLimits(c.MaxEventSubscribers, c.MaxEventSubscribersPerConn); err != nil {
			return []string{"client.max_event_subscribers"}, fmt.Errorf("reload event stream caps: %w", err)
		}
		applied.Client.MaxEventSubscribers = c.MaxEventSubscribers
		applied.Client.MaxEventSubscribersPerConn = c.MaxEventSubscribersPerConn
		return nil, nil
	}
	return agentService, part{reload: reload}, nil
}

// leasesOf is l as the Agent API takes it: nil stays an untyped nil, so
// that an agent without servers refuses the lease methods.
func leasesOf(l *nodeclient.Leases) rpc.Leases {
	if l == nil {
		return nil
	}
	return l
}

// localClaimsOf is lc as the Agent service takes it: nil stays a nil
// interface.
func localClaimsOf(lc *nodeclient.LocalClaims) rpc.LocalClaims {
	if lc == nil {
		return nil
	}
	return lc
}

// setupHTTP creates the HTTP server of /v1/health, /v1/ready, /metrics and
// /debug/pprof/.
func (a *Agent) setupHTTP() *http.Server {
	return &http.Server{
		Handler:           a.newHTTPHandler(),
		ReadHeaderTimeout: 5 * time.Second,
	}
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
