package dockerplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/ids"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// Owner is the owner of the claims the plugin makes.
const Owner = "docker"

// WorkloadPrefix is the prefix of the workloads Mount claims for: the
// workload of a mount with id ID is WorkloadPrefix+ID.
const WorkloadPrefix = "docker-"

// The lease Config.Lease may name: the bounds within which the servers
// admit a claim's lease_ttl.
const (
	minLease = 5 * time.Second
	maxLease = 24 * time.Hour
)

// Timeouts of the HTTP server. requestTimeout bounds each call, as
// Docker's plugin client waits about two minutes; a response may take
// that long to write, so writeTimeout is a little longer.
const (
	requestTimeout    = 2 * time.Minute
	readHeaderTimeout = 10 * time.Second
	readTimeout       = 30 * time.Second
	writeTimeout      = requestTimeout + 10*time.Second
	idleTimeout       = 2 * time.Minute
	maxHeaderBytes    = 64 << 10
	// shutdownTimeout is how long Run waits for calls in flight once its
	// context ends, before it cancels them.
	shutdownTimeout = 10 * time.Second
	// abandonTimeout is how long Run then waits for cancelled calls to
	// return before it gives up on them.
	abandonTimeout = 5 * time.Second
)

// Cluster is what the plugin needs of the servers, for this node. The
// agent passes a *nodeclient.LocalClaims, which has exactly these methods.
type Cluster interface {
	NodeID() string
	CreateVolume(ctx context.Context, req *csisupdv1.VolumeCreateRequest) (*csisupdv1.Volume, error)
	GetVolume(ctx context.Context, id string) (*csisupdv1.Volume, error) // gRPC NotFound status when absent
	ListVolumes(ctx context.Context) ([]*csisupdv1.Volume, error)
	DeleteVolume(ctx context.Context, id string) error
	Claim(ctx context.Context, volumeID, workloadID, owner string, lease time.Duration, usage *csisupdv1.VolumeUsage) (*csisupdv1.VolumeClaimResponse, error)
	Release(ctx context.Context, volumeID, workloadID string) error
	ClaimsIndex(ctx context.Context) (uint64, error)
	Sync(ctx context.Context, owner string, workloads []string, knownIndex uint64) (*csisupdv1.SyncNodeClaimsResponse, error)
}

// Config configures Server.
type Config struct {
	// Socket is the unix socket path, e.g.
	// /run/docker/plugins/csisupd.sock. Required, absolute.
	Socket string
	// Group is the group name or numeric gid that owns the socket with
	// root; "" is root's group (the socket keeps the agent's own group,
	// root's as the agent runs as root).
	Group string
	// DefaultPlugin is the plugin id Create uses when the options carry
	// no "plugin"; "" makes the "plugin" option required.
	DefaultPlugin string
	// Lease is the lease of Mount's claims (5s..24h), held by the agent.
	Lease time.Duration
	// EngineSocket is the engine's Docker-compatible API socket
	// (docker.sock or podman.sock) for the reconcile; "" runs none.
	EngineSocket string
	// ReconcileInterval is how often the reconcile runs; required when
	// EngineSocket is set.
	ReconcileInterval time.Duration
	// Cluster is the servers, for this node. Required.
	Cluster Cluster
	// Watchdog, when set, watches the reconcile loop ("docker
	// reconcile").
	Watchdog *watchdog.Monitor
}

// validate checks cfg, naming the agent's configuration keys.
func (cfg *Config) validate() error {
	var errs []error
	switch {
	case cfg.Socket == "":
		errs = append(errs, errors.New("docker.socket is required: the path of the plugin's unix socket, e.g. /run/docker/plugins/csisupd.sock"))
	case !filepath.IsAbs(cfg.Socket):
		errs = append(errs, fmt.Errorf("docker.socket %q must be an absolute path", cfg.Socket))
	}
	if cfg.DefaultPlugin != "" && !ids.ValidPluginID(cfg.DefaultPlugin) {
		errs = append(errs, fmt.Errorf("docker.default_plugin %q is not a plugin id (%s)", cfg.DefaultPlugin, ids.PluginIDPattern))
	}
	if cfg.Lease < minLease || cfg.Lease > maxLease {
		errs = append(errs, fmt.Errorf("docker plugin: the lease of its claims, %s, is outside %s..%s", cfg.Lease, minLease, maxLease))
	}
	if cfg.EngineSocket != "" {
		if !filepath.IsAbs(cfg.EngineSocket) {
			errs = append(errs, fmt.Errorf("docker.engine_socket %q must be an absolute path", cfg.EngineSocket))
		}
		if cfg.ReconcileInterval <= 0 {
			errs = append(errs, fmt.Errorf("docker.reconcile_interval must be positive with docker.engine_socket, got %s", cfg.ReconcileInterval))
		}
	}
	if cfg.Cluster == nil {
		errs = append(errs, errors.New("docker plugin: Cluster is required"))
	}
	return errors.Join(errs...)
}

