package testplugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
)

// inModes runs test once per mount mode, as subtests named after it.
func inModes(t *testing.T, test func(t *testing.T, mounts string)) {
	for _, mounts := range []string{MountsMarker, MountsBind} {
		t.Run(mounts, func(t *testing.T) { test(t, mounts) })
	}
}

// startNodePlugin starts a plugin whose node service places volumes as
// mounts says. With MountsBind the test is skipped when this process
// cannot mount, and the plugin's mounts are undone when the test ends:
// create the test's staging and target directories before, so that they
// are removed after that.
func startNodePlugin(t *testing.T, mounts string, cfg Config) *Plugin {
	t.Helper()
	if mounts == MountsBind {
		skipWithoutMounts(t)
	}
	cfg.Mounts = mounts
	p := startPlugin(t, cfg)
	t.Cleanup(func() {
		if err := p.UnmountAll(); err != nil {
			t.Errorf("UnmountAll: %v", err)
		}
	})
	return p
}

// skipWithoutMounts skips the test, saying why, when this process cannot
// make bind mounts.
func skipWithoutMounts(t *testing.T) {
	t.Helper()
	if ok, reason := RealMountsAvailable(); !ok {
		t.Skip("real mounts are not available: " + reason)
	}
}

// wantMountPoints fails the test unless each path is a mount point, or
// none is, as want says.
func wantMountPoints(t *testing.T, want bool, paths ...string) {
	t.Helper()
	for _, p := range paths {
		got, err := IsMountPoint(p)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("%s is a mount point: %v, want %v", p, got, want)
		}
	}
}

func TestParseMountInfo(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []string
		wantErr string
	}{
		{"plain", "21 26 0:20 / /proc rw,relatime - proc proc rw\n26 1 254:0 / / rw - ext4 /dev/vda rw\n", []string{"/proc", "/"}, ""},
		{"escaped space, tab, newline and backslash",
			`44 26 254:0 /a /mnt/a\040b\011c\012d\134e rw - ext4 /dev/vda rw` + "\n",
			[]string{"/mnt/a b\tc\nd\\e"}, ""},
		{"bind of a sub directory", "44 26 254:0 /tmp/x/data/v1 /tmp/x/staging rw,relatime shared:1 - ext4 /dev/vda rw\n", []string{"/tmp/x/staging"}, ""},
		{"empty", "", nil, ""},
		{"short line", "44 26 254:0 /a\n", nil, "fields"},
		{"cut escape", `44 26 254:0 /a /mnt/a\04 rw - ext4 /dev/vda rw`, nil, "cut short"},
		{"bad escape", `44 26 254:0 /a /mnt/a\9zz rw - ext4 /dev/vda rw`, nil, "bad escape"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseMountInfo(strings.NewReader(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseMountInfo: %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := make(map[string]bool)
			for _, p := range tt.want {
				want[p] = true
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("parseMountInfo = %v, want %v", got, want)
			}
		})
	}
}

// FuzzParseMountInfo checks that any mount point, escaped as the kernel
// escapes it, reads back as itself, and that no input makes the parser
// panic.
func FuzzParseMountInfo(f *testing.F) {
	for _, p := range []string{"/", "/mnt/a b", "/x\\040y", "/t\tn\n"} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, point string) {
		_, _ = parseMountInfo(strings.NewReader(point))
		if point == "" {
			return
		}
		var esc strings.Builder
		for _, c := range []byte(point) {
			if strings.IndexByte(" \t\n\\", c) >= 0 {
				fmt.Fprintf(&esc, "\\%03o", c)
				continue
			}
			esc.WriteByte(c)
		}
		got, err := parseMountInfo(strings.NewReader("44 26 254:0 / " + esc.String() + " rw - ext4 /dev/vda rw\n"))
		if err != nil || len(got) != 1 || !got[point] {
			t.Fatalf("mount point %q escaped as %q reads back as %v, %v", point, esc.String(), got, err)
		}
	})
}

