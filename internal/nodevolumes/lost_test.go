package nodevolumes

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// clusterMount mounts volume for workload as the servers do for a claim
// made at claimIndex, and returns the mount.
func clusterMount(t *testing.T, m *Manager, volume, workload string, claimIndex uint64) *csisupdv1.Mount {
	t.Helper()
	req := mountReq(volume, workload)
	req.Cluster, req.ClaimIndex = true, claimIndex
	mnt, err := m.Mount(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return mnt
}

// loseRecords removes every mount record of e's data directory, as an
// operator moving corrupt records aside does: every file of the records
// directory.
func (e *env) loseRecords(t *testing.T) {
	t.Helper()
	dir := filepath.Join(e.dataDir, RecordsDir)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, en := range entries {
		if err := os.Remove(filepath.Join(dir, en.Name())); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(e.diskRecords(t)); n != 0 {
		t.Fatalf("%d records left after losing them", n)
	}
}

// serverUnmount is the UnmountVolume request the servers send to release
// the claim of mnt: with the paths they hold.
func serverUnmount(mnt *csisupdv1.Mount) *csisupdv1.UnmountVolumeRequest {
	return &csisupdv1.UnmountVolumeRequest{
		PluginId: mnt.GetPluginId(), VolumeId: mnt.GetVolumeId(), WorkloadId: mnt.GetWorkloadId(), Usage: mnt.GetUsage(),
		ExternalId: mnt.GetExternalId(), HostPath: mnt.GetHostPath(), StagingPath: mnt.GetStagingPath(),
		Cluster: true, ClaimIndex: mnt.GetClaimIndex(),
	}
}

// claimOf is the servers' NodeClaims entry of the claim of mnt.
func claimOf(mnt *csisupdv1.Mount) *csisupdv1.NodeClaimRef {
	return &csisupdv1.NodeClaimRef{
		VolumeId: mnt.GetVolumeId(), WorkloadId: mnt.GetWorkloadId(), ClaimIndex: mnt.GetClaimIndex(),
		PluginId: mnt.GetPluginId(), ExternalId: mnt.GetExternalId(), Usage: mnt.GetUsage(),
		HostPath: mnt.GetHostPath(), StagingPath: mnt.GetStagingPath(), Mounted: true, State: "taken",
	}
}

// undoneCalls are the plugin calls that undo mnt: unpublish at its host
// path, then unstage at its staging path.
func undoneCalls(mnt *csisupdv1.Mount) []testplugin.NodeCall {
	return []testplugin.NodeCall{
		{Method: "NodeUnpublishVolume", VolumeID: mnt.GetExternalId(), Path: mnt.GetHostPath()},
		{Method: "NodeUnstageVolume", VolumeID: mnt.GetExternalId(), Path: mnt.GetStagingPath()},
	}
}

// checkUndone checks that the plugin's node calls since the first from
// are exactly those that undo mnt, that it keeps nothing staged or
// published, and that no mount record is left.
func (e *env) checkUndone(t *testing.T, from int, mnt *csisupdv1.Mount) {
	t.Helper()
	if got, want := e.plug.NodeLog()[from:], undoneCalls(mnt); !slices.Equal(got, want) {
		t.Errorf("plugin node calls = %+v, want %+v", got, want)
	}
	if vols := e.plug.NodeVolumes(); len(vols) != 0 {
		t.Errorf("plugin still has %+v", vols)
	}
	if files := e.diskRecords(t); len(files) != 0 {
		t.Errorf("records left: %v", files)
	}
}

// A release whose mount has no record unpublishes and unstages the
// servers' paths; NotFound from the plugin counts as done.
func TestUnmountWithoutRecordUsesServersPaths(t *testing.T) {
	for _, tc := range []struct {
		name   string
		faults map[string]codes.Code
	}{
		{"plugin undoes the mount", nil},
		{"NotFound is done", map[string]codes.Code{"NodeUnpublishVolume": codes.NotFound, "NodeUnstageVolume": codes.NotFound}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Config{}, false)
			mnt := clusterMount(t, e.m, "v1", "w1", 7)
			e.loseRecords(t)
			m := e.manager(t, Config{}, true)
			if got := m.List("", ""); len(got) != 0 {
				t.Fatalf("mounts with the records lost = %v, want none", got)
			}
			from := len(e.plug.NodeLog())
			e.plug.ResetStats()
			e.plug.SetFaults(testplugin.Faults{Errors: tc.faults})
			resp, err := m.Unmount(context.Background(), serverUnmount(mnt))
			if err != nil {
				t.Fatal(err)
			}
			if got := resp.GetUnmounted(); len(got) != 1 || got[0].GetState() != StateRecordLost || got[0].GetHostPath() != mnt.GetHostPath() || !resp.GetUnstaged() {
				t.Errorf("Unmount = %v, want the record-lost mount at %s unmounted and unstaged", resp, mnt.GetHostPath())
			}
			if e.plug.calls("NodeUnpublishVolume") != 1 || e.plug.calls("NodeUnstageVolume") != 1 {
				t.Errorf("plugin calls = %v, want one unpublish and one unstage", e.plug.Stats().Calls)
			}
			if tc.faults == nil {
				e.checkUndone(t, from, mnt)
			}
			if files := e.diskRecords(t); len(files) != 0 {
				t.Errorf("records left: %v", files)
			}
			if got := m.List("", ""); len(got) != 0 {
				t.Errorf("mounts after the unmount = %v, want none", got)
			}
			if !strings.Contains(e.logs.String(), "no record of the mount being released") {
				t.Error("the unmount from the servers' paths was not logged")
			}
		})
	}
}

