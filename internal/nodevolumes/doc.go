// Package nodevolumes is the node volume manager: it stages, publishes,
// unpublishes and unstages volumes through the node service of this node's
// CSI plugins, for the NodeVolumes service (see api/csisupd/v1
// volumes.proto, which is its contract), and keeps a record of every mount
// on disk so that an agent that stops in the middle of a step knows, when it
// starts again, what to finish or undo.
//
// # Mounts and usages
//
// A mount is one volume used by one workload with one usage (access mode,
// file system or block, read-only, mount options). The usage key names a
// usage: <rw|ro>-<file-system|block>-<access mode>, for example
// rw-file-system-single-node-writer, followed by 8 hex digits of a hash of
// the file system type and mount flags when any are set. A volume is staged
// once per (volume, usage) when the plugin has STAGE_UNSTAGE_VOLUME,
// published once per workload, and unstaged when the last mount using that
// staging is gone. Calls for one (plugin, volume) never overlap (a lock per
// volume that honours the caller's context); different volumes proceed at
// the same time. Plugin calls go through the call path ClientCSI uses
// (csiclient.Invoke), so they are retried as ClientCSI's are: 3 attempts
// in all while the plugin answers Unavailable, ResourceExhausted or
// DeadlineExceeded and the deadline leaves room, spaced by Config.Retry,
// with the request's secrets redacted from errors and logs.
// NotFound from NodeUnpublishVolume or NodeUnstageVolume counts as done.
//
// The NodeVolumes service (Service) checks what MountVolume and
// ExpandVolume bring before the manager records or calls anything
// (package volreq): mount flags, fs type, capacities and map sizes. The
// privileged mount flags suid and dev pass only when the operator allows
// them (client.allow_mount_flags, given to Register). UnmountVolume's
// usage is not checked: it mounts nothing, and must undo what a mount
// made under earlier rules.
//
// # Directories
//
// A plugin's mount root is Config.PluginDirs[id].MountDir, by default
// <data_dir>/volumes/<plugin id>:
//
//	<root>/staging/<volume>/<usage>                  staging target
//	<root>/per-workload/<workload>/<volume>/<usage>  publish target
//
// The manager creates the staging target and the parent of the publish
// target (0700); the plugin creates the publish target. When a mount is
// undone the manager removes those directories when they are empty. When
// PluginDirs[id].PluginMountDir is set, the plugin sees the root there: every
// path sent to it is the host path with the root replaced.
//
// # Records
//
// Each mount has one record, kept in the journal <data_dir>/volume-mounts/
// journal (mode 0600, in a 0700 directory): each change of a record (its
// new content, or its removal) is one appended line, the crc32c of the
// line's JSON, a space and the JSON, made durable by one fsync of the
// journal before the step it covers starts and before the caller is
// answered. Concurrent changes share their fsyncs. A record is named by a
// hash of (plugin, volume, workload, usage key). It holds: version,
// plugin_id, volume_id, external_id (the id the plugin knows), workload_id,
// usage and usage_key, roots (the mount root on the host and as the plugin
// sees it), host_path, staging_path (empty when the plugin does not
// stage), plugin_path and plugin_staging_path (the same paths as sent to
// the plugin), state, cluster and claim_index (set for mounts the servers
// made for a claim), error (the last failed step, redacted) and
// created_at, updated_at. It never holds a secret, a volume context or a
// publish context.
//
// On start the journal is replayed. A torn or unchecksummed last line is a
// change that was never acknowledged: it is cut off. New refuses to start
// on any other line it cannot read, or a record that is not valid, naming
// the journal, the line and its offset, and changes nothing: the operator
// moves the journal aside (or removes the line) and starts the agent, and
// releases then clean up from the servers' paths (see Lost records). Once
// the journal is four times the size of the live records and at least 64
// KiB, it is rewritten with the live records (temporary file, fsync,
// rename, fsync of the directory). Records of the earlier format, one JSON
// file per mount in the same directory, are taken into the journal on
// start: appended and synced first, then their files removed.
//
// The state is written before each step starts and after it ends:
//
//	staging       NodeStageVolume in progress
//	publishing    staged (or no staging needed), NodePublishVolume in progress
//	published     the workload can use host_path
//	unpublishing  NodeUnpublishVolume in progress
//	unstaging     unpublished, NodeUnstageVolume in progress
//	record-lost   the servers hold a claim of it that had no record here
//
// A mount fully undone is forgotten: its record is removed.
//
// # Failures and the crash rule
//
// A Mount whose step fails undoes what it did (unpublish, and unstage when
// no other mount uses the staging) and removes its record, so nothing
// half-done stays; a step the plugin refused outright (InvalidArgument,
// NotFound, FailedPrecondition and the like) needs no undo of its own. The
// failure is reported as a volume-mount-failed event with the secrets of the
// request removed from the message.
//
// When an undo or an unmount fails too, or the agent stopped in the middle,
// the record stays and Run resolves it, retrying with Config.Retry until it
// succeeds: a mount that never answered its caller (staging, publishing) is
// UNDONE, an unmount (unpublishing, unstaging) is FINISHED. Published mounts
// stay. Plugins may start after the agent: each record is retried on its
// own, without holding up the other volumes. Recovered tells when the
// records New found are resolved. A Mount of a mount in such a state answers
// Aborted with the Retryable detail.
//
// # Lost records
//
// An UnmountVolume from the servers carries the paths they hold of the
// claim (host_path, staging_path, with usage and external_id). When the
// mount has no record, Unmount still unpublishes host_path and unstages
// staging_path (when no other mount uses it), writing its intent first as
// any unmount does, so that the node never confirms a release it did not
// do; NotFound counts as done. A mount that has a record is undone from
// the record's paths, which are the agent's own (a difference is logged).
// The servers' paths, to be used, must be clean paths in the mount's
// directories under the plugin's mount root (per-workload/<workload>/
// <volume>/ and staging/<volume>/), with no symbolic link between the
// root and them; anything else is InvalidArgument naming the field. Records made from them say so
// (server_paths) and are checked on load against those directories. A
// record with the servers' paths and no staging path gets the staging
// target this agent derives when the plugin stages: servers that predate
// recording staging paths hold none.
//
// With Config.Claims set, each reconcile round also looks for claims the
// servers hold as mounted on this node (mounted, with a host path) that
// have no record, logs each at warn once and keeps it as a record in
// state record-lost (cluster, with the servers' paths and claim index).
// Run does not undo such a record on its own, since the servers still
// hold its claim: their release undoes it from its paths, a reconcile that
// finds the claim gone does too, and a Mount of it (the servers finishing
// the claim) stages and publishes it again. A mount undone while the
// servers' answer was read is not taken for a lost one. The first round
// that succeeds logs how many records there are and how many are lost.
//
// # Cluster reconcile
//
// With Config.Claims set, Run asks the servers for this node's claims at
// start, every Config.ReconcileInterval and on TriggerReconcile, and
// unmounts every cluster mount whose claim_index is at most the answer's
// index and whose (volume, workload) is not among the claims: the servers
// released the claim while the node could not hear it. Mounts that a local
// scheduler made (cluster false) are never touched. A failed round is
// logged and the next one tries again.
//
// # Events
//
// With Config.Events set, the manager emits volume-staged,
// volume-published, volume-unpublished and volume-unstaged as each step
// succeeds, and volume-mount-failed when a Mount fails.
package nodevolumes
