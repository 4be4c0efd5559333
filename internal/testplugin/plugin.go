package testplugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
)

// Plugin types accepted in Config.Type.
const (
	// TypeController serves the Identity and Controller services.
	TypeController = "controller"
	// TypeNode serves the Identity and Node services.
	TypeNode = "node"
	// TypeMonolith serves the Identity, Controller and Node services.
	TypeMonolith = "monolith"
)

// Defaults applied by New to zero Config fields.
const (
	DefaultName          = "csi.testplugin.csisupd"
	DefaultVendorVersion = "1.0.0"
	// DefaultCapacity is the storage pool size reported by GetCapacity.
	DefaultCapacity int64 = 1 << 50
	// DefaultVolumeSize is the size of a volume created without a capacity range.
	DefaultVolumeSize int64 = 1 << 30
)

// maxSocketPath is the longest path a unix socket address can hold on Linux
// (108 bytes including the terminating NUL).
const maxSocketPath = 107

// ExitCrash is the exit status of a plugin process that crashes as armed
// (ArmCrash without Config.Crash), the same as csi-testplugin's
// --exit-after.
const ExitCrash = 3

// AnyNode in Config.KnownNodeIDs makes ControllerPublishVolume accept every
// node id.
const AnyNode = "*"

// DefaultControllerCapabilities are the controller capabilities advertised
// when Config.ControllerCapabilities is nil.
var DefaultControllerCapabilities = []csi.ControllerServiceCapability_RPC_Type{
	csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
	csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
	csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
	csi.ControllerServiceCapability_RPC_GET_CAPACITY,
	csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
	csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
	csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
	csi.ControllerServiceCapability_RPC_LIST_VOLUMES_PUBLISHED_NODES,
	csi.ControllerServiceCapability_RPC_GET_VOLUME,
}

// SupportedControllerCapabilities are all capabilities the plugin can
// advertise: the defaults, PUBLISH_READONLY, GET_SNAPSHOT, CLONE_VOLUME,
// MODIFY_VOLUME, GET_VOLUME_HEALTH and LIST_VOLUME_HEALTH. The ones beyond
// the defaults are opt-in, so that a client under test meets them only
// when its test asks for them.
var SupportedControllerCapabilities = append(slices.Clone(DefaultControllerCapabilities),
	csi.ControllerServiceCapability_RPC_PUBLISH_READONLY,
	csi.ControllerServiceCapability_RPC_GET_SNAPSHOT,
	csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
	csi.ControllerServiceCapability_RPC_MODIFY_VOLUME,
	csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH,
	csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH,
)

// DefaultTopologyKey is the default of Config.TopologyKey: the topology
// key of a node-local plugin's segments.
const DefaultTopologyKey = "topology.csisupd.io/node"

// Values of Config.Expansion: which volume expansion the plugin
// advertises and how it behaves.
const (
	// ExpansionOnline, the default, advertises the ONLINE VolumeExpansion
	// plugin capability (when the controller or the node can expand):
	// volumes grow while published.
	ExpansionOnline = "online"
	// ExpansionOffline advertises OFFLINE: ControllerExpandVolume refuses,
	// with FailedPrecondition, a volume published to any node. It needs
	// the EXPAND_VOLUME controller capability.
	ExpansionOffline = "offline"
	// ExpansionNone advertises no expansion: no VolumeExpansion plugin
	// capability and neither the controller nor the node EXPAND_VOLUME
	// capability.
	ExpansionNone = "none"
)

// DefaultMutableParameters are the mutable parameter keys accepted when
// Config.MutableParameters is nil.
var DefaultMutableParameters = []string{"iops", "throughput", "tier"}

// maxParameterValue is the longest mutable parameter value accepted, in
// bytes: the CSI size limit for strings.
const maxParameterValue = 128

