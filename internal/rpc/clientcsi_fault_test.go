package rpc

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-test/v5/driver"
	"go.uber.org/mock/gomock"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/fingerprint"
	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/retry"
)

// clientCSICall calls one ClientCSI method with an empty CSI request.
type clientCSICall struct {
	method     string
	capability string // controller capability the method needs
	call       func(context.Context, csisupdv1.ClientCSIClient, string) error
}

// everyMethod lists every ClientCSI method.
var everyMethod = []clientCSICall{
	{"ControllerGetCapabilities", "", func(ctx context.Context, c csisupdv1.ClientCSIClient, id string) error {
		_, err := c.ControllerGetCapabilities(ctx, &csisupdv1.ControllerGetCapabilitiesRequest{PluginId: id, Request: &csi.ControllerGetCapabilitiesRequest{}})
		return err
	}},
	{"ControllerValidateVolume", "", func(ctx context.Context, c csisupdv1.ClientCSIClient, id string) error {
		_, err := c.ControllerValidateVolume(ctx, &csisupdv1.ControllerValidateVolumeRequest{PluginId: id, Request: &csi.ValidateVolumeCapabilitiesRequest{}})
		return err
	}},
	{"ControllerAttachVolume", "PUBLISH_UNPUBLISH_VOLUME", func(ctx context.Context, c csisupdv1.ClientCSIClient, id string) error {
		_, err := c.ControllerAttachVolume(ctx, &csisupdv1.ControllerAttachVolumeRequest{PluginId: id, Request: &csi.ControllerPublishVolumeRequest{}})
		return err
	}},
	{"ControllerDetachVolume", "PUBLISH_UNPUBLISH_VOLUME", func(ctx context.Context, c csisupdv1.ClientCSIClient, id string) error {
		_, err := c.ControllerDetachVolume(ctx, &csisupdv1.ControllerDetachVolumeRequest{PluginId: id, Request: &csi.ControllerUnpublishVolumeRequest{}})
		return err
	}},
	{"ControllerCreateVolume", "CREATE_DELETE_VOLUME", func(ctx context.Context, c csisupdv1.ClientCSIClient, id string) error {
		_, err := c.ControllerCreateVolume(ctx, &csisupdv1.ControllerCreateVolumeRequest{PluginId: id, Request: &csi.CreateVolumeRequest{}})
		return err
	}},
	{"ControllerDeleteVolume", "CREATE_DELETE_VOLUME", func(ctx context.Context, c csisupdv1.ClientCSIClient, id string) error {
		_, err := c.ControllerDeleteVolume(ctx, &csisupdv1.ControllerDeleteVolumeRequest{PluginId: id, Request: &csi.DeleteVolumeRequest{}})
		return err
	}},
	{"ControllerListVolumes", "LIST_VOLUMES", func(ctx context.Context, c csisupdv1.ClientCSIClient, id string) error {
		_, err := c.ControllerListVolumes(ctx, &csisupdv1.ControllerListVolumesRequest{PluginId: id, Request: &csi.ListVolumesRequest{}})
		return err
	}},
	{"ControllerGetVolume", "GET_VOLUME", func(ctx context.Context, c csisupdv1.ClientCSIClient, id string) error {
		_, err := c.ControllerGetVolume(ctx, &csisupdv1.ControllerGetVolumeRequest{PluginId: id, Request: &csi.ControllerGetVolumeRequest{}})
		return err
	}},
	{"ControllerExpandVolume", "EXPAND_VOLUME", func(ctx context.Context, c csisupdv1.ClientCSIClient, id string) error {
		_, err := c.ControllerExpandVolume(ctx, &csisupdv1.ControllerExpandVolumeRequest{PluginId: id, Request: &csi.ControllerExpandVolumeRequest{}})
		return err
	}},
	{"ControllerGetCapacity", "GET_CAPACITY", func(ctx context.Context, c csisupdv1.ClientCSIClient, id string) error {
		_, err := c.ControllerGetCapacity(ctx, &csisupdv1.ControllerGetCapacityRequest{PluginId: id, Request: &csi.GetCapacityRequest{}})
		return err
	}},
	{"ControllerCreateSnapshot", "CREATE_DELETE_SNAPSHOT", func(ctx context.Context, c csisupdv1.ClientCSIClient, id string) error {
		_, err := c.ControllerCreateSnapshot(ctx, &csisupdv1.ControllerCreateSnapshotRequest{PluginId: id, Request: &csi.CreateSnapshotRequest{}})
		return err
	}},
	{"ControllerDeleteSnapshot", "CREATE_DELETE_SNAPSHOT", func(ctx context.Context, c csisupdv1.ClientCSIClient, id string) error {
		_, err := c.ControllerDeleteSnapshot(ctx, &csisupdv1.ControllerDeleteSnapshotRequest{PluginId: id, Request: &csi.DeleteSnapshotRequest{}})
		return err
	}},
	{"ControllerListSnapshots", "LIST_SNAPSHOTS", func(ctx context.Context, c csisupdv1.ClientCSIClient, id string) error {
		_, err := c.ControllerListSnapshots(ctx, &csisupdv1.ControllerListSnapshotsRequest{PluginId: id, Request: &csi.ListSnapshotsRequest{}})
		return err
	}},
	{"ControllerGetSnapshot", "GET_SNAPSHOT", func(ctx context.Context, c csisupdv1.ClientCSIClient, id string) error {
		_, err := c.ControllerGetSnapshot(ctx, &csisupdv1.ControllerGetSnapshotRequest{PluginId: id, Request: &csi.GetSnapshotRequest{}})
		return err
	}},
	{"ControllerModifyVolume", "MODIFY_VOLUME", func(ctx context.Context, c csisupdv1.ClientCSIClient, id string) error {
		_, err := c.ControllerModifyVolume(ctx, &csisupdv1.ControllerModifyVolumeRequest{PluginId: id, Request: &csi.ControllerModifyVolumeRequest{}})
		return err
	}},
	{"ControllerGetVolumeHealth", "GET_VOLUME_HEALTH", func(ctx context.Context, c csisupdv1.ClientCSIClient, id string) error {
		_, err := c.ControllerGetVolumeHealth(ctx, &csisupdv1.ControllerGetVolumeHealthRequest{PluginId: id, Request: &csi.ControllerGetVolumeHealthRequest{}})
		return err
	}},
	{"ControllerListVolumeHealth", "LIST_VOLUME_HEALTH", func(ctx context.Context, c csisupdv1.ClientCSIClient, id string) error {
		_, err := c.ControllerListVolumeHealth(ctx, &csisupdv1.ControllerListVolumeHealthRequest{PluginId: id, Request: &csi.ControllerListVolumeHealthRequest{}})
		return err
	}},
}

