package nodevolumes

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-test/v5/driver"
	"go.uber.org/mock/gomock"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// mockReporter lets gomock fail the test from a gRPC handler goroutine,
// where t.Fatalf must not be called.
type mockReporter struct{ t *testing.T }

func (r mockReporter) Errorf(format string, args ...any) { r.t.Errorf(format, args...) }
func (r mockReporter) Fatalf(format string, args ...any) {
	r.t.Errorf(format, args...)
	runtime.Goexit()
}
func (r mockReporter) Helper()          {}
func (r mockReporter) Cleanup(f func()) { r.t.Cleanup(f) }

// mockNodeEnv is a manager over csi-test's gomock node service, registered
// as plugin "mp" with the node capabilities the test gives. An unexpected
// call to the mock fails the test.
type mockNodeEnv struct {
	node    *driver.MockNodeServer
	m       *Manager
	dataDir string
	logs    *testutil.SyncBuffer
}

func newMockNodeEnv(t *testing.T, caps ...string) *mockNodeEnv {
	t.Helper()
	dir := testutil.TempDir(t)
	mn := driver.NewMockNodeServer(gomock.NewController(mockReporter{t}))
	d := driver.NewCSIDriver(&driver.CSIDriverServers{
		Node: struct {
			csi.UnsafeNodeServer
			*driver.MockNodeServer
		}{MockNodeServer: mn},
	})
	sock := filepath.Join(dir, "mock.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(l); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Stop)
	c, err := csiclient.New(csiclient.Config{Socket: sock, Redial: config.DefaultRetry().PluginRedial})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	plugins := newFixedPlugins()
	plugins.set(&csisupdv1.Plugin{Id: "mp", Type: string(plugin.TypeNode), Healthy: true, HealthState: "healthy",
		NodeId: "csi-node-a", NodeCapabilities: caps}, c)
	e := &env{dir: dir, dataDir: filepath.Join(dir, "data"), plugins: plugins, events: &events{}, logs: &testutil.SyncBuffer{}}
	m := e.manager(t, Config{NodeName: "node-a"}, false)
	return &mockNodeEnv{node: mn, m: m, dataDir: e.dataDir, logs: e.logs}
}

// requests records the CSI requests a mock received.
type requests struct {
	mu   sync.Mutex
	msgs []proto.Message
}

func (r *requests) add(m proto.Message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, proto.Clone(m))
}

func (r *requests) all() []proto.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]proto.Message(nil), r.msgs...)
}

// expectMount makes the mock stage and publish successfully, recording
// the requests.
func (e *mockNodeEnv) expectMount(got *requests) {
	e.node.EXPECT().NodeStageVolume(gomock.Any(), gomock.Any()).DoAndReturn(
		func(_ context.Context, r *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
			got.add(r)
			return &csi.NodeStageVolumeResponse{}, nil
		}).AnyTimes()
	e.node.EXPECT().NodePublishVolume(gomock.Any(), gomock.Any()).DoAndReturn(
		func(_ context.Context, r *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
			got.add(r)
			return &csi.NodePublishVolumeResponse{}, nil
		}).AnyTimes()
}

// wantCapabilityMissing checks that err is the typed refusal for a node
// capability of plugin mp.
func wantCapabilityMissing(t *testing.T, err error, method, capability string, node string) {
	t.Helper()
	if status.Code(err) != codes.FailedPrecondition || csisupdv1.IsRetryable(err) {
		t.Fatalf("error = %v, want FailedPrecondition, not retryable", err)
	}
	d, ok := csisupdv1.ErrorDetail[*csisupdv1.CapabilityMissing](err)
	if !ok || d.GetPluginId() != "mp" || d.GetMethod() != method || d.GetCapability() != capability || d.GetNode() != node {
		t.Errorf("CapabilityMissing detail = %v, want plugin mp, method %s, capability %s, node %q", d, method, capability, node)
	}
	if !strings.Contains(status.Convert(err).Message(), capability) {
		t.Errorf("message %q does not name %s", status.Convert(err).Message(), capability)
	}
}