// A release whose claim never recorded the node's step carries no paths:
// when the agent lost its record of a mount the plugin made, it undoes it
// from the paths it derives, found on disk; when nothing was mounted (no
// directory of the mount on disk) the release calls the plugin not at
// all.
func TestUnmountWithoutRecordOrPathsUndoesWhatIsOnDisk(t *testing.T) {
	e := newEnv(t, Config{}, false)
	mnt := clusterMount(t, e.m, "v1", "w1", 7)
	e.loseRecords(t)
	m := e.manager(t, Config{}, true)
	noPaths := serverUnmount(mnt)
	noPaths.HostPath, noPaths.StagingPath = "", ""

	never := serverUnmount(mnt)
	never.WorkloadId, never.HostPath, never.StagingPath = "w2", "", ""
	from := len(e.plug.NodeLog())
	if _, err := m.Unmount(context.Background(), never); err != nil {
		t.Fatal(err)
	}
	if got := e.plug.NodeLog()[from:]; len(got) != 0 {
		t.Errorf("release of a claim never mounted made plugin calls %+v, want none", got)
	}

	resp, err := m.Unmount(context.Background(), noPaths)
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetUnmounted(); len(got) != 1 || got[0].GetHostPath() != mnt.GetHostPath() || !resp.GetUnstaged() {
		t.Errorf("Unmount = %v, want the mount at %s unmounted and unstaged", resp, mnt.GetHostPath())
	}
	e.checkUndone(t, from, mnt)
	if !strings.Contains(e.logs.String(), "no paths from the servers, but its directories are on disk") {
		t.Error("the unmount from the derived paths was not logged")
	}
}

// The servers' paths are host paths: the plugin gets them as it sees
// them, mapped through the roots as a record's are.
func TestUnmountWithoutRecordMapsToThePluginsView(t *testing.T) {
	hostRoot, pluginView := pluginViewRoots(t)
	cfg := Config{PluginDirs: map[string]PluginDirs{"tp": {MountDir: hostRoot, PluginMountDir: pluginView}}}
	e := newEnv(t, cfg, false)
	mnt := clusterMount(t, e.m, "v1", "w1", 7)
	e.loseRecords(t)
	m := e.manager(t, cfg, true)
	from := len(e.plug.NodeLog())
	if _, err := m.Unmount(context.Background(), serverUnmount(mnt)); err != nil {
		t.Fatal(err)
	}
	seen := func(hostPath string) string { return filepath.Join(pluginView, strings.TrimPrefix(hostPath, hostRoot)) }
	want := []testplugin.NodeCall{
		{Method: "NodeUnpublishVolume", VolumeID: "v1", Path: seen(mnt.GetHostPath())},
		{Method: "NodeUnstageVolume", VolumeID: "v1", Path: seen(mnt.GetStagingPath())},
	}
	if got := e.plug.NodeLog()[from:]; !slices.Equal(got, want) {
		t.Errorf("plugin node calls = %+v, want %+v", got, want)
	}
	if vols := e.plug.NodeVolumes(); len(vols) != 0 {
		t.Errorf("plugin still has %+v", vols)
	}
}

