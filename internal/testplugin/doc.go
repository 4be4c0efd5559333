// Package testplugin is a small but real CSI plugin for tests, benchmarks and
// the agent's development mode. It serves the CSI Identity, Controller and
// Node services over gRPC on a unix socket.
//
// # Types
//
// Config.Type picks the services: TypeController registers Identity and
// Controller and advertises CONTROLLER_SERVICE; TypeNode registers Identity
// and Node (Controller calls return Unimplemented); TypeMonolith, the
// default, registers all three. GetPluginCapabilities adds
// VOLUME_ACCESSIBILITY_CONSTRAINTS when Config.Topology is set or the plugin
// is node-local, and the volume expansion of Config.Expansion.
//
// Controller capabilities are DefaultControllerCapabilities unless
// Config.ControllerCapabilities picks a subset of
// SupportedControllerCapabilities; CLONE_VOLUME, MODIFY_VOLUME,
// GET_VOLUME_HEALTH, LIST_VOLUME_HEALTH, PUBLISH_READONLY and GET_SNAPSHOT
// are opt-in. The node advertises STAGE_UNSTAGE_VOLUME and
// GET_VOLUME_STATS; EXPAND_VOLUME unless Config.Expansion is ExpansionNone;
// GET_VOLUME_HEALTH and GET_STORAGE_HEALTH with Config.VolumeHealth;
// VOLUME_MOUNT_GROUP with Config.VolumeMountGroup.
//
// # Topology and node-local plugins
//
// With Config.Topology the plugin lives in one topology segment: volumes
// are created there, and CreateVolume fails with ResourceExhausted when no
// requisite topology matches it. With Config.NodeLocal the plugin behaves
// like a node-local driver (hostpath, local-path, LVM, ZFS): the instance's
// and every volume's accessible topology is {Config.TopologyKey:
// Config.NodeID} (DefaultTopologyKey by default); CreateVolume ignores the
// requisite and preferred topology and creates on its own node anyway,
// reporting that node as the volume's topology, as such drivers do. Volumes
// and snapshots live only on the instance that made them (each has its own
// state directory): every controller call naming another instance's volume
// or snapshot fails with NotFound (ControllerPublishVolume,
// ControllerExpandVolume, ControllerGetVolume, ControllerModifyVolume,
// ValidateVolumeCapabilities, ControllerGetVolumeHealth, CreateSnapshot's
// source, CreateVolume's content source, GetSnapshot), listings leave it
// out, and DeleteVolume and DeleteSnapshot of it succeed, as CSI says.
// ControllerPublishVolume to another node fails with FailedPrecondition, and
// the node service serves only the instance's own volumes.
//
// # Volumes
//
// Volumes and snapshots are JSON records under Config.StateDir, and every
// volume has a directory there, so a plugin created again on the same state
// directory sees the same volumes, snapshots, attachments and node
// publications. The controller follows the CSI rules: CreateVolume and
// CreateSnapshot are idempotent by name and return AlreadyExists for the same
// name with another capacity, parameters or source; unknown ids are NotFound
// (deletes of unknown ids succeed); listings page with max_entries and
// starting_token and return Aborted for a token they did not issue;
// ControllerPublishVolume accepts Config.NodeID and Config.KnownNodeIDs
// (AnyNode accepts all), keeps single-node access modes on one node, enforces
// Config.MaxVolumes per node and returns a publish context. Controller RPCs
// whose capability is not advertised (see Config.ControllerCapabilities)
// return Unimplemented. Only mount access is supported: volumes are
// directories, not block devices.
//
// # Snapshots, restores and clones
//
// CreateSnapshot copies the source volume's directory into the snapshot:
// regular files, directories and symbolic links (not followed), with their
// mode bits, and their owners when the plugin runs as root; other files
// fail with FailedPrecondition. CreateVolume with a snapshot source starts
// with a copy of the snapshot's content, and with a volume source (a clone,
// with CLONE_VOLUME) with a copy of the source volume's current content;
// the answer names the content source. A copy of more than
// Config.MaxContentBytes file bytes (DefaultMaxContentBytes) or
// MaxContentEntries entries fails with ResourceExhausted and leaves
// nothing behind. DeleteSnapshot removes the snapshot's content. With
// MountsBind the volume's directory is what is bind-mounted, so what a
// workload writes at its target is what a snapshot or clone copies.
// Config.SnapshotReadyAfter makes new snapshots report ready_to_use=false
// in CreateSnapshot's answer and that many further answers (repeated
// CreateSnapshot, GetSnapshot, ListSnapshots) before they are ready; a
// volume can be restored from a snapshot that is not ready yet.
//
// # Expansion, modification, health and mount groups
//
// Config.Expansion is ExpansionOnline (the default), ExpansionOffline (the
// OFFLINE plugin capability; ControllerExpandVolume fails with
// FailedPrecondition while the volume is published to any node) or
// ExpansionNone (no expansion capability at all). Expansion never
// shrinks: asking for no more than the current size succeeds with the
// current size, as CSI says (csi-sanity accepts it), and a limit_bytes
// below the current size fails with OutOfRange. ControllerExpandVolume
// answers node_expansion_required as Config.NodeExpansionRequired says;
// without it the node sees the new size at once. Without the EXPAND_VOLUME
// controller capability (node-only expansion), NodeExpandVolume grows the
// volume's record itself; with it, NodeExpandVolume beyond the controller's
// size is OutOfRange.
//
// ControllerModifyVolume, with MODIFY_VOLUME, sets the mutable parameters
// it is given, key by key; CreateVolume's mutable_parameters are checked
// the same way. Keys outside Config.MutableParameters
// (DefaultMutableParameters by default) and values longer than 128 bytes
// are InvalidArgument, unknown volumes NotFound.
//
// The CSI 1.13 health calls (ControllerGetVolumeHealth,
// ControllerListVolumeHealth, NodeGetVolumeHealth, NodeGetStorageHealth)
// report the conditions a test sets with Plugin.SetVolumeHealth,
// Plugin.SetVolumeCondition and Plugin.SetStorageHealth, and the volumes
// listed in Config.VolumeConditionsFile, which every health call reads
// again (the knob of a plugin process); listings leave healthy volumes
// out, as CSI recommends.
//
// With Config.VolumeMountGroup, NodeStageVolume and NodePublishVolume accept
// a numeric group id in volume_capability.mount.volume_mount_group and
// record it (NodeLog, NodeVolumes); with MountsBind the volume's directory
// is given to that group, group read-write-search and set-group-id, so new
// files join the group (what is already in it is left alone). Without it a
// mount group is InvalidArgument naming the field.
//
// Config.Mounts picks how the node service places a volume. With
// MountsMarker, the default, it mounts nothing and needs no privileges:
// NodeStageVolume records the staging path; NodePublishVolume creates the
// target path as a symbolic link to the volume's directory. With MountsBind
// it mounts as a driver does (root with CAP_SYS_ADMIN): NodeStageVolume
// bind-mounts the volume's directory on the staging path; NodePublishVolume
// creates the target directory and bind-mounts the staging path on it,
// read-only (bind, then remount read-only) when asked; NodeUnpublishVolume
// unmounts and removes the target; NodeUnstageVolume unmounts the staging
// path. Repeated calls with the same arguments succeed, and mount again
// what is recorded but no longer mounted. Either way files written at the
// target land in the volume and NodeGetVolumeStats reports them, and the
// plugin keeps the same records. A node-only plugin serves any well-formed
// volume id, since the volume was created by a controller elsewhere.
//
// Mounts outlive the plugin, as a driver's outlive its process: Stop and
// Kill leave them, and Plugin.UnmountAll lazily unmounts every recorded
// mount for a test's cleanup. RealMountsAvailable tells tests whether this
// process can make bind mounts, probing once; MountPoints and IsMountPoint
// read the mount table (/proc/self/mountinfo), so tests check real mounts
// rather than the plugin's word.
//
// # Faults and statistics
//
// Plugin.SetFaults makes Probe report not-ready, fail, answer late or hang,
// and delays or fails any method by name, or delays its answer after the
// work is done (AnswerDelays: a caller that gives up loses an answer whose
// effect is there). Plugin.Secrets lists the secrets each method was called with. Plugin.Stats counts calls and the
// highest number of calls in flight per method, so tests can check how many
// calls a client runs at once. Plugin.NodeLog lists the successful stage,
// unstage, publish, unpublish and expand calls in order, with their paths,
// mount groups and requested sizes, and Plugin.NodeVolumes the plugin's
// own record of what is staged and published, with the size the node
// sees, so tests check a node's volume steps against the plugin rather
// than against the caller. Plugin.Volumes, Plugin.Volume and
// Plugin.Snapshots return copies of the controller's records: capacity,
// parameters and mutable parameters, content source, topology, published
// nodes, snapshot readiness. Plugin.Kill stops like a crashed process: the
// socket file stays and dialing it is refused until Start runs again.
//
// # Call journal
//
// With Config.Journal the plugin keeps its own evidence of what it was
// asked and did, for tests that check invariants from records the system
// under test does not write: it appends a JournalRecord line to the file
// when each Node and Controller call begins (before any fault or effect)
// and when its work is done (with the outcome's gRPC code), syncing each
// before the call goes on, so the answer a caller saw always has its
// records even if the process is killed right after sending it. Records
// carry a wall-clock time, a sequence number and an id per plugin
// instance, the writer's node id, the method and the request's volume id,
// node id, paths, readonly flag and access mode; of secrets only the keys,
// and every string is cut to MaxJournalString. The file is appended to,
// never truncated, by any number of instances and restarts. A record that
// cannot be written fails the call with Internal, so no effect goes
// unrecorded: a call whose end record failed still has its begin record,
// which readers take as an effect of unknown outcome. Package journal
// reads journals and checks them.
//
// # Conformance
//
// The package's tests run the csi-sanity suite (kubernetes-csi/csi-test
// pkg/sanity) against a monolith plugin over a real unix socket advertising
// every supported capability (cloning, volume modification and the
// controller and node volume health calls included, and
// VOLUME_MOUNT_GROUP): with markers and, when the tests can mount, with
// bind mounts, both in a zone topology, and node-local with markers. The
// Identity, Controller, snapshot, clone, modification, expansion, health
// and Node groups pass completely; no spec is skipped by this package.
// csi-sanity itself skips the specs of features the plugin does not have
// (group snapshots, SINGLE_NODE_MULTI_WRITER, snapshot accessibility
// constraints) and one spec it disables for every driver (ListVolumes
// pagination with volumes added between pages).
//
// The command in cmd/csi-testplugin serves one or many plugins in their own
// process.
package testplugin
