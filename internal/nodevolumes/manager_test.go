package nodevolumes

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

func TestMountUnmountHappyPath(t *testing.T) {
	e := newEnv(t, Config{}, true)
	ctx := context.Background()

	mnt, err := e.m.Mount(ctx, mountReq("v1", "w1"))
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(e.dataDir, "volumes", "tp")
	wantHost := filepath.Join(root, "per-workload", "w1", "v1", defaultKey)
	wantStaging := filepath.Join(root, "staging", "v1", defaultKey)
	if mnt.GetState() != StatePublished || mnt.GetHostPath() != wantHost || mnt.GetStagingPath() != wantStaging ||
		mnt.GetUsageKey() != defaultKey || mnt.GetExternalId() != "v1" {
		t.Fatalf("mount = %v, want published at %s staged at %s", mnt, wantHost, wantStaging)
	}
	if got := e.plug.calls("NodeStageVolume"); got != 1 {
		t.Errorf("NodeStageVolume calls = %d, want 1", got)
	}
	if got := e.plug.calls("NodePublishVolume"); got != 1 {
		t.Errorf("NodePublishVolume calls = %d, want 1", got)
	}
	// The host path is the plugin's publish target: a file written there
	// lands in the plugin's volume.
	if err := os.WriteFile(filepath.Join(mnt.GetHostPath(), "hello"), []byte("hi"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(e.plug.dataPath("v1"), "hello")); err != nil || string(b) != "hi" {
		t.Fatalf("file in the plugin's volume = %q, %v; want %q", b, err, "hi")
	}
	n, ok := e.plug.node(t, "v1")
	if !ok || n.StagingPath != wantStaging || len(n.Targets) != 1 || n.Targets[wantHost] == nil {
		t.Fatalf("plugin node record = %+v, %t; want staged at %s, published at %s", n, ok, wantStaging, wantHost)
	}
	// The record is on disk, 0600, in a 0700 directory.
	rec, ok := e.readRecord(t, "tp", "v1", "w1", defaultKey)
	if !ok || rec.State != StatePublished || rec.PluginPath != wantHost || rec.PluginStagingPath != wantStaging {
		t.Fatalf("record = %+v, %t", rec, ok)
	}
	fi, err := os.Stat(filepath.Join(e.dataDir, RecordsDir, journalName))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("records journal mode = %v, %v; want 0600", fi.Mode(), err)
	}
	for _, d := range []string{filepath.Join(e.dataDir, RecordsDir), wantStaging, filepath.Dir(wantHost)} {
		if fi, err := os.Stat(d); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s mode = %v, %v; want 0700", d, fi.Mode(), err)
		}
	}
	if got := e.m.List("", ""); len(got) != 1 || !proto.Equal(got[0], mnt) {
		t.Errorf("List = %v, want [%v]", got, mnt)
	}

	// Stats and Expand reach the plugin with the mount's paths.
	st, err := e.m.Stats(ctx, &csisupdv1.VolumeStatsRequest{PluginId: "tp", VolumeId: "v1"})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetVolumePath() != wantHost || len(st.GetResponse().GetUsage()) == 0 || st.GetResponse().GetUsage()[0].GetUsed() != 2 {
		t.Errorf("Stats = %v, want 2 bytes used at %s", st, wantHost)
	}
	ex, err := e.m.Expand(ctx, &csisupdv1.ExpandVolumeRequest{PluginId: "tp", VolumeId: "v1", WorkloadId: "w1", RequiredBytes: 1 << 20})
	if err != nil || ex.GetCapacityBytes() != 1<<20 {
		t.Errorf("Expand = %v, %v; want %d bytes", ex, err, 1<<20)
	}
	if _, err := e.m.Stats(ctx, &csisupdv1.VolumeStatsRequest{PluginId: "tp", VolumeId: "v1", WorkloadId: "w2"}); status.Code(err) != codes.NotFound {
		t.Errorf("Stats of a workload without the mount: %v, want NotFound", err)
	}

	resp, err := e.m.Unmount(ctx, unmountReq("v1", "w1"))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetUnmounted()) != 1 || !resp.GetUnstaged() {
		t.Fatalf("Unmount = %v, want one mount unmounted and unstaged", resp)
	}
	if got, want := e.events.types(), []plugin.EventType{plugin.EventVolumeStaged, plugin.EventVolumePublished,
		plugin.EventVolumeUnpublished, plugin.EventVolumeUnstaged}; !slices.Equal(got, want) {
		t.Errorf("events = %v, want %v", got, want)
	}
	for _, ev := range e.events.all() {
		if ev.PluginID != "tp" || ev.VolumeID != "v1" || ev.WorkloadID != "w1" {
			t.Errorf("event %+v does not name plugin tp, volume v1, workload w1", ev)
		}
	}
	if _, ok := e.plug.node(t, "v1"); ok {
		t.Error("the plugin still has the volume staged or published")
	}
	for _, d := range []string{wantHost, filepath.Join(root, "per-workload", "w1"), filepath.Join(root, "staging", "v1")} {
		if exists(d) {
			t.Errorf("%s is left after the unmount", d)
		}
	}
	if files := e.diskRecords(t); len(files) != 0 {
		t.Errorf("records left: %v", files)
	}
	if got := e.m.List("", ""); len(got) != 0 {
		t.Errorf("List after unmount = %v", got)
	}
	// Unmounting again succeeds with nothing to do.
	if resp, err := e.m.Unmount(ctx, unmountReq("v1", "w1")); err != nil || len(resp.GetUnmounted()) != 0 {
		t.Errorf("second Unmount = %v, %v; want nothing unmounted", resp, err)
	}
}

