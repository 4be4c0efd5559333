// Package nodeclient is the agent's side of the control cluster: it keeps
// one node registered with the servers, sends them the node's plugins
// (the read model of a plugin.Source, on every change, coalesced),
// heartbeats at the TTL the servers return, registers again when a server
// does not know the node, and fails over between servers, found in a
// fixed list or through discovery.
package nodeclient
