package nodevolumes

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testutil"
	"github.com/csisupd/csisupd/internal/volreq"
)

// serveAllowing serves m's NodeVolumes on the unix socket dir/name,
// allowing the privileged mount flags allowed, and returns a client.
func serveAllowing(t *testing.T, dir, name string, m *Manager, allowed ...string) csisupdv1.NodeVolumesClient {
	t.Helper()
	sock := filepath.Join(dir, name)
	srv := grpc.NewServer()
	m.Register(srv, allowed...)
	testutil.ServeGRPC(t, testutil.ListenUnix(t, sock), srv)
	return csisupdv1.NewNodeVolumesClient(testutil.DialGRPC(t, "unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials())))
}

// The node refuses mount options that must not reach a plugin, and the
// privileged flags unless its operator allows them, before it records or
// calls anything.
func TestMountVolumeRefusesBadInputs(t *testing.T) {
	e := newEnv(t, Config{}, false)
	strict := serveAllowing(t, e.dir, "strict.sock", e.m)
	ctx := context.Background()
	big := make(map[string]string, 10000)
	for i := range 10000 {
		big[fmt.Sprintf("k%d", i)] = "v"
	}
	withUsage := func(u *csisupdv1.VolumeUsage) *csisupdv1.MountVolumeRequest {
		req := mountReq("v1", "w1")
		req.Usage = u
		return req
	}
	tests := []struct {
		name string
		req  *csisupdv1.MountVolumeRequest
		want string
	}{
		{"suid not allowed", withUsage(&csisupdv1.VolumeUsage{MountFlags: []string{"suid"}}), `usage.mount_flags[0] "suid" is not allowed on this node`},
		{"dev not allowed", withUsage(&csisupdv1.VolumeUsage{MountFlags: []string{"nosuid", "dev"}}), `usage.mount_flags[1] "dev" is not allowed on this node`},
		{"comma suid", withUsage(&csisupdv1.VolumeUsage{MountFlags: []string{",suid"}}), `",suid" holds a comma`},
		{"remount", withUsage(&csisupdv1.VolumeUsage{MountFlags: []string{"remount"}}), `"remount" is not allowed`},
		{"bind", withUsage(&csisupdv1.VolumeUsage{MountFlags: []string{"bind"}}), `"bind" is not allowed`},
		{"two in one", withUsage(&csisupdv1.VolumeUsage{MountFlags: []string{"a,b"}}), `"a,b" holds a comma`},
		{"fs type path", withUsage(&csisupdv1.VolumeUsage{FsType: "../../x"}), `usage.fs_type "../../x"`},
		{"volume context", func() *csisupdv1.MountVolumeRequest {
			req := mountReq("v1", "w1")
			req.VolumeContext = big
			return req
		}(), `volume_context has 10000 entries`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := strict.MountVolume(ctx, tt.req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tt.want) {
				t.Fatalf("MountVolume = %v, want InvalidArgument holding %q", err, tt.want)
			}
		})
	}
	if n := e.plug.calls("NodeStageVolume") + e.plug.calls("NodePublishVolume"); n != 0 {
		t.Errorf("the plugin got %d stage and publish calls for refused requests, want 0", n)
	}
	if files := e.diskRecords(t); len(files) != 0 {
		t.Errorf("refused requests left records %v", files)
	}
	if _, err := strict.ExpandVolume(ctx, &csisupdv1.ExpandVolumeRequest{PluginId: "tp", VolumeId: "v1", RequiredBytes: -5}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("ExpandVolume of -5 bytes = %v, want InvalidArgument", err)
	}

	// The same request passes where the operator allows suid.
	allowing := serveAllowing(t, e.dir, "allowing.sock", e.m, volreq.FlagSuid)
	resp, err := allowing.MountVolume(ctx, withUsage(&csisupdv1.VolumeUsage{MountFlags: []string{"suid"}}))
	if err != nil {
		t.Fatalf("MountVolume with suid allowed: %v", err)
	}
	if got := resp.GetMount().GetUsage().GetMountFlags(); len(got) != 1 || got[0] != "suid" {
		t.Errorf("mount flags of the mount = %q, want [suid]", got)
	}
	if e.plug.calls("NodePublishVolume") != 1 {
		t.Errorf("NodePublishVolume calls = %d, want 1", e.plug.calls("NodePublishVolume"))
	}
	if _, err := allowing.MountVolume(ctx, withUsage(&csisupdv1.VolumeUsage{MountFlags: []string{"dev"}})); status.Code(err) != codes.InvalidArgument {
		t.Errorf("MountVolume with dev where only suid is allowed = %v, want InvalidArgument", err)
	}
}