// The servers' paths must lie in the mount's directories under the
// plugin's mount root: anything else is refused, naming the field,
// before the plugin is called or anything is recorded.
func TestUnmountRefusesServersPathsOutsideTheMount(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(req *csisupdv1.UnmountVolumeRequest, root string)
		setup  func(t *testing.T, root string)
		want   string
	}{
		{name: "dot-dot out of the root", want: "host_path", change: func(r *csisupdv1.UnmountVolumeRequest, root string) {
			r.HostPath = root + "/per-workload/w1/v1/../../../../../etc"
		}},
		{name: "clean path out of the root", want: "host_path", change: func(r *csisupdv1.UnmountVolumeRequest, _ string) {
			r.HostPath = "/etc/passwd"
		}},
		{name: "relative", want: "host_path", change: func(r *csisupdv1.UnmountVolumeRequest, _ string) {
			r.HostPath = "per-workload/w1/v1/" + defaultKey
		}},
		{name: "another workload's target", want: "host_path", change: func(r *csisupdv1.UnmountVolumeRequest, root string) {
			r.HostPath = filepath.Join(root, "per-workload", "w2", "v1", defaultKey)
		}},
		{name: "the mount directory itself", want: "host_path", change: func(r *csisupdv1.UnmountVolumeRequest, root string) {
			r.HostPath = filepath.Join(root, "per-workload", "w1", "v1")
		}},
		{name: "trailing separator", want: "host_path", change: func(r *csisupdv1.UnmountVolumeRequest, _ string) {
			r.HostPath += "/"
		}},
		{name: "too long", want: "host_path", change: func(r *csisupdv1.UnmountVolumeRequest, root string) {
			r.HostPath = filepath.Join(root, "per-workload", "w1", "v1", strings.Repeat("x", maxPathLen))
		}},
		{name: "staging out of the root", want: "staging_path", change: func(r *csisupdv1.UnmountVolumeRequest, _ string) {
			r.StagingPath = "/var/lib"
		}},
		{name: "another volume's staging", want: "staging_path", change: func(r *csisupdv1.UnmountVolumeRequest, root string) {
			r.StagingPath = filepath.Join(root, "staging", "v2", defaultKey)
		}},
		{name: "staging without host path", want: "host_path is required", change: func(r *csisupdv1.UnmountVolumeRequest, _ string) {
			r.HostPath = ""
		}},
		{name: "no usage", want: "usage is required", change: func(r *csisupdv1.UnmountVolumeRequest, _ string) {
			r.Usage = nil
		}},
		{name: "no external id", want: "external_id is required", change: func(r *csisupdv1.UnmountVolumeRequest, _ string) {
			r.ExternalId = ""
		}},
		{name: "through a symbolic link", want: "symbolic link", setup: func(t *testing.T, root string) {
			outside := testutil.TempDir(t)
			if err := os.MkdirAll(filepath.Join(root, "per-workload"), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(outside, filepath.Join(root, "per-workload", "w1")); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Config{}, true)
			root := filepath.Join(e.dataDir, "volumes", "tp")
			if tc.setup != nil {
				tc.setup(t, root)
			}
			req := &csisupdv1.UnmountVolumeRequest{
				PluginId: "tp", VolumeId: "v1", WorkloadId: "w1", Usage: &csisupdv1.VolumeUsage{}, ExternalId: "v1",
				HostPath:    filepath.Join(root, "per-workload", "w1", "v1", defaultKey),
				StagingPath: filepath.Join(root, "staging", "v1", defaultKey),
			}
			if tc.change != nil {
				tc.change(req, root)
			}
			_, err := e.m.Unmount(context.Background(), req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Unmount: %v, want InvalidArgument naming %q", err, tc.want)
			}
			if n := len(e.plug.Stats().Calls); n != 0 {
				t.Errorf("the plugin was called: %v", e.plug.Stats().Calls)
			}
			if files := e.diskRecords(t); len(files) != 0 {
				t.Errorf("records written: %v", files)
			}
		})
	}
}

