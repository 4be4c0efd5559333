package server

import (
	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// The services answer with the API's messages; the state holds the
// storage messages of package statepb, whose converters translate one
// into the other. The plugin view is built by the state at read time and
// converted here.

// pluginToAPI converts the cluster-wide view of a plugin to its public
// form.
func pluginToAPI(p *state.ClusterPlugin) *csisupdv1.ClusterPlugin {
	out := &csisupdv1.ClusterPlugin{
		Id:                  p.ID,
		Provider:            p.Provider,
		Version:             p.Version,
		ControllersHealthy:  p.ControllersHealthy,
		ControllersExpected: p.ControllersExpected,
		NodesHealthy:        p.NodesHealthy,
		NodesExpected:       p.NodesExpected,
		Instances:           make([]*csisupdv1.PluginInstance, len(p.Instances)),
	}
	for i, inst := range p.Instances {
		out.Instances[i] = &csisupdv1.PluginInstance{
			NodeId:            inst.NodeID,
			NodeName:          inst.NodeName,
			Healthy:           inst.Healthy,
			HealthDescription: inst.HealthDescription,
			Plugin:            statepb.PluginToAPI(inst.Plugin),
		}
	}
	return out
}

// pluginsToAPI converts plugin views to their public form.
func pluginsToAPI(in []*state.ClusterPlugin) []*csisupdv1.ClusterPlugin {
	out := make([]*csisupdv1.ClusterPlugin, len(in))
	for i, p := range in {
		out[i] = pluginToAPI(p)
	}
	return out
}
