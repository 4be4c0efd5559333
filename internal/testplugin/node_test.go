package testplugin

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
)

// nodePaths returns a staging path and a target path in a fresh directory.
func nodePaths(t *testing.T) (staging, targetPath string) {
	t.Helper()
	dir := t.TempDir()
	return filepath.Join(dir, "staging"), filepath.Join(dir, "pods", "target")
}

func TestNodeLifecycle(t *testing.T) { inModes(t, testNodeLifecycle) }

func testNodeLifecycle(t *testing.T, mounts string) {
	staging, targetPath := nodePaths(t)
	p := startNodePlugin(t, mounts, Config{})
	c := dial(t, p.Socket())
	vol := createVolume(t, c, "node-vol", 1<<20)
	id := vol.GetVolumeId()

	_, err := c.node.NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: targetPath, VolumeCapability: snw})
	wantCode(t, err, codes.FailedPrecondition) // not staged yet

	for range 2 {
		if _, err := c.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: snw}); err != nil {
			t.Fatalf("NodeStageVolume: %v", err)
		}
	}
	_, err = c.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging + "2", VolumeCapability: snw})
	wantCode(t, err, codes.FailedPrecondition)

	for range 2 {
		if _, err := c.node.NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: targetPath, VolumeCapability: snw}); err != nil {
			t.Fatalf("NodePublishVolume: %v", err)
		}
	}
	_, err = c.node.NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: targetPath, VolumeCapability: snw, Readonly: true})
	wantCode(t, err, codes.AlreadyExists)

	// The target is the volume: what is written there is in the volume.
	if err := os.WriteFile(filepath.Join(targetPath, "data"), make([]byte, 1000), 0o644); err != nil {
		t.Fatalf("write through the target path: %v", err)
	}
	stats, err := c.node.NodeGetVolumeStats(ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: targetPath})
	if err != nil {
		t.Fatal(err)
	}
	bytes := stats.GetUsage()[0]
	if bytes.GetUnit() != csi.VolumeUsage_BYTES || bytes.GetUsed() != 1000 || bytes.GetTotal() != 1<<20 || bytes.GetAvailable() != 1<<20-1000 {
		t.Fatalf("stats = %v, want 1000 of %d bytes used", bytes, 1<<20)
	}
	_, err = c.node.NodeGetVolumeStats(ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: "/elsewhere"})
	wantCode(t, err, codes.NotFound)

	// Node expansion follows controller expansion.
	_, err = c.node.NodeExpandVolume(ctx(t), &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: targetPath, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 20}})
	wantCode(t, err, codes.OutOfRange)
	if _, err := c.ctrl.ControllerExpandVolume(ctx(t), &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 20}}); err != nil {
		t.Fatal(err)
	}
	exp, err := c.node.NodeExpandVolume(ctx(t), &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: targetPath, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 20}})
	if err != nil || exp.GetCapacityBytes() != 2<<20 {
		t.Fatalf("NodeExpandVolume = %v, %v", exp, err)
	}

	_, err = c.node.NodeUnstageVolume(ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	wantCode(t, err, codes.FailedPrecondition) // still published

	for range 2 {
		if _, err := c.node.NodeUnpublishVolume(ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: targetPath}); err != nil {
			t.Fatalf("NodeUnpublishVolume: %v", err)
		}
	}
	if _, err := os.Lstat(targetPath); !os.IsNotExist(err) {
		t.Fatalf("target path after unpublish: %v, want it removed", err)
	}
	for range 2 {
		if _, err := c.node.NodeUnstageVolume(ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			t.Fatalf("NodeUnstageVolume: %v", err)
		}
	}
	_, err = c.node.NodeGetVolumeStats(ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: staging})
	wantCode(t, err, codes.NotFound)
	_, err = c.node.NodeUnpublishVolume(ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: "vol-unknown", TargetPath: targetPath})
	wantCode(t, err, codes.NotFound)
}

// A node-only plugin serves volumes created by a controller elsewhere.
func TestNodeOnlyAcceptsForeignVolumes(t *testing.T) {
	p := startPlugin(t, Config{Type: TypeNode})
	c := dial(t, p.Socket())
	staging, targetPath := nodePaths(t)
	const id = "vol-from-elsewhere"
	if _, err := c.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: snw}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.node.NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: targetPath, VolumeCapability: snw}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(targetPath); err != nil || !fi.IsDir() {
		t.Fatalf("target path = %v, %v; want a directory", fi, err)
	}
	_, err := c.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: "../escape", StagingTargetPath: staging, VolumeCapability: snw})
	wantCode(t, err, codes.NotFound)
}