func TestTwoWorkloadsShareOneStaging(t *testing.T) {
	e := newEnv(t, Config{}, true)
	ctx := context.Background()
	m1, err := e.m.Mount(ctx, mountReq("v1", "w1"))
	if err != nil {
		t.Fatal(err)
	}
	m2, err := e.m.Mount(ctx, mountReq("v1", "w2"))
	if err != nil {
		t.Fatal(err)
	}
	if m1.GetStagingPath() != m2.GetStagingPath() || m1.GetHostPath() == m2.GetHostPath() {
		t.Fatalf("mounts %v and %v: want one staging path and two host paths", m1, m2)
	}
	if s, p := e.plug.calls("NodeStageVolume"), e.plug.calls("NodePublishVolume"); s != 1 || p != 2 {
		t.Fatalf("NodeStageVolume %d, NodePublishVolume %d calls; want 1 and 2", s, p)
	}
	resp, err := e.m.Unmount(ctx, unmountReq("v1", "w1"))
	if err != nil || resp.GetUnstaged() || len(resp.GetUnmounted()) != 1 {
		t.Fatalf("first Unmount = %v, %v; want unmounted, not unstaged", resp, err)
	}
	if n, ok := e.plug.node(t, "v1"); !ok || n.StagingPath != m1.GetStagingPath() || len(n.Targets) != 1 {
		t.Fatalf("plugin node record after the first unmount = %+v, %t; want staged with one target", n, ok)
	}
	if e.plug.calls("NodeUnstageVolume") != 0 || !exists(m1.GetStagingPath()) {
		t.Fatal("the staging was removed while the second workload uses it")
	}
	resp, err = e.m.Unmount(ctx, unmountReq("v1", "w2"))
	if err != nil || !resp.GetUnstaged() {
		t.Fatalf("second Unmount = %v, %v; want unstaged", resp, err)
	}
	if _, ok := e.plug.node(t, "v1"); ok || e.plug.calls("NodeUnstageVolume") != 1 {
		t.Error("the volume is still staged after its last unmount")
	}
}