func TestEveryMethodListed(t *testing.T) {
	var listed []string
	for _, m := range everyMethod {
		listed = append(listed, m.method)
	}
	for _, name := range methodNames() {
		found := false
		for _, l := range listed {
			found = found || l == name
		}
		if !found {
			t.Errorf("ClientCSI method %s is missing from everyMethod", name)
		}
	}
	if len(listed) != len(methodNames()) {
		t.Errorf("everyMethod lists %d methods, the service has %d", len(listed), len(methodNames()))
	}
}

// countCalls makes every controller method of mc count its calls in n and
// answer with err.
func countCalls(mc *driver.MockControllerServer, n *atomic.Int64, err error) {
	f := func(context.Context, any) { n.Add(1) }
	mc.EXPECT().ControllerGetCapabilities(gomock.Any(), gomock.Any()).Do(f).Return(nil, err).AnyTimes()
	mc.EXPECT().ValidateVolumeCapabilities(gomock.Any(), gomock.Any()).Do(f).Return(nil, err).AnyTimes()
	mc.EXPECT().ControllerPublishVolume(gomock.Any(), gomock.Any()).Do(f).Return(nil, err).AnyTimes()
	mc.EXPECT().ControllerUnpublishVolume(gomock.Any(), gomock.Any()).Do(f).Return(nil, err).AnyTimes()
	mc.EXPECT().CreateVolume(gomock.Any(), gomock.Any()).Do(f).Return(nil, err).AnyTimes()
	mc.EXPECT().DeleteVolume(gomock.Any(), gomock.Any()).Do(f).Return(nil, err).AnyTimes()
	mc.EXPECT().ListVolumes(gomock.Any(), gomock.Any()).Do(f).Return(nil, err).AnyTimes()
	mc.EXPECT().ControllerGetVolume(gomock.Any(), gomock.Any()).Do(f).Return(nil, err).AnyTimes()
	mc.EXPECT().ControllerExpandVolume(gomock.Any(), gomock.Any()).Do(f).Return(nil, err).AnyTimes()
	mc.EXPECT().GetCapacity(gomock.Any(), gomock.Any()).Do(f).Return(nil, err).AnyTimes()
	mc.EXPECT().CreateSnapshot(gomock.Any(), gomock.Any()).Do(f).Return(nil, err).AnyTimes()
	mc.EXPECT().DeleteSnapshot(gomock.Any(), gomock.Any()).Do(f).Return(nil, err).AnyTimes()
	mc.EXPECT().ListSnapshots(gomock.Any(), gomock.Any()).Do(f).Return(nil, err).AnyTimes()
	mc.EXPECT().GetSnapshot(gomock.Any(), gomock.Any()).Do(f).Return(nil, err).AnyTimes()
	mc.EXPECT().ControllerModifyVolume(gomock.Any(), gomock.Any()).Do(f).Return(nil, err).AnyTimes()
	mc.EXPECT().ControllerGetVolumeHealth(gomock.Any(), gomock.Any()).Do(f).Return(nil, err).AnyTimes()
	mc.EXPECT().ControllerListVolumeHealth(gomock.Any(), gomock.Any()).Do(f).Return(nil, err).AnyTimes()
}

