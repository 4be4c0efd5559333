// Package raftnode is a server's raft member: the hashicorp/raft instance
// over a raft-boltdb log store, a file snapshot store and a TCP transport
// (TLS in both directions when the server has TLS, accepting and dialling
// only peers with a server certificate), the join and bootstrap loop, the
// leader's autopilot, the recovery from a peers.json and the write
// batcher that groups concurrent node writes into one raft entry. It runs
// the FSM of package fsm; it serves no gRPC, and reaches the other
// servers' Cluster services through a connection the server gives it.
//
// Clusters form only through BootstrapExpect: a server first tries to join a
// cluster that already has a leader, and otherwise bootstraps only by a rule
// that cannot split. Each server keeps a known set in memory: its own id,
// the ids of the servers it reached through RetryJoin (or DiscoverServers)
// and the known sets those servers reported in PeerInfo. The set only grows
// while the server runs. A server bootstraps when its known set has exactly
// BootstrapExpect ids and, in one attempt, it reached every one of them and
// each reported the same BootstrapExpect, no raft state and a known set
// equal to its own; the configuration is that set sorted by server id, all
// voters, so every server that bootstraps computes the same one. A server
// whose known set grew past BootstrapExpect refuses to bootstrap and says
// so once per change, naming the servers it knows: the operator stops the
// surplus servers and restarts the others, and starts the surplus ones
// again once a leader exists, when they join it. A server with raft state
// never bootstraps again.
// A server that joins a formed cluster is added as a non-voter; autopilot
// promotes it once it has been healthy for ServerStabilizationTime, so a
// join naming an unreachable address never counts toward the quorum.
//
// Why it is safe: if two servers bootstrap sets V and W that share a member
// C, C reported V to one and W to the other as its known set; that set only
// grows and V and W have the same size, so V = W. With fewer than twice
// BootstrapExpect servers, any two sets of BootstrapExpect of them share a
// member. The guarantee has two limits. With twice BootstrapExpect servers
// or more, two groups that never hear of each other look exactly like two
// separate clusters, and no rule can tell them apart: each group may form
// its own cluster. And a server forgets its known set when it restarts, so
// the argument covers only servers that do not restart while the cluster
// forms.
//
// A peers.json in the raft directory (RaftDir) replaces the raft
// configuration before raft starts: the manual recovery of a cluster that
// lost its quorum for good. ReadOfflineRaftState reads a stopped server's
// raft state without writing to it, for the operator commands that write
// such a file.
//
// With a watchdog, the write batcher and the join loop beat a
// watchdog.Loop each for the node's life.
package raftnode