func TestPluginMountDirMapsPaths(t *testing.T) {
	hostRoot, pluginView := pluginViewRoots(t)
	e := newEnv(t, Config{PluginDirs: map[string]PluginDirs{"tp": {MountDir: hostRoot, PluginMountDir: pluginView}}}, true)
	ctx := context.Background()
	mnt, err := e.m.Mount(ctx, mountReq("v1", "w1"))
	if err != nil {
		t.Fatal(err)
	}
	wantHost := filepath.Join(hostRoot, "per-workload", "w1", "v1", defaultKey)
	if mnt.GetHostPath() != wantHost || mnt.GetStagingPath() != filepath.Join(hostRoot, "staging", "v1", defaultKey) {
		t.Fatalf("mount = %v, want host paths under %s", mnt, hostRoot)
	}
	n, ok := e.plug.node(t, "v1")
	wantPluginTarget := filepath.Join(pluginView, "per-workload", "w1", "v1", defaultKey)
	if !ok || n.StagingPath != filepath.Join(pluginView, "staging", "v1", defaultKey) || n.Targets[wantPluginTarget] == nil {
		t.Fatalf("plugin node record = %+v; want its paths under %s", n, pluginView)
	}
	if err := os.WriteFile(filepath.Join(wantHost, "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if !exists(filepath.Join(e.plug.dataPath("v1"), "f")) {
		t.Fatal("a file written at the host path is not in the plugin's volume")
	}
	rec, _ := e.readRecord(t, "tp", "v1", "w1", defaultKey)
	if rec.PluginPath != wantPluginTarget || rec.Roots != (roots{Host: hostRoot, Plugin: pluginView}) {
		t.Errorf("record = %+v; want the plugin's paths and roots", rec)
	}
	if _, err := e.m.Unmount(ctx, unmountReq("v1", "w1")); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.plug.node(t, "v1"); ok {
		t.Error("the plugin still has the volume after the unmount")
	}
}

func TestMountIsIdempotent(t *testing.T) {
	e := newEnv(t, Config{}, true)
	ctx := context.Background()
	first, err := e.m.Mount(ctx, mountReq("v1", "w1"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := e.m.Mount(ctx, mountReq("v1", "w1"))
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(first, again) {
		t.Errorf("second Mount = %v, want %v unchanged", again, first)
	}
	if e.plug.calls("NodePublishVolume") != 1 || e.plug.calls("NodeStageVolume") != 1 {
		t.Errorf("the second Mount called the plugin: %v", e.plug.Stats().Calls)
	}
	// The same volume with another external id is refused.
	req := mountReq("v1", "w2")
	req.ExternalId = "other"
	if _, err := e.m.Mount(ctx, req); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "external id") {
		t.Errorf("Mount with another external id: %v, want FailedPrecondition naming the external id", err)
	}
	// Another usage of the same volume is another mount.
	req = mountReq("v1", "w1")
	req.Usage = &csisupdv1.VolumeUsage{ReadOnly: true, AccessMode: "MULTI_NODE_READER_ONLY"}
	if _, err := e.m.Mount(ctx, req); status.Code(err) != codes.FailedPrecondition {
		// The test plugin stages a volume at one path only.
		t.Errorf("Mount with another usage: %v, want the plugin's FailedPrecondition", err)
	}
	if files := e.diskRecords(t); len(files) != 1 {
		t.Errorf("records = %v, want the first mount's only", files)
	}
}

func TestNotFoundFromUnpublishAndUnstageIsDone(t *testing.T) {
	e := newEnv(t, Config{}, true)
	ctx := context.Background()
	if _, err := e.m.Mount(ctx, mountReq("v1", "w1")); err != nil {
		t.Fatal(err)
	}
	e.plug.SetFaults(testplugin.Faults{Errors: map[string]codes.Code{"NodeUnpublishVolume": codes.NotFound, "NodeUnstageVolume": codes.NotFound}})
	resp, err := e.m.Unmount(ctx, unmountReq("v1", "w1"))
	if err != nil || len(resp.GetUnmounted()) != 1 {
		t.Fatalf("Unmount = %v, %v; want success", resp, err)
	}
	if e.plug.calls("NodeUnpublishVolume") != 1 || e.plug.calls("NodeUnstageVolume") != 1 {
		t.Errorf("calls = %v, want one unpublish and one unstage", e.plug.Stats().Calls)
	}
	if files := e.diskRecords(t); len(files) != 0 {
		t.Errorf("records left: %v", files)
	}
}

func TestMaxVolumes(t *testing.T) {
	e := newEnv(t, Config{}, true)
	model := nodeModel("tp")
	model.MaxVolumes = 1
	e.plugins.set(model, e.plug.client)
	ctx := context.Background()
	if _, err := e.m.Mount(ctx, mountReq("v1", "w1")); err != nil {
		t.Fatal(err)
	}
	_, err := e.m.Mount(ctx, mountReq("v2", "w1"))
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "max_volumes_per_node") {
		t.Fatalf("Mount of a second volume: %v, want FailedPrecondition naming max_volumes_per_node", err)
	}
	// Another workload of the mounted volume adds no volume.
	if _, err := e.m.Mount(ctx, mountReq("v1", "w2")); err != nil {
		t.Fatalf("Mount of the same volume for another workload: %v", err)
	}
	if e.plug.calls("NodeStageVolume") != 1 || len(e.diskRecords(t)) != 2 {
		t.Errorf("the refused mount reached the plugin or left a record: %v, %v", e.plug.Stats().Calls, e.diskRecords(t))
	}
}

func TestInvalidRequests(t *testing.T) {
	e := newEnv(t, Config{}, false)
	long := strings.Repeat("a", 129)
	cases := []struct {
		name  string
		req   *csisupdv1.MountVolumeRequest
		field string
	}{
		{"slash in plugin id", &csisupdv1.MountVolumeRequest{PluginId: "a/b", VolumeId: "v", WorkloadId: "w"}, "plugin_id"},
		{"dot-dot volume", &csisupdv1.MountVolumeRequest{PluginId: "tp", VolumeId: "..", WorkloadId: "w"}, "volume_id"},
		{"dot workload", &csisupdv1.MountVolumeRequest{PluginId: "tp", VolumeId: "v", WorkloadId: "."}, "workload_id"},
		{"empty workload", &csisupdv1.MountVolumeRequest{PluginId: "tp", VolumeId: "v"}, "workload_id"},
		{"slash in volume", &csisupdv1.MountVolumeRequest{PluginId: "tp", VolumeId: "a/b", WorkloadId: "w"}, "volume_id"},
		{"too long", &csisupdv1.MountVolumeRequest{PluginId: "tp", VolumeId: long, WorkloadId: "w"}, "volume_id"},
		{"leading dot", &csisupdv1.MountVolumeRequest{PluginId: "tp", VolumeId: ".v", WorkloadId: "w"}, "volume_id"},
		{"unknown access mode", &csisupdv1.MountVolumeRequest{PluginId: "tp", VolumeId: "v", WorkloadId: "w",
			Usage: &csisupdv1.VolumeUsage{AccessMode: "WRITE_EVERYWHERE"}}, "access_mode"},
		{"unknown access type", &csisupdv1.MountVolumeRequest{PluginId: "tp", VolumeId: "v", WorkloadId: "w",
			Usage: &csisupdv1.VolumeUsage{AccessType: "nfs"}}, "access_type"},
		{"block with fs type", &csisupdv1.MountVolumeRequest{PluginId: "tp", VolumeId: "v", WorkloadId: "w",
			Usage: &csisupdv1.VolumeUsage{AccessType: "block", FsType: "ext4"}}, "fs_type"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.m.Mount(context.Background(), tc.req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("Mount: %v, want InvalidArgument naming %s", err, tc.field)
			}
		})
	}
	_, err := e.m.Unmount(context.Background(), &csisupdv1.UnmountVolumeRequest{PluginId: "tp", VolumeId: "..", WorkloadId: "w"})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("Unmount of volume \"..\": %v, want InvalidArgument", err)
	}
	if len(e.plug.Stats().Calls) != 0 {
		t.Errorf("invalid requests reached the plugin: %v", e.plug.Stats().Calls)
	}
}

