package testplugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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

// Config configures one plugin instance.
type Config struct {
	// Socket is the unix socket path the plugin listens on. Required; at
	// most 107 bytes. Its directory is created by Start when missing.
	Socket string
	// StateDir holds the volume, snapshot and node records and one data
	// directory per volume. Required. A plugin created again on the same
	// StateDir sees the same volumes.
	StateDir string
	// Name is the CSI plugin name (default DefaultName).
	Name string
	// VendorVersion is reported by GetPluginInfo (default DefaultVendorVersion).
	VendorVersion string
	// Type is TypeController, TypeNode or TypeMonolith (default).
	Type string
	// NodeID is reported by NodeGetInfo and always accepted by
	// ControllerPublishVolume (default: the host name).
	NodeID string
	// MaxVolumes is NodeGetInfo's max_volumes_per_node and the number of
	// volumes ControllerPublishVolume attaches to one node (0 = no limit).
	MaxVolumes int64
	// Topology is the node's accessible topology. When set, the plugin
	// advertises VOLUME_ACCESSIBILITY_CONSTRAINTS and volumes are created
	// in this one topology segment.
	Topology map[string]string
	// KnownNodeIDs are node ids, besides NodeID, that ControllerPublishVolume
	// accepts. AnyNode accepts every id.
	KnownNodeIDs []string
	// Crash is what a call armed by ArmCrash calls after its work; nil
	// exits the process with status ExitCrash. Tests set it to observe
	// the crash in process.
	Crash func()
	// ForeignVolumes makes the node service serve every well-formed volume
	// id, as a node-only plugin does, rather than only the volumes this
	// instance's controller created: the instances of one plugin on
	// several nodes each keep their own state directory, and a volume
	// created by one is staged on the others.
	ForeignVolumes bool
	// ControllerCapabilities overrides the advertised controller
	// capabilities with a subset of SupportedControllerCapabilities; nil
	// means DefaultControllerCapabilities (without EXPAND_VOLUME when
	// Expansion is ExpansionNone). Controller RPCs whose capability is not
	// advertised return Unimplemented.
	ControllerCapabilities []csi.ControllerServiceCapability_RPC_Type
	// Capacity is the total size of the storage pool (default DefaultCapacity).
	Capacity int64
	// Mounts is how the node service places volumes: MountsMarker (the
	// default) or MountsBind.
	Mounts string
	// NodeLocal makes the plugin behave like a node-local driver
	// (hostpath, local-path, LVM, ZFS): its accessible topology, and that
	// of every volume it creates, is {TopologyKey: NodeID}, and it
	// advertises VOLUME_ACCESSIBILITY_CONSTRAINTS. CreateVolume ignores
	// the requisite and preferred topology and creates on this node
	// anyway, as such drivers do; ControllerPublishVolume refuses other
	// nodes with FailedPrecondition; the node service serves only the
	// volumes this instance created. Not with Topology, ForeignVolumes or
	// TypeNode.
	NodeLocal bool
	// TopologyKey is the topology key of NodeLocal (default
	// DefaultTopologyKey). Only with NodeLocal.
	TopologyKey string
	// Expansion is ExpansionOnline (the default), ExpansionOffline or
	// ExpansionNone.
	Expansion string
	// NodeExpansionRequired makes ControllerExpandVolume answer
	// node_expansion_required=true, so a CO calls NodeExpandVolume on
	// every node the volume is staged or published on, and the node
	// keeps the old size until it does. Without it the answer is false
	// and the node sees the new size at once.
	NodeExpansionRequired bool
	// MutableParameters are the keys CreateVolume's mutable_parameters
	// and ControllerModifyVolume accept; other keys are InvalidArgument.
	// nil means DefaultMutableParameters; an empty list accepts none.
	MutableParameters []string
	// RequiredSecrets makes the plugin refuse, with Unauthenticated, every
	// call that can carry secrets (its request has a secrets field) and
	// lacks one of these or has another value, as drivers that
	// authenticate each call to their storage do (Ceph RBD, many SAN
	// arrays). The error names the key, never a value.
	RequiredSecrets map[string]string
	// SnapshotReadyAfter makes a new snapshot report ready_to_use=false
	// in CreateSnapshot's answer and in the next SnapshotReadyAfter
	// answers that include it (repeated CreateSnapshot, GetSnapshot,
	// ListSnapshots), then true. 0 makes snapshots ready at once.
	SnapshotReadyAfter int
	// MaxContentBytes bounds the file bytes a snapshot, restore or clone
	// copies (default DefaultMaxContentBytes); a larger copy fails with
	// ResourceExhausted. MaxContentEntries bounds the number of files.
	MaxContentBytes int64
	// VolumeHealth advertises the node capabilities GET_VOLUME_HEALTH and
	// GET_STORAGE_HEALTH. The controller's GET_VOLUME_HEALTH and
	// LIST_VOLUME_HEALTH come with ControllerCapabilities. Conditions are
	// set with Plugin.SetVolumeHealth and Plugin.SetStorageHealth.
	VolumeHealth bool
	// VolumeConditionsFile, when set, names a file of volumes to report
	// abnormal besides those of SetVolumeHealth, so that a test or an
	// operator can turn a volume of a plugin process abnormal and back:
	// one volume a line, "<volume id> <message>", read again by every
	// health call (a missing file lists none; at most 64 KiB are read;
	// blank lines and lines starting with # are skipped). A listed volume
	// is DEGRADED with reason ReasonAbnormal and the line's message.
	VolumeConditionsFile string
	// VolumeMountGroup advertises the VOLUME_MOUNT_GROUP node capability:
	// NodeStageVolume and NodePublishVolume accept a numeric group id in
	// volume_capability.mount.volume_mount_group, record it, and with
	// MountsBind give the volume's directory to that group (group
	// read-write-search and set-group-id, so new files join the group).
	// Without it a mount group is InvalidArgument.
	VolumeMountGroup bool
	// Journal, when set, is a file to which the plugin appends a
	// JournalRecord line when every Node and Controller call begins and
	// another when it ends (Identity calls are left out), each synced
	// before the call goes on, so the file holds a record of every effect
	// a caller could have seen even if the process is killed right after
	// an answer. The file is opened by Start, created when missing and
	// appended to, never truncated, so a plugin started again on the same
	// path adds to it. Secrets are never written, only their keys. When a
	// record cannot be written the call fails with Internal: with the
	// begin record before any effect; with the end record after the
	// effect, which the begin record then covers as an unknown outcome.
	Journal string
	// Logger receives debug logs of every call (default: discard).
	Logger hclog.Logger
}

