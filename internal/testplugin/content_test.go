package testplugin

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
)

// treeEntry is one file of a directory tree as tests compare it.
type treeEntry struct {
	Mode fs.FileMode
	Data string // file content or link destination
}

// readTree returns the entries under dir by relative path; dir itself is ".".
func readTree(t *testing.T, dir string) map[string]treeEntry {
	t.Helper()
	// A marker target is a link to the volume: walk what it points to.
	dir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]treeEntry)
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		info, err := d.Info()
		if err != nil {
			return err
		}
		e := treeEntry{Mode: info.Mode()}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			e.Data, err = os.Readlink(path)
		case d.Type().IsRegular():
			var b []byte
			b, err = os.ReadFile(path)
			e.Data = string(b)
		}
		out[rel] = e
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// writeFiles writes name -> content under dir, creating directories.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCopyContent(t *testing.T) {
	src := filepath.Join(t.TempDir(), "src")
	writeFiles(t, src, map[string]string{"a.txt": "alpha", "sub/deep/b.bin": "beta"})
	for _, m := range []struct {
		path string
		mode fs.FileMode
	}{{"a.txt", 0o640}, {"sub", 0o750 | fs.ModeSetgid}, {"sub/deep", 0o500}, {".", 0o711}} {
		if err := os.Chmod(filepath.Join(src, m.path), m.mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("sub/deep/b.bin", filepath.Join(src, "link")); err != nil {
		t.Fatal(err)
	}
	// The read-only directory would block its own removal otherwise.
	t.Cleanup(func() { _ = os.Chmod(filepath.Join(src, "sub/deep"), 0o755) })

	dst := filepath.Join(t.TempDir(), "dst")
	if err := copyContent(src, dst, 1<<20, 100); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chmod(filepath.Join(dst, "sub/deep"), 0o755) })
	if got, want := readTree(t, dst), readTree(t, src); !reflect.DeepEqual(got, want) {
		t.Fatalf("copy = %+v\nwant %+v", got, want)
	}

	t.Run("missing source copies as empty", func(t *testing.T) {
		dst := filepath.Join(t.TempDir(), "dst")
		if err := copyContent(filepath.Join(t.TempDir(), "none"), dst, 1, 1); err != nil {
			t.Fatal(err)
		}
		if entries, err := os.ReadDir(dst); err != nil || len(entries) != 0 {
			t.Fatalf("copy of nothing = %v, %v; want an empty directory", entries, err)
		}
	})

	fifoDir := filepath.Join(t.TempDir(), "fifo")
	writeFiles(t, fifoDir, map[string]string{"ok": "x"})
	if err := syscall.Mkfifo(filepath.Join(fifoDir, "pipe"), 0o644); err != nil {
		t.Fatal(err)
	}
	limits := []struct {
		name       string
		src        string
		maxBytes   int64
		maxEntries int
		wantErr    any
		wantCode   codes.Code
	}{
		{"bytes", src, 8, 100, &contentLimitError{}, codes.ResourceExhausted},
		{"bytes exactly", src, 9, 100, nil, codes.OK},
		{"entries", src, 1 << 20, 3, &contentLimitError{}, codes.ResourceExhausted},
		{"fifo", fifoDir, 1 << 20, 100, &unsupportedFileError{}, codes.FailedPrecondition},
	}
	for _, tt := range limits {
		t.Run(tt.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "dst")
			err := copyContent(tt.src, dst, tt.maxBytes, tt.maxEntries)
			t.Cleanup(func() { _ = os.Chmod(filepath.Join(dst, "sub/deep"), 0o755) })
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("copy: %v", err)
				}
				return
			}
			if err == nil || !errors.As(err, reflect.New(reflect.TypeOf(tt.wantErr)).Interface()) {
				t.Fatalf("copy error = %v, want a %T", err, tt.wantErr)
			}
			wantCode(t, contentStatus("copy", err), tt.wantCode)
			// Nothing half-copied is left behind.
			if entries, _ := os.ReadDir(filepath.Dir(dst)); len(entries) != 0 {
				t.Fatalf("after a failed copy the directory holds %v, want nothing", entries)
			}
		})
	}
}