func TestClientCSIPluginNotFound(t *testing.T) {
	env := newMockEnv(t, controllerFingerprint(allControllerCaps...), heartbeat.Healthy, ClientCSIConfig{NodeName: "node-a"})
	var calls atomic.Int64
	countCalls(env.mock, &calls, status.Error(codes.Internal, "must not be called"))

	for _, m := range everyMethod {
		t.Run(m.method, func(t *testing.T) {
			err := m.call(context.Background(), env.client, "no-such-plugin")
			if got := status.Code(err); got != codes.NotFound {
				t.Fatalf("code = %s, want NotFound (error %v)", got, err)
			}
			if !csisupdv1.IsPluginNotFound(err) || !csisupdv1.IsRetryable(err) {
				t.Errorf("IsPluginNotFound = %t, IsRetryable = %t, want both true (error %v)",
					csisupdv1.IsPluginNotFound(err), csisupdv1.IsRetryable(err), err)
			}
			d, ok := csisupdv1.ErrorDetail[*csisupdv1.PluginNotFound](err)
			if !ok || d.GetPluginId() != "no-such-plugin" || d.GetNode() != "node-a" {
				t.Errorf("PluginNotFound detail = %v, want plugin no-such-plugin on node node-a", d)
			}
		})
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("the plugin saw %d calls, want 0", n)
	}
}

func TestClientCSIEmptyPluginID(t *testing.T) {
	env := newMockEnv(t, controllerFingerprint(allControllerCaps...), heartbeat.Healthy, ClientCSIConfig{})
	err := everyMethod[0].call(context.Background(), env.client, "")
	if status.Code(err) != codes.InvalidArgument || csisupdv1.IsRetryable(err) {
		t.Errorf("error = %v, want InvalidArgument, not retryable", err)
	}
}