// IsMountPoint reads this process's real mount table and resolves links.
func TestIsMountPoint(t *testing.T) {
	dir := t.TempDir()
	link := filepath.Join(dir, "root-link")
	if err := os.Symlink("/", link); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]bool{
		"/":                           true, // every mount namespace has a root mount
		link:                          true,
		dir:                           false,
		filepath.Join(dir, "missing"): false,
	} {
		if got, err := IsMountPoint(path); err != nil || got != want {
			t.Errorf("IsMountPoint(%q) = %v, %v; want %v", path, got, err, want)
		}
	}
}

// With bind mounts, stage and publish show up in the mount table and
// unpublish and unstage take them away again; each call may repeat.
func TestBindMountLifecycle(t *testing.T) {
	staging, targetPath := nodePaths(t)
	p := startNodePlugin(t, MountsBind, Config{})
	c := dial(t, p.Socket())
	id := createVolume(t, c, "bind-vol", 1<<20).GetVolumeId()
	data := p.st.dataPath(id)

	for range 2 {
		if _, err := c.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: snw}); err != nil {
			t.Fatalf("NodeStageVolume: %v", err)
		}
	}
	wantMountPoints(t, true, staging)
	wantMountPoints(t, false, targetPath)
	for range 2 {
		if _, err := c.node.NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: targetPath, VolumeCapability: snw}); err != nil {
			t.Fatalf("NodePublishVolume: %v", err)
		}
	}
	wantMountPoints(t, true, staging, targetPath)
	if fi, err := os.Lstat(targetPath); err != nil || !fi.IsDir() {
		t.Fatalf("target path = %v, %v; want a directory, not a link", fi, err)
	}
	_, err := c.node.NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: targetPath, VolumeCapability: snw, Readonly: true})
	wantCode(t, err, codes.AlreadyExists)

	// What the workload writes at the target lands in the volume.
	if err := os.WriteFile(filepath.Join(targetPath, "file"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(data, "file")); err != nil || string(b) != "data" {
		t.Fatalf("the volume's directory has %q, %v; want what was written at the target", b, err)
	}

	_, err = c.node.NodeUnstageVolume(ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	wantCode(t, err, codes.FailedPrecondition)
	wantMountPoints(t, true, staging)

	for range 2 {
		if _, err := c.node.NodeUnpublishVolume(ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: targetPath}); err != nil {
			t.Fatalf("NodeUnpublishVolume: %v", err)
		}
	}
	wantMountPoints(t, false, targetPath)
	wantMountPoints(t, true, staging)
	if _, err := os.Lstat(targetPath); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("target path after unpublish: %v, want it removed", err)
	}
	for range 2 {
		if _, err := c.node.NodeUnstageVolume(ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			t.Fatalf("NodeUnstageVolume: %v", err)
		}
	}
	wantMountPoints(t, false, staging)
	// The staging directory is the orchestrator's to remove; the data
	// stays in the volume.
	if entries, err := os.ReadDir(staging); err != nil || len(entries) != 0 {
		t.Fatalf("staging path after unstage: %v, %v; want an empty directory", entries, err)
	}
	if _, err := os.Stat(filepath.Join(data, "file")); err != nil {
		t.Fatalf("the volume lost its file: %v", err)
	}
}

