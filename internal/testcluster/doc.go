// Package testcluster builds real csisupd server clusters for tests and
// benchmarks, exactly as production forms them: every server gets its own
// gRPC server and raft transport on loopback ports, lists every server in
// retry_join, and the cluster forms only through bootstrap_expect.
//
// A Cluster can kill (abruptly), stop (gracefully), restart (same data dir
// and addresses), partition and heal its servers, and add new ones.
// Partitions cut a server's raft and gRPC traffic in both directions: its
// existing connections are closed, its outgoing dials fail, and connections
// it accepts are closed at once.
package testcluster