func TestClientCSIUnhealthyPlugin(t *testing.T) {
	for _, h := range []heartbeat.State{heartbeat.Unhealthy, heartbeat.Unknown} {
		t.Run(string(h), func(t *testing.T) {
			env := newMockEnv(t, controllerFingerprint(allControllerCaps...), h, ClientCSIConfig{})
			var calls atomic.Int64
			countCalls(env.mock, &calls, status.Error(codes.Internal, "must not be called"))
			for _, m := range everyMethod {
				err := m.call(context.Background(), env.client, "mock")
				if status.Code(err) != codes.Unavailable || !csisupdv1.IsRetryable(err) || csisupdv1.IsPluginNotFound(err) {
					t.Errorf("%s: error = %v, want Unavailable, retryable, not PluginNotFound", m.method, err)
				}
				d, ok := csisupdv1.ErrorDetail[*csisupdv1.PluginUnhealthy](err)
				if !ok || d.GetPluginId() != "mock" || d.GetHealthState() != string(h) {
					t.Errorf("%s: PluginUnhealthy detail = %v, want plugin mock in state %s", m.method, d, h)
				}
			}
			if n := calls.Load(); n != 0 {
				t.Errorf("the plugin saw %d calls, want 0", n)
			}
		})
	}
}

func TestClientCSIMissingCapability(t *testing.T) {
	nodeOnly := fingerprint.Fingerprint{VendorName: "node.csi.test", Type: plugin.TypeNode, NodeID: "n1"}
	tests := []struct {
		name string
		fp   fingerprint.Fingerprint
		// want is the capability each method reports missing, "" when the
		// call reaches the plugin.
		want func(m clientCSICall) string
	}{
		{
			name: "controller without controller capabilities",
			fp:   controllerFingerprint(),
			want: func(m clientCSICall) string { return m.capability },
		},
		{
			name: "node plugin",
			fp:   nodeOnly,
			want: func(clientCSICall) string { return "CONTROLLER_SERVICE" },
		},
		{
			name: "controller without PUBLISH_UNPUBLISH_VOLUME",
			fp: controllerFingerprint(
				csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
				csi.ControllerServiceCapability_RPC_LIST_VOLUMES),
			want: func(m clientCSICall) string {
				switch m.capability {
				case "CREATE_DELETE_VOLUME", "LIST_VOLUMES":
					return ""
				}
				return m.capability
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newMockEnv(t, tt.fp, heartbeat.Healthy, ClientCSIConfig{})
			var calls atomic.Int64
			answer := status.Error(codes.Aborted, "answered by the plugin")
			countCalls(env.mock, &calls, answer)
			wantCalls := int64(0)
			for _, m := range everyMethod {
				err := m.call(context.Background(), env.client, "mock")
				want := tt.want(m)
				if want == "" {
					wantCalls++
					if status.Code(err) != codes.Aborted {
						t.Errorf("%s: error = %v, want the plugin's Aborted", m.method, err)
					}
					continue
				}
				if status.Code(err) != codes.FailedPrecondition || csisupdv1.IsRetryable(err) {
					t.Errorf("%s: error = %v, want FailedPrecondition, not retryable", m.method, err)
				}
				d, ok := csisupdv1.ErrorDetail[*csisupdv1.CapabilityMissing](err)
				if !ok || d.GetCapability() != want || d.GetMethod() != m.method || d.GetPluginId() != "mock" {
					t.Errorf("%s: CapabilityMissing detail = %v, want capability %s", m.method, d, want)
				}
				if !strings.Contains(status.Convert(err).Message(), want) {
					t.Errorf("%s: message %q does not name %s", m.method, status.Convert(err).Message(), want)
				}
			}
			if n := calls.Load(); n != wantCalls {
				t.Errorf("the plugin saw %d calls, want %d", n, wantCalls)
			}
		})
	}
}

func TestClientCSIHangingPluginDeadline(t *testing.T) {
	env := newMockEnv(t, controllerFingerprint(allControllerCaps...), heartbeat.Healthy, ClientCSIConfig{})
	var calls atomic.Int64
	env.mock.EXPECT().ControllerPublishVolume(gomock.Any(), gomock.Any()).
		DoAndReturn(func(ctx context.Context, _ *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
			calls.Add(1)
			<-ctx.Done()
			return nil, status.FromContextError(ctx.Err()).Err()
		}).AnyTimes()

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := env.client.ControllerAttachVolume(ctx, &csisupdv1.ControllerAttachVolumeRequest{
		PluginId: "mock",
		Request:  &csi.ControllerPublishVolumeRequest{VolumeId: "v1", NodeId: "n1"},
	})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("error = %v, want DeadlineExceeded", err)
	}
	// The one attempt used the whole deadline: no time was left to retry.
	if n := calls.Load(); n != 1 {
		t.Errorf("the plugin saw %d calls, want 1", n)
	}
}

