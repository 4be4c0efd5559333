package registry

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/retry"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// DefaultStopTimeout is ManagerConfig.StopTimeout when it is zero.
const DefaultStopTimeout = 2 * time.Second

// ManagerConfig configures a Manager. Every duration but StopTimeout is
// required; the defaults live in the config package.
type ManagerConfig struct {
	// PluginDir is the directory plugins put their sockets in. It is
	// created (mode 0750) when missing, and again if it is removed.
	//
	// A socket found there is trusted with volume secrets, so only trusted
	// entries are dialled (see CheckPluginDir for the directory itself):
	// while PluginDir is writable by its group or others, or owned by a
	// user other than root and the agent's, no socket in it is; a plugin
	// subdirectory that fails the same checks (with PluginOwners allowed
	// as owners too) is ignored; a socket owned by a user other than
	// root, the agent's and PluginOwners is ignored; a symlink is never
	// followed. Each ignored entry is reported once by a
	// plugin-socket-ignored event. The manager does not refuse to run on
	// an untrusted PluginDir: the agent checks it at start.
	PluginDir string
	// PluginOwners are users, besides root and the agent's own, that may
	// own plugin sockets and plugin subdirectories (client.plugin_owners,
	// resolved to uids).
	PluginOwners []uint32
	// AllowInsecurePluginDir turns the directory checks off: PluginDir and
	// its subdirectories are used whoever owns them and may write to them
	// (client.allow_insecure_plugin_dir). Socket owners are still checked
	// and symlinks still never followed.
	AllowInsecurePluginDir bool
	// DataDir holds the registry file (registry.json). Empty disables
	// persistence.
	DataDir string
	// ProbeInterval is the time between two probes of a plugin. It also
	// caps the full gRPC connection's redial backoff and the fingerprint
	// retry backoff (see FingerprintRetry).
	ProbeInterval time.Duration
	// ProbeTimeout bounds one probe and one fingerprint, and every write
	// to a plugin (csiclient.Config.WriteTimeout): a plugin that stops
	// reading fails the call instead of holding it. At most ProbeInterval.
	// A new value (SetTiming) bounds the writes of supervisors started
	// after it (new plugin instances); running ones keep theirs.
	ProbeTimeout time.Duration
	// FingerprintInterval is the time between two fingerprints of a
	// healthy plugin.
	FingerprintInterval time.Duration
	// DeregisterGrace is how long a socket may be gone before its plugin
	// is deregistered. Zero deregisters at once.
	DeregisterGrace time.Duration
	// RescanInterval is the period of the backstop rescan of PluginDir.
	RescanInterval time.Duration
	// StopTimeout bounds the wait for a supervisor being stopped (its
	// socket was removed or replaced), and for all of them together when
	// Run returns. A supervisor still running then is abandoned: logged
	// at warn and counted (AbandonedSupervisors). Zero means
	// DefaultStopTimeout.
	StopTimeout time.Duration
	// MaxPluginMessageSize caps one reply from a plugin on the
	// supervisor's connection, in bytes (csiclient.Config.MaxMessageSize);
	// a larger reply is a protocol violation, and the plugin is backed
	// off. Zero means csiclient's default (4 MiB). The agent sets it from
	// client.max_plugin_message_size.
	MaxPluginMessageSize int
	// PluginRedial spaces a supervisor's redials of a socket that refuses
	// connections while a probe or fingerprint waits for it
	// (csiclient.Config.Redial). Required: config.Retry.PluginRedial.
	PluginRedial retry.Policy
	// FingerprintRetry spaces the fingerprint attempts of a plugin that
	// has not answered yet. Its Cap is replaced by the probe interval in
	// force, and its Base lowered to that interval when it is shorter, so
	// that a plugin that does not answer is tried about as often as it
	// would be probed. Required: config.Retry.Fingerprint.
	FingerprintRetry retry.Policy
	// PluginDialOptions are added to every plugin's full gRPC connection,
	// the one ClientCSI and the node volume manager call the plugin on
	// (csiclient.Config.DialOptions): the agent's gRPC client metrics.
	PluginDialOptions []grpc.DialOption
	// Registry is the store to fill. Nil creates a new one.
	Registry *Registry
	// Logger receives the manager's logs. Nil discards them.
	Logger hclog.Logger
	// Metrics receives the registry's series (csisupd_plugin_*,
	// csisupd_registry_*, csisupd_watcher_*). Nil registers nothing; the
	// series are kept all the same. Series labelled by plugin_id are
	// deleted when the plugin is deregistered.
	Metrics prometheus.Registerer
	// Declarations are the plugins the configuration declares (plugin
	// blocks with socket, type or required), by id; SetDeclarations
	// replaces them. A declared socket is supervised wherever it lies, and
	// holds its plugin id before a kubelet registration or a socket in
	// PluginDir does.
	Declarations map[string]Declaration
	// KubeletRegistrationDir, when set, turns on kubelet's plugin
	// registration protocol: registration sockets there are asked for
	// their driver's name and CSI endpoint, and the endpoint is supervised
	// under the driver's name (see registrations).
	KubeletRegistrationDir string
	// KubeletEndpointDirs are the directories a kubelet-registered
	// endpoint may lie in (client.kubelet_endpoint_dirs, absolute);
	// required with KubeletRegistrationDir. A registration naming an
	// endpoint elsewhere, or one that the trust rules of a plugin socket
	// refuse (a symlink on its path, an owner not allowed), is refused.
	KubeletEndpointDirs []string
	// KubeletRetry spaces the GetInfo attempts at one registration
	// socket that does not answer, or answers garbage; each wait is
	// capped at one minute whatever the policy says. Required with
	// KubeletRegistrationDir: config.Retry.KubeletRegistration.
	KubeletRetry retry.Policy
	// InUse reports whether plugin pluginID has volumes (staged,
	// published or being set up) on this node: the node volume manager's
	// records. A plugin that has, or that is healthy, keeps its socket:
	// a claim of another source on its id at another socket is refused
	// until the plugin is deregistered. Nil means no plugin has volumes.
	// It is called from the watcher's scans and must not block.
	InUse func(pluginID string) bool
	// Watchdog, when set, gets the manager's essential loops ("plugin
	// watcher", "plugin reconciler" and, with a DataDir, "registry
	// persister"), each beaten on every turn, so that a wedged loop stops
	// the systemd watchdog's pings. Plugin supervisors are not loops: a
	// plugin that hangs never stops the pings.
	Watchdog *watchdog.Monitor
}

