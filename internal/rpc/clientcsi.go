package rpc

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/retry"
)

// ClientCSIConfig configures ClientCSI.
type ClientCSIConfig struct {
	// Plugins finds plugins by id. Required.
	Plugins csiclient.PluginLookup
	// NodeName names this node in PluginNotFound errors. Optional.
	NodeName string
	// RPCTimeout is the deadline of calls that arrive without one
	// (client.rpc_timeout). Required.
	RPCTimeout time.Duration
	// MethodTimeouts overrides RPCTimeout per ClientCSI method name, for
	// example "ControllerCreateVolume". Optional.
	MethodTimeouts map[string]time.Duration
	// MaxDestructiveInFlight is how many destructive calls may run at one
	// plugin at the same time (client.max_destructive_in_flight). Required.
	MaxDestructiveInFlight int
	// Retry spaces the attempts of one request (csiclient.MaxAttempts at
	// most), each request with a backoff of its own (jittered, so requests
	// that failed together do not retry together). Required: the agent's
	// ClientCSI retry policy; tests make it short.
	Retry retry.Policy
	// Logger receives one debug line per call, and at trace level the
	// request with its secrets redacted. Optional.
	Logger hclog.Logger
	// Secrets adds the node's secrets of a plugin (its secrets file) to
	// every call made to it. Optional.
	Secrets csiclient.SecretSource
}

// method describes one ClientCSI method.
type method struct {
	name string
	// csi is the plugin's method the ClientCSI method calls.
	csi string
	// capability is the controller capability the method needs, besides
	// the plugin's CONTROLLER_SERVICE; empty when none.
	capability string
	// destructive calls change storage and are serialised per plugin.
	destructive bool
	// notFoundIgnorable marks a NotFound from the plugin as Ignorable: the
	// volume or snapshot is already gone, or the volume is not attached.
	notFoundIgnorable bool
}

// ClientCSI implements csisupd.v1.ClientCSI: it calls the controller service
// of plugins on this node for a control plane. Create it with NewClientCSI
// and add it to a gRPC server with Register.
type ClientCSI struct {
	csisupdv1.UnimplementedClientCSIServer

	calls          *csiclient.Invoker
	timeout        time.Duration
	methodTimeouts map[string]time.Duration
	maxDestructive int

	mu    sync.Mutex
	slots map[string]chan struct{} // plugin id -> destructive call slots
}

// NewClientCSI validates cfg and returns the service.
func NewClientCSI(cfg ClientCSIConfig) (*ClientCSI, error) {
	var errs []error
	if cfg.Plugins == nil {
		errs = append(errs, errors.New("rpc: ClientCSIConfig.Plugins is required"))
	}
	if cfg.RPCTimeout <= 0 {
		errs = append(errs, fmt.Errorf("rpc: ClientCSIConfig.RPCTimeout (client.rpc_timeout) must be positive, got %s", cfg.RPCTimeout))
	}
	if cfg.MaxDestructiveInFlight <= 0 {
		errs = append(errs, fmt.Errorf("rpc: ClientCSIConfig.MaxDestructiveInFlight (client.max_destructive_in_flight) must be positive, got %d", cfg.MaxDestructiveInFlight))
	}
	if err := cfg.Retry.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("rpc: ClientCSIConfig.Retry: %w", err))
	}
	names := methodNames()
	for _, name := range slices.Sorted(maps.Keys(cfg.MethodTimeouts)) {
		d := cfg.MethodTimeouts[name]
		switch {
		case !slices.Contains(names, name):
			errs = append(errs, fmt.Errorf("rpc: ClientCSIConfig.MethodTimeouts: %q is not a ClientCSI method", name))
		case d <= 0:
			errs = append(errs, fmt.Errorf("rpc: ClientCSIConfig.MethodTimeouts[%q] must be positive, got %s", name, d))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	calls, err := csiclient.NewInvoker(csiclient.InvokerConfig{Plugins: cfg.Plugins, NodeName: cfg.NodeName, Retry: cfg.Retry, Logger: cfg.Logger.Named("clientcsi"),
		Secrets: cfg.Secrets})
	if err != nil {
		return nil, fmt.Errorf("rpc: ClientCSI: %w", err)
	}
	return &ClientCSI{
		calls:          calls,
		timeout:        cfg.RPCTimeout,
		methodTimeouts: maps.Clone(cfg.MethodTimeouts),
		maxDestructive: cfg.MaxDestructiveInFlight,
		slots:          make(map[string]chan struct{}),
	}, nil
}

// Register adds the service to a gRPC server.
func (s *ClientCSI) Register(r grpc.ServiceRegistrar) { csisupdv1.RegisterClientCSIServer(r, s) }

// ControllerGetCapabilities calls the plugin's ControllerGetCapabilities.
func (s *ClientCSI) ControllerGetCapabilities(ctx context.Context, in *csisupdv1.ControllerGetCapabilitiesRequest) (*csisupdv1.ControllerGetCapabilitiesResponse, error) {
	m := method{name: "ControllerGetCapabilities", csi: "ControllerGetCapabilities"}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.ControllerGetCapabilities)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerGetCapabilitiesResponse{Response: resp}, nil
}