func TestClientCSIDefaultDeadline(t *testing.T) {
	tests := []struct {
		name    string
		cfg     ClientCSIConfig
		wantMax time.Duration
	}{
		{"rpc_timeout", ClientCSIConfig{RPCTimeout: 5 * time.Second}, 5 * time.Second},
		{"method timeout", ClientCSIConfig{RPCTimeout: time.Hour, MethodTimeouts: map[string]time.Duration{"ControllerValidateVolume": 7 * time.Second}}, 7 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newMockEnv(t, controllerFingerprint(allControllerCaps...), heartbeat.Healthy, tt.cfg)
			seen := make(chan time.Duration, 1)
			env.mock.EXPECT().ValidateVolumeCapabilities(gomock.Any(), gomock.Any()).
				DoAndReturn(func(ctx context.Context, _ *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
					dl, ok := ctx.Deadline()
					if !ok {
						seen <- -1
					} else {
						seen <- time.Until(dl)
					}
					return &csi.ValidateVolumeCapabilitiesResponse{}, nil
				})
			// No deadline on the caller's side.
			_, err := env.client.ControllerValidateVolume(context.Background(), &csisupdv1.ControllerValidateVolumeRequest{
				PluginId: "mock", Request: &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "v1"},
			})
			if err != nil {
				t.Fatal(err)
			}
			left := <-seen
			if left <= 0 || left > tt.wantMax {
				t.Errorf("the plugin saw %s left until its deadline, want a deadline of at most %s", left, tt.wantMax)
			}
		})
	}

	t.Run("hanging plugin", func(t *testing.T) {
		env := newMockEnv(t, controllerFingerprint(allControllerCaps...), heartbeat.Healthy, ClientCSIConfig{RPCTimeout: 200 * time.Millisecond})
		env.mock.EXPECT().ValidateVolumeCapabilities(gomock.Any(), gomock.Any()).
			DoAndReturn(func(ctx context.Context, _ *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
				<-ctx.Done()
				return nil, status.FromContextError(ctx.Err()).Err()
			})
		_, err := env.client.ControllerValidateVolume(context.Background(), &csisupdv1.ControllerValidateVolumeRequest{PluginId: "mock"})
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("error = %v, want DeadlineExceeded", err)
		}
	})
}