func TestBlockUsageRefusedByPluginLeavesNothing(t *testing.T) {
	e := newEnv(t, Config{}, true)
	req := mountReq("v1", "w1")
	req.Usage = &csisupdv1.VolumeUsage{AccessType: AccessTypeBlock}
	// A secret whose value is in the plugin's error message is removed
	// from it.
	req.Secrets = map[string]string{"key": "volumes are directories"}
	_, err := e.m.Mount(context.Background(), req)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "block access is not supported") {
		t.Fatalf("Mount of a block volume: %v, want the plugin's InvalidArgument", err)
	}
	if strings.Contains(err.Error(), "volumes are directories") || !strings.Contains(err.Error(), "[redacted]") {
		t.Errorf("error %q carries the secret value", err)
	}
	if files := e.diskRecords(t); len(files) != 0 {
		t.Errorf("records left: %v", files)
	}
	root := filepath.Join(e.dataDir, "volumes", "tp")
	for _, d := range []string{filepath.Join(root, "staging", "v1"), filepath.Join(root, "per-workload", "w1")} {
		if exists(d) {
			t.Errorf("%s is left after the failed mount", d)
		}
	}
	if e.plug.calls("NodePublishVolume") != 0 || e.plug.calls("NodeUnstageVolume") != 0 {
		t.Errorf("calls after a refused stage = %v, want no publish and no unstage", e.plug.Stats().Calls)
	}
	evs := e.events.all()
	if len(evs) != 1 || evs[0].Type != plugin.EventVolumeMountFailed || strings.Contains(evs[0].Description, "volumes are directories") {
		t.Errorf("events = %+v, want one volume-mount-failed without the secret", evs)
	}
}

