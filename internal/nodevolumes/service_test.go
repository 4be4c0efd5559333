package nodevolumes

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// serve serves m's NodeVolumes on a unix socket in dir, with the server
// options opts, and returns a client; both end with the test.
func serve(t *testing.T, dir string, m *Manager, opts ...grpc.ServerOption) csisupdv1.NodeVolumesClient {
	t.Helper()
	sock := filepath.Join(dir, "agent.sock")
	srv := grpc.NewServer(opts...)
	m.Register(srv)
	testutil.ServeGRPC(t, testutil.ListenUnix(t, sock), srv)
	return csisupdv1.NewNodeVolumesClient(testutil.DialGRPC(t, "unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials())))
}

func TestServiceOverGRPC(t *testing.T) {
	e := newEnv(t, Config{}, true)
	c := serve(t, e.dir, e.m)
	ctx := context.Background()
	resp, err := c.MountVolume(ctx, &csisupdv1.MountVolumeRequest{PluginId: "tp", VolumeId: "v1", WorkloadId: "w1",
		Usage: &csisupdv1.VolumeUsage{FsType: "ext4", MountFlags: []string{"noatime"}}})
	if err != nil {
		t.Fatal(err)
	}
	key := resp.GetMount().GetUsageKey()
	if len(key) != len(defaultKey)+9 || key[:len(defaultKey)] != defaultKey {
		t.Errorf("usage key with mount options = %q, want %s-<8 hex>", key, defaultKey)
	}
	if _, err := c.MountVolume(ctx, &csisupdv1.MountVolumeRequest{PluginId: "nope", VolumeId: "v1", WorkloadId: "w1"}); !csisupdv1.IsPluginNotFound(err) {
		t.Errorf("MountVolume of an unknown plugin: %v, want PluginNotFound across the wire", err)
	}
	list, err := c.ListMounts(ctx, &csisupdv1.ListMountsRequest{PluginId: "tp"})
	if err != nil || len(list.GetMounts()) != 1 || list.GetMounts()[0].GetHostPath() != resp.GetMount().GetHostPath() {
		t.Fatalf("ListMounts = %v, %v", list, err)
	}
	st, err := c.VolumeStats(ctx, &csisupdv1.VolumeStatsRequest{PluginId: "tp", VolumeId: "v1"})
	if err != nil || st.GetVolumePath() != resp.GetMount().GetHostPath() {
		t.Errorf("VolumeStats = %v, %v", st, err)
	}
	// The read model of "tp" lacks the health capabilities: the typed
	// refusals cross the wire.
	for method, call := range map[string]func() error{
		plugin.CapGetVolumeHealth: func() error {
			_, err := c.VolumeHealth(ctx, &csisupdv1.VolumeHealthRequest{PluginId: "tp", VolumeId: "v1"})
			return err
		},
		plugin.CapGetStorageHealth: func() error {
			_, err := c.StorageHealth(ctx, &csisupdv1.StorageHealthRequest{PluginId: "tp"})
			return err
		},
		plugin.CapVolumeMountGroup: func() error {
			_, err := c.MountVolume(ctx, &csisupdv1.MountVolumeRequest{PluginId: "tp", VolumeId: "v2", WorkloadId: "w1",
				Usage: &csisupdv1.VolumeUsage{VolumeMountGroup: "1000"}})
			return err
		},
	} {
		err := call()
		if d, ok := csisupdv1.ErrorDetail[*csisupdv1.CapabilityMissing](err); !ok || d.GetCapability() != method {
			t.Errorf("%s missing: error = %v, want CapabilityMissing across the wire", method, err)
		}
	}
	if _, err := c.MountVolume(ctx, &csisupdv1.MountVolumeRequest{PluginId: "tp", VolumeId: "v2", WorkloadId: "w1",
		Usage: &csisupdv1.VolumeUsage{VolumeMountGroup: "-5"}}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "usage.volume_mount_group") {
		t.Errorf("MountVolume with a malformed mount group: %v, want InvalidArgument naming usage.volume_mount_group", err)
	}
	if _, err := c.ExpandVolume(ctx, &csisupdv1.ExpandVolumeRequest{PluginId: "tp", VolumeId: "v9"}); status.Code(err) != codes.NotFound {
		t.Errorf("ExpandVolume of a volume not mounted: %v, want NotFound", err)
	}
	// Unmounting another usage leaves the mount; the mount's own usage
	// removes it.
	other, err := c.UnmountVolume(ctx, &csisupdv1.UnmountVolumeRequest{PluginId: "tp", VolumeId: "v1", WorkloadId: "w1",
		Usage: &csisupdv1.VolumeUsage{}})
	if err != nil || len(other.GetUnmounted()) != 0 {
		t.Fatalf("UnmountVolume of another usage = %v, %v; want nothing unmounted", other, err)
	}
	un, err := c.UnmountVolume(ctx, &csisupdv1.UnmountVolumeRequest{PluginId: "tp", VolumeId: "v1", WorkloadId: "w1",
		Usage: &csisupdv1.VolumeUsage{FsType: "ext4", MountFlags: []string{"noatime"}}})
	if err != nil || len(un.GetUnmounted()) != 1 || !un.GetUnstaged() {
		t.Fatalf("UnmountVolume = %v, %v", un, err)
	}
}