func TestClientCSIRetries(t *testing.T) {
	detailed, err := status.New(codes.InvalidArgument, "volume_id is malformed").WithDetails(
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "volume_id", Description: "bad"}}})
	if err != nil {
		t.Fatal(err)
	}
	ok := &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: "vol-1", CapacityBytes: 42, VolumeContext: map[string]string{"k": "v"}}}
	unavailable := status.Error(codes.Unavailable, "backend unreachable")
	tests := []struct {
		name      string
		answers   []error // the plugin's answer to each attempt; nil = ok
		wantErr   error   // nil = success
		wantCalls int64
	}{
		{"unavailable twice then success", []error{unavailable, unavailable, nil}, nil, 3},
		{"resource exhausted twice then success", []error{status.Error(codes.ResourceExhausted, "busy"), status.Error(codes.ResourceExhausted, "busy"), nil}, nil, 3},
		{"attempt deadline exceeded then success", []error{status.Error(codes.DeadlineExceeded, "backend timed out"), nil}, nil, 2},
		{"unavailable three times", []error{unavailable, unavailable, unavailable, nil}, unavailable, 3},
		{"invalid argument with details", []error{detailed.Err(), nil}, detailed.Err(), 1},
		{"internal", []error{status.Error(codes.Internal, "boom"), nil}, status.Error(codes.Internal, "boom"), 1},
		{"already exists", []error{status.Error(codes.AlreadyExists, "different size"), nil}, status.Error(codes.AlreadyExists, "different size"), 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newMockEnv(t, controllerFingerprint(allControllerCaps...), heartbeat.Healthy, ClientCSIConfig{})
			var calls atomic.Int64
			env.mock.EXPECT().CreateVolume(gomock.Any(), gomock.Any()).
				DoAndReturn(func(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
					n := calls.Add(1)
					if req.GetName() != "vol-1" {
						return nil, status.Errorf(codes.InvalidArgument, "request changed on the way: name %q", req.GetName())
					}
					if err := tt.answers[n-1]; err != nil {
						return nil, err
					}
					return ok, nil
				}).AnyTimes()

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			resp, err := env.client.ControllerCreateVolume(ctx, &csisupdv1.ControllerCreateVolumeRequest{
				PluginId: "mock", Request: &csi.CreateVolumeRequest{Name: "vol-1"},
			})
			if got := calls.Load(); got != tt.wantCalls {
				t.Errorf("the plugin saw %d attempts, want %d", got, tt.wantCalls)
			}
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("error = %v, want success", err)
				}
				if !proto.Equal(resp.GetResponse(), ok) {
					t.Errorf("response = %v, want the plugin's %v", resp.GetResponse(), ok)
				}
				return
			}
			got, want := status.Convert(err).Proto(), status.Convert(tt.wantErr).Proto()
			if !proto.Equal(got, want) {
				t.Errorf("status = %v, want the plugin's %v unchanged", got, want)
			}
			if csisupdv1.IsRetryable(err) || csisupdv1.IsPluginNotFound(err) || csisupdv1.IsIgnorable(err) {
				t.Errorf("a plugin error got a typed detail: %v", err)
			}
		})
	}
}

func TestClientCSIRetryNeedsDeadlineRoom(t *testing.T) {
	// The first retry would wait an hour; the caller's deadline is sooner,
	// so the plugin's Unavailable comes back after one attempt.
	env := newMockEnv(t, controllerFingerprint(allControllerCaps...), heartbeat.Healthy, ClientCSIConfig{Retry: retry.Policy{Base: time.Hour, Cap: time.Hour, Multiplier: 2, Jitter: 0.5}})
	var calls atomic.Int64
	env.mock.EXPECT().ListVolumes(gomock.Any(), gomock.Any()).
		DoAndReturn(func(context.Context, *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
			calls.Add(1)
			return nil, status.Error(codes.Unavailable, "try later")
		}).AnyTimes()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := env.client.ControllerListVolumes(ctx, &csisupdv1.ControllerListVolumesRequest{PluginId: "mock"})
	if status.Code(err) != codes.Unavailable || status.Convert(err).Message() != "try later" {
		t.Errorf("error = %v, want the plugin's Unavailable", err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the plugin saw %d attempts, want 1", n)
	}
}

func TestClientCSIIgnorable(t *testing.T) {
	notFound := status.Error(codes.NotFound, "no such volume")
	tests := []struct {
		method string
		want   bool
	}{
		{"ControllerDetachVolume", true},
		{"ControllerDeleteVolume", true},
		{"ControllerDeleteSnapshot", true},
		{"ControllerAttachVolume", false},
		{"ControllerValidateVolume", false},
		{"ControllerCreateSnapshot", false},
		{"ControllerGetSnapshot", false},
		{"ControllerModifyVolume", false},
		{"ControllerGetVolumeHealth", false},
	}
	env := newMockEnv(t, controllerFingerprint(allControllerCaps...), heartbeat.Healthy, ClientCSIConfig{})
	var calls atomic.Int64
	countCalls(env.mock, &calls, notFound)
	for _, tt := range tests {
		t.Run(tt.method, func(t *testing.T) {
			var call clientCSICall
			for _, m := range everyMethod {
				if m.method == tt.method {
					call = m
				}
			}
			err := call.call(context.Background(), env.client, "mock")
			st := status.Convert(err)
			if st.Code() != codes.NotFound || st.Message() != "no such volume" {
				t.Errorf("error = %v, want the plugin's NotFound", err)
			}
			if got := csisupdv1.IsIgnorable(err); got != tt.want {
				t.Errorf("IsIgnorable = %t, want %t", got, tt.want)
			}
			if csisupdv1.IsPluginNotFound(err) || csisupdv1.IsRetryable(err) {
				t.Errorf("the plugin's NotFound looks like a missing plugin: %v", err)
			}
		})
	}
}

func TestClientCSIPassThrough(t *testing.T) {
	env := newMockEnv(t, controllerFingerprint(allControllerCaps...), heartbeat.Healthy, ClientCSIConfig{})
	req := &csi.ControllerPublishVolumeRequest{
		VolumeId:         "vol-1",
		NodeId:           "node-1",
		Readonly:         true,
		VolumeCapability: &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY}},
		VolumeContext:    map[string]string{"a": "b"},
		Secrets:          map[string]string{"key": "value"},
	}
	resp := &csi.ControllerPublishVolumeResponse{PublishContext: map[string]string{"device": "/dev/x"}}
	env.mock.EXPECT().ControllerPublishVolume(gomock.Any(), gomock.Any()).
		DoAndReturn(func(_ context.Context, got *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
			if !proto.Equal(got, req) {
				return nil, status.Errorf(codes.InvalidArgument, "request changed on the way")
			}
			return resp, nil
		})
	env.mock.EXPECT().ControllerGetCapabilities(gomock.Any(), gomock.Any()).
		DoAndReturn(func(_ context.Context, got *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
			return &csi.ControllerGetCapabilitiesResponse{}, nil
		})

	got, err := env.client.ControllerAttachVolume(context.Background(), &csisupdv1.ControllerAttachVolumeRequest{PluginId: "mock", Request: req})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got.GetResponse(), resp) {
		t.Errorf("response = %v, want %v", got.GetResponse(), resp)
	}
	// A request without the CSI message reaches the plugin as an empty one.
	if _, err := env.client.ControllerGetCapabilities(context.Background(), &csisupdv1.ControllerGetCapabilitiesRequest{PluginId: "mock"}); err != nil {
		t.Errorf("ControllerGetCapabilities without request: %v", err)
	}
}