// ControllerValidateVolume calls the plugin's ValidateVolumeCapabilities.
func (s *ClientCSI) ControllerValidateVolume(ctx context.Context, in *csisupdv1.ControllerValidateVolumeRequest) (*csisupdv1.ControllerValidateVolumeResponse, error) {
	m := method{name: "ControllerValidateVolume", csi: "ValidateVolumeCapabilities"}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.ValidateVolumeCapabilities)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerValidateVolumeResponse{Response: resp}, nil
}

// ControllerAttachVolume calls the plugin's ControllerPublishVolume.
func (s *ClientCSI) ControllerAttachVolume(ctx context.Context, in *csisupdv1.ControllerAttachVolumeRequest) (*csisupdv1.ControllerAttachVolumeResponse, error) {
	m := method{name: "ControllerAttachVolume", csi: "ControllerPublishVolume", capability: plugin.CapPublishUnpublishVolume, destructive: true}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.ControllerPublishVolume)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerAttachVolumeResponse{Response: resp}, nil
}

// ControllerDetachVolume calls the plugin's ControllerUnpublishVolume.
func (s *ClientCSI) ControllerDetachVolume(ctx context.Context, in *csisupdv1.ControllerDetachVolumeRequest) (*csisupdv1.ControllerDetachVolumeResponse, error) {
	m := method{name: "ControllerDetachVolume", csi: "ControllerUnpublishVolume", capability: plugin.CapPublishUnpublishVolume, destructive: true, notFoundIgnorable: true}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.ControllerUnpublishVolume)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerDetachVolumeResponse{Response: resp}, nil
}

// ControllerCreateVolume calls the plugin's CreateVolume.
func (s *ClientCSI) ControllerCreateVolume(ctx context.Context, in *csisupdv1.ControllerCreateVolumeRequest) (*csisupdv1.ControllerCreateVolumeResponse, error) {
	m := method{name: "ControllerCreateVolume", csi: "CreateVolume", capability: plugin.CapCreateDeleteVolume, destructive: true}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.CreateVolume)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerCreateVolumeResponse{Response: resp}, nil
}

// ControllerDeleteVolume calls the plugin's DeleteVolume.
func (s *ClientCSI) ControllerDeleteVolume(ctx context.Context, in *csisupdv1.ControllerDeleteVolumeRequest) (*csisupdv1.ControllerDeleteVolumeResponse, error) {
	m := method{name: "ControllerDeleteVolume", csi: "DeleteVolume", capability: plugin.CapCreateDeleteVolume, destructive: true, notFoundIgnorable: true}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.DeleteVolume)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerDeleteVolumeResponse{Response: resp}, nil
}

