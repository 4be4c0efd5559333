package state

import (
	"slices"

	"github.com/hashicorp/go-memdb"

	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// ClusterPlugin is the cluster-wide view of one plugin id, built from its
// instance rows at read time. It is not stored; the services answer with
// it converted to the API's csisupd.v1.ClusterPlugin.
type ClusterPlugin struct {
	ID string
	// Provider and Version are the vendor name and version of a healthy
	// instance when there is one, else of the first instance.
	Provider, Version   string
	ControllersHealthy  uint32
	ControllersExpected uint32
	NodesHealthy        uint32
	NodesExpected       uint32
	// Instances are sorted by node id.
	Instances []*PluginInstance
}

// PluginInstance is one instance of a plugin, on one node.
type PluginInstance struct {
	NodeID   string
	NodeName string
	// Healthy is set when the plugin reports healthy and its node is
	// ready.
	Healthy           bool
	HealthDescription string
	// Plugin is the instance as the node's agent reported it: a stored
	// row, shared, never to be modified.
	Plugin *statepb.Plugin
}

// Plugin returns the cluster-wide view of one plugin, or nil.
func (s *Store) Plugin(id string) *ClusterPlugin {
	return getPlugin(s.db.Txn(false), id)
}

func getPlugin(txn *memdb.Txn, id string) *ClusterPlugin {
	it, err := txn.Get(tablePlugins, "id_prefix", id)
	if err != nil {
		return nil
	}
	var rows []*instanceRow
	for raw := it.Next(); raw != nil; raw = it.Next() {
		if r := raw.(*instanceRow); r.PluginID == id {
			rows = append(rows, r)
		}
	}
	if len(rows) == 0 {
		return nil
	}
	return buildPlugin(txn, rows)
}

// ControllerAdvertises reports whether a controller instance of plugin
// id, healthy or not, advertises a controller capability. It reads only
// the plugin's instance rows: a claim asks it on every admission, and the
// whole view (Plugin) looks up the node of every instance.
func (s *Store) ControllerAdvertises(id, capability string) bool {
	return controllerAdvertises(s.db.Txn(false), id, capability)
}

func controllerAdvertises(txn *memdb.Txn, id, capability string) bool {
	it, err := txn.Get(tablePlugins, "id_prefix", id)
	if err != nil {
		return false
	}
	for raw := it.Next(); raw != nil; raw = it.Next() {
		r := raw.(*instanceRow)
		if r.PluginID != id {
			continue
		}
		if ctrl, _ := plugin.Type(r.Plugin.GetType()).Roles(); ctrl && slices.Contains(r.Plugin.GetControllerCapabilities(), capability) {
			return true
		}
	}
	return false
}

// Plugins returns the cluster-wide view of every plugin, sorted by id.
func (s *Store) Plugins() []*ClusterPlugin {
	out, _ := s.PluginsPage("", 0)
	return out
}

// buildPlugin aggregates the instance rows of one plugin, sorted by node
// id. An instance is healthy only when the plugin reports healthy and its
// node is ready.
func buildPlugin(txn *memdb.Txn, rows []*instanceRow) *ClusterPlugin {
	out := &ClusterPlugin{ID: rows[0].PluginID}
	for _, row := range rows {
		p := row.Plugin
		inst := &PluginInstance{
			NodeID:            row.NodeID,
			Healthy:           p.GetHealthy(),
			HealthDescription: p.GetHealthDescription(),
			Plugin:            p,
		}
		node := getNode(txn, row.NodeID)
		if node != nil {
			inst.NodeName = node.GetName()
		}
		if node == nil || node.GetStatus() != NodeStatusReady {
			inst.Healthy = false
			inst.HealthDescription = "node is down"
		}
		controller, nodeService := plugin.Type(p.GetType()).Roles()
		if controller {
			out.ControllersExpected++
			if inst.Healthy {
				out.ControllersHealthy++
			}
		}
		if nodeService {
			out.NodesExpected++
			if inst.Healthy {
				out.NodesHealthy++
			}
		}
		if out.Provider == "" || (inst.Healthy && !instHealthy(out.Instances)) {
			out.Provider, out.Version = p.GetVendorName(), p.GetVendorVersion()
		}
		out.Instances = append(out.Instances, inst)
	}
	return out
}

func instHealthy(insts []*PluginInstance) bool {
	for _, i := range insts {
		if i.Healthy {
			return true
		}
	}
	return false
}