// Faults are runtime fault knobs, set with Plugin.SetFaults. The zero value
// injects nothing. Delays end early, with the context's error, when the
// call's context ends or the plugin stops.
type Faults struct {
	// ProbeNotReady makes Probe answer ready=false.
	ProbeNotReady bool
	// ProbeError makes Probe fail with this code (codes.OK = no error).
	ProbeError codes.Code
	// ProbeDelay delays every Probe answer.
	ProbeDelay time.Duration
	// ProbeHang makes Probe block until the call's context ends.
	ProbeHang bool
	// PublishDelay delays every ControllerPublishVolume call.
	PublishDelay time.Duration
	// Delays delays calls by method name (for example "CreateVolume").
	Delays map[string]time.Duration
	// Errors fails calls by method name with the given code, after any delay.
	Errors map[string]codes.Code
	// AnswerDelays delays the answer of calls by method name after the
	// call has done its work: a caller that gives up, or dies, in the
	// meantime loses an answer whose effect is already there.
	AnswerDelays map[string]time.Duration
}

// Stats counts calls by method name (for example "ControllerPublishVolume").
// Only calls to registered services are counted.
type Stats struct {
	// Calls is the number of calls received, including failed ones.
	Calls map[string]int64
	// InFlight is the number of calls running now.
	InFlight map[string]int64
	// MaxInFlight is the highest number of calls that ran at the same time.
	MaxInFlight map[string]int64
}

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