func TestPluginStateErrors(t *testing.T) {
	e := newEnv(t, Config{}, false)
	ctx := context.Background()
	unhealthy := nodeModel("sick")
	unhealthy.Healthy, unhealthy.HealthState, unhealthy.HealthDescription = false, "unhealthy", "probe failed"
	e.plugins.set(unhealthy, e.plug.client)
	e.plugins.set(nodeModel("fresh"), nil)
	ctrl := nodeModel("ctrl")
	ctrl.Type = "controller"
	e.plugins.set(ctrl, e.plug.client)
	bare := nodeModel("bare")
	bare.NodeCapabilities = nil
	e.plugins.set(bare, e.plug.client)

	check := func(t *testing.T, err error, code codes.Code, want func(error) bool) {
		t.Helper()
		if status.Code(err) != code || !want(err) {
			t.Errorf("error %v, want %s with the right detail", err, code)
		}
	}
	unhealthyDetail := func(state string) func(error) bool {
		return func(err error) bool {
			d, ok := csisupdv1.ErrorDetail[*csisupdv1.PluginUnhealthy](err)
			return ok && d.GetHealthState() == state && csisupdv1.IsRetryable(err)
		}
	}
	missing := func(capability string) func(error) bool {
		return func(err error) bool {
			d, ok := csisupdv1.ErrorDetail[*csisupdv1.CapabilityMissing](err)
			return ok && d.GetCapability() == capability
		}
	}
	t.Run("unknown plugin", func(t *testing.T) {
		_, err := e.m.Mount(ctx, &csisupdv1.MountVolumeRequest{PluginId: "nope", VolumeId: "v", WorkloadId: "w"})
		check(t, err, codes.NotFound, csisupdv1.IsPluginNotFound)
	})
	t.Run("unhealthy", func(t *testing.T) {
		_, err := e.m.Mount(ctx, &csisupdv1.MountVolumeRequest{PluginId: "sick", VolumeId: "v", WorkloadId: "w"})
		check(t, err, codes.Unavailable, unhealthyDetail("unhealthy"))
	})
	t.Run("not fingerprinted", func(t *testing.T) {
		_, err := e.m.Mount(ctx, &csisupdv1.MountVolumeRequest{PluginId: "fresh", VolumeId: "v", WorkloadId: "w"})
		check(t, err, codes.Unavailable, unhealthyDetail("unknown"))
		if !strings.Contains(err.Error(), "not fingerprinted yet") {
			t.Errorf("error %v does not say the plugin is not fingerprinted yet", err)
		}
	})
	t.Run("controller plugin", func(t *testing.T) {
		_, err := e.m.Mount(ctx, &csisupdv1.MountVolumeRequest{PluginId: "ctrl", VolumeId: "v", WorkloadId: "w"})
		check(t, err, codes.FailedPrecondition, missing(plugin.CapNodeService))
	})
	t.Run("expand without EXPAND_VOLUME", func(t *testing.T) {
		_, err := e.m.Expand(ctx, &csisupdv1.ExpandVolumeRequest{PluginId: "bare", VolumeId: "v"})
		check(t, err, codes.FailedPrecondition, missing(plugin.CapExpandVolume))
	})
	t.Run("stats without GET_VOLUME_STATS", func(t *testing.T) {
		_, err := e.m.Stats(ctx, &csisupdv1.VolumeStatsRequest{PluginId: "bare", VolumeId: "v"})
		check(t, err, codes.FailedPrecondition, missing(plugin.CapGetVolumeStats))
	})
	if len(e.plug.Stats().Calls) != 0 || len(e.diskRecords(t)) != 0 {
		t.Errorf("refused requests reached the plugin or left records: %v, %v", e.plug.Stats().Calls, e.diskRecords(t))
	}
	// A plugin without STAGE_UNSTAGE_VOLUME is published without staging.
	// (The test plugin insists on staging, so its refusal comes back and
	// the mount is undone.)
	_, err := e.m.Mount(ctx, &csisupdv1.MountVolumeRequest{PluginId: "bare", VolumeId: "v", WorkloadId: "w"})
	if status.Code(err) != codes.InvalidArgument || e.plug.calls("NodeStageVolume") != 0 || e.plug.calls("NodePublishVolume") != 1 {
		t.Errorf("Mount without staging: %v, calls %v; want one publish without a stage", err, e.plug.Stats().Calls)
	}
	if len(e.diskRecords(t)) != 0 {
		t.Errorf("records left: %v", e.diskRecords(t))
	}
}