// nameRE is the plugin name rule csi-sanity enforces (CSI: domain name notation).
var nameRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9._-]{0,61}[A-Za-z]$`)

// Plugin is a CSI plugin keeping volumes as records and directories under a
// state directory. All methods are safe for concurrent use.
type Plugin struct {
	cfg      Config
	logger   hclog.Logger
	caps     []csi.ControllerServiceCapability_RPC_Type
	nodeCaps []csi.NodeServiceCapability_RPC_Type
	topology map[string]string // accessible topology; nil = none
	mutable  map[string]bool   // accepted mutable parameter keys
	hasCtrl  bool
	hasNode  bool
	anyNode  bool
	known    map[string]bool
	st       *state
	lifeMu   sync.Mutex // serialises Start, Stop and Kill
	srv      *grpc.Server
	lis      *net.UnixListener
	done     chan struct{}      // closed when Serve returns
	runStop  context.CancelFunc // cancels the calls of the current server
	faultsMu sync.RWMutex
	faults   Faults
	statsMu  sync.Mutex
	stats    Stats
	nodeLog  []NodeCall // guarded by statsMu
	// secrets are the secrets each method was called with, in order;
	// guarded by statsMu.
	secrets  map[string][]map[string]string
	healthMu sync.Mutex
	health   map[string][]VolumeHealthStatus // by volume id
	storage  []StorageHealthStatus
	journal  *journal // nil without Config.Journal
	// slow is the delay of slow mode (SetSlow), in nanoseconds; 0 off.
	slow atomic.Int64
	// crashArmed makes the next mutating call crash (ArmCrash).
	crashArmed atomic.Bool
}

// New validates cfg, applies defaults and loads the state directory. It does
// not listen; call Start.
func New(cfg Config) (*Plugin, error) {
	if cfg.Socket == "" {
		return nil, errors.New("testplugin: Config.Socket is required")
	}
	if len(cfg.Socket) > maxSocketPath {
		return nil, fmt.Errorf("testplugin: Config.Socket %q is %d bytes, longer than the %d-byte unix socket limit", cfg.Socket, len(cfg.Socket), maxSocketPath)
	}
	if cfg.StateDir == "" {
		return nil, errors.New("testplugin: Config.StateDir is required")
	}
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if !nameRE.MatchString(cfg.Name) {
		return nil, fmt.Errorf("testplugin: Config.Name %q is not a valid CSI plugin name (%s)", cfg.Name, nameRE)
	}
	if cfg.VendorVersion == "" {
		cfg.VendorVersion = DefaultVendorVersion
	}
	if cfg.Type == "" {
		cfg.Type = TypeMonolith
	}
	p := &Plugin{known: make(map[string]bool)}
	switch cfg.Type {
	case TypeController:
		p.hasCtrl = true
	case TypeNode:
		p.hasNode = true
	case TypeMonolith:
		p.hasCtrl, p.hasNode = true, true
	default:
		return nil, fmt.Errorf("testplugin: Config.Type %q is not %q, %q or %q", cfg.Type, TypeController, TypeNode, TypeMonolith)
	}
	if cfg.NodeID == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "localhost"
		}
		cfg.NodeID = host
	}
	if cfg.MaxVolumes < 0 {
		return nil, fmt.Errorf("testplugin: Config.MaxVolumes is %d, must not be negative", cfg.MaxVolumes)
	}
	if cfg.Capacity < 0 {
		return nil, fmt.Errorf("testplugin: Config.Capacity is %d, must not be negative", cfg.Capacity)
	}
	if cfg.Capacity == 0 {
		cfg.Capacity = DefaultCapacity
	}
	switch cfg.Mounts {
	case "":
		cfg.Mounts = MountsMarker
	case MountsMarker, MountsBind:
	default:
		return nil, fmt.Errorf("testplugin: Config.Mounts %q is not %q or %q", cfg.Mounts, MountsMarker, MountsBind)
	}
	for k := range cfg.Topology {
		if k == "" {
			return nil, errors.New("testplugin: Config.Topology has an empty key")
		}
	}
	cfg.Topology = maps.Clone(cfg.Topology)
	p.topology = maps.Clone(cfg.Topology)
	if err := p.nodeLocal(&cfg); err != nil {
		return nil, err
	}
	p.caps = DefaultControllerCapabilities
	if cfg.ControllerCapabilities != nil {
		p.caps = nil
		for _, c := range cfg.ControllerCapabilities {
			if !slices.Contains(SupportedControllerCapabilities, c) {
				return nil, fmt.Errorf("testplugin: Config.ControllerCapabilities: %s is not supported", c)
			}
			if !slices.Contains(p.caps, c) {
				p.caps = append(p.caps, c)
			}
		}
	}
	p.caps = slices.Clone(p.caps)
	if err := p.capabilities(&cfg); err != nil {
		return nil, err
	}
	p.known[cfg.NodeID] = true
	for _, id := range cfg.KnownNodeIDs {
		if id == AnyNode {
			p.anyNode = true
		}
		p.known[id] = true
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	p.logger = cfg.Logger.Named("testplugin").With("socket", cfg.Socket)
	st, err := openState(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	p.st = st
	p.cfg = cfg
	p.stats = newStats()
	if cfg.Journal != "" {
		p.journal = newJournal(cfg.Journal, cfg.Name, cfg.NodeID)
	}
	return p, nil
}

// Config returns a copy of the plugin's configuration with defaults applied.
func (p *Plugin) Config() Config {
	cfg := p.cfg
	cfg.Topology = maps.Clone(cfg.Topology)
	cfg.KnownNodeIDs = slices.Clone(cfg.KnownNodeIDs)
	cfg.ControllerCapabilities = slices.Clone(p.caps)
	cfg.MutableParameters = slices.Clone(cfg.MutableParameters)
	return cfg
}

// nodeLocal checks the node-local settings of cfg, applies their
// defaults and sets the plugin's topology.
func (p *Plugin) nodeLocal(cfg *Config) error {
	if !cfg.NodeLocal {
		if cfg.TopologyKey != "" {
			return fmt.Errorf("testplugin: Config.TopologyKey %q is set without Config.NodeLocal", cfg.TopologyKey)
		}
		return nil
	}
	switch {
	case len(cfg.Topology) > 0:
		return errors.New("testplugin: Config.NodeLocal and Config.Topology exclude each other: a node-local plugin's topology is its node")
	case cfg.ForeignVolumes:
		return errors.New("testplugin: Config.NodeLocal and Config.ForeignVolumes exclude each other: a node-local plugin serves only its own volumes")
	case cfg.Type == TypeNode:
		return errors.New("testplugin: Config.NodeLocal needs a controller (Config.Type controller or monolith): a node-local plugin creates its own volumes")
	}
	if cfg.TopologyKey == "" {
		cfg.TopologyKey = DefaultTopologyKey
	}
	p.topology = map[string]string{cfg.TopologyKey: cfg.NodeID}
	return nil
}

// capabilities checks the expansion, mutable parameter and content
// settings of cfg, applies their defaults, and fixes the controller and
// node capabilities that follow from them.
func (p *Plugin) capabilities(cfg *Config) error {
	has := func(c csi.ControllerServiceCapability_RPC_Type) bool { return slices.Contains(p.caps, c) }
	p.nodeCaps = []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
	}
	switch cfg.Expansion {
	case "":
		cfg.Expansion = ExpansionOnline
		fallthrough
	case ExpansionOnline:
		p.nodeCaps = append(p.nodeCaps, csi.NodeServiceCapability_RPC_EXPAND_VOLUME)
	case ExpansionOffline:
		// CSI: OFFLINE expansion happens in ControllerExpandVolume.
		if !has(csi.ControllerServiceCapability_RPC_EXPAND_VOLUME) {
			return errors.New("testplugin: Config.Expansion offline needs the EXPAND_VOLUME controller capability")
		}
		p.nodeCaps = append(p.nodeCaps, csi.NodeServiceCapability_RPC_EXPAND_VOLUME)
	case ExpansionNone:
		if cfg.ControllerCapabilities != nil && has(csi.ControllerServiceCapability_RPC_EXPAND_VOLUME) {
			return errors.New("testplugin: Config.Expansion none excludes EXPAND_VOLUME in Config.ControllerCapabilities")
		}
		p.caps = slices.DeleteFunc(p.caps, func(c csi.ControllerServiceCapability_RPC_Type) bool {
			return c == csi.ControllerServiceCapability_RPC_EXPAND_VOLUME
		})
	default:
		return fmt.Errorf("testplugin: Config.Expansion %q is not %q, %q or %q", cfg.Expansion, ExpansionOnline, ExpansionOffline, ExpansionNone)
	}
	if cfg.VolumeHealth {
		p.nodeCaps = append(p.nodeCaps, csi.NodeServiceCapability_RPC_GET_VOLUME_HEALTH, csi.NodeServiceCapability_RPC_GET_STORAGE_HEALTH)
	}
	if cfg.VolumeMountGroup {
		p.nodeCaps = append(p.nodeCaps, csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP)
	}
	// CSI: a plugin with LIST_VOLUME_HEALTH must also have GET_VOLUME_HEALTH.
	if has(csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH) && !has(csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH) {
		return errors.New("testplugin: Config.ControllerCapabilities has LIST_VOLUME_HEALTH without GET_VOLUME_HEALTH")
	}
	if cfg.MutableParameters == nil {
		cfg.MutableParameters = DefaultMutableParameters
	}
	cfg.MutableParameters = slices.Clone(cfg.MutableParameters)
	p.mutable = make(map[string]bool)
	for _, k := range cfg.MutableParameters {
		if k == "" {
			return errors.New("testplugin: Config.MutableParameters has an empty key")
		}
		p.mutable[k] = true
	}
	if cfg.SnapshotReadyAfter < 0 {
		return fmt.Errorf("testplugin: Config.SnapshotReadyAfter is %d, must not be negative", cfg.SnapshotReadyAfter)
	}
	switch {
	case cfg.MaxContentBytes < 0:
		return fmt.Errorf("testplugin: Config.MaxContentBytes is %d, must not be negative", cfg.MaxContentBytes)
	case cfg.MaxContentBytes == 0:
		cfg.MaxContentBytes = DefaultMaxContentBytes
	}
	return nil
}

// Socket returns the path of the plugin's unix socket.
func (p *Plugin) Socket() string {
	return p.cfg.Socket
}

// Start removes a stale socket file (one nobody listens on, as a killed
// plugin leaves), listens on the socket and serves in the background. It
// fails when the plugin is already serving, when another process listens on
// the socket, or when a file that is not a socket is in the way.
func (p *Plugin) Start() error {
	p.lifeMu.Lock()
	defer p.lifeMu.Unlock()
	if p.srv != nil {
		return fmt.Errorf("testplugin: socket %q: already serving", p.cfg.Socket)
	}
	if err := removeStaleSocket(p.cfg.Socket); err != nil {
		return err
	}
	if p.journal != nil {
		if err := p.journal.open(); err != nil {
			return err
		}
	}
	l, err := net.Listen("unix", p.cfg.Socket)
	if err != nil {
		p.closeJournal()
		return fmt.Errorf("testplugin: listen on socket %q: %w", p.cfg.Socket, err)
	}
	runCtx, runStop := context.WithCancel(context.Background())
	srv := grpc.NewServer(
		grpc.UnaryInterceptor(p.interceptor(runCtx)),
		// Small buffers keep a thousand plugins in one process cheap.
		grpc.ReadBufferSize(4<<10),
		grpc.WriteBufferSize(4<<10),
	)
	csi.RegisterIdentityServer(srv, &identityServer{p: p})
	if p.hasCtrl {
		csi.RegisterControllerServer(srv, &controllerServer{p: p})
	}
	if p.hasNode {
		csi.RegisterNodeServer(srv, &nodeServer{p: p})
	}
	p.srv = srv
	p.runStop = runStop
	p.lis = l.(*net.UnixListener)
	p.done = make(chan struct{})
	go func(done chan struct{}) {
		defer close(done)
		// Serve returns nil after Stop/GracefulStop; any other error means
		// the listener broke, which callers see as refused connections.
		if err := srv.Serve(l); err != nil {
			p.logger.Debug("serve ended", "error", err)
		}
	}(p.done)
	p.logger.Debug("serving", "type", p.cfg.Type)
	return nil
}

// Stop stops serving: it ends delayed and hanging calls, waits for running
// calls to return, closes all connections and removes the socket file.
// Stop on a plugin that is not serving, killed ones included, does nothing:
// the socket path may belong to another instance by then.
func (p *Plugin) Stop() {
	p.lifeMu.Lock()
	defer p.lifeMu.Unlock()
	if p.srv == nil {
		return
	}
	p.runStop()
	p.srv.GracefulStop()
	<-p.done
	p.srv, p.lis = nil, nil
	p.closeJournal()
	if err := os.Remove(p.cfg.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		p.logger.Warn("cannot remove socket", "error", err)
	}
}

// Kill stops serving abruptly, like a crashed process: the listener and all
// connections close at once, running calls are cancelled, and the socket file
// stays in place so that dialing it is refused. Start works again afterwards.
func (p *Plugin) Kill() {
	p.lifeMu.Lock()
	defer p.lifeMu.Unlock()
	if p.srv == nil {
		return
	}
	p.lis.SetUnlinkOnClose(false)
	p.runStop()
	p.srv.Stop()
	<-p.done
	p.srv, p.lis = nil, nil
	// A call still running after Stop cannot write its end record any
	// more and fails, as in a crashed process; its begin record stays.
	p.closeJournal()
}

// closeJournal closes the journal file, when there is one.
func (p *Plugin) closeJournal() {
	if p.journal != nil {
		p.journal.close()
	}
}

// mutating are the methods that change a volume, a snapshot or a mount:
// the calls ArmCrash crashes in.
var mutating = map[string]bool{
	"CreateVolume": true, "DeleteVolume": true, "ControllerPublishVolume": true, "ControllerUnpublishVolume": true,
	"CreateSnapshot": true, "DeleteSnapshot": true, "ControllerExpandVolume": true, "ControllerModifyVolume": true,
	"NodeStageVolume": true, "NodeUnstageVolume": true, "NodePublishVolume": true, "NodeUnpublishVolume": true,
	"NodeExpandVolume": true,
}

// removeStaleSocket removes a socket file nobody listens on and creates the
// socket's directory.
func removeStaleSocket(sock string) error {
	fi, err := os.Lstat(sock)
	switch {
	case errors.Is(err, os.ErrNotExist):
		dir := filepath.Dir(sock)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("testplugin: socket %q: create directory: %w", sock, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("testplugin: socket %q: %w", sock, err)
	case fi.Mode().Type() != os.ModeSocket:
		return fmt.Errorf("testplugin: socket %q: a file that is not a socket is in the way", sock)
	}
	if conn, err := net.DialTimeout("unix", sock, time.Second); err == nil {
		conn.Close()
		return fmt.Errorf("testplugin: socket %q: another process is listening on it", sock)
	}
	if err := os.Remove(sock); err != nil {
		return fmt.Errorf("testplugin: remove stale socket %q: %w", sock, err)
	}
	return nil
}
