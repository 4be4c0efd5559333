package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// snapshotDoc is a VolumeSnapshot as the CLI prints it.
type snapshotDoc struct {
	ID             string `json:"id"`
	PluginID       string `json:"plugin_id"`
	SourceVolumeID string `json:"source_volume_id"`
	ExternalID     string `json:"external_id"`
	SizeBytes      int64  `json:"size_bytes,string"`
	ReadyToUse     bool   `json:"ready_to_use"`
	CreatedAt      string `json:"created_at"`
	State          string `json:"state"`
}

type snapshotListDoc struct {
	Snapshots []snapshotDoc `json:"snapshots"`
}

// TestSnapshotRoundTrip drives a volume's content through the CLI on 3
// servers and 2 agents with node-local plugins that make real bind mounts
// when the test can: claim and write a file, snapshot, change the file,
// restore the snapshot into a new volume (it holds the old content) and
// clone the volume (it holds the new one), then delete the snapshot, which
// leaves the plugin and the list; the claimed volume is expanded and
// modified on the way. Each volume lands on the node that holds its source, and with real mounts every claim's host path is checked in
// the mount table.
func TestSnapshotRoundTrip(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 3, Agents: 2})
	mode := pluginMounts(t)
	var plugins []*testplugin.Plugin
	for i, a := range c.Agents() {
		p := a.StartPlugin("nl", testplugin.Config{
			NodeID: fmt.Sprintf("csi-node-%d", i), NodeLocal: true, Mounts: mode,
			ControllerCapabilities: testplugin.SupportedControllerCapabilities,
		})
		unmountAtEnd(t, p)
		plugins = append(plugins, p)
	}
	addr := followerAddr(t, c)
	testutil.WaitFor(t, 30*time.Second, "plugin nl healthy on both agents", func() bool {
		p, ok := tryPlugin(t, addr, "nl")
		return ok && p.ControllersHealthy == 2 && p.NodesHealthy == 2
	})
	// The volume lives on agent 1; everything made from it must too.
	const home = 1
	node := c.Agent(home).Name
	claim := func(vol string) string {
		t.Helper()
		var cl claimDoc
		cliJSON(t, addr, &cl, "volume", "claim", vol, "--node", node, "--workload", "w-"+vol)
		wantMountPoints(t, plugins[home], true, cl.HostPath)
		return cl.HostPath
	}
	read := func(path string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(path, "data.txt"))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}

	var vol volumeDoc
	cliJSON(t, addr, &vol, "volume", "create", "data", "--plugin", "nl", "--capacity", "4MiB",
		"--topology-required", testplugin.DefaultTopologyKey+"=csi-node-1")
	if vol.ControllerNodeID != c.Agent(home).NodeID() {
		t.Fatalf("data created by node %s, want agent %d's", vol.ControllerNodeID, home)
	}
	data := claim("data")
	if err := os.WriteFile(filepath.Join(data, "data.txt"), []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}

	var snap snapshotDoc
	cliJSON(t, addr, &snap, "volume", "snapshot", "create", "data", "snap1")
	if snap.ID != "snap1" || snap.SourceVolumeID != "data" || snap.PluginID != "nl" || snap.ExternalID == "" || snap.CreatedAt == "" {
		t.Fatalf("snapshot create: %+v", snap)
	}
	if err := os.WriteFile(filepath.Join(data, "data.txt"), []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct{ vol, flag, source, want string }{
		{"restored", "--snapshot", "snap1", "old"},
		{"cloned", "--clone", "data", "new"},
	} {
		var v volumeDoc
		cliJSON(t, addr, &v, "volume", "create", tc.vol, "--plugin", "nl", tc.flag, tc.source)
		if v.ControllerNodeID != c.Agent(home).NodeID() {
			t.Errorf("%s created by node %s, want agent %d's, which holds %s", tc.vol, v.ControllerNodeID, home, tc.source)
		}
		if got := read(claim(tc.vol)); got != tc.want {
			t.Errorf("%s holds %q, want %q", tc.vol, got, tc.want)
		}
	}

	// The claimed volume grows, and takes new mutable parameters.
	cliJSON(t, addr, &vol, "volume", "expand", "data", "--capacity", "8MiB")
	if vol.CapacityBytes != 8<<20 {
		t.Errorf("volume expand: capacity %d, want %d", vol.CapacityBytes, 8<<20)
	}
	cliJSON(t, addr, &vol, "volume", "modify", "data", "--parameter", "iops=500")
	if v, ok := plugins[home].Volume(vol.ExternalID); !ok || v.MutableParameters["iops"] != "500" || v.CapacityBytes != 8<<20 {
		t.Errorf("the plugin's record of data after expand and modify: %+v", v)
	}

	var list snapshotListDoc
	cliJSON(t, addr, &list, "volume", "snapshot", "list", "--volume", "data")
	if len(list.Snapshots) != 1 || list.Snapshots[0].ID != "snap1" || !list.Snapshots[0].ReadyToUse {
		t.Fatalf("snapshot list: %+v", list)
	}
	if r := cli(t, addr, "volume", "snapshot", "delete", "snap1"); r.code != 0 {
		t.Fatalf("snapshot delete: exit %d: %s", r.code, r.stderr)
	}
	cliJSON(t, addr, &list, "volume", "snapshot", "list")
	if len(list.Snapshots) != 0 {
		t.Errorf("snapshot list after delete: %+v", list)
	}
	for i, p := range plugins {
		if s := p.Snapshots(); len(s) != 0 {
			t.Errorf("plugin on agent %d still has snapshots %v", i, s)
		}
	}
	if r := cli(t, addr, "volume", "snapshot", "delete", "snap1"); r.code == 0 || !strings.Contains(r.stderr, "not found") {
		t.Errorf("deleting it again: exit %d: %s; want a not-found error", r.code, r.stderr)
	}

	for _, v := range []string{"data", "restored", "cloned"} {
		if r := cli(t, addr, "volume", "release", v, "--node", node, "--workload", "w-"+v); r.code != 0 {
			t.Fatalf("release %s: exit %d: %s", v, r.code, r.stderr)
		}
	}
	if left := mountsLeft(t, plugins[home]); len(left) > 0 {
		t.Errorf("mounts left after the releases: %v", left)
	}
}