func TestRetriesUnavailable(t *testing.T) {
	e := newEnv(t, Config{}, true)
	e.plug.SetFaults(testplugin.Faults{Errors: map[string]codes.Code{"NodePublishVolume": codes.Unavailable}})
	_, err := e.m.Mount(context.Background(), mountReq("v1", "w1"))
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Mount: %v, want Unavailable", err)
	}
	if got := e.plug.calls("NodePublishVolume"); got != csiclient.MaxAttempts {
		t.Errorf("NodePublishVolume calls = %d, want %d", got, csiclient.MaxAttempts)
	}
	// The failed mount was undone: unpublished and unstaged. Its outcome
	// was unknown, so its record settles until the undo is repeated.
	if e.plug.calls("NodeUnpublishVolume") != 1 || e.plug.calls("NodeUnstageVolume") != 1 {
		t.Errorf("undo calls = %v, want one unpublish and one unstage", e.plug.Stats().Calls)
	}
	if _, ok := e.plug.node(t, "v1"); ok {
		t.Error("the failed mount left the volume staged")
	}
	if got := e.m.List("", ""); len(got) != 1 || got[0].GetState() != StateSettling {
		t.Errorf("mounts after the failed mount: %v, want it settling", got)
	}
	// Codes that are not transient are not retried.
	e.plug.ResetStats()
	e.plug.SetFaults(testplugin.Faults{Errors: map[string]codes.Code{"NodeStageVolume": codes.Internal}})
	if _, err := e.m.Mount(context.Background(), mountReq("v1", "w1")); status.Code(err) != codes.Internal {
		t.Fatalf("Mount: %v, want Internal", err)
	}
	if got := e.plug.calls("NodeStageVolume"); got != 1 {
		t.Errorf("NodeStageVolume calls after Internal = %d, want 1", got)
	}
}