func (c *ManagerConfig) validate() error {
	var errs []error
	if c.PluginDir == "" {
		errs = append(errs, errors.New("registry: PluginDir is required"))
	}
	t := timing{ProbeInterval: c.ProbeInterval, ProbeTimeout: c.ProbeTimeout, FingerprintInterval: c.FingerprintInterval}
	if err := t.validate(); err != nil {
		errs = append(errs, fmt.Errorf("registry: %w", err))
	}
	if c.DeregisterGrace < 0 {
		errs = append(errs, fmt.Errorf("registry: DeregisterGrace must not be negative, got %s", c.DeregisterGrace))
	}
	if c.RescanInterval <= 0 {
		errs = append(errs, fmt.Errorf("registry: RescanInterval must be positive, got %s", c.RescanInterval))
	}
	if c.StopTimeout < 0 {
		errs = append(errs, fmt.Errorf("registry: StopTimeout must not be negative, got %s", c.StopTimeout))
	}
	if c.MaxPluginMessageSize < 0 {
		errs = append(errs, fmt.Errorf("registry: MaxPluginMessageSize must not be negative, got %d", c.MaxPluginMessageSize))
	}
	if err := c.PluginRedial.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("registry: PluginRedial: %w", err))
	}
	if err := c.FingerprintRetry.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("registry: FingerprintRetry: %w", err))
	}
	if err := validateDeclarations(c.Declarations); err != nil {
		errs = append(errs, err)
	}
	if c.KubeletRegistrationDir != "" {
		if !filepath.IsAbs(c.KubeletRegistrationDir) {
			errs = append(errs, fmt.Errorf("registry: KubeletRegistrationDir %q is not absolute", c.KubeletRegistrationDir))
		}
		if len(c.KubeletEndpointDirs) == 0 {
			errs = append(errs, errors.New("registry: KubeletEndpointDirs is required with KubeletRegistrationDir"))
		}
		for _, d := range c.KubeletEndpointDirs {
			if !filepath.IsAbs(d) {
				errs = append(errs, fmt.Errorf("registry: KubeletEndpointDirs: %q is not absolute", d))
			}
		}
		if err := c.KubeletRetry.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("registry: KubeletRetry: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Manager runs the plugin registry of one node: the watcher of the plugin
// directory, the reconciler, one supervisor per plugin instance and the
// persistence of the registry.
type Manager struct {
	cfg   ManagerConfig
	log   hclog.Logger
	reg   *Registry
	rec   *reconciler
	ready chan struct{}
	ran   atomic.Bool
	// watcher is Run's, once it has started: SetDeclarations asks it for
	// a scan.
	watcher atomic.Pointer[watcher]
	// onRegistrationRetry, when set before Run (by tests), is called
	// before every wait between two GetInfo attempts at a registration
	// socket.
	onRegistrationRetry func(path string, wait time.Duration)
}

// NewManager validates cfg and returns a Manager. Nothing runs until Run.
// It registers the registry's metrics with cfg.Metrics, and fails when
// they cannot be (already registered there, say by another manager).
func NewManager(cfg ManagerConfig) (*Manager, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(cfg.PluginDir)
	if err != nil {
		return nil, fmt.Errorf("registry: PluginDir %q: %w", cfg.PluginDir, err)
	}
	cfg.PluginDir = filepath.Clean(dir)
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Registry == nil {
		cfg.Registry = New(Config{Logger: cfg.Logger})
	}
	if cfg.StopTimeout == 0 {
		cfg.StopTimeout = DefaultStopTimeout
	}
	m := &Manager{
		cfg: cfg,
		log: cfg.Logger,
		reg: cfg.Registry,
		rec: newReconciler(reconcilerConfig{
			Registry: cfg.Registry,
			Grace:    cfg.DeregisterGrace,
			Timing: timing{
				ProbeInterval:       cfg.ProbeInterval,
				ProbeTimeout:        cfg.ProbeTimeout,
				FingerprintInterval: cfg.FingerprintInterval,
			},
			StopTimeout:      cfg.StopTimeout,
			MaxMessageSize:   cfg.MaxPluginMessageSize,
			Redial:           cfg.PluginRedial,
			FingerprintRetry: cfg.FingerprintRetry,
			DialOptions:      cfg.PluginDialOptions,
			Logger:           cfg.Logger,
			Watchdog:         cfg.Watchdog,
		}),
		ready: make(chan struct{}),
	}
	m.reg.setDeclarations(cfg.Declarations)
	if cfg.Metrics != nil {
		if err := registerMetrics(cfg.Metrics, m.reg.metrics, newManagerCollector(m.reg, m.rec.abandonedCount)); err != nil {
			return nil, fmt.Errorf("registry: metrics: %w", err)
		}
	}
	return m, nil
}

// Registry returns the store the manager fills.
func (m *Manager) Registry() *Registry { return m.reg }

// Ready is closed once the initial scan of the plugin directory has been
// reconciled: every plugin found then has a supervisor.
func (m *Manager) Ready() <-chan struct{} { return m.ready }

// Run restores the registry from the data directory, then watches,
// supervises and persists until ctx ends. It then stops every supervisor,
// waiting for them for at most StopTimeout whatever the plugins do,
// saves the registry and returns nil. It returns an error when it cannot
// start: the plugin directory cannot be created or watched, or the data
// directory is unusable. Run may be called once.
func (m *Manager) Run(ctx context.Context) error {
	if !m.ran.CompareAndSwap(false, true) {
		return errors.New("registry: Manager.Run called twice")
	}
	var p *persister
	if m.cfg.DataDir != "" {
		p = newPersister(m.cfg.DataDir, m.reg, m.log)
		if err := p.load(); err != nil {
			return fmt.Errorf("registry: %w", err)
		}
	}
	trust := newTrustPolicy(m.cfg.PluginOwners, m.cfg.AllowInsecurePluginDir)
	var kubelet *registrations
	if m.cfg.KubeletRegistrationDir != "" {
		kubelet = newRegistrations(kubeletConfig{
			Dir:          m.cfg.KubeletRegistrationDir,
			Registry:     m.reg,
			Trust:        trust,
			CallTimeout:  m.cfg.ProbeTimeout,
			Retry:        m.cfg.KubeletRetry,
			EndpointDirs: cleanPaths(m.cfg.KubeletEndpointDirs),
			Redial:       m.cfg.PluginRedial,
			Poke:         m.requestScan,
			Logger:       m.log.Named("kubelet"),
		})
		kubelet.onRetry = m.onRegistrationRetry
	}
	w, err := newWatcher(watcherConfig{
		Dir:            m.cfg.PluginDir,
		RescanInterval: m.cfg.RescanInterval,
		Registry:       m.reg,
		Trust:          trust,
		Logger:         m.log,
		Watchdog:       m.cfg.Watchdog,
		Kubelet:        kubelet,
		InUse:          m.cfg.InUse,
	})
	if err != nil {
		return fmt.Errorf("registry: %w", err)
	}
	m.watcher.Store(w)
	m.log.Info("watching plugin directory", "dir", m.cfg.PluginDir)
	if kubelet != nil {
		m.log.Info("watching kubelet plugin registration directory", "dir", m.cfg.KubeletRegistrationDir)
	}

	var wg sync.WaitGroup
	wg.Go(func() { w.run(ctx) })
	wg.Go(func() { m.rec.run(ctx, w.updates(), m.ready) })
	wg.Go(func() { m.reg.watchRequired(ctx) })
	if p != nil {
		wg.Go(func() { p.run(ctx, m.cfg.Watchdog) })
	}
	wg.Wait()
	if kubelet != nil {
		// Each handler ends with ctx, its calls bounded by the probe
		// timeout.
		kubelet.wait()
	}

	if p != nil {
		if err := p.save(); err != nil {
			m.log.Warn("cannot save registry at shutdown", "error", err)
		}
	}
	return nil
}

// requestScan asks the running watcher for a scan; nothing before Run.
func (m *Manager) requestScan() {
	if w := m.watcher.Load(); w != nil {
		w.requestScan()
	}
}

// SetDeclarations replaces the declared plugins (a configuration reload).
// Only the plugins whose declaration changed are affected: a new or moved
// socket is supervised, a changed type restarts the plugin's supervision,
// and a plugin no longer declared is left to the other sources (its
// socket, if no other source names it, is deregistered after the grace
// period). A new required plugin starts its health_timeout now.
func (m *Manager) SetDeclarations(decls map[string]Declaration) error {
	if err := validateDeclarations(decls); err != nil {
		return err
	}
	m.reg.setDeclarations(decls)
	m.requestScan()
	return nil
}

// AbandonedSupervisors returns how many plugin supervisors did not stop
// within StopTimeout and were left behind. Each still holds a goroutine
// and the connection to a plugin that does not let go; a growing count
// means plugins that hang the agent's calls.
func (m *Manager) AbandonedSupervisors() uint64 { return m.rec.abandonedCount() }

// SetTiming applies new probe and fingerprint timing (a configuration
// reload) to every running supervisor and to those started later. The redial
// backoff and the write timeout of existing connections keep their old
// values.
func (m *Manager) SetTiming(probeInterval, probeTimeout, fingerprintInterval time.Duration) error {
	t := timing{ProbeInterval: probeInterval, ProbeTimeout: probeTimeout, FingerprintInterval: fingerprintInterval}
	if err := t.validate(); err != nil {
		return fmt.Errorf("registry: %w", err)
	}
	m.rec.setTiming(t)
	return nil
}

// Lookup returns plugin id's read model and its supervisor's live
// connection, so calls to the plugin share the connection the supervisor
// watches. ok is false when the plugin is not registered.
//
// The two always belong to one plugin instance: the connection is nil when
// the supervisor runs another instance than the record describes (the
// socket was replaced and the new instance is not fingerprinted yet), so a
// caller never reads one instance's capabilities and calls another. It is
// nil too when the instance has not answered a fingerprint yet (its
// capabilities are not known), and when nothing supervises the plugin (a
// record restored from disk whose socket has not been found). The
// connection closes when the supervisor stops (the socket was replaced or
// removed); calls on it then fail with codes.Canceled.
func (m *Manager) Lookup(id string) (*csisupdv1.Plugin, *csiclient.Client, bool) {
	// The record is read first: a supervisor registers its own instance,
	// so once the record names it the supervisor read after it is either
	// that one or a successor, which the instance check then refuses.
	p, ok := m.reg.Get(id)
	if !ok {
		return nil, nil, false
	}
	inst, c, ok := m.rec.lookup(id)
	if !ok || inst != p.Instance || !p.FingerprintOfInstance() {
		return p.Proto(), nil, true
	}
	return p.Proto(), c, true
}

// cleanPaths returns paths, each cleaned.
func cleanPaths(paths []string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = filepath.Clean(p)
	}
	return out
}
