package rpc

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"google.golang.org/grpc"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil/sanitytest"
)

// controllerAdapter is a CSI Controller service that makes every call
// through ClientCSI, so csi-sanity can test the mediated path.
type controllerAdapter struct {
	csi.UnimplementedControllerServer
	c      csisupdv1.ClientCSIClient
	plugin string
}

func (a *controllerAdapter) CreateVolume(ctx context.Context, r *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	resp, err := a.c.ControllerCreateVolume(ctx, &csisupdv1.ControllerCreateVolumeRequest{PluginId: a.plugin, Request: r})
	return resp.GetResponse(), err
}

func (a *controllerAdapter) DeleteVolume(ctx context.Context, r *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	resp, err := a.c.ControllerDeleteVolume(ctx, &csisupdv1.ControllerDeleteVolumeRequest{PluginId: a.plugin, Request: r})
	return resp.GetResponse(), err
}

func (a *controllerAdapter) ControllerPublishVolume(ctx context.Context, r *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	resp, err := a.c.ControllerAttachVolume(ctx, &csisupdv1.ControllerAttachVolumeRequest{PluginId: a.plugin, Request: r})
	return resp.GetResponse(), err
}

func (a *controllerAdapter) ControllerUnpublishVolume(ctx context.Context, r *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	resp, err := a.c.ControllerDetachVolume(ctx, &csisupdv1.ControllerDetachVolumeRequest{PluginId: a.plugin, Request: r})
	return resp.GetResponse(), err
}

func (a *controllerAdapter) ValidateVolumeCapabilities(ctx context.Context, r *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	resp, err := a.c.ControllerValidateVolume(ctx, &csisupdv1.ControllerValidateVolumeRequest{PluginId: a.plugin, Request: r})
	return resp.GetResponse(), err
}

func (a *controllerAdapter) ListVolumes(ctx context.Context, r *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	resp, err := a.c.ControllerListVolumes(ctx, &csisupdv1.ControllerListVolumesRequest{PluginId: a.plugin, Request: r})
	return resp.GetResponse(), err
}

func (a *controllerAdapter) GetCapacity(ctx context.Context, r *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	resp, err := a.c.ControllerGetCapacity(ctx, &csisupdv1.ControllerGetCapacityRequest{PluginId: a.plugin, Request: r})
	return resp.GetResponse(), err
}

func (a *controllerAdapter) ControllerGetCapabilities(ctx context.Context, r *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	resp, err := a.c.ControllerGetCapabilities(ctx, &csisupdv1.ControllerGetCapabilitiesRequest{PluginId: a.plugin, Request: r})
	return resp.GetResponse(), err
}

func (a *controllerAdapter) CreateSnapshot(ctx context.Context, r *csi.CreateSnapshotRequest) (*csi.CreateSnapshotResponse, error) {
	resp, err := a.c.ControllerCreateSnapshot(ctx, &csisupdv1.ControllerCreateSnapshotRequest{PluginId: a.plugin, Request: r})
	return resp.GetResponse(), err
}

func (a *controllerAdapter) DeleteSnapshot(ctx context.Context, r *csi.DeleteSnapshotRequest) (*csi.DeleteSnapshotResponse, error) {
	resp, err := a.c.ControllerDeleteSnapshot(ctx, &csisupdv1.ControllerDeleteSnapshotRequest{PluginId: a.plugin, Request: r})
	return resp.GetResponse(), err
}

func (a *controllerAdapter) ListSnapshots(ctx context.Context, r *csi.ListSnapshotsRequest) (*csi.ListSnapshotsResponse, error) {
	resp, err := a.c.ControllerListSnapshots(ctx, &csisupdv1.ControllerListSnapshotsRequest{PluginId: a.plugin, Request: r})
	return resp.GetResponse(), err
}

func (a *controllerAdapter) ControllerExpandVolume(ctx context.Context, r *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	resp, err := a.c.ControllerExpandVolume(ctx, &csisupdv1.ControllerExpandVolumeRequest{PluginId: a.plugin, Request: r})
	return resp.GetResponse(), err
}

func (a *controllerAdapter) ControllerGetVolume(ctx context.Context, r *csi.ControllerGetVolumeRequest) (*csi.ControllerGetVolumeResponse, error) {
	resp, err := a.c.ControllerGetVolume(ctx, &csisupdv1.ControllerGetVolumeRequest{PluginId: a.plugin, Request: r})
	return resp.GetResponse(), err
}

func (a *controllerAdapter) GetSnapshot(ctx context.Context, r *csi.GetSnapshotRequest) (*csi.GetSnapshotResponse, error) {
	resp, err := a.c.ControllerGetSnapshot(ctx, &csisupdv1.ControllerGetSnapshotRequest{PluginId: a.plugin, Request: r})
	return resp.GetResponse(), err
}

func (a *controllerAdapter) ControllerModifyVolume(ctx context.Context, r *csi.ControllerModifyVolumeRequest) (*csi.ControllerModifyVolumeResponse, error) {
	resp, err := a.c.ControllerModifyVolume(ctx, &csisupdv1.ControllerModifyVolumeRequest{PluginId: a.plugin, Request: r})
	return resp.GetResponse(), err
}

