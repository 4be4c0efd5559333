// Package statepb is the storage format of the servers' replicated state:
// the raft log entries and their commands (LogEntry, LogBatch and the
// command messages), the raft snapshot (StateSnapshot, also the format of
// an operator's snapshot file), and the rows of the state store (Volume
// with its claims, ClusterNode, Plugin, ServerRecord, ACLPolicy,
// ACLTokenRecord).
//
// The messages are defined in the .proto files of this package, not
// borrowed from the public API, so that a change to the public API does
// not change what a data_dir holds. They are wire-compatible with the
// public messages that were stored before they existed: same field
// numbers, same wire types. A raft log and snapshots written by those
// releases decode into them directly. The public messages that were only
// ever stored (the log entry and batch, the snapshot, the node and ACL
// bootstrap commands, the server and token records) have since left the
// public API; the package's tests keep a record of them
// (testdata/stored_public_messages.textproto) and compare it with these.
// log.proto says why a field number is never changed or reused.
//
// The converters (VolumeFromAPI, VolumeToAPI, ...) translate between a
// stored row, or a part of one, that the services show and its public
// counterpart, field by field, in both directions; nil converts to nil.
// ACLTokenView and VolumeSnapshotView show a stored token and snapshot. FromAPI copies, so a stored row never
// aliases a message its caller may change; ToAPI shares the row's maps,
// slices and timestamps, since rows are never changed once stored, so
// the public message made from a row must be treated as read-only, as the
// rows themselves are. A test builds every converted message with
// every field set and requires both round trips to give it back, so a
// field added on one side without the converter fails it.
//
// The .pb.go files are generated from the .proto files (`make proto`).
package statepb
