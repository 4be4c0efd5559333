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
// VOLUME_ACCESSIBILITY_CONSTRAINTS when Config.Topology is set, and ONLINE
// volume expansion.
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
// directories, not block devices. Snapshots are records only: a volume
// restored from a snapshot names it as its source but starts empty.
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
// and delays or fails any method by name. Plugin.Stats counts calls and the
// highest number of calls in flight per method, so tests can check how many
// calls a client runs at once. Plugin.NodeLog lists the successful stage,
// unstage, publish and unpublish calls in order, and Plugin.NodeVolumes
// the plugin's own record of what is staged and published, so tests check
// a node's volume steps against the plugin rather than against the caller. Plugin.Kill stops like a crashed process: the
// socket file stays and dialing it is refused until Start runs again.
//
// # Conformance
//
// The package's tests run the csi-sanity suite (kubernetes-csi/csi-test
// pkg/sanity) against a monolith plugin over a real unix socket, with
// markers and, when the tests can mount, with bind mounts. The
// Identity, Controller, snapshot and Node groups pass completely; no spec is
// skipped by this package. csi-sanity itself skips the specs of features the
// plugin does not advertise (group snapshots, volume modification, volume
// health, cloning, SINGLE_NODE_MULTI_WRITER, snapshot accessibility
// constraints) and one spec it disables for every driver (ListVolumes
// pagination with volumes added between pages).
//
// The command in cmd/csi-testplugin serves one or many plugins in their own
// process.
package testplugin
