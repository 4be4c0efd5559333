// Package nodeclient is the agent's side of the control cluster: it keeps
// one node registered with the servers, sends them the node's plugins
// (the read model of a plugin.Source, on every change, coalesced),
// heartbeats at the TTL the servers return, registers again when a server
// does not know the node, and fails over between servers, found in a
// fixed list or through discovery.
//
// Leases holds leases for local workloads (Hold, Drop): it renews the
// leased claims of every held workload in one Cluster.NodeRenewClaims per
// interval (a third of the smallest lease), through the same servers,
// secret and failover, retries a failed renewal before the next interval,
// drops and reports (LeasesConfig.Lost) a workload the servers hold no
// claim of any more, and keeps what it holds in data_dir (LeaseFileName),
// so that a restarted agent renews it again at once.
//
// LocalClaims claims volumes for workloads that run on this node (a
// Docker or Podman container, a systemd service) through the servers'
// Control API, with an owner and a lease that Leases then holds, and
// releases and syncs them; it passes the volume calls of the Docker
// volume plugin on to the servers. Its calls use the node client's
// servers, connection, token and failover; errors keep the servers' gRPC
// status.
//
// Which connection: the agent (client role) is the gRPC client here, and
// the servers' Cluster and Control services are the server. Not to be confused with
// package csiclient (the agent dialling a CSI plugin's unix socket) or
// with the agent's client.go (the setup of the client role, which dials
// nothing itself). The servers' calls back into an agent (ClientCSI,
// NodeVolumes) are made by package server, not here.
package nodeclient
