package e2e

import (
	"fmt"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// TestStatusAndPluginStatusShowOnePlugin runs one `agent --dev` and
// compares the demo plugin as `status --json` shows it (the agent's read
// model) with the same plugin inside `plugin status demo --json` (the
// servers' replicated copy, in the instance of this node): both are the
// Plugin message, so they must have the same fields with the same values.
func TestStatusAndPluginStatusShowOnePlugin(t *testing.T) {
	const nodeName = "e2e-json"
	addr := startDevAgent(t, nodeName).addr

	// The replicated copy follows the agent's changes through the node
	// client, a moment behind: the two are compared until they agree,
	// and the fields still different at the deadline are logged with the
	// failure.
	var diffs []string
	t.Cleanup(func() {
		if t.Failed() {
			for _, d := range diffs {
				t.Log(d)
			}
		}
	})
	testutil.WaitFor(t, 60*time.Second, "status and plugin status to show plugin demo healthy and alike", func() bool {
		local, replicated := demoPlugins(t, addr)
		diffs = comparePlugins(local, replicated)
		if local["healthy"] != true || replicated["healthy"] != true {
			diffs = append(diffs, fmt.Sprintf("healthy: status %v, plugin status %v; want both true", local["healthy"], replicated["healthy"]))
		}
		return len(diffs) == 0
	})
}

// demoPlugins returns the demo plugin from `status --json` and from this
// node's instance in `plugin status demo --json` (nil when absent).
func demoPlugins(t *testing.T, addr string) (local, replicated map[string]any) {
	var status struct {
		Plugins []map[string]any `json:"plugins"`
		Cluster struct {
			NodeID string `json:"node_id"`
		} `json:"cluster"`
	}
	if res := cli(t, addr, "status", "--json"); res.code != 0 || !jsonInto(res.stdout, &status) {
		return nil, nil
	}
	for _, p := range status.Plugins {
		if p["id"] == "demo" {
			local = p
		}
	}
	var plugin struct {
		Instances []struct {
			NodeID string         `json:"node_id"`
			Plugin map[string]any `json:"plugin"`
		} `json:"instances"`
	}
	if res := cli(t, addr, "plugin", "status", "demo", "--json"); res.code != 0 || !jsonInto(res.stdout, &plugin) {
		return local, nil
	}
	for _, in := range plugin.Instances {
		if status.Cluster.NodeID != "" && in.NodeID == status.Cluster.NodeID {
			replicated = in.Plugin
		}
	}
	return local, replicated
}

// comparePlugins returns every field in which the two plugin objects
// differ: present in one only, or with another value.
func comparePlugins(local, replicated map[string]any) []string {
	// The servers do not replicate last_probe: it changes at every probe,
	// and replicating it would be a raft write per probe.
	const notReplicated = "last_probe"
	names := map[string]bool{}
	for k := range local {
		names[k] = true
	}
	for k := range replicated {
		names[k] = true
	}
	if len(names) == 0 {
		return []string{"neither status nor plugin status shows the demo plugin"}
	}
	var sorted []string
	for k := range names {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	var diffs []string
	for _, k := range sorted {
		lv, inLocal := local[k]
		rv, inReplicated := replicated[k]
		switch {
		case !inLocal:
			diffs = append(diffs, fmt.Sprintf("plugin status has %s = %v, status has no such field", k, rv))
		case !inReplicated:
			diffs = append(diffs, fmt.Sprintf("status has %s = %v, plugin status has no such field", k, lv))
		case k == notReplicated:
		case !reflect.DeepEqual(lv, rv):
			diffs = append(diffs, fmt.Sprintf("%s: status %v, plugin status %v", k, lv, rv))
		}
	}
	return diffs
}