// stagePublish stages and publishes volume id at the given paths (made
// with nodePaths before the plugin started, so that its mounts are undone
// before they are removed) and returns the target path.
func stagePublish(t *testing.T, c *client, id, staging, targetPath string) string {
	t.Helper()
	if _, err := c.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: snw}); err != nil {
		t.Fatalf("stage %s: %v", id, err)
	}
	if _, err := c.node.NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: targetPath, VolumeCapability: snw}); err != nil {
		t.Fatalf("publish %s: %v", id, err)
	}
	return targetPath
}

func snapshotSource(id string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}}
}

func volumeSource(id string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}
}

// createFrom creates a volume with a content source.
func createFrom(t *testing.T, c *client, name string, src *csi.VolumeContentSource) (*csi.Volume, error) {
	t.Helper()
	resp, err := c.ctrl.CreateVolume(ctx(t), &csi.CreateVolumeRequest{
		Name: name, VolumeCapabilities: []*csi.VolumeCapability{snw},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20}, VolumeContentSource: src,
	})
	return resp.GetVolume(), err
}

func TestSnapshotRestoreCloneContent(t *testing.T) { inModes(t, testSnapshotRestoreCloneContent) }

// testSnapshotRestoreCloneContent writes through a published target,
// snapshots, changes the volume, and checks through the targets of a
// restored and a cloned volume that each holds the content it should.
func testSnapshotRestoreCloneContent(t *testing.T, mounts string) {
	var paths [3][2]string
	for i := range paths {
		paths[i][0], paths[i][1] = nodePaths(t)
	}
	p := startNodePlugin(t, mounts, Config{ControllerCapabilities: SupportedControllerCapabilities})
	c := dial(t, p.Socket())
	src := createVolume(t, c, "content-src", 1<<20).GetVolumeId()
	srcTarget := stagePublish(t, c, src, paths[0][0], paths[0][1])
	writeFiles(t, srcTarget, map[string]string{"before.txt": "at snapshot time", "dir/nested.txt": "nested"})

	snap, err := c.ctrl.CreateSnapshot(ctx(t), &csi.CreateSnapshotRequest{Name: "content-snap", SourceVolumeId: src})
	if err != nil {
		t.Fatal(err)
	}
	snapID := snap.GetSnapshot().GetSnapshotId()
	// Changes after the snapshot are in the clone, not in the restore.
	writeFiles(t, srcTarget, map[string]string{"after.txt": "after the snapshot", "before.txt": "changed"})

	restored, err := createFrom(t, c, "content-restored", snapshotSource(snapID))
	if err != nil {
		t.Fatal(err)
	}
	clone, err := createFrom(t, c, "content-clone", volumeSource(src))
	if err != nil {
		t.Fatal(err)
	}
	if got := clone.GetContentSource().GetVolume().GetVolumeId(); got != src {
		t.Fatalf("clone's content source = %v, want volume %s", clone.GetContentSource(), src)
	}
	if got := restored.GetContentSource().GetSnapshot().GetSnapshotId(); got != snapID {
		t.Fatalf("restored volume's content source = %v, want snapshot %s", restored.GetContentSource(), snapID)
	}
	if v, ok := p.Volume(clone.GetVolumeId()); !ok || v.SourceVolumeID != src || v.SourceSnapshotID != "" {
		t.Fatalf("Volume(clone) = %+v, %v; want source volume %s", v, ok, src)
	}

	// No subtests: their temporary directories would go before the
	// plugin's mounts in them are undone.
	tests := []struct {
		name string
		id   string
		want map[string]string
	}{
		{"restored", restored.GetVolumeId(), map[string]string{"before.txt": "at snapshot time", "dir/nested.txt": "nested"}},
		{"clone", clone.GetVolumeId(), map[string]string{"before.txt": "changed", "after.txt": "after the snapshot", "dir/nested.txt": "nested"}},
	}
	for i, tt := range tests {
		func() {
			targetPath := stagePublish(t, c, tt.id, paths[i+1][0], paths[i+1][1])
			if mounts == MountsBind {
				wantMountPoints(t, true, targetPath)
				points, err := MountPoints()
				if err != nil {
					t.Fatal(err)
				}
				if !points[targetPath] {
					t.Fatalf("%s is not in %s", targetPath, mountInfoFile)
				}
			}
			got := make(map[string]string)
			for rel, e := range readTree(t, targetPath) {
				if e.Mode.IsRegular() {
					got[rel] = e.Data
				}
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("files at the %s volume's target = %v, want %v", tt.name, got, tt.want)
			}
			// The volumes are copies: writing to one leaves the source alone.
			writeFiles(t, targetPath, map[string]string{"only-here.txt": tt.name})
			if _, err := os.Stat(filepath.Join(srcTarget, "only-here.txt")); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("a file written to the %s volume shows in the source: %v", tt.name, err)
			}
		}()
	}

	snapDir := p.st.snapDataPath(snapID)
	if _, err := os.Stat(filepath.Join(snapDir, "before.txt")); err != nil {
		t.Fatalf("snapshot content: %v", err)
	}
	if _, err := c.ctrl.DeleteSnapshot(ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: snapID}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(snapDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("snapshot content after DeleteSnapshot: %v, want it removed", err)
	}
	if got := p.Snapshots(); len(got) != 0 {
		t.Fatalf("Snapshots after delete = %+v, want none", got)
	}
}