// A read-only publish is a read-only mount: writes there fail with EROFS,
// while a read-write publish of the same staging writes.
func TestBindMountReadOnly(t *testing.T) {
	staging, ro := nodePaths(t)
	rw := filepath.Join(filepath.Dir(ro), "rw")
	p := startNodePlugin(t, MountsBind, Config{})
	c := dial(t, p.Socket())
	id := createVolume(t, c, "ro-vol", 1<<20).GetVolumeId()
	if _, err := c.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: snw}); err != nil {
		t.Fatal(err)
	}
	for target, readonly := range map[string]bool{ro: true, rw: false} {
		for range 2 {
			if _, err := c.node.NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: snw, Readonly: readonly}); err != nil {
				t.Fatalf("NodePublishVolume at %s, readonly %v: %v", target, readonly, err)
			}
		}
	}
	wantMountPoints(t, true, ro, rw)

	err := os.WriteFile(filepath.Join(ro, "file"), []byte("no"), 0o644)
	if !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write at the read-only target: %v, want EROFS", err)
	}
	if err := os.WriteFile(filepath.Join(rw, "file"), []byte("yes"), 0o644); err != nil {
		t.Fatalf("write at the read-write target: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(ro, "file")); err != nil || string(b) != "yes" {
		t.Fatalf("read at the read-only target: %q, %v; want the file written through the other", b, err)
	}
	if err := os.WriteFile(filepath.Join(staging, "other"), nil, 0o644); err != nil {
		t.Fatalf("the staging mount became read-only too: %v", err)
	}

	for _, target := range []string{ro, rw} {
		if _, err := c.node.NodeUnpublishVolume(ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.node.NodeUnstageVolume(ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	wantMountPoints(t, false, staging, ro, rw)
}

// A killed plugin leaves its mounts, as a crashed process does;
// UnmountAll removes them and keeps the records, and a repeated stage and
// publish mount again what is recorded.
func TestUnmountAllAfterKill(t *testing.T) {
	staging, targetPath := nodePaths(t)
	p := startNodePlugin(t, MountsBind, Config{})
	c := dial(t, p.Socket())
	id := createVolume(t, c, "kill-vol", 1<<20).GetVolumeId()
	stage := &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: snw}
	publish := &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: targetPath, VolumeCapability: snw}
	if _, err := c.node.NodeStageVolume(ctx(t), stage); err != nil {
		t.Fatal(err)
	}
	if _, err := c.node.NodePublishVolume(ctx(t), publish); err != nil {
		t.Fatal(err)
	}

	p.Kill()
	wantMountPoints(t, true, staging, targetPath)
	if err := p.UnmountAll(); err != nil {
		t.Fatal(err)
	}
	wantMountPoints(t, false, staging, targetPath)
	want := map[string]NodeVolume{id: {StagingPath: staging, Targets: []string{targetPath}, CapacityBytes: 1 << 20}}
	if got := p.NodeVolumes(); !reflect.DeepEqual(got, want) {
		t.Fatalf("NodeVolumes after UnmountAll = %+v, want %+v", got, want)
	}

	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	c = dial(t, p.Socket())
	if _, err := c.node.NodeStageVolume(ctx(t), stage); err != nil {
		t.Fatal(err)
	}
	if _, err := c.node.NodePublishVolume(ctx(t), publish); err != nil {
		t.Fatal(err)
	}
	wantMountPoints(t, true, staging, targetPath)
}

// A bind publish refuses a target that is a file or a link, or a mount
// point the plugin did not make.
func TestBindPublishRefusesForeignTargets(t *testing.T) {
	staging, targetPath := nodePaths(t)
	pods := filepath.Dir(targetPath)
	foreign, file, link := filepath.Join(pods, "foreign"), filepath.Join(pods, "file"), filepath.Join(pods, "link")
	p := startNodePlugin(t, MountsBind, Config{})
	c := dial(t, p.Socket())
	id := createVolume(t, c, "foreign-vol", 1<<20).GetVolumeId()
	if _, err := c.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: snw}); err != nil {
		t.Fatal(err)
	}

	other := t.TempDir()
	if err := os.MkdirAll(foreign, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := bindMount(other, foreign, false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unmount(foreign, 0); err != nil {
			t.Error(err)
		}
	})
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(other, link); err != nil {
		t.Fatal(err)
	}
	for _, target := range []string{foreign, file, link} {
		_, err := c.node.NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: snw})
		wantCode(t, err, codes.FailedPrecondition)
	}
	if vols := p.NodeVolumes(); len(vols[id].Targets) != 0 {
		t.Fatalf("NodeVolumes = %+v, want no target recorded", vols)
	}
	wantMountPoints(t, false, link)
	if _, err := c.node.NodeUnstageVolume(ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
}