// TestMountGroupReachesThePlugin checks that a usage's mount group is in
// the MountVolume capability of NodeStageVolume and NodePublishVolume, in
// the mount's record, and in a usage key of its own.
func TestMountGroupReachesThePlugin(t *testing.T) {
	e := newMockNodeEnv(t, plugin.CapStageUnstageVolume, plugin.CapVolumeMountGroup)
	var got requests
	e.expectMount(&got)
	ctx := context.Background()
	req := &csisupdv1.MountVolumeRequest{PluginId: "mp", VolumeId: "v1", WorkloadId: "w1",
		Usage: &csisupdv1.VolumeUsage{VolumeMountGroup: "1000"}}
	mnt, err := e.m.Mount(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	msgs := got.all()
	if len(msgs) != 2 {
		t.Fatalf("the plugin got %d calls, want stage and publish", len(msgs))
	}
	for _, msg := range msgs {
		var vc *csi.VolumeCapability
		switch r := msg.(type) {
		case *csi.NodeStageVolumeRequest:
			vc = r.GetVolumeCapability()
		case *csi.NodePublishVolumeRequest:
			vc = r.GetVolumeCapability()
		}
		if g := vc.GetMount().GetVolumeMountGroup(); g != "1000" {
			t.Errorf("%T volume_mount_group = %q, want 1000", msg, g)
		}
	}
	if g := mnt.GetUsage().GetVolumeMountGroup(); g != "1000" {
		t.Errorf("mount usage volume_mount_group = %q, want 1000", g)
	}
	if mnt.GetUsageKey() == defaultKey || !strings.HasPrefix(mnt.GetUsageKey(), defaultKey+"-") {
		t.Errorf("usage key = %q, want %s with a hash of the options", mnt.GetUsageKey(), defaultKey)
	}
	(&env{dataDir: e.dataDir}).readRecordOK(t, "mp", "v1", "w1", mnt.GetUsageKey(), func(r *record) {
		if r.Usage.MountGroup != "1000" {
			t.Errorf("record usage mount group = %q, want 1000", r.Usage.MountGroup)
		}
	})

	// Another group is another usage: a staging of its own.
	other, err := e.m.Mount(ctx, &csisupdv1.MountVolumeRequest{PluginId: "mp", VolumeId: "v1", WorkloadId: "w2",
		Usage: &csisupdv1.VolumeUsage{VolumeMountGroup: "2000"}})
	if err != nil {
		t.Fatal(err)
	}
	if other.GetUsageKey() == mnt.GetUsageKey() || other.GetStagingPath() == mnt.GetStagingPath() {
		t.Errorf("groups 1000 and 2000 share usage key %q and staging %q", other.GetUsageKey(), other.GetStagingPath())
	}
}

// readRecordOK reads a record that must exist and hands it to check.
func (e *env) readRecordOK(t *testing.T, pluginID, volume, workload, usageKey string, check func(*record)) {
	t.Helper()
	r, ok := e.readRecord(t, pluginID, volume, workload, usageKey)
	if !ok {
		t.Fatalf("no record of %s/%s for %s (%s)", pluginID, volume, workload, usageKey)
	}
	check(r)
}

// TestMountGroupRefusedWithoutCapability checks the agent's own refusal of
// a mount group: typed, naming plugin, node and capability, before the
// plugin is called or anything is recorded.
func TestMountGroupRefusedWithoutCapability(t *testing.T) {
	e := newMockNodeEnv(t, plugin.CapStageUnstageVolume)
	_, err := e.m.Mount(context.Background(), &csisupdv1.MountVolumeRequest{PluginId: "mp", VolumeId: "v1", WorkloadId: "w1",
		Usage: &csisupdv1.VolumeUsage{VolumeMountGroup: "1000"}})
	wantCapabilityMissing(t, err, methodMount, plugin.CapVolumeMountGroup, "node-a")
	if got := e.m.List("", ""); len(got) != 0 {
		t.Errorf("mounts after the refusal: %v, want none", got)
	}
	_, err = e.m.Mount(context.Background(), &csisupdv1.MountVolumeRequest{PluginId: "mp", VolumeId: "v1", WorkloadId: "w1",
		Usage: &csisupdv1.VolumeUsage{AccessType: AccessTypeBlock, VolumeMountGroup: "1000"}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "volume_mount_group") {
		t.Errorf("block usage with a group: error = %v, want InvalidArgument naming volume_mount_group", err)
	}
}

// TestVolumeHealth checks NodeGetVolumeHealth on a mount: the plugin gets
// the mount's external id and paths, the caller the plugin's answer.
func TestVolumeHealth(t *testing.T) {
	e := newMockNodeEnv(t, plugin.CapStageUnstageVolume, plugin.CapGetVolumeHealth)
	var got requests
	e.expectMount(&got)
	ctx := context.Background()
	mnt, err := e.m.Mount(ctx, &csisupdv1.MountVolumeRequest{PluginId: "mp", VolumeId: "v1", ExternalId: "ext-1", WorkloadId: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	answer := &csi.NodeGetVolumeHealthResponse{VolumeHealth: &csi.VolumeHealth{VolumeId: "ext-1",
		HealthStatuses: []*csi.VolumeHealth_VolumeHealthEntry{{Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: "PathDown"}}}}
	var asked *csi.NodeGetVolumeHealthRequest
	e.node.EXPECT().NodeGetVolumeHealth(gomock.Any(), gomock.Any()).DoAndReturn(
		func(_ context.Context, r *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
			asked = proto.Clone(r).(*csi.NodeGetVolumeHealthRequest)
			return answer, nil
		}).Times(1)
	resp, err := NewService(e.m).VolumeHealth(ctx, &csisupdv1.VolumeHealthRequest{PluginId: "mp", VolumeId: "v1"})
	if err != nil {
		t.Fatal(err)
	}
	want := &csi.NodeGetVolumeHealthRequest{VolumeId: "ext-1", VolumePublishPath: mnt.GetHostPath(), StagingTargetPath: mnt.GetStagingPath()}
	if !proto.Equal(asked, want) {
		t.Errorf("the plugin was asked %v, want %v", asked, want)
	}
	if !proto.Equal(resp.GetResponse(), answer) || resp.GetVolumePath() != mnt.GetHostPath() {
		t.Errorf("response = %v, want the plugin's %v at %s", resp, answer, mnt.GetHostPath())
	}

	tests := []struct {
		name string
		req  *csisupdv1.VolumeHealthRequest
		code codes.Code
		want string
	}{
		{"not mounted", &csisupdv1.VolumeHealthRequest{PluginId: "mp", VolumeId: "v2"}, codes.NotFound, `volume "v2" of plugin "mp" is not mounted`},
		{"other workload", &csisupdv1.VolumeHealthRequest{PluginId: "mp", VolumeId: "v1", WorkloadId: "w9"}, codes.NotFound, `for workload "w9"`},
		{"bad volume id", &csisupdv1.VolumeHealthRequest{PluginId: "mp", VolumeId: "../x"}, codes.InvalidArgument, "volume_id"},
		{"unknown plugin", &csisupdv1.VolumeHealthRequest{PluginId: "nope", VolumeId: "v1"}, codes.NotFound, `"nope"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.m.VolumeHealth(ctx, tt.req)
			if status.Code(err) != tt.code || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v, want %s holding %q", err, tt.code, tt.want)
			}
		})
	}
}

// TestVolumeHealthNeedsCapability checks the typed refusal of a plugin
// without the node GET_VOLUME_HEALTH capability; the plugin is not asked.
func TestVolumeHealthNeedsCapability(t *testing.T) {
	e := newMockNodeEnv(t, plugin.CapStageUnstageVolume)
	var got requests
	e.expectMount(&got)
	if _, err := e.m.Mount(context.Background(), &csisupdv1.MountVolumeRequest{PluginId: "mp", VolumeId: "v1", WorkloadId: "w1"}); err != nil {
		t.Fatal(err)
	}
	_, err := e.m.VolumeHealth(context.Background(), &csisupdv1.VolumeHealthRequest{PluginId: "mp", VolumeId: "v1"})
	wantCapabilityMissing(t, err, methodVolumeHealth, plugin.CapGetVolumeHealth, "")
}

// TestStorageHealth checks NodeGetStorageHealth: the secrets reach the
// plugin, its answer the caller, a secret it repeats in an error neither
// the caller nor the log; the capability and the request are checked first.
func TestStorageHealth(t *testing.T) {
	const secret = "storage-Secret-7781"
	answer := &csi.NodeGetStorageHealthResponse{BackendHealth: []*csi.NodeGetStorageHealthResponse_StorageBackendHealth{
		{Status: csi.StorageHealthErrorType_STORAGE_DEGRADED, Reason: "HighLatency", Message: "p99 over 1s"},
	}}
	e := newMockNodeEnv(t, plugin.CapGetStorageHealth)
	var calls atomic.Int64
	e.node.EXPECT().NodeGetStorageHealth(gomock.Any(), gomock.Any()).DoAndReturn(
		func(_ context.Context, r *csi.NodeGetStorageHealthRequest) (*csi.NodeGetStorageHealthResponse, error) {
			n := calls.Add(1)
			if r.GetSecrets()["token"] != secret {
				t.Errorf("the plugin got secrets %v, want the caller's", csiclient.Redact(r))
			}
			if n == 1 {
				return answer, nil
			}
			return nil, status.Errorf(codes.PermissionDenied, "token %s rejected", r.GetSecrets()["token"])
		}).Times(2)
	svc := NewService(e.m)
	ctx := context.Background()
	req := &csisupdv1.StorageHealthRequest{PluginId: "mp", Secrets: map[string]string{"token": secret}}
	resp, err := svc.StorageHealth(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(resp.GetResponse(), answer) {
		t.Errorf("response = %v, want the plugin's %v", resp.GetResponse(), answer)
	}
	_, err = svc.StorageHealth(ctx, req)
	if status.Code(err) != codes.PermissionDenied || strings.Contains(err.Error(), secret) || !strings.Contains(err.Error(), csiclient.Redacted) {
		t.Errorf("error = %v, want the plugin's PermissionDenied with the secret redacted", err)
	}
	if strings.Contains(e.logs.String(), secret) {
		t.Errorf("the log carries the secret:\n%s", e.logs.String())
	}

	tooMany := map[string]string{}
	for i := range 600 {
		tooMany[fmt.Sprintf("k%d", i)] = "v"
	}
	tests := []struct {
		name string
		req  *csisupdv1.StorageHealthRequest
		code codes.Code
		want string
	}{
		{"no plugin id", &csisupdv1.StorageHealthRequest{}, codes.InvalidArgument, "plugin_id is required"},
		{"unknown plugin", &csisupdv1.StorageHealthRequest{PluginId: "nope"}, codes.NotFound, `"nope"`},
		{"too many secrets", &csisupdv1.StorageHealthRequest{PluginId: "mp", Secrets: tooMany}, codes.InvalidArgument, "secrets has"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := svc.StorageHealth(ctx, tt.req)
			if status.Code(err) != tt.code || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v, want %s holding %q", err, tt.code, tt.want)
			}
		})
	}
}

// TestStorageHealthNeedsCapability checks the typed refusal of a plugin
// without GET_STORAGE_HEALTH; the plugin is not asked.
func TestStorageHealthNeedsCapability(t *testing.T) {
	e := newMockNodeEnv(t, plugin.CapGetVolumeHealth)
	_, err := e.m.StorageHealth(context.Background(), &csisupdv1.StorageHealthRequest{PluginId: "mp"})
	wantCapabilityMissing(t, err, methodStorageHealth, plugin.CapGetStorageHealth, "")
}
