package rpc

import (
	"context"
	"strings"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"go.uber.org/mock/gomock"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// TestClientCSISecretsNotLogged sends secrets in every kind of request that
// has them, through a real agent logging at trace level, and checks that no
// secret value appears in its log while the requests themselves do.
func TestClientCSISecretsNotLogged(t *testing.T) {
	const secret = "s3cr3t-Value-0042"
	secrets := map[string]string{"password": secret}
	logs := &testutil.SyncBuffer{}
	logger := hclog.New(&hclog.LoggerOptions{Name: "agent", Level: hclog.Trace, Output: logs})
	env := newManagedEnv(t, "p1",
		testplugin.Config{NodeID: "node-1", Logger: logger.Named("plugin")},
		ClientCSIConfig{Logger: logger}, logger)
	c := env.client
	ctx := context.Background()

	created, err := c.ControllerCreateVolume(ctx, &csisupdv1.ControllerCreateVolumeRequest{PluginId: "p1", Request: &csi.CreateVolumeRequest{
		Name: "secret-test-vol", VolumeCapabilities: []*csi.VolumeCapability{mountCap}, Secrets: secrets,
	}})
	if err != nil {
		t.Fatal(err)
	}
	vol := created.GetResponse().GetVolume().GetVolumeId()
	calls := []struct {
		name string
		call func() error
	}{
		{"validate", func() error {
			_, err := c.ControllerValidateVolume(ctx, &csisupdv1.ControllerValidateVolumeRequest{PluginId: "p1", Request: &csi.ValidateVolumeCapabilitiesRequest{
				VolumeId: vol, VolumeCapabilities: []*csi.VolumeCapability{mountCap}, Secrets: secrets}})
			return err
		}},
		{"attach", func() error {
			_, err := c.ControllerAttachVolume(ctx, &csisupdv1.ControllerAttachVolumeRequest{PluginId: "p1", Request: &csi.ControllerPublishVolumeRequest{
				VolumeId: vol, NodeId: "node-1", VolumeCapability: mountCap, Secrets: secrets}})
			return err
		}},
		{"expand", func() error {
			_, err := c.ControllerExpandVolume(ctx, &csisupdv1.ControllerExpandVolumeRequest{PluginId: "p1", Request: &csi.ControllerExpandVolumeRequest{
				VolumeId: vol, CapacityRange: &csi.CapacityRange{RequiredBytes: 2 << 30}, Secrets: secrets}})
			return err
		}},
		{"snapshot", func() error {
			snap, err := c.ControllerCreateSnapshot(ctx, &csisupdv1.ControllerCreateSnapshotRequest{PluginId: "p1", Request: &csi.CreateSnapshotRequest{
				SourceVolumeId: vol, Name: "secret-test-snap", Secrets: secrets}})
			if err != nil {
				return err
			}
			if _, err := c.ControllerListSnapshots(ctx, &csisupdv1.ControllerListSnapshotsRequest{PluginId: "p1", Request: &csi.ListSnapshotsRequest{Secrets: secrets}}); err != nil {
				return err
			}
			_, err = c.ControllerDeleteSnapshot(ctx, &csisupdv1.ControllerDeleteSnapshotRequest{PluginId: "p1", Request: &csi.DeleteSnapshotRequest{
				SnapshotId: snap.GetResponse().GetSnapshot().GetSnapshotId(), Secrets: secrets}})
			return err
		}},
		{"detach", func() error {
			_, err := c.ControllerDetachVolume(ctx, &csisupdv1.ControllerDetachVolumeRequest{PluginId: "p1", Request: &csi.ControllerUnpublishVolumeRequest{
				VolumeId: vol, NodeId: "node-1", Secrets: secrets}})
			return err
		}},
		{"invalid create", func() error {
			// Fails at the plugin (no capabilities): the error path logs too.
			_, err := c.ControllerCreateVolume(ctx, &csisupdv1.ControllerCreateVolumeRequest{PluginId: "p1", Request: &csi.CreateVolumeRequest{
				Name: "secret-test-invalid", Secrets: secrets}})
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("invalid create: error = %v, want InvalidArgument", err)
			}
			return nil
		}},
		{"unknown plugin", func() error {
			_, err := c.ControllerDeleteVolume(ctx, &csisupdv1.ControllerDeleteVolumeRequest{PluginId: "nope", Request: &csi.DeleteVolumeRequest{
				VolumeId: vol, Secrets: secrets}})
			if !csisupdv1.IsPluginNotFound(err) {
				t.Errorf("unknown plugin: error = %v, want PluginNotFound", err)
			} else if strings.Contains(err.Error(), secret) {
				t.Errorf("unknown plugin: error %q carries the secret", err)
			}
			return nil
		}},
		{"delete", func() error {
			_, err := c.ControllerDeleteVolume(ctx, &csisupdv1.ControllerDeleteVolumeRequest{PluginId: "p1", Request: &csi.DeleteVolumeRequest{
				VolumeId: vol, Secrets: secrets}})
			return err
		}},
	}
	for _, cl := range calls {
		if err := cl.call(); err != nil {
			t.Errorf("%s: %v", cl.name, err)
		}
	}

	out := logs.String()
	// The log must show the requests, or the test proves nothing.
	for _, want := range []string{"secret-test-vol", "secret-test-snap", "ControllerAttachVolume", csiclient.Redacted} {
		if !strings.Contains(out, want) {
			t.Errorf("the agent's log does not contain %q; it logged:\n%s", want, out)
		}
	}
	if strings.Contains(out, secret) {
		for _, line := range strings.Split(out, "\n") {
			if strings.Contains(line, secret) {
				t.Errorf("secret logged: %s", line)
			}
		}
	}
}

