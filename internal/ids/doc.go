// Package ids holds the syntax of the ids csisupd takes from outside: plugin
// ids, volume, snapshot and workload ids, node names and node ids. Each rule
// lives here once, and every package that checks an id (the configuration,
// the plugin watcher, kubelet's registration protocol, the node's volume
// manager, the servers, the CLI) asks this package.
//
//   - A plugin id (PluginIDPattern, ValidPluginID) names the plugin's socket
//     or socket directory, its plugin block, and a directory under the mount
//     roots: 1 to 128 letters, digits, '.', '_' and '-', starting with a
//     letter or digit.
//   - Volume, snapshot and workload ids (ValidPathID) follow the same rule
//     and are neither "." nor "..": the node's agent names a directory after
//     each of them.
//   - A node name (CheckNodeName) is the name key of an agent, the node
//     identity of a token and the node a client certificate names: 1 to
//     MaxNodeName letters, digits, '.', '_' and '-', starting with a letter
//     or digit.
//   - A node id (NodeID) is made by the agent at its first start from random
//     bytes and kept in its data_dir; the servers and raft know the node by
//     it. It is opaque: nothing checks its syntax, since an id an agent
//     already registered with must stay valid.
//   - Free-form ids, names and keys (CheckText: an external id, a parameter
//     or topology key) are valid UTF-8 without control characters.
//
// The package holds pure functions of the standard library only, so that
// every package of the module may import it.
package ids