func TestContentErrors(t *testing.T) {
	p := startPlugin(t, Config{ControllerCapabilities: SupportedControllerCapabilities, MaxContentBytes: 100})
	c := dial(t, p.Socket())
	small := createVolume(t, c, "small", 1<<20).GetVolumeId()
	big := createVolume(t, c, "big", 1<<20).GetVolumeId()
	writeFiles(t, p.st.dataPath(big), map[string]string{"data": strings.Repeat("x", 101)})
	writeFiles(t, p.st.dataPath(small), map[string]string{"data": "fits"})
	smallSnap, err := c.ctrl.CreateSnapshot(ctx(t), &csi.CreateSnapshotRequest{Name: "small-snap", SourceVolumeId: small})
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		call func() error
		code codes.Code
		want string // in the message
	}{
		{"snapshot above MaxContentBytes", func() error {
			_, err := c.ctrl.CreateSnapshot(ctx(t), &csi.CreateSnapshotRequest{Name: "big-snap", SourceVolumeId: big})
			return err
		}, codes.ResourceExhausted, "100 bytes"},
		{"clone above MaxContentBytes", func() error {
			_, err := createFrom(t, c, "big-clone", volumeSource(big))
			return err
		}, codes.ResourceExhausted, big},
		{"clone of an unknown volume", func() error {
			_, err := createFrom(t, c, "clone-none", volumeSource("vol-none"))
			return err
		}, codes.NotFound, "vol-none"},
		{"clone without a volume id", func() error {
			_, err := createFrom(t, c, "clone-empty", volumeSource(""))
			return err
		}, codes.InvalidArgument, "volume_id"},
		{"same name, other clone source", func() error {
			if _, err := createFrom(t, c, "clone-a", volumeSource(small)); err != nil {
				return err
			}
			_, err := createFrom(t, c, "clone-a", volumeSource(big))
			return err
		}, codes.AlreadyExists, "content source"},
		{"same name, snapshot instead of clone source", func() error {
			_, err := createFrom(t, c, "clone-a", snapshotSource(smallSnap.GetSnapshot().GetSnapshotId()))
			return err
		}, codes.AlreadyExists, "content source"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			wantCode(t, err, tt.code)
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q does not name %q", err, tt.want)
			}
		})
	}
	// The refused snapshot left no record and no content behind.
	if snaps := p.Snapshots(); len(snaps) != 1 || snaps[0].ID != smallSnap.GetSnapshot().GetSnapshotId() {
		t.Fatalf("Snapshots = %+v, want only the small one", snaps)
	}
	if entries, err := os.ReadDir(filepath.Join(p.cfg.StateDir, snapDataDir)); err != nil || len(entries) != 1 {
		t.Fatalf("snapshot content directories = %v, %v; want one", entries, err)
	}
	// A repeated clone is the same volume.
	again, err := createFrom(t, c, "clone-a", volumeSource(small))
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := p.Volume(again.GetVolumeId()); !ok || v.Name != "clone-a" {
		t.Fatalf("repeated clone = %+v, %v", v, ok)
	}

	// Without CLONE_VOLUME a volume source is not supported.
	plain := startPlugin(t, Config{})
	pc := dial(t, plain.Socket())
	_, err = createFrom(t, pc, "no-clone", volumeSource(createVolume(t, pc, "src", 1<<20).GetVolumeId()))
	wantCode(t, err, codes.InvalidArgument)
}

