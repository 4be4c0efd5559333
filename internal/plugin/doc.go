// Package plugin is the plugin model every part of csisupd shares: a
// plugin's identity (its id and the Instance of its socket), its type
// (Type: controller, node, monolith or unknown, with TypeOf and Roles
// between a type and the services it serves), the names of the
// capabilities it is checked for, its read model, the events of its life,
// and Source, the interface through which consumers read plugin state.
//
// The read model is the API message csisupdv1.Plugin: the Agent API, the
// node client that reports plugins to the servers, the Consul sync and
// the CLI all read that one shape, produced by one converter in the
// registry. The registry is the only owner of plugin state and implements
// Source; consumers depend on Source, never on the registry, so that the
// arrows of the package graph point down:
//
//	cmd -> agent -> {registry, rpc, server, consulsync, nodeclient} -> {plugin, stream, retry, heartbeat, fingerprint, csiclient, config}
//
// The package has no goroutines and no state of its own.
package plugin
