package rpc

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"go.uber.org/mock/gomock"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/testplugin"
)

// csi113Call is one of the ClientCSI methods added for CSI 1.13: how to
// expect its CSI call at the mock, and how to make it through ClientCSI.
type csi113Call struct {
	method string
	// request is the CSI request sent; it carries secrets.
	request proto.Message
	// response is what the mock plugin answers.
	response proto.Message
	// expect makes the mock answer the CSI call with f.
	expect func(env *mockEnv, f func(ctx context.Context, req proto.Message) (proto.Message, error)) *gomock.Call
	// call makes the ClientCSI call and returns the CSI response it got.
	call func(ctx context.Context, c csisupdv1.ClientCSIClient, req proto.Message) (proto.Message, error)
}

// csi113Calls returns the new methods with requests carrying secret.
func csi113Calls(secret string) []csi113Call {
	secrets := map[string]string{"token": secret}
	return []csi113Call{
		{
			method:   "ControllerGetSnapshot",
			request:  &csi.GetSnapshotRequest{SnapshotId: "snap-1", Secrets: secrets},
			response: &csi.GetSnapshotResponse{Snapshot: &csi.Snapshot{SnapshotId: "snap-1", SourceVolumeId: "vol-1", SizeBytes: 42, ReadyToUse: true}},
			expect: func(env *mockEnv, f func(context.Context, proto.Message) (proto.Message, error)) *gomock.Call {
				return env.mock.EXPECT().GetSnapshot(gomock.Any(), gomock.Any()).DoAndReturn(
					func(ctx context.Context, r *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
						resp, err := f(ctx, r)
						out, _ := resp.(*csi.GetSnapshotResponse)
						return out, err
					})
			},
			call: func(ctx context.Context, c csisupdv1.ClientCSIClient, req proto.Message) (proto.Message, error) {
				resp, err := c.ControllerGetSnapshot(ctx, &csisupdv1.ControllerGetSnapshotRequest{PluginId: "mock", Request: req.(*csi.GetSnapshotRequest)})
				return resp.GetResponse(), err
			},
		},
		{
			method: "ControllerModifyVolume",
			request: &csi.ControllerModifyVolumeRequest{VolumeId: "vol-1", Secrets: secrets,
				MutableParameters: map[string]string{"iops": "3000"}},
			response: &csi.ControllerModifyVolumeResponse{},
			expect: func(env *mockEnv, f func(context.Context, proto.Message) (proto.Message, error)) *gomock.Call {
				return env.mock.EXPECT().ControllerModifyVolume(gomock.Any(), gomock.Any()).DoAndReturn(
					func(ctx context.Context, r *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
						resp, err := f(ctx, r)
						out, _ := resp.(*csi.ControllerModifyVolumeResponse)
						return out, err
					})
			},
			call: func(ctx context.Context, c csisupdv1.ClientCSIClient, req proto.Message) (proto.Message, error) {
				resp, err := c.ControllerModifyVolume(ctx, &csisupdv1.ControllerModifyVolumeRequest{PluginId: "mock", Request: req.(*csi.ControllerModifyVolumeRequest)})
				return resp.GetResponse(), err
			},
		},
		{
			method:  "ControllerGetVolumeHealth",
			request: &csi.ControllerGetVolumeHealthRequest{VolumeId: "vol-1", Secrets: secrets},
			response: &csi.ControllerGetVolumeHealthResponse{VolumeHealth: &csi.VolumeHealth{VolumeId: "vol-1",
				HealthStatuses: []*csi.VolumeHealth_VolumeHealthEntry{{Status: csi.VolumeHealthErrorType_DEGRADED, Reason: "PathDown", Message: "1 of 2 paths down"}}}},
			expect: func(env *mockEnv, f func(context.Context, proto.Message) (proto.Message, error)) *gomock.Call {
				return env.mock.EXPECT().ControllerGetVolumeHealth(gomock.Any(), gomock.Any()).DoAndReturn(
					func(ctx context.Context, r *csi.ControllerGetVolumeHealthRequest) (*csi.ControllerGetVolumeHealthResponse, error) {
						resp, err := f(ctx, r)
						out, _ := resp.(*csi.ControllerGetVolumeHealthResponse)
						return out, err
					})
			},
			call: func(ctx context.Context, c csisupdv1.ClientCSIClient, req proto.Message) (proto.Message, error) {
				resp, err := c.ControllerGetVolumeHealth(ctx, &csisupdv1.ControllerGetVolumeHealthRequest{PluginId: "mock", Request: req.(*csi.ControllerGetVolumeHealthRequest)})
				return resp.GetResponse(), err
			},
		},
		{
			method:  "ControllerListVolumeHealth",
			request: &csi.ControllerListVolumeHealthRequest{MaxEntries: 2, StartingToken: "t1", Secrets: secrets},
			response: &csi.ControllerListVolumeHealthResponse{NextToken: "t2", Entries: []*csi.VolumeHealth{
				{VolumeId: "vol-1", HealthStatuses: []*csi.VolumeHealth_VolumeHealthEntry{{Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: "BackendDown"}}},
				{VolumeId: "vol-2", HealthStatuses: []*csi.VolumeHealth_VolumeHealthEntry{{Status: csi.VolumeHealthErrorType_DATA_LOSS, Reason: "Corrupt"}}},
			}},
			expect: func(env *mockEnv, f func(context.Context, proto.Message) (proto.Message, error)) *gomock.Call {
				return env.mock.EXPECT().ControllerListVolumeHealth(gomock.Any(), gomock.Any()).DoAndReturn(
					func(ctx context.Context, r *csi.ControllerListVolumeHealthRequest) (*csi.ControllerListVolumeHealthResponse, error) {
						resp, err := f(ctx, r)
						out, _ := resp.(*csi.ControllerListVolumeHealthResponse)
						return out, err
					})
			},
			call: func(ctx context.Context, c csisupdv1.ClientCSIClient, req proto.Message) (proto.Message, error) {
				resp, err := c.ControllerListVolumeHealth(ctx, &csisupdv1.ControllerListVolumeHealthRequest{PluginId: "mock", Request: req.(*csi.ControllerListVolumeHealthRequest)})
				return resp.GetResponse(), err
			},
		},
	}
}