// When the agent has a record, its own paths are unmounted, whatever the
// servers send (even paths it would refuse to use), and a difference is
// logged.
func TestUnmountPrefersTheRecordsPaths(t *testing.T) {
	e := newEnv(t, Config{}, true)
	mnt := clusterMount(t, e.m, "v1", "w1", 3)
	req := serverUnmount(mnt)
	req.HostPath = "/elsewhere/" + defaultKey
	from := len(e.plug.NodeLog())
	if _, err := e.m.Unmount(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	e.checkUndone(t, from, mnt)
	if !strings.Contains(e.logs.String(), "differ from its record") {
		t.Error("the differing paths were not logged")
	}
}

// An unmount from the servers' paths writes its intent first: when it
// fails halfway, the record is finished by Run after a restart.
func TestUnmountWithoutRecordIsFinishedAfterARestart(t *testing.T) {
	e := newEnv(t, Config{}, false)
	mnt := clusterMount(t, e.m, "v1", "w1", 7)
	e.loseRecords(t)
	m := e.manager(t, Config{}, false)
	e.plug.SetFaults(testplugin.Faults{Errors: map[string]codes.Code{"NodeUnpublishVolume": codes.Internal}})
	if _, err := m.Unmount(context.Background(), serverUnmount(mnt)); status.Code(err) != codes.Internal {
		t.Fatalf("Unmount with the plugin failing: %v, want Internal", err)
	}
	rec, ok := e.readRecord(t, "tp", "v1", "w1", defaultKey)
	if !ok || rec.State != StateUnpublishing || !rec.ServerPaths || rec.HostPath != mnt.GetHostPath() || rec.StagingPath != mnt.GetStagingPath() {
		t.Fatalf("record after the failed unmount = %+v, %t; want unpublishing with the servers' paths", rec, ok)
	}
	e.plug.SetFaults(testplugin.Faults{})
	from := len(e.plug.NodeLog())
	restarted := e.manager(t, Config{}, true)
	waitRecovered(t, restarted)
	e.checkUndone(t, from, mnt)
}

// lostEnv is a node whose manager lost the record of mnt, a cluster
// mount, and reconciles with src, which holds mnt's claim at index 10.
func lostEnv(t *testing.T) (e *env, src *claimSource, mnt *csisupdv1.Mount) {
	t.Helper()
	e = newEnv(t, Config{}, false)
	mnt = clusterMount(t, e.m, "v1", "w1", 5)
	e.loseRecords(t)
	src = &claimSource{}
	src.set([]*csisupdv1.NodeClaimRef{claimOf(mnt)}, 10, nil)
	e.m = e.manager(t, Config{Claims: src.get, ReconcileInterval: time.Hour}, true)
	testutil.WaitFor(t, waitTime, "the lost mount listed", func() bool { return len(e.m.List("", "")) == 1 })
	return e, src, mnt
}

// reconcileRounds triggers n more reconcile rounds and waits until they
// have ended: a round starts only after the one before it has ended.
func reconcileRounds(t *testing.T, m *Manager, src *claimSource, n int) {
	t.Helper()
	for range n {
		want := src.count() + 1
		m.TriggerReconcile()
		testutil.WaitFor(t, waitTime, "a reconcile round", func() bool { return src.count() >= want })
	}
	// The round asked last has answered; one more ask ends it.
	want := src.count() + 1
	m.TriggerReconcile()
	testutil.WaitFor(t, waitTime, "the reconcile round to end", func() bool { return src.count() >= want })
}

// A claim the servers hold for a mount the node has no record of is kept
// as a record-lost mount: logged once, listed, persisted, not undone on
// its own (also not after a restart), and undone from the servers' paths
// when released.
func TestReconcileKeepsLostRecord(t *testing.T) {
	e, src, mnt := lostEnv(t)
	got := e.m.List("", "")[0]
	if got.GetState() != StateRecordLost || got.GetHostPath() != mnt.GetHostPath() || got.GetStagingPath() != mnt.GetStagingPath() ||
		!got.GetCluster() || got.GetClaimIndex() != 5 || got.GetExternalId() != mnt.GetExternalId() || got.GetUsageKey() != defaultKey {
		t.Fatalf("lost mount = %v, want record-lost with the claim's paths and index", got)
	}
	waitRecovered(t, e.m) // a lost mount is not an unfinished step
	reconcileRounds(t, e.m, src, 2)
	logs := e.logs.String()
	if n := strings.Count(logs, "volume mount record lost; the servers hold a claim for it"); n != 1 {
		t.Errorf("the lost record was logged %d times, want once:\n%s", n, logs)
	}
	for _, want := range []string{"host_path=" + mnt.GetHostPath(), "claim_index=5", "usage=" + defaultKey, "record_lost=1"} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs do not name %s:\n%s", want, logs)
		}
	}
	if vols := e.plug.NodeVolumes(); len(vols["v1"].Targets) != 1 {
		t.Errorf("plugin volumes = %+v: the lost mount was undone while its claim is held", vols)
	}
	rec, ok := e.readRecord(t, "tp", "v1", "w1", defaultKey)
	if !ok || rec.State != StateRecordLost || !rec.ServerPaths {
		t.Fatalf("record on disk = %+v, %t; want record-lost", rec, ok)
	}

	// A restart loads it as it is and leaves it alone.
	restarted := e.manager(t, Config{}, true)
	waitRecovered(t, restarted)
	if got := restarted.List("", ""); len(got) != 1 || got[0].GetState() != StateRecordLost {
		t.Fatalf("mounts after a restart = %v, want the record-lost mount", got)
	}
	from := len(e.plug.NodeLog())
	if _, err := restarted.Unmount(context.Background(), serverUnmount(mnt)); err != nil {
		t.Fatal(err)
	}
	e.checkUndone(t, from, mnt)
}

