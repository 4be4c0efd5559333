package testplugin

import (
	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
)

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