func TestSecretsNeverStoredLoggedOrEmitted(t *testing.T) {
	const secret = "s3cr3t-token-value"
	e := newEnv(t, Config{}, true)
	ctx := context.Background()
	// One failed attempt makes the retry path log too.
	e.plug.SetFaults(testplugin.Faults{Errors: map[string]codes.Code{"NodeStageVolume": codes.Unavailable}})
	req := mountReq("v1", "w1")
	req.Secrets = map[string]string{"token": secret}
	req.VolumeContext = map[string]string{"k": "v"}
	if _, err := e.m.Mount(ctx, req); status.Code(err) != codes.Unavailable {
		t.Fatalf("Mount: %v, want Unavailable", err)
	}
	e.plug.SetFaults(testplugin.Faults{})
	if _, err := e.m.Mount(ctx, req); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Expand(ctx, &csisupdv1.ExpandVolumeRequest{PluginId: "tp", VolumeId: "v1", Secrets: map[string]string{"token": secret}}); err != nil {
		t.Fatal(err)
	}
	err := filepath.Walk(e.dataDir, func(path string, info os.FileInfo, err error) error {
		if err != nil || !info.Mode().IsRegular() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), secret) {
			t.Errorf("%s holds the secret", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if logs := e.logs.String(); strings.Contains(logs, secret) || !strings.Contains(logs, "retrying") {
		t.Errorf("logs hold the secret, or lack the retry line:\n%s", logs)
	}
	for _, ev := range e.events.all() {
		if strings.Contains(ev.Description, secret) {
			t.Errorf("event %+v holds the secret", ev)
		}
	}
}

func TestCallsForOneVolumeAreSerialised(t *testing.T) {
	e := newEnv(t, Config{}, true)
	e.plug.SetFaults(testplugin.Faults{Delays: map[string]time.Duration{"NodePublishVolume": 100 * time.Millisecond}})
	ctx := context.Background()
	mountAll := func(reqs ...*csisupdv1.MountVolumeRequest) {
		t.Helper()
		errs := make(chan error, len(reqs))
		for _, r := range reqs {
			go func() {
				_, err := e.m.Mount(ctx, r)
				errs <- err
			}()
		}
		for range reqs {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
	}
	mountAll(mountReq("v1", "w1"), mountReq("v1", "w2"), mountReq("v1", "w3"))
	if got := e.plug.Stats().MaxInFlight["NodePublishVolume"]; got != 1 {
		t.Errorf("publishes of one volume in flight at once: %d, want 1", got)
	}
	e.plug.ResetStats()
	mountAll(mountReq("v2", "w1"), mountReq("v3", "w1"))
	if got := e.plug.Stats().MaxInFlight["NodePublishVolume"]; got != 2 {
		t.Errorf("publishes of two volumes in flight at once: %d, want 2", got)
	}

	// A call waiting for the volume's lock ends with its context.
	e.plug.SetFaults(testplugin.Faults{Delays: map[string]time.Duration{"NodeUnpublishVolume": time.Minute}})
	done := make(chan error, 1)
	go func() {
		_, err := e.m.Unmount(ctx, unmountReq("v1", "w1"))
		done <- err
	}()
	testutil.WaitFor(t, waitTime, "the unpublish to start", func() bool { return e.plug.Stats().InFlight["NodeUnpublishVolume"] == 1 })
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := e.m.Mount(short, mountReq("v1", "w9")); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("Mount waiting for the volume: %v, want DeadlineExceeded", err)
	}
	if _, err := e.m.Mount(ctx, mountReq("v4", "w1")); err != nil {
		t.Errorf("Mount of another volume while v1 is busy: %v", err)
	}
	e.plug.Stop() // ends the delayed unpublish
	select {
	case <-done:
	case <-time.After(waitTime):
		t.Fatal("Unmount did not return after the plugin stopped")
	}
}

func TestAPluginGoneMidMountIsUndoneWhenItReturns(t *testing.T) {
	// The plugin stages the volume and then leaves the node (it crashed;
	// its socket is gone) before the publish. csisupd's own "plugin not
	// found" for the publish and for the undo's unstage says nothing of
	// what the plugin holds: the agent keeps the record and unstages once
	// the plugin is back, rather than forget a staged volume that the
	// servers would then give to another node.
	e := newEnv(t, Config{}, true)
	gone := startPluginWith(t, e.dir, "gone", testplugin.Config{Type: testplugin.TypeNode, Crash: func() { e.plugins.remove("gone") }})
	c, p := gone.client, gone.Plugin
	e.plugins.set(nodeModel("gone"), c)

	p.ArmCrash() // in NodeStageVolume, after staging
	_, err := e.m.Mount(context.Background(), &csisupdv1.MountVolumeRequest{PluginId: "gone", VolumeId: "v1", WorkloadId: "w1"})
	if !csisupdv1.IsPluginNotFound(err) {
		t.Fatalf("Mount = %v, want PluginNotFound", err)
	}
	if _, staged := gone.node(t, "v1"); !staged {
		t.Fatal("the plugin did not stage the volume before it went away")
	}
	if n := len(e.m.List("gone", "v1")); n != 1 {
		t.Fatalf("records of the failed mount = %d, want 1 kept until the plugin undoes it", n)
	}
	// A release meanwhile is not confirmed either.
	if _, err := e.m.Unmount(context.Background(), &csisupdv1.UnmountVolumeRequest{PluginId: "gone", VolumeId: "v1", WorkloadId: "w1"}); err == nil {
		t.Fatal("Unmount succeeded while the plugin holding the volume was away")
	}

	e.plugins.set(nodeModel("gone"), c) // the plugin is back
	testutil.WaitFor(t, waitTime, "the failed mount undone", func() bool { return len(e.m.List("gone", "")) == 0 })
	if _, staged := gone.node(t, "v1"); staged {
		t.Error("the record is gone but the plugin still has the volume staged")
	}
	if n := gone.calls("NodeUnstageVolume"); n == 0 {
		t.Error("NodeUnstageVolume never reached the plugin")
	}
}

func TestALateStageIsUndoneAgain(t *testing.T) {
	// The plugin stages late, after the agent gave up on the call at its
	// RPC timeout and undid it (a plugin that is slow and does not stop
	// at its deadline). The agent keeps the record settling and undoes
	// the mount again after the RPC timeout: nothing is left staged.
	e := newEnv(t, Config{RPCTimeout: time.Second}, true)
	e.plug.SetSlow(1500 * time.Millisecond)
	go func() {
		// Fast again once the stage is under way: the undo is not slow.
		deadline := time.Now().Add(waitTime)
		for e.plug.Stats().InFlight["NodeStageVolume"] == 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond) // polls a condition, with a deadline
		}
		e.plug.SetSlow(0)
	}()
	if _, err := e.m.Mount(context.Background(), mountReq("v1", "w1")); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("Mount = %v, want DeadlineExceeded", err)
	}
	if got := e.m.List("tp", "v1"); len(got) != 1 || got[0].GetState() != StateSettling {
		t.Fatalf("mounts after the failed mount = %v, want one settling", got)
	}
	testutil.WaitFor(t, waitTime, "the late stage done and the record settled", func() bool {
		return e.plug.Stats().InFlight["NodeStageVolume"] == 0 && len(e.diskRecords(t)) == 0
	})
	if _, staged := e.plug.node(t, "v1"); staged {
		t.Error("the plugin's late stage is left: the volume is staged with no record of it")
	}
	if n := e.plug.calls("NodeUnstageVolume"); n < 2 {
		t.Errorf("NodeUnstageVolume calls = %d, want the undo and its repeat", n)
	}
}

