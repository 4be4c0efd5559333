// Package agent wires csisupd's roles into one daemon and owns its
// lifecycle: listeners opened before anything starts (a bad address never
// leaves half a daemon), start, reload on SIGHUP, and a graceful stop that
// persists the registry and deregisters from Consul.
//
// New sets the agent up in steps, one per component, each in the file of
// its role: setup.go for the agent as a whole (directories, listeners,
// the gRPC server and services, HTTP), client.go for the client role
// (registry, node client, node volumes), consul.go, serverrole.go, and
// security.go (TLS, ACL tokens). "Client" in client.go means the client
// role (the node side: plugins, node volumes, the node client), not a
// connection: the connections are package nodeclient (agent to servers)
// and package csiclient (agent to a CSI plugin's socket). A step builds its component from the
// configuration and the components of earlier steps, and returns it with
// its part: what Run runs of it, what releases it when Run never starts,
// and how Reload changes it. Run starts the parts in order and stops them
// in reverse; Reload calls their hooks.
package agent