func TestNewClientCSIConfig(t *testing.T) {
	plugins := newFixedPlugins()
	tests := []struct {
		name    string
		cfg     ClientCSIConfig
		wantErr string // substring; "" = valid
	}{
		{"the configuration's defaults", ClientCSIConfig{Plugins: plugins, Retry: testRetry.ClientCSI,
			RPCTimeout: config.DefaultRPCTimeout, MaxDestructiveInFlight: config.DefaultMaxDestructiveInFlight}, ""},
		{"no plugins", ClientCSIConfig{}, "Plugins is required"},
		{"no timeout", ClientCSIConfig{Plugins: plugins}, "client.rpc_timeout) must be positive"},
		{"negative timeout", ClientCSIConfig{Plugins: plugins, RPCTimeout: -time.Second}, "client.rpc_timeout"},
		{"no in-flight limit", ClientCSIConfig{Plugins: plugins}, "client.max_destructive_in_flight) must be positive"},
		{"negative in flight", ClientCSIConfig{Plugins: plugins, MaxDestructiveInFlight: -1}, "client.max_destructive_in_flight"},
		{"no retry policy", ClientCSIConfig{Plugins: plugins}, "ClientCSIConfig.Retry: retry: Base must be positive"},
		{"negative retry delay", ClientCSIConfig{Plugins: plugins, Retry: retry.Policy{Base: -1, Cap: time.Second, Multiplier: 2}}, "ClientCSIConfig.Retry: retry: Base"},
		{"unknown method timeout", ClientCSIConfig{Plugins: plugins, MethodTimeouts: map[string]time.Duration{"CreateVolume": time.Second}}, `"CreateVolume" is not a ClientCSI method`},
		{"zero method timeout", ClientCSIConfig{Plugins: plugins, MethodTimeouts: map[string]time.Duration{"ControllerCreateVolume": 0}}, `MethodTimeouts["ControllerCreateVolume"] must be positive`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := NewClientCSI(tt.cfg)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if s.timeout != 2*time.Minute || s.maxDestructive != 1 || s.calls.Policy() != testRetry.ClientCSI {
					t.Errorf("defaults: timeout %s, max destructive %d, retry %v", s.timeout, s.maxDestructive, s.calls.Policy())
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestClientCSIRetryFindsPluginAgain(t *testing.T) {
	// The plugin fails with Unavailable and its supervisor marks it
	// unhealthy meanwhile: the retry is refused with the typed error
	// instead of calling the plugin again.
	env := newMockEnv(t, controllerFingerprint(allControllerCaps...), heartbeat.Healthy, ClientCSIConfig{})
	var calls atomic.Int64
	env.mock.EXPECT().ControllerGetVolume(gomock.Any(), gomock.Any()).
		DoAndReturn(func(context.Context, *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
			calls.Add(1)
			env.plugins.reg.SetHealth("mock", plugin.Instance{Path: env.socket},
				heartbeat.Result{State: heartbeat.Unhealthy, Description: "probe: connection refused"})
			return nil, status.Error(codes.Unavailable, "going down")
		}).AnyTimes()
	_, err := env.client.ControllerGetVolume(context.Background(), &csisupdv1.ControllerGetVolumeRequest{PluginId: "mock"})
	d, ok := csisupdv1.ErrorDetail[*csisupdv1.PluginUnhealthy](err)
	if status.Code(err) != codes.Unavailable || !ok || d.GetHealthDescription() != "probe: connection refused" {
		t.Errorf("error = %v, want Unavailable with PluginUnhealthy", err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the plugin saw %d attempts, want 1", n)
	}
}

func TestClientCSIRetriesOfRequestsThatFailedTogetherDoNotCoincide(t *testing.T) {
	// Each request has a backoff of its own, jittered: requests that met
	// the same unavailable plugin do not come back to it in the same
	// instant. The waits are read from the debug lines, not timed.
	env := newMockEnv(t, controllerFingerprint(allControllerCaps...), heartbeat.Healthy, ClientCSIConfig{})
	env.mock.EXPECT().ListVolumes(gomock.Any(), gomock.Any()).
		Return(nil, status.Error(codes.Unavailable, "restarting")).AnyTimes()
	const requests = 2
	for range requests {
		_, err := env.client.ControllerListVolumes(context.Background(), &csisupdv1.ControllerListVolumesRequest{PluginId: "mock"})
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("error = %v, want the plugin's Unavailable", err)
		}
	}
	var waits []time.Duration
	for _, line := range strings.Split(env.logs.String(), "\n") {
		if !strings.Contains(line, "attempt failed; retrying") {
			continue
		}
		_, after, ok := strings.Cut(line, "backoff=")
		if !ok {
			t.Fatalf("retry line without its backoff: %s", line)
		}
		d, err := time.ParseDuration(strings.Trim(strings.Fields(after)[0], `"`))
		if err != nil {
			t.Fatalf("backoff of %q: %v", line, err)
		}
		waits = append(waits, d)
	}
	// MaxAttempts attempts make MaxAttempts-1 waits per request.
	if len(waits) != requests*(csiclient.MaxAttempts-1) {
		t.Fatalf("logged waits %v, want %d", waits, requests*(csiclient.MaxAttempts-1))
	}
	for i, d := range waits {
		around := shortRetry.Base << (i % (csiclient.MaxAttempts - 1)) // 1 ms, then 2 ms
		lo := time.Duration(float64(around) * (1 - shortRetry.Jitter))
		hi := time.Duration(float64(around)*(1+shortRetry.Jitter)) + 1
		if d < lo || d > hi {
			t.Errorf("wait %d = %s, want one in [%s, %s]", i, d, lo, hi)
		}
	}
	if first, second := waits[:csiclient.MaxAttempts-1], waits[csiclient.MaxAttempts-1:]; first[0] == second[0] && first[1] == second[1] {
		t.Errorf("two requests waited %v and %v: in lockstep", first, second)
	}
}
