package server

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// TestPluginToAPI converts a plugin view with every field set and requires
// the public message with every field set to the same values: a field
// added to the public message and not to the conversion fails it.
func TestPluginToAPI(t *testing.T) {
	inst := func(node string, healthy bool) *state.PluginInstance {
		return &state.PluginInstance{NodeID: node, NodeName: "name-" + node, Healthy: healthy,
			HealthDescription: "desc-" + node, Plugin: &statepb.Plugin{Id: "p", NodeId: "csi-" + node, Type: "monolith"}}
	}
	in := &state.ClusterPlugin{ID: "p", Provider: "vendor", Version: "1.2", ControllersHealthy: 1,
		ControllersExpected: 2, NodesHealthy: 3, NodesExpected: 4, Instances: []*state.PluginInstance{inst("a", true), inst("b", false)}}
	want := &csisupdv1.ClusterPlugin{Id: "p", Provider: "vendor", Version: "1.2", ControllersHealthy: 1,
		ControllersExpected: 2, NodesHealthy: 3, NodesExpected: 4, Instances: []*csisupdv1.PluginInstance{
			{NodeId: "a", NodeName: "name-a", Healthy: true, HealthDescription: "desc-a", Plugin: &csisupdv1.Plugin{Id: "p", NodeId: "csi-a", Type: "monolith"}},
			{NodeId: "b", NodeName: "name-b", HealthDescription: "desc-b", Plugin: &csisupdv1.Plugin{Id: "p", NodeId: "csi-b", Type: "monolith"}},
		}}
	// draining_nodes comes from the nodes' records, which GetPlugin reads
	// (TestPluginDrain checks it), not from the plugin's view.
	const filledByGetPlugin = 1
	for _, m := range []proto.Message{want, want.Instances[0]} {
		all := m.ProtoReflect().Descriptor().Fields().Len()
		if m == proto.Message(want) {
			all -= filledByGetPlugin
		}
		if set := setFields(m); set != all {
			t.Fatalf("the expected %T sets %d of the %d fields it converts: set them all", m, set, all)
		}
	}
	got := pluginToAPI(in)
	if !proto.Equal(got, want) {
		t.Fatalf("converted plugin\n%v\nwant\n%v", got, want)
	}
	if all := pluginsToAPI([]*state.ClusterPlugin{in, in}); len(all) != 2 || !proto.Equal(all[1], want) {
		t.Fatalf("pluginsToAPI: %v", all)
	}
}

// setFields counts the fields of m that are set.
func setFields(m proto.Message) int {
	n := 0
	m.ProtoReflect().Range(func(protoreflect.FieldDescriptor, protoreflect.Value) bool {
		n++
		return true
	})
	return n
}
