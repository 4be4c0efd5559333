package server_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// nodeLocalCluster is a real cluster of 3 servers and 2 agents, each agent
// with a node-local test plugin "nl": every instance keeps its volumes
// and snapshots to itself, reports the topology {DefaultTopologyKey:
// csi-node-<i>}, creates on its own node whatever it is asked, and
// advertises every controller capability it has (GET_SNAPSHOT,
// CLONE_VOLUME and MODIFY_VOLUME among them).
type nodeLocalCluster struct {
	*claimCluster
}

func newNodeLocalCluster(t *testing.T, configure func(i int, cfg *testplugin.Config)) *nodeLocalCluster {
	t.Helper()
	c := testcluster.New(t, testcluster.Config{Servers: 3, Agents: 2, Configure: fastVolumeWatcher})
	cc := &claimCluster{c: c}
	for i, a := range c.Agents() {
		cfg := testplugin.Config{NodeID: fmt.Sprintf("csi-node-%d", i), NodeLocal: true,
			ControllerCapabilities: testplugin.SupportedControllerCapabilities}
		if configure != nil {
			configure(i, &cfg)
		}
		cc.plugins = append(cc.plugins, a.StartPlugin("nl", cfg))
	}
	testutil.WaitFor(t, 30*time.Second, "plugin nl healthy on both agents", func() bool {
		p, err := cc.control(t).GetPlugin(context.Background(), &csisupdv1.PluginGetRequest{Id: "nl"})
		return err == nil && p.GetPlugin().GetNodesHealthy() == 2 && p.GetPlugin().GetControllersHealthy() == 2
	})
	return &nodeLocalCluster{claimCluster: cc}
}

// nodeSegment is the requirement of one segment naming csi-node-<i>.
func nodeSegment(i int) *csisupdv1.TopologySegment {
	return &csisupdv1.TopologySegment{Segments: map[string]string{testplugin.DefaultTopologyKey: fmt.Sprintf("csi-node-%d", i)}}
}

// stableFirst is the agent a router that ignores topology would call
// first: the one with the lowest node id.
func (nc *nodeLocalCluster) stableFirst() int {
	if nc.c.Agent(0).NodeID() < nc.c.Agent(1).NodeID() {
		return 0
	}
	return 1
}

func (nc *nodeLocalCluster) createOn(t *testing.T, id string, agent int, src *csisupdv1.VolumeContentSource) (*csisupdv1.Volume, error) {
	t.Helper()
	req := &csisupdv1.VolumeCreateRequest{
		Id: id, PluginId: "nl", CapacityMinBytes: 1 << 20,
		Capabilities:  []*csisupdv1.VolumeCapability{{AccessType: "mount", AccessMode: "SINGLE_NODE_WRITER"}},
		ContentSource: src,
	}
	if agent >= 0 {
		req.AccessibilityRequirements = &csisupdv1.TopologyRequirement{Requisite: []*csisupdv1.TopologySegment{nodeSegment(agent)}}
	}
	resp, err := nc.control(t).CreateVolume(context.Background(), req)
	return resp.GetVolume(), err
}

// holder returns the index of the one plugin instance holding a volume
// named name, or -1; it fails the test when both do.
func (nc *nodeLocalCluster) holder(t *testing.T, name string) int {
	t.Helper()
	at := -1
	for i, p := range nc.plugins {
		for _, v := range p.Volumes() {
			if v.Name == name {
				if at >= 0 {
					t.Fatalf("volume %s exists on both plugin instances", name)
				}
				at = i
			}
		}
	}
	return at
}

// directCSI is a CSI controller client of plugin instance i, bypassing
// the cluster: what a router that ignores topology would reach.
func (nc *nodeLocalCluster) directCSI(t *testing.T, i int) csi.ControllerClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+nc.plugins[i].Socket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return csi.NewControllerClient(conn)
}

var mountCaps = []*csi.VolumeCapability{{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}}

