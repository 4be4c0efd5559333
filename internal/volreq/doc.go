// Package volreq checks the volume requests that come from outside before
// anything acts on them: the mount flags and file system types that reach a
// plugin, the capacities of a new volume, the size of the maps
// (parameters, secrets, volume and publish contexts) that are stored or
// passed on, and the text of the ids, names and keys they carry.
//
// It is one job, shared by the servers (Control.CreateVolume,
// RegisterVolume, ClaimVolume, ReleaseVolume, DeleteVolume) and the node
// agent (NodeVolumes.MountVolume, ExpandVolume). Both check at the entry
// point, so that a refused request stores nothing and calls no plugin.
//
// Text: every free-form id, name and key a server request carries (volume,
// snapshot, workload and node ids, the external id, the owner, the keys of
// parameters, contexts and secrets, topology keys and values) must be valid
// UTF-8 without control characters (ids.CheckText), as the CLI demands of
// a volume file, so that a client other than the CLI cannot store what
// rewrites a terminal or a log line. Values of parameters and contexts are
// the plugin's and may hold anything; secrets' values are never checked.
//
// The validators return plain errors that name the field and quote the bad
// value (never a secret's value: only its key); callers turn them into
// InvalidArgument. The package knows no gRPC status and no raft.
//
// Mount flags: a flag is one mount option. The servers refuse what no node
// may take (structural options such as remount and bind, propagation
// changes, util-linux's X-mount.* actions, malformed flags) and let the
// privileged flags suid and dev through; the node's agent refuses those
// unless its operator allows them (client.allow_mount_flags), since only
// the node knows its own list.
package volreq