// TestClientCSISecretsNotEchoed checks that a plugin repeating a secret in
// its error message gets it neither into the caller's error nor the log.
func TestClientCSISecretsNotEchoed(t *testing.T) {
	const secret = "hunter2-but-longer"
	env := newMockEnv(t, controllerFingerprint(allControllerCaps...), heartbeat.Healthy, ClientCSIConfig{})
	env.mock.EXPECT().ControllerPublishVolume(gomock.Any(), gomock.Any()).
		DoAndReturn(func(_ context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
			return nil, status.Errorf(codes.PermissionDenied, "credentials %v rejected for %s", req.GetSecrets(), req.GetVolumeId())
		}).Times(1)
	env.mock.EXPECT().CreateVolume(gomock.Any(), gomock.Any()).
		DoAndReturn(func(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
			return nil, status.Errorf(codes.Unavailable, "backend said: bad token %s", req.GetSecrets()["token"])
		}).Times(csiclient.MaxAttempts)

	_, err := env.client.ControllerAttachVolume(context.Background(), &csisupdv1.ControllerAttachVolumeRequest{PluginId: "mock",
		Request: &csi.ControllerPublishVolumeRequest{VolumeId: "vol-9", NodeId: "n", Secrets: map[string]string{"token": secret}}})
	st := status.Convert(err)
	if st.Code() != codes.PermissionDenied {
		t.Fatalf("error = %v, want the plugin's PermissionDenied", err)
	}
	if want := "credentials map[token:" + csiclient.Redacted + "] rejected for vol-9"; st.Message() != want {
		t.Errorf("message = %q, want %q", st.Message(), want)
	}

	_, err = env.client.ControllerCreateVolume(context.Background(), &csisupdv1.ControllerCreateVolumeRequest{PluginId: "mock",
		Request: &csi.CreateVolumeRequest{Name: "v", Secrets: map[string]string{"token": secret}}})
	if status.Code(err) != codes.Unavailable || strings.Contains(err.Error(), secret) {
		t.Errorf("error = %v, want Unavailable without the secret", err)
	}

	out := env.logs.String()
	if !strings.Contains(out, "rejected for vol-9") || !strings.Contains(out, "backend said") {
		t.Errorf("the log does not show the plugin's errors:\n%s", out)
	}
	if strings.Contains(out, secret) {
		t.Errorf("the log carries the secret:\n%s", out)
	}
}