func (a *controllerAdapter) ControllerGetVolumeHealth(ctx context.Context, r *csi.ControllerGetVolumeHealthRequest) (*csi.ControllerGetVolumeHealthResponse, error) {
	resp, err := a.c.ControllerGetVolumeHealth(ctx, &csisupdv1.ControllerGetVolumeHealthRequest{PluginId: a.plugin, Request: r})
	return resp.GetResponse(), err
}

func (a *controllerAdapter) ControllerListVolumeHealth(ctx context.Context, r *csi.ControllerListVolumeHealthRequest) (*csi.ControllerListVolumeHealthResponse, error) {
	resp, err := a.c.ControllerListVolumeHealth(ctx, &csisupdv1.ControllerListVolumeHealthRequest{PluginId: a.plugin, Request: r})
	return resp.GetResponse(), err
}

// serveAdapter serves the adapter for plugin on a unix socket in dir and
// returns the socket. mediated counts the controller calls it receives.
func serveAdapter(t *testing.T, dir string, c csisupdv1.ClientCSIClient, plugin, pluginSocket string, mediated *atomic.Int64) string {
	t.Helper()
	count := grpc.ChainUnaryInterceptor(
		func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if strings.HasPrefix(info.FullMethod, "/csi.v1.Controller/") {
				mediated.Add(1)
			}
			return h(ctx, req)
		})
	return sanitytest.ServeAdapter(t, dir, pluginSocket, []grpc.ServerOption{count}, func(srv *grpc.Server, _ *grpc.ClientConn) {
		csi.RegisterControllerServer(srv, &controllerAdapter{c: c, plugin: plugin})
	})
}

// TestClientCSISanity runs csi-sanity twice in one Ginkgo suite (Ginkgo runs
// one suite per process): against testplugin directly, and with every
// controller call going through ClientCSI on an agent that supervises the
// same plugin. The specs that pass must be the same. Ginkgo refuses
// go test -count > 1; repeat the other tests with -short.
func TestClientCSISanity(t *testing.T) {
	if testing.Short() {
		t.Skip("csi-sanity takes a while; skipped with -short")
	}
	pcfg := testplugin.Config{
		NodeID:     "sanity-node",
		MaxVolumes: 4,
		Topology:   map[string]string{"topology.testplugin/zone": "z1"},
		// Every capability the plugin can advertise: ClientCSI mediates
		// every controller RPC of CSI 1.13, so each spec the plugin makes
		// run directly must pass through ClientCSI too.
		ControllerCapabilities: slices.Clone(testplugin.SupportedControllerCapabilities),
	}
	env := newManagedEnv(t, "sanity", pcfg, ClientCSIConfig{}, nil)
	var mediatedCalls atomic.Int64
	adapter := serveAdapter(t, env.dir, env.client, "sanity", env.plugin.Socket(), &mediatedCalls)

	newConfig := func(name, controller string) *sanity.TestConfig {
		cfg := sanity.NewTestConfig()
		cfg.Address = env.plugin.Socket()
		cfg.ControllerAddress = controller
		cfg.TargetPath = filepath.Join(env.dir, name+"-target")
		cfg.StagingPath = filepath.Join(env.dir, name+"-staging")
		cfg.TestNodeVolumeAttachLimit = true
		cfg.IdempotentCount = 2
		// The modify specs send these; the test plugin accepts its
		// default mutable parameter keys.
		cfg.TestVolumeMutableParameters = map[string]string{"iops": "3000", "tier": "fast"}
		return &cfg
	}
	const direct, mediated = "direct", "through ClientCSI"
	outcome := sanitytest.Run("csi-sanity: direct and through ClientCSI",
		sanitytest.Target{Name: direct, Config: newConfig("d", "")},
		sanitytest.Target{Name: mediated, Config: newConfig("m", "unix://"+adapter)})
	passed := outcome.Passed
	pd, pm := passed(direct), passed(mediated)
	t.Logf("csi-sanity: %d specs pass directly, %d through ClientCSI (of %d); %d controller calls mediated",
		len(pd), len(pm), len(outcome[direct]), mediatedCalls.Load())
	if n := mediatedCalls.Load(); n < 100 {
		t.Errorf("only %d controller calls went through ClientCSI", n)
	}
	if len(pd) < 50 {
		t.Errorf("only %d csi-sanity specs pass against the plugin directly; the comparison proves little", len(pd))
	}
	for _, text := range pd {
		if outcome[mediated][text] != sanitytest.Passed {
			t.Errorf("passes directly but not through ClientCSI: %s\n  %s", text, outcome[mediated][text])
		}
	}
	for _, text := range pm {
		if outcome[direct][text] != sanitytest.Passed {
			t.Errorf("passes through ClientCSI but not directly: %s\n  %s", text, outcome[direct][text])
		}
	}
	for text, o := range outcome[direct] {
		if o != sanitytest.Passed && o != sanitytest.Skipped {
			t.Logf("fails directly too (a testplugin matter): %s\n  %s", text, o)
		}
	}
}