func TestAMountOutlivesItsCaller(t *testing.T) {
	// The caller of a mount goes away while the plugin publishes (nemesis
	// seed 10: the leader died mid-claim). The mount runs on to its end,
	// so its outcome is known: published, with no settling record, and
	// a release after it unpublishes at once.
	e := newEnv(t, Config{}, true)
	e.plug.SetFaults(testplugin.Faults{Delays: map[string]time.Duration{"NodePublishVolume": 300 * time.Millisecond}})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		deadline := time.Now().Add(waitTime)
		for e.plug.Stats().InFlight["NodePublishVolume"] == 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond) // polls a condition, with a deadline
		}
		cancel()
	}()
	m, err := e.m.Mount(ctx, mountReq("v1", "w1"))
	if err != nil || m.GetState() != StatePublished {
		t.Fatalf("Mount whose caller went away = %v, %v; want it published", m, err)
	}
	if ctx.Err() == nil {
		t.Fatal("the caller's context did not end during the publish; the test did not exercise it")
	}
	if _, err := e.m.Unmount(context.Background(), unmountReq("v1", "w1")); err != nil {
		t.Fatalf("Unmount = %v", err)
	}
	if _, staged := e.plug.node(t, "v1"); staged {
		t.Error("the volume is left staged")
	}
}

func TestAReleaseWaitsForItsSettlingMount(t *testing.T) {
	// A publish of unknown outcome is undone, and the record settles: the
	// plugin may still publish late (nemesis seed 10: it did, after the
	// undo, and the servers had freed the claim and given the volume to
	// another node). The release of that workload is refused, retryable,
	// until the undo is repeated; then it succeeds.
	e := newEnv(t, Config{RPCTimeout: time.Second}, true)
	e.plug.SetFaults(testplugin.Faults{Errors: map[string]codes.Code{"NodePublishVolume": codes.Unavailable}})
	if _, err := e.m.Mount(context.Background(), mountReq("v1", "w1")); status.Code(err) != codes.Unavailable {
		t.Fatalf("Mount: %v, want Unavailable", err)
	}
	e.plug.SetFaults(testplugin.Faults{})
	if got := e.m.List("tp", "v1"); len(got) != 1 || got[0].GetState() != StateSettling {
		t.Fatalf("mounts after the failed mount = %v, want one settling", got)
	}
	_, err := e.m.Unmount(context.Background(), unmountReq("v1", "w1"))
	if status.Code(err) != codes.Aborted || !csisupdv1.IsRetryable(err) || !strings.Contains(err.Error(), "repeated") {
		t.Fatalf("Unmount of a settling mount = %v, want a retryable Aborted naming the repeated undo", err)
	}
	testutil.WaitFor(t, waitTime, "the undo repeated and the record gone", func() bool { return len(e.diskRecords(t)) == 0 })
	if _, err := e.m.Unmount(context.Background(), unmountReq("v1", "w1")); err != nil {
		t.Fatalf("Unmount once settled = %v", err)
	}
	if _, staged := e.plug.node(t, "v1"); staged {
		t.Error("the volume is left staged")
	}
}

func TestASettlingMountHoldsNoStaging(t *testing.T) {
	// A failed mount settles; a second workload of the volume on the node
	// mounts and releases it: the release unstages, since the settling
	// record is no mount (nemesis seed 1 of the second run: the volume
	// stayed staged for the settle time, freed in the servers' eyes).
	e := newEnv(t, Config{}, true)
	e.plug.SetFaults(testplugin.Faults{Errors: map[string]codes.Code{"NodePublishVolume": codes.Unavailable}})
	if _, err := e.m.Mount(context.Background(), mountReq("v1", "w1")); status.Code(err) != codes.Unavailable {
		t.Fatalf("Mount: %v, want Unavailable", err)
	}
	e.plug.SetFaults(testplugin.Faults{})
	if _, err := e.m.Mount(context.Background(), mountReq("v1", "w2")); err != nil {
		t.Fatal(err)
	}
	unstages := e.plug.calls("NodeUnstageVolume")
	resp, err := e.m.Unmount(context.Background(), unmountReq("v1", "w2"))
	if err != nil || !resp.GetUnstaged() {
		t.Fatalf("Unmount = %v, %v; want the staging undone", resp, err)
	}
	if e.plug.calls("NodeUnstageVolume") != unstages+1 {
		t.Error("the release did not call NodeUnstageVolume")
	}
	if _, staged := e.plug.node(t, "v1"); staged {
		t.Error("the volume is left staged while only a settling record shares its staging")
	}
}