// ControllerListVolumes calls the plugin's ListVolumes.
func (s *ClientCSI) ControllerListVolumes(ctx context.Context, in *csisupdv1.ControllerListVolumesRequest) (*csisupdv1.ControllerListVolumesResponse, error) {
	m := method{name: "ControllerListVolumes", csi: "ListVolumes", capability: plugin.CapListVolumes}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.ListVolumes)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerListVolumesResponse{Response: resp}, nil
}

// ControllerGetVolume calls the plugin's ControllerGetVolume.
func (s *ClientCSI) ControllerGetVolume(ctx context.Context, in *csisupdv1.ControllerGetVolumeRequest) (*csisupdv1.ControllerGetVolumeResponse, error) {
	m := method{name: "ControllerGetVolume", csi: "ControllerGetVolume", capability: plugin.CapGetVolume}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.ControllerGetVolume)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerGetVolumeResponse{Response: resp}, nil
}

// ControllerExpandVolume calls the plugin's ControllerExpandVolume.
func (s *ClientCSI) ControllerExpandVolume(ctx context.Context, in *csisupdv1.ControllerExpandVolumeRequest) (*csisupdv1.ControllerExpandVolumeResponse, error) {
	m := method{name: "ControllerExpandVolume", csi: "ControllerExpandVolume", capability: plugin.CapExpandVolume, destructive: true}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.ControllerExpandVolume)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerExpandVolumeResponse{Response: resp}, nil
}

// ControllerGetCapacity calls the plugin's GetCapacity.
func (s *ClientCSI) ControllerGetCapacity(ctx context.Context, in *csisupdv1.ControllerGetCapacityRequest) (*csisupdv1.ControllerGetCapacityResponse, error) {
	m := method{name: "ControllerGetCapacity", csi: "GetCapacity", capability: plugin.CapGetCapacity}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.GetCapacity)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerGetCapacityResponse{Response: resp}, nil
}

// ControllerCreateSnapshot calls the plugin's CreateSnapshot.
func (s *ClientCSI) ControllerCreateSnapshot(ctx context.Context, in *csisupdv1.ControllerCreateSnapshotRequest) (*csisupdv1.ControllerCreateSnapshotResponse, error) {
	m := method{name: "ControllerCreateSnapshot", csi: "CreateSnapshot", capability: plugin.CapCreateDeleteSnapshot, destructive: true}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.CreateSnapshot)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerCreateSnapshotResponse{Response: resp}, nil
}

// ControllerDeleteSnapshot calls the plugin's DeleteSnapshot.
func (s *ClientCSI) ControllerDeleteSnapshot(ctx context.Context, in *csisupdv1.ControllerDeleteSnapshotRequest) (*csisupdv1.ControllerDeleteSnapshotResponse, error) {
	m := method{name: "ControllerDeleteSnapshot", csi: "DeleteSnapshot", capability: plugin.CapCreateDeleteSnapshot, destructive: true, notFoundIgnorable: true}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.DeleteSnapshot)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerDeleteSnapshotResponse{Response: resp}, nil
}

// ControllerListSnapshots calls the plugin's ListSnapshots.
func (s *ClientCSI) ControllerListSnapshots(ctx context.Context, in *csisupdv1.ControllerListSnapshotsRequest) (*csisupdv1.ControllerListSnapshotsResponse, error) {
	m := method{name: "ControllerListSnapshots", csi: "ListSnapshots", capability: plugin.CapListSnapshots}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.ListSnapshots)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerListSnapshotsResponse{Response: resp}, nil
}

// ControllerGetSnapshot calls the plugin's GetSnapshot.
func (s *ClientCSI) ControllerGetSnapshot(ctx context.Context, in *csisupdv1.ControllerGetSnapshotRequest) (*csisupdv1.ControllerGetSnapshotResponse, error) {
	m := method{name: "ControllerGetSnapshot", csi: "GetSnapshot", capability: plugin.CapGetSnapshot}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.GetSnapshot)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerGetSnapshotResponse{Response: resp}, nil
}