// A lost mount whose claim the servers no longer hold is undone from the
// servers' paths.
func TestReconcileUndoesLostRecordTheServersReleased(t *testing.T) {
	e, src, mnt := lostEnv(t)
	from := len(e.plug.NodeLog())
	src.set(nil, 11, nil)
	e.m.TriggerReconcile()
	testutil.WaitFor(t, waitTime, "the lost mount undone", func() bool { return len(e.m.List("", "")) == 0 })
	e.checkUndone(t, from, mnt)
}

// A Mount of a lost mount (the servers finishing its claim) stages and
// publishes it again at its paths and makes it published.
func TestMountOfLostRecordPublishesAgain(t *testing.T) {
	e, _, mnt := lostEnv(t)
	from := len(e.plug.NodeLog())
	again := clusterMount(t, e.m, "v1", "w1", 5)
	if again.GetState() != StatePublished || again.GetHostPath() != mnt.GetHostPath() || again.GetStagingPath() != mnt.GetStagingPath() {
		t.Fatalf("Mount of the lost mount = %v, want it published at %s", again, mnt.GetHostPath())
	}
	want := []testplugin.NodeCall{
		{Method: "NodeStageVolume", VolumeID: "v1", Path: mnt.GetStagingPath()},
		{Method: "NodePublishVolume", VolumeID: "v1", Path: mnt.GetHostPath(), StagingPath: mnt.GetStagingPath()},
	}
	if got := e.plug.NodeLog()[from:]; !slices.Equal(got, want) {
		t.Errorf("plugin node calls = %+v, want %+v", got, want)
	}
	if rec, ok := e.readRecord(t, "tp", "v1", "w1", defaultKey); !ok || rec.State != StatePublished {
		t.Errorf("record = %+v, %t; want published", rec, ok)
	}
	from = len(e.plug.NodeLog())
	if _, err := e.m.Unmount(context.Background(), unmountReq("v1", "w1")); err != nil {
		t.Fatal(err)
	}
	e.checkUndone(t, from, mnt)
}