// TestClientCSI113PassThrough checks that the CSI 1.13 methods give the
// plugin the caller's request, secrets and mutable parameters included, and
// the caller the plugin's response, both unchanged.
func TestClientCSI113PassThrough(t *testing.T) {
	for _, tc := range csi113Calls("pass-through-secret") {
		t.Run(tc.method, func(t *testing.T) {
			env := newMockEnv(t, controllerFingerprint(allControllerCaps...), heartbeat.Healthy, ClientCSIConfig{})
			tc.expect(env, func(_ context.Context, got proto.Message) (proto.Message, error) {
				if !proto.Equal(got, tc.request) {
					t.Errorf("the plugin got %v, want %v", got, tc.request)
				}
				return tc.response, nil
			}).Times(1)
			got, err := tc.call(context.Background(), env.client, tc.request)
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, tc.response) {
				t.Errorf("response = %v, want the plugin's %v", got, tc.response)
			}
		})
	}
}

// TestClientCSI113SecretsRedacted has the plugin repeat the request's
// secret in its error: neither the caller's error nor the agent's log
// (at trace level, which logs requests) may carry it.
func TestClientCSI113SecretsRedacted(t *testing.T) {
	const secret = "s3cr3t-csi113-Value"
	for _, tc := range csi113Calls(secret) {
		t.Run(tc.method, func(t *testing.T) {
			env := newMockEnv(t, controllerFingerprint(allControllerCaps...), heartbeat.Healthy, ClientCSIConfig{})
			tc.expect(env, func(_ context.Context, req proto.Message) (proto.Message, error) {
				return nil, status.Errorf(codes.PermissionDenied, "rejected credentials %v", csiclient.SecretValues(req))
			}).Times(1)
			_, err := tc.call(context.Background(), env.client, tc.request)
			st := status.Convert(err)
			if st.Code() != codes.PermissionDenied {
				t.Fatalf("error = %v, want the plugin's PermissionDenied", err)
			}
			if want := "rejected credentials [" + csiclient.Redacted + "]"; st.Message() != want {
				t.Errorf("message = %q, want %q", st.Message(), want)
			}
			out := env.logs.String()
			if !strings.Contains(out, tc.method) || !strings.Contains(out, csiclient.Redacted) {
				t.Errorf("the log does not show the redacted %s request:\n%s", tc.method, out)
			}
			if strings.Contains(out, secret) {
				t.Errorf("the log carries the secret:\n%s", out)
			}
		})
	}
}