// ControllerModifyVolume calls the plugin's ControllerModifyVolume. It
// changes the volume's storage, so it is destructive like an expansion.
func (s *ClientCSI) ControllerModifyVolume(ctx context.Context, in *csisupdv1.ControllerModifyVolumeRequest) (*csisupdv1.ControllerModifyVolumeResponse, error) {
	m := method{name: "ControllerModifyVolume", csi: "ControllerModifyVolume", capability: plugin.CapModifyVolume, destructive: true}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.ControllerModifyVolume)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerModifyVolumeResponse{Response: resp}, nil
}

// ControllerGetVolumeHealth calls the plugin's ControllerGetVolumeHealth.
func (s *ClientCSI) ControllerGetVolumeHealth(ctx context.Context, in *csisupdv1.ControllerGetVolumeHealthRequest) (*csisupdv1.ControllerGetVolumeHealthResponse, error) {
	m := method{name: "ControllerGetVolumeHealth", csi: "ControllerGetVolumeHealth", capability: plugin.CapGetVolumeHealth}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.ControllerGetVolumeHealth)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerGetVolumeHealthResponse{Response: resp}, nil
}

// ControllerListVolumeHealth calls the plugin's ControllerListVolumeHealth.
func (s *ClientCSI) ControllerListVolumeHealth(ctx context.Context, in *csisupdv1.ControllerListVolumeHealthRequest) (*csisupdv1.ControllerListVolumeHealthResponse, error) {
	m := method{name: "ControllerListVolumeHealth", csi: "ControllerListVolumeHealth", capability: plugin.CapListVolumeHealth}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.ControllerListVolumeHealth)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerListVolumeHealthResponse{Response: resp}, nil
}

// invoke runs one ClientCSI request through the node's one plugin call
// path (csiclient.Invoke): the plugin must have the controller service and
// m's capability, a call without a deadline gets m's, and each attempt of
// a destructive m holds one of the plugin's destructive slots. Plugin
// errors are returned as the plugin made them, except that secret values
// of req are removed from their message and a NotFound of an idempotent
// removal is marked Ignorable.
func invoke[Req proto.Message, Resp any](
	ctx context.Context, s *ClientCSI, m method, pluginID string, req Req,
	rpc func(csi.ControllerClient, context.Context, Req, ...grpc.CallOption) (Resp, error),
) (Resp, error) {
	c := csiclient.Call{PluginID: pluginID, Method: m.name, CSIMethod: m.csi, Capability: m.capability, Timeout: s.timeoutOf(m)}
	if m.destructive {
		c.Slot = func(ctx context.Context) (func(), error) { return s.acquire(ctx, pluginID) }
	}
	resp, err := csiclient.Invoke(ctx, s.calls, csiclient.ControllerService, c, req, func(ctx context.Context, cl *csiclient.Client) (Resp, error) {
		return rpc(cl.Controller, ctx, req)
	})
	if m.notFoundIgnorable && status.Code(err) == codes.NotFound {
		err = csisupdv1.MarkIgnorable(err, "already gone")
	}
	return resp, err
}

// acquire takes one of the plugin's destructive slots, waiting until one is
// free or ctx ends. The returned function gives the slot back.
func (s *ClientCSI) acquire(ctx context.Context, pluginID string) (func(), error) {
	s.mu.Lock()
	slots, ok := s.slots[pluginID]
	if !ok {
		slots = make(chan struct{}, s.maxDestructive)
		s.slots[pluginID] = slots
	}
	s.mu.Unlock()
	select {
	case slots <- struct{}{}:
		return func() { <-slots }, nil
	case <-ctx.Done():
		return nil, csiclient.ContextError(ctx)
	}
}

func (s *ClientCSI) timeoutOf(m method) time.Duration {
	if d, ok := s.methodTimeouts[m.name]; ok {
		return d
	}
	return s.timeout
}

// methodNames returns the names of the ClientCSI methods.
func methodNames() []string {
	var names []string
	for _, m := range csisupdv1.ClientCSI_ServiceDesc.Methods {
		names = append(names, m.MethodName)
	}
	return names
}