// TestCreateFollowsRequiredTopology creates a volume with a requisite
// segment naming each node in turn, the node a stable order would skip
// first: it lands on that node, and the volume records the topology the
// plugin returned; its claim and its delete reach that node's controller.
// A requirement no node has is refused with a typed error, and nothing is
// created anywhere. The control at the end shows
// that routing by stable order puts the volume on the wrong node.
func TestCreateFollowsRequiredTopology(t *testing.T) {
	nc := newNodeLocalCluster(t, nil)
	first := nc.stableFirst()
	for n, agent := range []int{1 - first, first} {
		id := fmt.Sprintf("placed-%d", n)
		v, err := nc.createOn(t, id, agent, nil)
		if err != nil {
			t.Fatalf("create %s on csi-node-%d: %v", id, agent, err)
		}
		if got, want := v.GetControllerNodeId(), nc.c.Agent(agent).NodeID(); got != want {
			t.Errorf("%s: controller node %s, want %s (agent %d)", id, got, want, agent)
		}
		if at := nc.holder(t, id); at != agent {
			t.Errorf("%s: the plugin on agent %d holds it, want agent %d", id, at, agent)
		}
		if top := v.GetAccessibleTopology(); len(top) != 1 || top[0].GetSegments()[testplugin.DefaultTopologyKey] != fmt.Sprintf("csi-node-%d", agent) {
			t.Errorf("%s: recorded topology %v, want the plugin's {%s: csi-node-%d}", id, top, testplugin.DefaultTopologyKey, agent)
		}
	}

	// Claims and deletes reach the controller that holds the volume too:
	// the other one would answer NotFound to the publish, and success to
	// the delete, leaving the volume behind.
	for n, agent := range []int{1 - first, first} {
		id := fmt.Sprintf("placed-%d", n)
		if _, err := nc.claim(t, id, agent, "w", nil); err != nil {
			t.Fatalf("claim %s on agent %d: %v", id, agent, err)
		}
		if err := nc.release(t, id, agent, "w"); err != nil {
			t.Fatalf("release %s: %v", id, err)
		}
		if _, err := nc.control(t).DeleteVolume(context.Background(), &csisupdv1.VolumeDeleteRequest{Id: id}); err != nil {
			t.Fatalf("delete %s: %v", id, err)
		}
		if at := nc.holder(t, id); at >= 0 {
			t.Errorf("%s is still in the plugin on agent %d after its delete", id, at)
		}
	}

	_, err := nc.control(t).CreateVolume(context.Background(), &csisupdv1.VolumeCreateRequest{
		Id: "nowhere", PluginId: "nl",
		AccessibilityRequirements: &csisupdv1.TopologyRequirement{Requisite: []*csisupdv1.TopologySegment{
			{Segments: map[string]string{testplugin.DefaultTopologyKey: "csi-node-9"}},
		}},
	})
	d, ok := csisupdv1.ErrorDetail[*csisupdv1.TopologyUnsatisfiable](err)
	if status.Code(err) != codes.FailedPrecondition || !ok || !slices.Contains(d.GetRequisite(), testplugin.DefaultTopologyKey+"=csi-node-9") {
		t.Fatalf("create with an unknown requisite = %v, want FailedPrecondition with TopologyUnsatisfiable naming it", err)
	}
	if at := nc.holder(t, "nowhere"); at >= 0 {
		t.Errorf("a refused create left a volume on agent %d", at)
	}
	if _, err := nc.control(t).GetVolume(context.Background(), &csisupdv1.VolumeGetRequest{Id: "nowhere"}); status.Code(err) != codes.NotFound {
		t.Errorf("a refused create was recorded: %v", err)
	}

	// Control: the controller a stable order picks first creates on its
	// own node even when asked for the other.
	resp, err := nc.directCSI(t, first).CreateVolume(context.Background(), &csi.CreateVolumeRequest{
		Name: "stable-order", VolumeCapabilities: mountCaps,
		AccessibilityRequirements: &csi.TopologyRequirement{Requisite: []*csi.Topology{{Segments: nodeSegment(1 - first).GetSegments()}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetVolume().GetAccessibleTopology()[0].GetSegments()[testplugin.DefaultTopologyKey]; got == fmt.Sprintf("csi-node-%d", 1-first) {
		t.Fatalf("the node-local plugin honoured a requisite it should ignore (%s): this test could not catch a stable-order router", got)
	}
}

// TestRestoreAndCloneReachTheSource snapshots a volume on the node a
// stable order would try last, then restores the snapshot and clones the
// volume without naming a topology: both reach the node that holds the
// source. The controls at the end show that the controller a stable order
// picks first does not know the source.
func TestRestoreAndCloneReachTheSource(t *testing.T) {
	nc := newNodeLocalCluster(t, nil)
	first := nc.stableFirst()
	home := 1 - first
	if _, err := nc.createOn(t, "origin", home, nil); err != nil {
		t.Fatal(err)
	}
	sresp, err := nc.control(t).CreateVolumeSnapshot(context.Background(), &csisupdv1.VolumeSnapshotCreateRequest{VolumeId: "origin", Id: "origin-snap"})
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	snap := sresp.GetSnapshot()
	if snap.GetControllerNodeId() != nc.c.Agent(home).NodeID() || snap.GetExternalId() == "" || snap.GetState() != "created" {
		t.Fatalf("snapshot = %v, want created by agent %d's controller with an external id", snap, home)
	}
	if n := len(nc.plugins[home].Snapshots()); n != 1 {
		t.Fatalf("plugin on agent %d has %d snapshots, want 1", home, n)
	}
	if n := len(nc.plugins[first].Snapshots()); n != 0 {
		t.Fatalf("plugin on agent %d has %d snapshots, want 0", first, n)
	}
	testutil.WaitFor(t, 10*time.Second, "snapshot ready to use", func() bool {
		r, err := nc.control(t).GetVolumeSnapshot(context.Background(), &csisupdv1.VolumeSnapshotGetRequest{Id: "origin-snap"})
		return err == nil && r.GetSnapshot().GetReadyToUse()
	})

	for _, tc := range []struct {
		id  string
		src *csisupdv1.VolumeContentSource
	}{
		{"restored", &csisupdv1.VolumeContentSource{Source: &csisupdv1.VolumeContentSource_SnapshotId{SnapshotId: "origin-snap"}}},
		{"cloned", &csisupdv1.VolumeContentSource{Source: &csisupdv1.VolumeContentSource_VolumeId{VolumeId: "origin"}}},
	} {
		v, err := nc.createOn(t, tc.id, -1, tc.src)
		if err != nil {
			t.Fatalf("create %s: %v", tc.id, err)
		}
		if v.GetControllerNodeId() != nc.c.Agent(home).NodeID() || nc.holder(t, tc.id) != home {
			t.Errorf("%s: created by node %s (plugin holder %d), want agent %d, which holds the source", tc.id, v.GetControllerNodeId(), nc.holder(t, tc.id), home)
		}
		if v.GetContentSource() == nil {
			t.Errorf("%s: content source not recorded", tc.id)
		}
	}

	// Controls: the first controller of a stable order knows neither.
	direct := nc.directCSI(t, first)
	if _, err := direct.CreateVolume(context.Background(), &csi.CreateVolumeRequest{
		Name: "stable-restore", VolumeCapabilities: mountCaps,
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetExternalId()}}},
	}); status.Code(err) != codes.NotFound {
		t.Errorf("restore through the stable-order controller = %v, want NotFound: this test could not catch a stable-order router", err)
	}
	origin := nc.volume(t, "origin")
	if _, err := direct.CreateVolume(context.Background(), &csi.CreateVolumeRequest{
		Name: "stable-clone", VolumeCapabilities: mountCaps,
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: origin.GetExternalId()}}},
	}); status.Code(err) != codes.NotFound {
		t.Errorf("clone through the stable-order controller = %v, want NotFound", err)
	}
}