// maxNodeLog bounds the node call log; older calls are dropped.
const maxNodeLog = 10000

// NodeCall is one successful node call that changes a volume on the
// node: NodeStageVolume, NodeUnstageVolume, NodePublishVolume,
// NodeUnpublishVolume or NodeExpandVolume, as the plugin received it.
type NodeCall struct {
	Method   string
	VolumeID string
	// Path is the staging target path of stage and unstage calls, the
	// target path of publish and unpublish calls and the volume_path of
	// expand calls.
	Path string
	// StagingPath is the staging target path of a publish or expand call.
	StagingPath string
	// MountGroup is the volume_mount_group of a stage or publish call.
	MountGroup string
	// RequiredBytes and LimitBytes are the capacity range of an expand
	// call.
	RequiredBytes, LimitBytes int64
}

// NodeLog returns the successful node calls in the order they ended, the
// oldest first (at most the last 10000).
func (p *Plugin) NodeLog() []NodeCall {
	p.statsMu.Lock()
	defer p.statsMu.Unlock()
	return slices.Clone(p.nodeLog)
}

// NodeVolume is the node record of one volume: where it is staged and
// published on this node.
type NodeVolume struct {
	StagingPath string
	// Targets are the target paths it is published at, sorted.
	Targets []string
	// MountGroup is the volume_mount_group it was staged with.
	MountGroup string
	// TargetMountGroups are the volume_mount_groups of the targets
	// published with one, by target path; nil when none was.
	TargetMountGroups map[string]string
	// CapacityBytes is the volume's size as this node sees it: its size
	// when staged, grown by NodeExpandVolume, and without
	// Config.NodeExpansionRequired by ControllerExpandVolume at once.
	CapacityBytes int64
}

// NodeVolumes returns the node records of the volumes staged or published
// on this node, by volume id. Volumes neither staged nor published are
// left out.
func (p *Plugin) NodeVolumes() map[string]NodeVolume {
	p.st.mu.Lock()
	defer p.st.mu.Unlock()
	out := make(map[string]NodeVolume)
	for id, n := range p.st.node {
		if n.StagingPath == "" && len(n.Targets) == 0 {
			continue
		}
		nv := NodeVolume{StagingPath: n.StagingPath, Targets: slices.Sorted(maps.Keys(n.Targets)),
			MountGroup: n.StageGroup, CapacityBytes: p.nodeCapacity(n)}
		for path, t := range n.Targets {
			if t.MountGroup != "" {
				if nv.TargetMountGroups == nil {
					nv.TargetMountGroups = make(map[string]string)
				}
				nv.TargetMountGroups[path] = t.MountGroup
			}
		}
		out[id] = nv
	}
	return out
}