func TestSnapshotReadyAfter(t *testing.T) {
	p := startPlugin(t, Config{ControllerCapabilities: SupportedControllerCapabilities, SnapshotReadyAfter: 2})
	c := dial(t, p.Socket())
	vol := createVolume(t, c, "ready-src", 1<<20).GetVolumeId()
	create := func() (bool, error) {
		resp, err := c.ctrl.CreateSnapshot(ctx(t), &csi.CreateSnapshotRequest{Name: "ready", SourceVolumeId: vol})
		return resp.GetSnapshot().GetReadyToUse(), err
	}
	var id string
	get := func() (bool, error) {
		resp, err := c.ctrl.GetSnapshot(ctx(t), &csi.GetSnapshotRequest{SnapshotId: id})
		return resp.GetSnapshot().GetReadyToUse(), err
	}
	list := func() (bool, error) {
		resp, err := c.ctrl.ListSnapshots(ctx(t), &csi.ListSnapshotsRequest{SnapshotId: id})
		if len(resp.GetEntries()) != 1 {
			return false, errors.New("ListSnapshots did not list the snapshot")
		}
		return resp.GetEntries()[0].GetSnapshot().GetReadyToUse(), err
	}
	if ready, err := create(); err != nil || ready {
		t.Fatalf("CreateSnapshot: ready %v, %v; want not ready", ready, err)
	}
	id = p.Snapshots()[0].ID
	// CreateSnapshot's answer and the next two say not ready, whichever
	// call makes them; then the snapshot is ready for good.
	steps := []struct {
		name  string
		call  func() (bool, error)
		ready bool
	}{
		{"GetSnapshot", get, false},
		{"repeated CreateSnapshot", create, false},
		{"ListSnapshots", list, true},
		{"GetSnapshot again", get, true},
		{"repeated CreateSnapshot again", create, true},
	}
	for _, s := range steps {
		ready, err := s.call()
		if err != nil || ready != s.ready {
			t.Fatalf("%s: ready %v, %v; want %v", s.name, ready, err, s.ready)
		}
		if got := p.Snapshots()[0].ReadyToUse; s.ready && !got {
			t.Fatalf("after %s Snapshots says not ready", s.name)
		}
	}
}

// Snapshot content, mutable parameters, clone sources and the readiness
// countdown survive a plugin made again on the same state directory.
func TestContentPersistence(t *testing.T) {
	stateDir := t.TempDir()
	cfg := Config{StateDir: stateDir, ControllerCapabilities: SupportedControllerCapabilities, SnapshotReadyAfter: 1}
	p := startPlugin(t, cfg)
	c := dial(t, p.Socket())
	resp, err := c.ctrl.CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "kept", VolumeCapabilities: []*csi.VolumeCapability{snw},
		MutableParameters: map[string]string{"tier": "gold"}})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetVolume().GetVolumeId()
	writeFiles(t, p.st.dataPath(id), map[string]string{"kept.txt": "still here"})
	snap, err := c.ctrl.CreateSnapshot(ctx(t), &csi.CreateSnapshotRequest{Name: "kept-snap", SourceVolumeId: id})
	if err != nil || snap.GetSnapshot().GetReadyToUse() {
		t.Fatalf("CreateSnapshot = %v, %v; want not ready", snap, err)
	}
	clone, err := createFrom(t, c, "kept-clone", volumeSource(id))
	if err != nil {
		t.Fatal(err)
	}
	p.Stop()

	p2 := startPlugin(t, cfg)
	c2 := dial(t, p2.Socket())
	if v, ok := p2.Volume(id); !ok || !reflect.DeepEqual(v.MutableParameters, map[string]string{"tier": "gold"}) {
		t.Fatalf("Volume after restart = %+v, %v; want mutable tier=gold", v, ok)
	}
	if v, ok := p2.Volume(clone.GetVolumeId()); !ok || v.SourceVolumeID != id {
		t.Fatalf("clone after restart = %+v, %v; want source %s", v, ok, id)
	}
	snapID := snap.GetSnapshot().GetSnapshotId()
	for _, want := range []bool{false, true} {
		got, err := c2.ctrl.GetSnapshot(ctx(t), &csi.GetSnapshotRequest{SnapshotId: snapID})
		if err != nil || got.GetSnapshot().GetReadyToUse() != want {
			t.Fatalf("GetSnapshot after restart = %v, %v; want ready %v", got, err, want)
		}
	}
	restored, err := createFrom(t, c2, "kept-restored", snapshotSource(snapID))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(p2.st.dataPath(restored.GetVolumeId()), "kept.txt"))
	if err != nil || string(b) != "still here" {
		t.Fatalf("restored content after restart = %q, %v", b, err)
	}
}