// TestClientCSIModifyIsDestructive checks that ControllerModifyVolume
// takes the plugin's destructive slot (one by default) while the health
// reads do not wait for it.
func TestClientCSIModifyIsDestructive(t *testing.T) {
	env := newMockEnv(t, controllerFingerprint(allControllerCaps...), heartbeat.Healthy, ClientCSIConfig{MaxDestructiveInFlight: 1})
	calls := csi113Calls("x")
	byName := map[string]csi113Call{}
	for _, c := range calls {
		byName[c.method] = c
	}
	modify := byName["ControllerModifyVolume"]
	entered := make(chan struct{})
	// The first modify holds the slot until its caller gives up; a second
	// one must never reach the plugin.
	modify.expect(env, func(ctx context.Context, _ proto.Message) (proto.Message, error) {
		close(entered)
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}).Times(1)
	for _, name := range []string{"ControllerGetVolumeHealth", "ControllerListVolumeHealth", "ControllerGetSnapshot"} {
		c := byName[name]
		c.expect(env, func(context.Context, proto.Message) (proto.Message, error) { return c.response, nil }).Times(1)
	}

	holdCtx, release := context.WithCancel(context.Background())
	held := make(chan error, 1)
	go func() {
		_, err := modify.call(holdCtx, env.client, modify.request)
		held <- err
	}()
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the first ControllerModifyVolume never reached the plugin")
	}

	for _, name := range []string{"ControllerGetVolumeHealth", "ControllerListVolumeHealth", "ControllerGetSnapshot"} {
		c := byName[name]
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		if _, err := c.call(ctx, env.client, c.request); err != nil {
			t.Errorf("%s while a modify holds the destructive slot: %v", name, err)
		}
		cancel()
	}

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := modify.call(ctx, env.client, modify.request)
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("queued ControllerModifyVolume: error = %v, want DeadlineExceeded", err)
	}
	release()
	if err := <-held; status.Code(err) != codes.Canceled {
		t.Errorf("held ControllerModifyVolume: error = %v, want Canceled", err)
	}
}

// TestClientCSIGetSnapshotTestPlugin gets a snapshot through ClientCSI from
// the real test plugin, which serves GetSnapshot behind GET_SNAPSHOT, and
// checks that a plugin without the capability is refused before it is
// called.
func TestClientCSIGetSnapshotTestPlugin(t *testing.T) {
	for _, advertise := range []bool{true, false} {
		t.Run(fmt.Sprintf("GET_SNAPSHOT=%t", advertise), func(t *testing.T) {
			caps := []csi.ControllerServiceCapability_RPC_Type{
				csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
				csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
			}
			if advertise {
				caps = append(caps, csi.ControllerServiceCapability_RPC_GET_SNAPSHOT)
			}
			env := newManagedEnv(t, "p1", testplugin.Config{NodeID: "node-1", ControllerCapabilities: caps}, ClientCSIConfig{}, nil)
			vol := createVolume(t, env.client, "p1", "snap-source")
			ctx := context.Background()
			snap, err := env.client.ControllerCreateSnapshot(ctx, &csisupdv1.ControllerCreateSnapshotRequest{PluginId: "p1",
				Request: &csi.CreateSnapshotRequest{SourceVolumeId: vol, Name: "snap-1"}})
			if err != nil {
				t.Fatal(err)
			}
			id := snap.GetResponse().GetSnapshot().GetSnapshotId()
			env.plugin.ResetStats()
			got, err := env.client.ControllerGetSnapshot(ctx, &csisupdv1.ControllerGetSnapshotRequest{PluginId: "p1",
				Request: &csi.GetSnapshotRequest{SnapshotId: id}})
			if !advertise {
				d, ok := csisupdv1.ErrorDetail[*csisupdv1.CapabilityMissing](err)
				if status.Code(err) != codes.FailedPrecondition || !ok || d.GetCapability() != "GET_SNAPSHOT" {
					t.Errorf("error = %v, want FailedPrecondition with CapabilityMissing GET_SNAPSHOT", err)
				}
				if n := env.plugin.Stats().Calls["GetSnapshot"]; n != 0 {
					t.Errorf("the plugin saw %d GetSnapshot calls, want 0", n)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got.GetResponse().GetSnapshot(), snap.GetResponse().GetSnapshot()) {
				t.Errorf("GetSnapshot = %v, want the created %v", got.GetResponse().GetSnapshot(), snap.GetResponse().GetSnapshot())
			}
			_, err = env.client.ControllerGetSnapshot(ctx, &csisupdv1.ControllerGetSnapshotRequest{PluginId: "p1",
				Request: &csi.GetSnapshotRequest{SnapshotId: "no-such-snapshot"}})
			if status.Code(err) != codes.NotFound || csisupdv1.IsIgnorable(err) || csisupdv1.IsPluginNotFound(err) {
				t.Errorf("missing snapshot: error = %v, want the plugin's NotFound, neither ignorable nor PluginNotFound", err)
			}
		})
	}
}
