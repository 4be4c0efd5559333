// Package csisupdv1 is csisupd's public gRPC API and a small Go client for
// it. Every service is served on an agent's rpc port (default 4780):
//
//   - Agent: the plugins one node agent supervises, and their events;
//   - ClientCSI: controller RPCs mediated to a plugin on that node, with
//     unmodified csi.v1 requests and answers;
//   - Control: the cluster-wide view (plugins, nodes, volumes, raft) served
//     by servers;
//   - Cluster: the servers' internal RPCs (joining, forwarding, node
//     registration and heartbeats).
//
// Errors carry typed details (PluginNotFound, Retryable, Ignorable,
// CapabilityMissing, PluginUnhealthy); use IsRetryable, IsPluginNotFound
// and IsIgnorable instead of matching messages. The .pb.go files are
// generated from the .proto files beside them (`make proto`).
//
// The messages are what the RPCs carry, never what the servers store:
// their raft log, snapshots and snapshot files are a format of their own,
// so no message here is a log entry, a snapshot or a stored record.
package csisupdv1