func TestNodePublishReplacesEmptyTargetDir(t *testing.T) {
	p := startPlugin(t, Config{})
	c := dial(t, p.Socket())
	id := createVolume(t, c, "pre-made", 1<<20).GetVolumeId()
	staging, targetPath := nodePaths(t)
	if err := os.MkdirAll(targetPath, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := c.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: snw}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.node.NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: targetPath, VolumeCapability: snw}); err != nil {
		t.Fatalf("publish over an empty directory: %v", err)
	}
	if fi, err := os.Lstat(targetPath); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("target path = %v, %v; want a link to the volume", fi, err)
	}

	other := filepath.Join(filepath.Dir(targetPath), "busy")
	if err := os.MkdirAll(filepath.Join(other, "file"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := c.node.NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: other, VolumeCapability: snw})
	wantCode(t, err, codes.FailedPrecondition)
}

func TestNodeArguments(t *testing.T) {
	p := startPlugin(t, Config{})
	c := dial(t, p.Socket())
	tests := []struct {
		name string
		call func() error
	}{
		{"stage without volume id", func() error {
			_, err := c.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{StagingTargetPath: "/s", VolumeCapability: snw})
			return err
		}},
		{"stage without capability", func() error {
			_, err := c.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: "v", StagingTargetPath: "/s"})
			return err
		}},
		{"publish without target", func() error {
			_, err := c.node.NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: "v", StagingTargetPath: "/s", VolumeCapability: snw})
			return err
		}},
		{"publish without staging path", func() error {
			_, err := c.node.NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: "v", TargetPath: "/t", VolumeCapability: snw})
			return err
		}},
		{"relative staging path", func() error {
			_, err := c.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: "v", StagingTargetPath: "s", VolumeCapability: snw})
			return err
		}},
		{"relative target path", func() error {
			_, err := c.node.NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: "v", StagingTargetPath: "/s", TargetPath: "t", VolumeCapability: snw})
			return err
		}},
		{"unstage without path", func() error {
			_, err := c.node.NodeUnstageVolume(ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: "v"})
			return err
		}},
		{"stats without path", func() error {
			_, err := c.node.NodeGetVolumeStats(ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: "v"})
			return err
		}},
		{"expand without path", func() error {
			_, err := c.node.NodeExpandVolume(ctx(t), &csi.NodeExpandVolumeRequest{VolumeId: "v"})
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { wantCode(t, tt.call(), codes.InvalidArgument) })
	}
}

func TestNodeLogAndRecords(t *testing.T) { inModes(t, testNodeLogAndRecords) }

func testNodeLogAndRecords(t *testing.T, mounts string) {
	staging, targetPath := nodePaths(t)
	p := startNodePlugin(t, mounts, Config{})
	c := dial(t, p.Socket())
	id := createVolume(t, c, "log-vol", 1<<20).GetVolumeId()

	// A block usage is refused: the plugin's volumes are directories.
	block := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: snw.GetAccessMode(),
	}
	_, err := c.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: block})
	wantCode(t, err, codes.InvalidArgument)

	if _, err := c.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: snw}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.node.NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: targetPath, VolumeCapability: snw}); err != nil {
		t.Fatal(err)
	}
	if got, want := p.NodeVolumes(), map[string]NodeVolume{id: {StagingPath: staging, Targets: []string{targetPath}, CapacityBytes: 1 << 20}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("NodeVolumes = %+v, want %+v", got, want)
	}
	if _, err := c.node.NodeUnpublishVolume(ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: targetPath}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.node.NodeUnstageVolume(ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if got := p.NodeVolumes(); len(got) != 0 {
		t.Fatalf("NodeVolumes after unstage = %+v, want none", got)
	}
	// Only successful calls are logged, in order.
	want := []NodeCall{
		{Method: "NodeStageVolume", VolumeID: id, Path: staging},
		{Method: "NodePublishVolume", VolumeID: id, Path: targetPath, StagingPath: staging},
		{Method: "NodeUnpublishVolume", VolumeID: id, Path: targetPath},
		{Method: "NodeUnstageVolume", VolumeID: id, Path: staging},
	}
	if got := p.NodeLog(); !reflect.DeepEqual(got, want) {
		t.Fatalf("NodeLog = %+v, want %+v", got, want)
	}
}