// Claims that are not lost mounts are not kept as such: one the node never
// mounted, one whose paths lie outside the mount, one whose mount was
// undone while the servers' answer was read, and one whose usage the
// servers name otherwise but whose host path has a record.
func TestReconcileKeepsOnlyLostMounts(t *testing.T) {
	src := &claimSource{}
	e := newEnv(t, Config{Claims: src.get, ReconcileInterval: time.Hour}, false)
	released := clusterMount(t, e.m, "v3", "w1", 4)
	kept := clusterMount(t, e.m, "v4", "w1", 5)
	otherUsage := claimOf(kept)
	otherUsage.Usage = &csisupdv1.VolumeUsage{AccessMode: "MULTI_NODE_MULTI_WRITER"}
	unmounted := make(chan error, 1)
	var once sync.Once
	src.reading = func() {
		// The release of v3 ends on the node while the servers answer
		// from a state that still holds its claim.
		once.Do(func() {
			_, err := e.m.Unmount(context.Background(), unmountReq("v3", "w1"))
			unmounted <- err
		})
	}
	outside := claimOf(released)
	outside.VolumeId, outside.HostPath, outside.StagingPath = "v2", "/etc", ""
	src.set([]*csisupdv1.NodeClaimRef{
		{VolumeId: "v1", WorkloadId: "w1", ClaimIndex: 6, PluginId: "tp", ExternalId: "v1", State: "taken"}, // not mounted yet
		outside,
		claimOf(released),
		otherUsage,
	}, 10, nil)
	startRun(t, e.m)
	select {
	case err := <-unmounted:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(waitTime):
		t.Fatal("no reconcile round read the claims")
	}
	testutil.WaitFor(t, waitTime, "the first round to end", func() bool {
		return strings.Contains(e.logs.String(), "compared mount records with the servers' claims")
	})
	if got := e.m.List("", ""); len(got) != 1 || got[0].GetVolumeId() != "v4" || got[0].GetState() != StatePublished {
		t.Errorf("mounts = %v, want v4 published only, none kept as lost", got)
	}
	logs := e.logs.String()
	if strings.Contains(logs, "volume mount record lost") {
		t.Errorf("a mount was logged as lost:\n%s", logs)
	}
	if !strings.Contains(logs, "cannot keep a claim") || !strings.Contains(logs, `host_path \"/etc\"`) {
		t.Errorf("the claim with paths outside the mount was not logged:\n%s", logs)
	}
}

// A record with the servers' paths is checked when loaded as any record
// is: a path out of the mount's directories makes it corrupt, and New
// names the file.
func TestServerPathRecordsAreCheckedOnLoad(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(r *record)
		want   string
	}{
		{"host path out of the mount", func(r *record) { r.HostPath = "/etc" }, "host_path"},
		{"host path climbing out", func(r *record) { r.HostPath += "/../../../../x" }, "host_path"},
		{"staging path out of the mount", func(r *record) { r.StagingPath = filepath.Join(r.Roots.Host, "staging", "v2", defaultKey) }, "staging_path"},
		{"record-lost with derived paths", func(r *record) { r.ServerPaths = false }, "record-lost"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, _, _ := lostEnv(t)
			rec, ok := e.readRecord(t, "tp", "v1", "w1", defaultKey)
			if !ok {
				t.Fatal("no record-lost record on disk")
			}
			tc.change(rec)
			if err := e.m.store.write(rec); err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(e.dataDir, RecordsDir, journalName)
			_, err := New(Config{DataDir: e.dataDir, Plugins: e.plugins, RPCTimeout: time.Second, Retry: shortRetry})
			if err == nil || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), "corrupt") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New: %v, want the record %s corrupt for its %s", err, file, tc.want)
			}
		})
	}
}