// TestSnapshotLifecycle lists, follows and deletes snapshots: a snapshot
// not ready yet is followed until it is, and refused as a source until
// then; the list filters by volume; deleting removes it from the plugin
// and the list; an unknown snapshot is NotFound; one the plugin lost is
// forgotten.
func TestSnapshotLifecycle(t *testing.T) {
	nc := newNodeLocalCluster(t, func(_ int, cfg *testplugin.Config) { cfg.SnapshotReadyAfter = 3 })
	ctl := nc.control(t)
	ctx := context.Background()
	for _, id := range []string{"a", "b"} {
		if _, err := nc.createOn(t, id, 0, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range [][2]string{{"a", "a1"}, {"a", "a2"}, {"b", "b1"}} {
		if _, err := ctl.CreateVolumeSnapshot(ctx, &csisupdv1.VolumeSnapshotCreateRequest{VolumeId: s[0], Id: s[1], Parameters: map[string]string{"k": "v"}}); err != nil {
			t.Fatalf("snapshot %s of %s: %v", s[1], s[0], err)
		}
	}
	r, err := ctl.GetVolumeSnapshot(ctx, &csisupdv1.VolumeSnapshotGetRequest{Id: "a1"})
	if err != nil || r.GetSnapshot().GetReadyToUse() {
		t.Fatalf("a1 = %v, %v; want not ready yet", r.GetSnapshot(), err)
	}
	if _, err := nc.createOn(t, "early", -1, &csisupdv1.VolumeContentSource{Source: &csisupdv1.VolumeContentSource_SnapshotId{SnapshotId: "a1"}}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("restore from a snapshot not ready = %v, want FailedPrecondition", err)
	}
	testutil.WaitFor(t, 20*time.Second, "every snapshot followed until ready", func() bool {
		l, err := ctl.ListVolumeSnapshots(ctx, &csisupdv1.VolumeSnapshotListRequest{})
		if err != nil || len(l.GetSnapshots()) != 3 {
			return false
		}
		for _, s := range l.GetSnapshots() {
			if !s.GetReadyToUse() {
				return false
			}
		}
		return true
	})
	if n := nc.plugins[0].Stats().Calls["GetSnapshot"]; n == 0 {
		t.Errorf("snapshots followed without GetSnapshot, which the plugin has")
	}
	l, err := ctl.ListVolumeSnapshots(ctx, &csisupdv1.VolumeSnapshotListRequest{VolumeId: "a"})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range l.GetSnapshots() {
		ids = append(ids, s.GetId())
		if s.GetPluginId() != "nl" || s.GetSourceVolumeId() != "a" || s.GetCreatedAt() == nil || s.GetParameters()["k"] != "v" {
			t.Errorf("listed snapshot %v lacks a field", s)
		}
	}
	if !slices.Equal(ids, []string{"a1", "a2"}) {
		t.Errorf("snapshots of a = %v, want [a1 a2]", ids)
	}

	if _, err := ctl.DeleteVolumeSnapshot(ctx, &csisupdv1.VolumeSnapshotDeleteRequest{Id: "a1"}); err != nil {
		t.Fatalf("delete a1: %v", err)
	}
	for _, s := range nc.plugins[0].Snapshots() {
		if s.Name == "a1" {
			t.Errorf("a1 still in the plugin after its delete")
		}
	}
	if _, err := ctl.GetVolumeSnapshot(ctx, &csisupdv1.VolumeSnapshotGetRequest{Id: "a1"}); status.Code(err) != codes.NotFound {
		t.Errorf("get a deleted snapshot = %v, want NotFound", err)
	}
	if _, err := ctl.DeleteVolumeSnapshot(ctx, &csisupdv1.VolumeSnapshotDeleteRequest{Id: "a1"}); status.Code(err) != codes.NotFound {
		t.Errorf("delete an unknown snapshot = %v, want NotFound", err)
	}
	// The plugin loses b1; deleting it then succeeds and forgets it.
	b1, err := ctl.GetVolumeSnapshot(ctx, &csisupdv1.VolumeSnapshotGetRequest{Id: "b1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.directCSI(t, 0).DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: b1.GetSnapshot().GetExternalId()}); err != nil {
		t.Fatal(err)
	}
	if _, err := ctl.DeleteVolumeSnapshot(ctx, &csisupdv1.VolumeSnapshotDeleteRequest{Id: "b1"}); err != nil {
		t.Errorf("delete a snapshot the plugin lost = %v, want success", err)
	}
	l, err = ctl.ListVolumeSnapshots(ctx, &csisupdv1.VolumeSnapshotListRequest{})
	if err != nil || len(l.GetSnapshots()) != 1 || l.GetSnapshots()[0].GetId() != "a2" {
		t.Errorf("snapshots left = %v, %v; want only a2", l.GetSnapshots(), err)
	}
}

// TestExpandClaimedVolume expands a volume claimed on both nodes of a
// plugin that needs node expansion: the recorded capacity rises, and
// NodeExpandVolume reached each node with the volume and staging paths of
// that node's own mount. A shrink and a size over the volume's limit are
// refused.
func TestExpandClaimedVolume(t *testing.T) {
	cc := &claimCluster{c: testcluster.New(t, testcluster.Config{Servers: 3, Agents: 2, Configure: fastVolumeWatcher})}
	for i, a := range cc.c.Agents() {
		cc.plugins = append(cc.plugins, a.StartPlugin("tp", testplugin.Config{NodeID: fmt.Sprintf("csi-node-%d", i), NodeExpansionRequired: true}))
	}
	testutil.WaitFor(t, 30*time.Second, "plugin tp healthy on both agents", func() bool {
		p, err := cc.control(t).GetPlugin(context.Background(), &csisupdv1.PluginGetRequest{Id: "tp"})
		return err == nil && p.GetPlugin().GetNodesHealthy() == 2
	})
	ctx := context.Background()
	if _, err := cc.control(t).CreateVolume(ctx, &csisupdv1.VolumeCreateRequest{
		Id: "grow", PluginId: "tp", CapacityMinBytes: 1 << 20, CapacityMaxBytes: 8 << 20,
		Capabilities: []*csisupdv1.VolumeCapability{{AccessType: "mount", AccessMode: "MULTI_NODE_MULTI_WRITER"}},
	}); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := cc.claim(t, "grow", i, "w", &csisupdv1.VolumeUsage{AccessMode: "MULTI_NODE_MULTI_WRITER"}); err != nil {
			t.Fatalf("claim on agent %d: %v", i, err)
		}
	}
	resp, err := cc.control(t).ExpandVolume(ctx, &csisupdv1.VolumeExpandRequest{Id: "grow", CapacityMinBytes: 4 << 20})
	if err != nil {
		t.Fatalf("expand: %v", err)
	}
	if v := resp.GetVolume(); v.GetCapacityBytes() != 4<<20 || v.GetExpansion() != nil {
		t.Errorf("expanded volume: capacity %d, expansion %v; want %d and none under way", v.GetCapacityBytes(), v.GetExpansion(), 4<<20)
	}
	for i, p := range cc.plugins {
		var publish, expand *testplugin.NodeCall
		for _, c := range p.NodeLog() {
			switch c.Method {
			case "NodePublishVolume":
				publish = &c
			case "NodeExpandVolume":
				expand = &c
			}
		}
		if publish == nil || expand == nil {
			t.Fatalf("agent %d: node log %v lacks a publish or an expansion", i, methods(p.NodeLog()))
		}
		if expand.Path != publish.Path || expand.StagingPath != publish.StagingPath || expand.RequiredBytes != 4<<20 {
			t.Errorf("agent %d: NodeExpandVolume(path %q, staging %q, %d bytes), want this node's mount (%q, %q) and %d bytes",
				i, expand.Path, expand.StagingPath, expand.RequiredBytes, publish.Path, publish.StagingPath, 4<<20)
		}
	}
	if _, err := cc.control(t).ExpandVolume(ctx, &csisupdv1.VolumeExpandRequest{Id: "grow", CapacityMinBytes: 2 << 20}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("shrink = %v, want InvalidArgument", err)
	}
	if _, err := cc.control(t).ExpandVolume(ctx, &csisupdv1.VolumeExpandRequest{Id: "grow", CapacityMinBytes: 16 << 20}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("expansion over the limit = %v, want InvalidArgument", err)
	}
}

// TestOfflineExpansionWaitsForRelease: a plugin that expands only offline
// refuses while the volume is claimed, naming the claim, and expands once
// it is released.
func TestOfflineExpansionWaitsForRelease(t *testing.T) {
	cc := &claimCluster{c: testcluster.New(t, testcluster.Config{Servers: 3, Agents: 1, Configure: fastVolumeWatcher})}
	cc.plugins = append(cc.plugins, cc.c.Agent(0).StartPlugin("tp", testplugin.Config{NodeID: "csi-node-0", Expansion: testplugin.ExpansionOffline}))
	testutil.WaitFor(t, 30*time.Second, "plugin tp healthy", func() bool {
		p, err := cc.control(t).GetPlugin(context.Background(), &csisupdv1.PluginGetRequest{Id: "tp"})
		return err == nil && p.GetPlugin().GetNodesHealthy() == 1
	})
	cc.create(t, "offline", "SINGLE_NODE_WRITER")
	if _, err := cc.claim(t, "offline", 0, "w", nil); err != nil {
		t.Fatal(err)
	}
	_, err := cc.control(t).ExpandVolume(context.Background(), &csisupdv1.VolumeExpandRequest{Id: "offline", CapacityMinBytes: 4 << 20})
	if status.Code(err) != codes.FailedPrecondition || !containsAll(status.Convert(err).Message(), "offline", "w") {
		t.Fatalf("expand while claimed = %v, want FailedPrecondition naming the claim", err)
	}
	if err := cc.release(t, "offline", 0, "w"); err != nil {
		t.Fatal(err)
	}
	resp, err := cc.control(t).ExpandVolume(context.Background(), &csisupdv1.VolumeExpandRequest{Id: "offline", CapacityMinBytes: 4 << 20})
	if err != nil || resp.GetVolume().GetCapacityBytes() != 4<<20 {
		t.Fatalf("expand after release = %v, %v; want 4 MiB", resp.GetVolume(), err)
	}
}

// TestModifyVolume records the mutable parameters ControllerModifyVolume
// took, and refuses with CapabilityMissing when the plugin lacks
// MODIFY_VOLUME.
func TestModifyVolume(t *testing.T) {
	nc := newNodeLocalCluster(t, nil)
	if _, err := nc.createOn(t, "tuned", 1-nc.stableFirst(), nil); err != nil {
		t.Fatal(err)
	}
	resp, err := nc.control(t).ModifyVolume(context.Background(), &csisupdv1.VolumeModifyRequest{Id: "tuned", MutableParameters: map[string]string{"iops": "3000"}})
	if err != nil {
		t.Fatalf("modify: %v", err)
	}
	if got := resp.GetVolume().GetMutableParameters()["iops"]; got != "3000" {
		t.Errorf("recorded iops = %q, want 3000", got)
	}
	home := nc.holder(t, "tuned")
	for _, v := range nc.plugins[home].Volumes() {
		if v.Name == "tuned" && v.MutableParameters["iops"] != "3000" {
			t.Errorf("the plugin's volume has mutable parameters %v, want iops=3000", v.MutableParameters)
		}
	}
	if _, err := nc.control(t).ModifyVolume(context.Background(), &csisupdv1.VolumeModifyRequest{Id: "tuned", MutableParameters: map[string]string{"colour": "red"}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("modify with a key the plugin refuses = %v, want its InvalidArgument", err)
	}

	cc := newClaimCluster(t, csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME)
	cc.create(t, "plain", "SINGLE_NODE_WRITER")
	_, err = cc.control(t).ModifyVolume(context.Background(), &csisupdv1.VolumeModifyRequest{Id: "plain", MutableParameters: map[string]string{"iops": "1"}})
	if _, ok := csisupdv1.ErrorDetail[*csisupdv1.CapabilityMissing](err); !ok {
		t.Errorf("modify without MODIFY_VOLUME = %v, want CapabilityMissing", err)
	}
}

// containsAll reports whether s contains every one of subs.
func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// TestMisplacedCreateIsUndone: a plugin whose controller satisfies the
// requisite segment but creates the volume elsewhere (it ignored the
// requirement) gets the volume deleted again, and the create is refused
// with a TopologyUnsatisfiable error that says so; nothing is recorded.
func TestMisplacedCreateIsUndone(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 3})
	leader := checkFormed(t, c, 3)
	cl := c.Control(leader.Index)
	a := startFakeAgent(t, "node-a")
	inZone := monolith("p1", "node-a")
	inZone.AccessibleTopology = map[string]string{"zone": "a"}
	startNode(t, "node-a", a.addr, c.RPCAddrs(), inZone)
	testutil.WaitFor(t, 10*time.Second, "a healthy controller", func() bool {
		p := pluginOf(t, cl, "p1")
		return p != nil && p.GetControllersHealthy() == 1
	})
	// The fake controller puts a volume in the zone its "zone" parameter
	// names, whatever the requirement says.
	_, err := cl.CreateVolume(context.Background(), &csisupdv1.VolumeCreateRequest{
		Id: "astray", PluginId: "p1", Parameters: map[string]string{"zone": "b"},
		AccessibilityRequirements: &csisupdv1.TopologyRequirement{Requisite: []*csisupdv1.TopologySegment{{Segments: map[string]string{"zone": "a"}}}},
	})
	d, ok := csisupdv1.ErrorDetail[*csisupdv1.TopologyUnsatisfiable](err)
	if status.Code(err) != codes.FailedPrecondition || !ok || !containsAll(d.GetReason(), "ignored the requirement", "zone=b", "deleted") {
		t.Fatalf("misplaced create = %v (detail %v), want TopologyUnsatisfiable saying the volume was deleted", err, d)
	}
	if a.callCount("create astray") != 1 || a.callCount("delete ext-astray") != 1 {
		t.Errorf("controller calls %v, want one create and one delete of astray", a.calls)
	}
	if _, err := cl.GetVolume(context.Background(), &csisupdv1.VolumeGetRequest{Id: "astray"}); status.Code(err) != codes.NotFound {
		t.Errorf("the misplaced volume was recorded: %v", err)
	}
	// In its zone, the same controller's volume is recorded with the
	// topology the plugin returned.
	resp, err := cl.CreateVolume(context.Background(), &csisupdv1.VolumeCreateRequest{
		Id: "placed", PluginId: "p1", Parameters: map[string]string{"zone": "a"},
		AccessibilityRequirements: &csisupdv1.TopologyRequirement{Requisite: []*csisupdv1.TopologySegment{{Segments: map[string]string{"zone": "a"}}}},
	})
	if err != nil || len(resp.GetVolume().GetAccessibleTopology()) != 1 || resp.GetVolume().GetAccessibleTopology()[0].GetSegments()["zone"] != "a" {
		t.Fatalf("create in the zone = %v, %v", resp.GetVolume(), err)
	}
}

// TestSnapshotFollowedWithListSnapshots: a plugin without GET_SNAPSHOT has
// its snapshots followed with ListSnapshots until they are ready.
func TestSnapshotFollowedWithListSnapshots(t *testing.T) {
	nc := newNodeLocalCluster(t, func(_ int, cfg *testplugin.Config) {
		cfg.SnapshotReadyAfter = 2
		cfg.ControllerCapabilities = testplugin.DefaultControllerCapabilities
	})
	if _, err := nc.createOn(t, "v", 0, nil); err != nil {
		t.Fatal(err)
	}
	ctl := nc.control(t)
	if _, err := ctl.CreateVolumeSnapshot(context.Background(), &csisupdv1.VolumeSnapshotCreateRequest{VolumeId: "v", Id: "s"}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, "the snapshot followed until ready", func() bool {
		r, err := ctl.GetVolumeSnapshot(context.Background(), &csisupdv1.VolumeSnapshotGetRequest{Id: "s"})
		return err == nil && r.GetSnapshot().GetReadyToUse()
	})
	st := nc.plugins[0].Stats()
	if st.Calls["ListSnapshots"] == 0 || st.Calls["GetSnapshot"] != 0 {
		t.Errorf("calls: ListSnapshots %d, GetSnapshot %d; want ListSnapshots only", st.Calls["ListSnapshots"], st.Calls["GetSnapshot"])
	}
}

// TestVolumeDeleteWaitsForItsSnapshots: while a snapshot of a volume is
// being created, deleting the volume is refused before the plugin is
// called; the snapshot is completed by the leader after its caller gave
// up, and then the volume can go.
func TestVolumeDeleteWaitsForItsSnapshots(t *testing.T) {
	nc := newNodeLocalCluster(t, nil)
	if _, err := nc.createOn(t, "v", 0, nil); err != nil {
		t.Fatal(err)
	}
	nc.plugins[0].SetFaults(testplugin.Faults{AnswerDelays: map[string]time.Duration{"CreateSnapshot": time.Hour}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := nc.control(t).CreateVolumeSnapshot(ctx, &csisupdv1.VolumeSnapshotCreateRequest{VolumeId: "v", Id: "s"})
		done <- err
	}()
	testutil.WaitFor(t, 10*time.Second, "the plugin to make the snapshot", func() bool { return len(nc.plugins[0].Snapshots()) == 1 })
	_, err := nc.control(t).DeleteVolume(context.Background(), &csisupdv1.VolumeDeleteRequest{Id: "v"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "being created") {
		t.Fatalf("delete while a snapshot is being created = %v, want FailedPrecondition", err)
	}
	if nc.holder(t, "v") != 0 {
		t.Fatal("the refused delete reached the plugin")
	}
	nc.plugins[0].SetFaults(testplugin.Faults{})
	if err := <-done; err == nil {
		t.Fatal("the snapshot call whose answer never came succeeded")
	}
	testutil.WaitFor(t, 20*time.Second, "the leader to complete the snapshot", func() bool {
		r, err := nc.control(t).GetVolumeSnapshot(context.Background(), &csisupdv1.VolumeSnapshotGetRequest{Id: "s"})
		return err == nil && r.GetSnapshot().GetState() == "created"
	})
	if n := len(nc.plugins[0].Snapshots()); n != 1 {
		t.Errorf("plugin has %d snapshots, want the one", n)
	}
	if _, err := nc.control(t).DeleteVolume(context.Background(), &csisupdv1.VolumeDeleteRequest{Id: "v"}); err != nil {
		t.Fatalf("delete once the snapshot is created: %v", err)
	}
}

// TestRefusedSnapshotIsForgotten: a CreateSnapshot the plugin refuses
// (InvalidArgument) fails the call with the plugin's code and forgets the
// snapshot, since the plugin made none; a failure that may pass (the
// plugin unavailable) keeps it recorded as creating, with the error, and
// the leader completes it once the plugin answers. A delete the plugin
// refuses keeps the snapshot, created, with the refusal.
func TestRefusedSnapshotIsForgotten(t *testing.T) {
	nc := newNodeLocalCluster(t, nil)
	if _, err := nc.createOn(t, "v", 0, nil); err != nil {
		t.Fatal(err)
	}
	ctl := nc.control(t)
	ctx := context.Background()
	nc.plugins[0].SetFaults(testplugin.Faults{Errors: map[string]codes.Code{"CreateSnapshot": codes.InvalidArgument}})
	if _, err := ctl.CreateVolumeSnapshot(ctx, &csisupdv1.VolumeSnapshotCreateRequest{VolumeId: "v", Id: "refused"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("refused snapshot = %v, want the plugin's InvalidArgument", err)
	}
	if _, err := ctl.GetVolumeSnapshot(ctx, &csisupdv1.VolumeSnapshotGetRequest{Id: "refused"}); status.Code(err) != codes.NotFound {
		t.Errorf("a refused snapshot is still recorded: %v", err)
	}

	nc.plugins[0].SetFaults(testplugin.Faults{Errors: map[string]codes.Code{"CreateSnapshot": codes.Internal}})
	if _, err := ctl.CreateVolumeSnapshot(ctx, &csisupdv1.VolumeSnapshotCreateRequest{VolumeId: "v", Id: "later"}); status.Code(err) != codes.Internal {
		t.Fatalf("failed snapshot = %v, want the plugin's Internal", err)
	}
	r, err := ctl.GetVolumeSnapshot(ctx, &csisupdv1.VolumeSnapshotGetRequest{Id: "later"})
	if err != nil || r.GetSnapshot().GetState() != "creating" || r.GetSnapshot().GetLastError() == "" {
		t.Fatalf("failed snapshot recorded as %v, %v; want creating with its error", r.GetSnapshot(), err)
	}
	nc.plugins[0].SetFaults(testplugin.Faults{})
	testutil.WaitFor(t, 30*time.Second, "the leader to complete the snapshot", func() bool {
		r, err := ctl.GetVolumeSnapshot(ctx, &csisupdv1.VolumeSnapshotGetRequest{Id: "later"})
		return err == nil && r.GetSnapshot().GetState() == "created" && r.GetSnapshot().GetLastError() == ""
	})

	// A delete the plugin refuses keeps the snapshot, created.
	nc.plugins[0].SetFaults(testplugin.Faults{Errors: map[string]codes.Code{"DeleteSnapshot": codes.FailedPrecondition}})
	if _, err := ctl.DeleteVolumeSnapshot(ctx, &csisupdv1.VolumeSnapshotDeleteRequest{Id: "later"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("refused delete = %v, want the plugin's FailedPrecondition", err)
	}
	r, err = ctl.GetVolumeSnapshot(ctx, &csisupdv1.VolumeSnapshotGetRequest{Id: "later"})
	if err != nil || r.GetSnapshot().GetState() != "created" || r.GetSnapshot().GetLastError() == "" || len(nc.plugins[0].Snapshots()) != 1 {
		t.Fatalf("after a refused delete: %v, %v; want it kept, created, with the refusal", r.GetSnapshot(), err)
	}
	nc.plugins[0].SetFaults(testplugin.Faults{})
	if _, err := ctl.DeleteVolumeSnapshot(ctx, &csisupdv1.VolumeSnapshotDeleteRequest{Id: "later"}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if n := len(nc.plugins[0].Snapshots()); n != 0 {
		t.Errorf("plugin still has %d snapshots", n)
	}
}

// TestRefusedExpansionIsAbandoned: a ControllerExpandVolume the plugin
// refuses ends the expansion with the plugin's code, and the volume keeps
// its size, with nothing left for the volume watcher; an expansion the
// plugin fails for now stays recorded with its error, and the leader
// finishes it once the plugin answers.
func TestRefusedExpansionIsAbandoned(t *testing.T) {
	cc := newClaimCluster(t)
	cc.create(t, "v", "SINGLE_NODE_WRITER")
	ctx := context.Background()
	for _, p := range cc.plugins {
		p.SetFaults(testplugin.Faults{Errors: map[string]codes.Code{"ControllerExpandVolume": codes.OutOfRange}})
	}
	if _, err := cc.control(t).ExpandVolume(ctx, &csisupdv1.VolumeExpandRequest{Id: "v", CapacityMinBytes: 4 << 20}); status.Code(err) != codes.OutOfRange {
		t.Fatalf("refused expansion = %v, want the plugin's OutOfRange", err)
	}
	if v := cc.volume(t, "v"); v.GetExpansion() != nil || v.GetCapacityBytes() != 1<<20 {
		t.Fatalf("after a refused expansion: capacity %d, expansion %v; want 1 MiB and none", v.GetCapacityBytes(), v.GetExpansion())
	}

	for _, p := range cc.plugins {
		p.SetFaults(testplugin.Faults{Errors: map[string]codes.Code{"ControllerExpandVolume": codes.Internal}})
	}
	if _, err := cc.control(t).ExpandVolume(ctx, &csisupdv1.VolumeExpandRequest{Id: "v", CapacityMinBytes: 4 << 20}); status.Code(err) != codes.Internal {
		t.Fatalf("failed expansion = %v, want the plugin's Internal", err)
	}
	if e := cc.volume(t, "v").GetExpansion(); e.GetState() != "controller" || e.GetLastError() == "" {
		t.Fatalf("after a failed expansion: %v, want it recorded with its error", e)
	}
	for _, p := range cc.plugins {
		p.SetFaults(testplugin.Faults{})
	}
	testutil.WaitFor(t, 30*time.Second, "the leader to finish the expansion", func() bool {
		v := cc.volume(t, "v")
		return v.GetExpansion() == nil && v.GetCapacityBytes() == 4<<20
	})
}