// Server serves the volume plugin protocol on Config.Socket.
type Server struct {
	cfg    Config
	logger hclog.Logger
	sock   *socket
	srv    *http.Server
	// routes maps the protocol's paths to their endpoints.
	routes map[string]endpoint
	// engine is the engine's API client; nil without EngineSocket.
	engine *engineClient
	// slots holds one token per call in flight: at most maxInFlight.
	slots chan struct{}
	// calls is the base context of every call; cancelCalls ends the
	// calls still in flight when Run's shutdown grace has passed.
	calls       context.Context
	cancelCalls context.CancelFunc
	inFlight    sync.WaitGroup

	mu      sync.Mutex
	started bool
	closed  bool
}

// New validates cfg and opens the socket (removing a stale socket file
// left by a previous run, only if it is a socket no one serves; creating
// the parent directory 0755 if missing; mode 0660, owner root:Group). A
// Group that does not resolve is an error naming docker.group. When New
// fails nothing is left open. It starts nothing.
func New(cfg Config, logger hclog.Logger) (*Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	gid, err := resolveGroup(cfg.Group)
	if err != nil {
		return nil, err
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	sock, err := listen(cfg.Socket, gid)
	if err != nil {
		return nil, err
	}
	calls, cancel := context.WithCancel(context.Background())
	s := &Server{
		cfg:         cfg,
		logger:      logger.Named("docker"),
		sock:        sock,
		slots:       make(chan struct{}, maxInFlight),
		calls:       calls,
		cancelCalls: cancel,
	}
	s.routes = s.endpoints()
	if cfg.EngineSocket != "" {
		s.engine = newEngineClient(cfg.EngineSocket)
	}
	s.srv = &http.Server{
		Handler:           http.HandlerFunc(s.serveHTTP),
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          s.logger.StandardLogger(&hclog.StandardLoggerOptions{ForceLevel: hclog.Debug}),
		BaseContext:       func(net.Listener) context.Context { return s.calls },
	}
	return s, nil
}

// Addr is the socket path.
func (s *Server) Addr() string { return s.cfg.Socket }

// Run serves until ctx ends, then shuts the HTTP server down within a
// bounded time and removes the socket file. With EngineSocket, it also
// runs the reconcile loop (at start and every interval). It returns nil
// when ctx ended, or the error that stopped serving; it runs once.
func (s *Server) Run(ctx context.Context) error {
	s.mu.Lock()
	switch {
	case s.closed:
		s.mu.Unlock()
		return fmt.Errorf("docker plugin socket %s: the server was closed", s.cfg.Socket)
	case s.started:
		s.mu.Unlock()
		return fmt.Errorf("docker plugin socket %s: Run was called twice", s.cfg.Socket)
	}
	s.started = true
	s.mu.Unlock()

	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var loops sync.WaitGroup
	if s.engine != nil {
		loops.Add(1)
		go func() {
			defer loops.Done()
			s.reconcileLoop(ctx)
		}()
	}
	served := make(chan error, 1)
	go func() { served <- s.srv.Serve(s.sock.lis) }()
	s.logger.Info("serving the Docker volume plugin protocol", "socket", s.cfg.Socket, "engine_socket", s.cfg.EngineSocket)

	var err error
	select {
	case <-ctx.Done():
	case err = <-served:
		served <- err
	}
	stop()
	s.shutdown()
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	loops.Wait()
	s.release()
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("docker plugin socket %s: %w", s.cfg.Socket, err)
	}
	return nil
}

// shutdown stops the HTTP server: it waits shutdownTimeout for the calls
// in flight, then cancels them, closes their connections and waits
// abandonTimeout more for them to return.
func (s *Server) shutdown() {
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := s.srv.Shutdown(sctx); err == nil {
		return
	}
	s.logger.Warn("calls still in flight at shutdown; cancelling them", "socket", s.cfg.Socket, "waited", shutdownTimeout)
	s.cancelCalls()
	_ = s.srv.Close()
	done := make(chan struct{})
	go func() {
		s.inFlight.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(abandonTimeout):
		s.logger.Error("calls did not return after cancellation; abandoning them", "socket", s.cfg.Socket, "waited", abandonTimeout)
	}
}

// Close releases what New opened, for a Server whose Run never starts. It
// does nothing once Run started: Run releases it.
func (s *Server) Close() {
	s.mu.Lock()
	started := s.started
	s.closed = true
	s.mu.Unlock()
	if !started {
		s.release()
	}
}

// release closes the socket and removes its file; once.
func (s *Server) release() {
	s.cancelCalls()
	if err := s.sock.close(); err != nil {
		s.logger.Warn("cannot remove the plugin socket", "socket", s.cfg.Socket, "error", err)
	}
}