// logNodeCall records a successful node call in the node log.
func (p *Plugin) logNodeCall(req any) {
	var c NodeCall
	switch r := req.(type) {
	case *csi.NodeStageVolumeRequest:
		c = NodeCall{Method: "NodeStageVolume", VolumeID: r.GetVolumeId(), Path: r.GetStagingTargetPath(),
			MountGroup: r.GetVolumeCapability().GetMount().GetVolumeMountGroup()}
	case *csi.NodeUnstageVolumeRequest:
		c = NodeCall{Method: "NodeUnstageVolume", VolumeID: r.GetVolumeId(), Path: r.GetStagingTargetPath()}
	case *csi.NodePublishVolumeRequest:
		c = NodeCall{Method: "NodePublishVolume", VolumeID: r.GetVolumeId(), Path: r.GetTargetPath(), StagingPath: r.GetStagingTargetPath(),
			MountGroup: r.GetVolumeCapability().GetMount().GetVolumeMountGroup()}
	case *csi.NodeUnpublishVolumeRequest:
		c = NodeCall{Method: "NodeUnpublishVolume", VolumeID: r.GetVolumeId(), Path: r.GetTargetPath()}
	case *csi.NodeExpandVolumeRequest:
		c = NodeCall{Method: "NodeExpandVolume", VolumeID: r.GetVolumeId(), Path: r.GetVolumePath(), StagingPath: r.GetStagingTargetPath(),
			RequiredBytes: r.GetCapacityRange().GetRequiredBytes(), LimitBytes: r.GetCapacityRange().GetLimitBytes()}
	default:
		return
	}
	p.statsMu.Lock()
	defer p.statsMu.Unlock()
	if len(p.nodeLog) == maxNodeLog {
		p.nodeLog = slices.Delete(p.nodeLog, 0, 1)
	}
	p.nodeLog = append(p.nodeLog, c)
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

// SetFaults replaces the fault knobs; it copies f's maps.
func (p *Plugin) SetFaults(f Faults) {
	f.Delays = maps.Clone(f.Delays)
	f.Errors = maps.Clone(f.Errors)
	p.faultsMu.Lock()
	p.faults = f
	p.faultsMu.Unlock()
}

func (p *Plugin) currentFaults() Faults {
	p.faultsMu.RLock()
	defer p.faultsMu.RUnlock()
	return p.faults
}

// Stats returns a copy of the call counters.
func (p *Plugin) Stats() Stats {
	p.statsMu.Lock()
	defer p.statsMu.Unlock()
	return Stats{
		Calls:       maps.Clone(p.stats.Calls),
		InFlight:    maps.Clone(p.stats.InFlight),
		MaxInFlight: maps.Clone(p.stats.MaxInFlight),
	}
}

// ResetStats zeroes the call counters; MaxInFlight restarts from the calls
// running now.
// Secrets returns the secrets of every call of method received so far
// (nil entries for calls without any), in order, so that tests can check
// what reached the plugin.
func (p *Plugin) Secrets(method string) []map[string]string {
	p.statsMu.Lock()
	defer p.statsMu.Unlock()
	var out []map[string]string
	for _, m := range p.secrets[method] {
		out = append(out, maps.Clone(m))
	}
	return out
}

// recordSecrets keeps the secrets of a request that has them.
func (p *Plugin) recordSecrets(method string, req any) {
	r, ok := req.(interface{ GetSecrets() map[string]string })
	if !ok {
		return
	}
	p.statsMu.Lock()
	defer p.statsMu.Unlock()
	if p.secrets == nil {
		p.secrets = map[string][]map[string]string{}
	}
	p.secrets[method] = append(p.secrets[method], maps.Clone(r.GetSecrets()))
}

// checkSecrets refuses a call that can carry secrets and lacks
// Config.RequiredSecrets.
func (p *Plugin) checkSecrets(method string, req any) error {
	r, ok := req.(interface{ GetSecrets() map[string]string })
	if !ok {
		return nil
	}
	for _, k := range slices.Sorted(maps.Keys(p.cfg.RequiredSecrets)) {
		if got, ok := r.GetSecrets()[k]; !ok || got != p.cfg.RequiredSecrets[k] {
			return status.Errorf(codes.Unauthenticated, "testplugin: %s needs secret %q, missing or wrong", method, k)
		}
	}
	return nil
}

func (p *Plugin) ResetStats() {
	p.statsMu.Lock()
	defer p.statsMu.Unlock()
	inFlight := p.stats.InFlight
	p.stats = newStats()
	for m, n := range inFlight {
		if n > 0 {
			p.stats.InFlight[m] = n
			p.stats.MaxInFlight[m] = n
		}
	}
}

func newStats() Stats {
	return Stats{
		Calls:       make(map[string]int64),
		InFlight:    make(map[string]int64),
		MaxInFlight: make(map[string]int64),
	}
}

// interceptor returns the server's interceptor: it counts every call,
// cancels it when runCtx ends (the plugin stops), applies the method
// delays and errors of the current faults, and with Config.Journal
// journals Node and Controller calls before they start and before they
// answer.
func (p *Plugin) interceptor(runCtx context.Context) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		method := path.Base(info.FullMethod)
		p.recordSecrets(method, req)
		// Read before the call is counted: a call that Stats shows in
		// flight has its slow delay, whatever SetSlow does after.
		slow := time.Duration(p.slow.Load())
		p.callStarted(method)
		defer p.callEnded(method)
		if err := p.checkSecrets(method, req); err != nil {
			return nil, err
		}

		var rec JournalRecord
		jn := p.journal != nil && journaled(info.FullMethod)
		if jn {
			// Before anything else, so a record covers every effect.
			rec = journalRequest(method, req)
			rec.Phase = JournalBegin
			if err := p.journal.write(&rec); err != nil {
				return nil, status.Errorf(codes.Internal, "testplugin: %s not done: %v", method, err)
			}
		}

		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(runCtx, cancel)()

		if slow > 0 && journaled(info.FullMethod) {
			// Slow mode waits whatever the caller does: a slow plugin
			// acts late, after its caller may have given up. Only
			// stopping the plugin ends the wait early.
			if err := sleep(runCtx, slow); err != nil {
				return nil, err
			}
		}

		f := p.currentFaults()
		delay := f.Delays[method]
		if method == "ControllerPublishVolume" {
			delay += f.PublishDelay
		}
		resp, err := p.serve(ctx, req, method, delay, f.Errors[method], handler)
		if mutating[method] && p.crashArmed.CompareAndSwap(true, false) {
			// The work is done and saved; its caller is never told, and
			// the journal has no end record for it.
			p.logger.Info("crashing in the middle of a call, as armed", "method", method, "code", status.Code(err))
			p.crash()
		}
		if jn {
			// Before the answer: a caller never sees an effect the
			// journal does not hold. Code is the work's outcome; a
			// lost answer below does not undo the effect.
			journalOutcome(&rec, resp, err)
			if jerr := p.journal.write(&rec); jerr != nil {
				return nil, status.Errorf(codes.Internal, "testplugin: %s done with code %s but not journaled: %v", method, status.Code(err), jerr)
			}
		}
		p.logger.Debug("call", "method", method, "code", status.Code(err))
		if err == nil {
			if err := sleep(ctx, f.AnswerDelays[method]); err != nil {
				return nil, err
			}
		}
		return resp, err
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

// SetSlow turns slow mode on with delay d, or off with 0: every Node and
// Controller call that starts after it waits d before its work, even
// after its caller gave up (a stopped plugin's calls end early). A call
// that Stats already counts in flight keeps the delay it started with.
// Faults.Delays, which end with the caller, still apply after it.
func (p *Plugin) SetSlow(d time.Duration) {
	p.slow.Store(int64(max(d, 0)))
}

// ArmCrash makes the next mutating call (CreateVolume, NodePublishVolume
// and the like) crash after its work is done and saved, before its answer
// and before the journal's end record: Config.Crash is called, and
// without it the process exits with status 3. One call crashes per
// arming.
func (p *Plugin) ArmCrash() { p.crashArmed.Store(true) }

func (p *Plugin) crash() {
	if p.cfg.Crash != nil {
		p.cfg.Crash()
		return
	}
	os.Exit(ExitCrash)
}

// serve runs one call: the injected delay and error, then the handler,
// logging a successful node call.
func (p *Plugin) serve(ctx context.Context, req any, method string, delay time.Duration, code codes.Code, handler grpc.UnaryHandler) (any, error) {
	if err := sleep(ctx, delay); err != nil {
		return nil, err
	}
	if code != codes.OK {
		return nil, status.Errorf(code, "testplugin: injected %s error for %s", code, method)
	}
	resp, err := handler(ctx, req)
	if err == nil {
		p.logNodeCall(req)
	}
	return resp, err
}

func (p *Plugin) callStarted(method string) {
	p.statsMu.Lock()
	defer p.statsMu.Unlock()
	p.stats.Calls[method]++
	p.stats.InFlight[method]++
	if n := p.stats.InFlight[method]; n > p.stats.MaxInFlight[method] {
		p.stats.MaxInFlight[method] = n
	}
}

func (p *Plugin) callEnded(method string) {
	p.statsMu.Lock()
	defer p.statsMu.Unlock()
	p.stats.InFlight[method]--
}

// sleep waits for d or until ctx ends, then returns ctx's error as a status.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
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
