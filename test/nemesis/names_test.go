package nemesis

// The plugins every agent host runs, as csi-testplugin processes: ids
// (their sockets' directories under plugin_dir) and what they are.
const (
	// localPlugin behaves like a node-local driver (hostpath, LVM): a
	// volume lives only on the node whose controller made it.
	localPlugin = "tp"
	// sharedPlugin's volumes are reachable from every node, as a network
	// storage driver's are: each instance serves every volume id.
	sharedPlugin = "sp"
)

// plugins are the plugin ids, in start order.
var plugins = []string{localPlugin, sharedPlugin}

// PluginName is the process name of agent's test plugin with id plugin.
func PluginName(agent, plugin string) string { return agent + "/" + plugin }
