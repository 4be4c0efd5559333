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
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/retry"
)

// MaxAttempts is how many times ClientCSI calls a plugin for one request at
// most: the first attempt and up to two retries, spaced by
// ClientCSIConfig.Retry.
const MaxAttempts = 3

// controllerService is the plugin capability every ClientCSI method needs.
const controllerService = "CONTROLLER_SERVICE"

// PluginLookup finds a plugin on this node. The registry's Manager
// implements it.
type PluginLookup interface {
	// Lookup returns plugin id's read model and the supervisor's live
	// connection to the instance that read model describes; the
	// connection is nil while no such connection exists (the instance is
	// not fingerprinted yet, or not supervised). ok is false when no
	// plugin has the id.
	Lookup(id string) (p *csisupdv1.Plugin, conn *csiclient.Client, ok bool)
}

// ClientCSIConfig configures ClientCSI.
type ClientCSIConfig struct {
	// Plugins finds plugins by id. Required.
	Plugins PluginLookup
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
	// Retry spaces the attempts of one request, each request with a
	// backoff of its own (jittered, so requests that failed together do
	// not retry together). Required: config.DefaultRetry().ClientCSI; tests make it
	// short.
	Retry retry.Policy
	// Logger receives one debug line per call, and at trace level the
	// request with its secrets redacted. Optional.
	Logger hclog.Logger
}

// method describes one ClientCSI method.
type method struct {
	name string
	// capability is the controller capability the method needs, besides
	// the plugin's CONTROLLER_SERVICE; empty when none.
	capability string
	// destructive calls change storage and are serialised per plugin.
	destructive bool
	// notFoundIgnorable marks a NotFound from the plugin as Ignorable: the
	// volume or snapshot is already gone, or the volume is not attached.
	notFoundIgnorable bool
}

// Controller capabilities the ClientCSI methods need, as fingerprints name
// them (csi.v1.ControllerServiceCapability.RPC.Type names).
const (
	capPublishUnpublish = "PUBLISH_UNPUBLISH_VOLUME"
	capCreateDelete     = "CREATE_DELETE_VOLUME"
	capListVolumes      = "LIST_VOLUMES"
	capGetVolume        = "GET_VOLUME"
	capExpandVolume     = "EXPAND_VOLUME"
	capGetCapacity      = "GET_CAPACITY"
	capSnapshot         = "CREATE_DELETE_SNAPSHOT"
	capListSnapshots    = "LIST_SNAPSHOTS"
)

// ClientCSI implements csisupd.v1.ClientCSI: it calls the controller service
// of plugins on this node for a control plane. Create it with NewClientCSI
// and add it to a gRPC server with Register.
type ClientCSI struct {
	csisupdv1.UnimplementedClientCSIServer

	plugins        PluginLookup
	node           string
	timeout        time.Duration
	methodTimeouts map[string]time.Duration
	maxDestructive int
	retry          retry.Policy
	log            hclog.Logger

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
	return &ClientCSI{
		plugins:        cfg.Plugins,
		node:           cfg.NodeName,
		timeout:        cfg.RPCTimeout,
		methodTimeouts: maps.Clone(cfg.MethodTimeouts),
		maxDestructive: cfg.MaxDestructiveInFlight,
		retry:          cfg.Retry,
		log:            cfg.Logger.Named("clientcsi"),
		slots:          make(map[string]chan struct{}),
	}, nil
}

// Register adds the service to a gRPC server.
func (s *ClientCSI) Register(r grpc.ServiceRegistrar) { csisupdv1.RegisterClientCSIServer(r, s) }

// ControllerGetCapabilities calls the plugin's ControllerGetCapabilities.
func (s *ClientCSI) ControllerGetCapabilities(ctx context.Context, in *csisupdv1.ControllerGetCapabilitiesRequest) (*csisupdv1.ControllerGetCapabilitiesResponse, error) {
	m := method{name: "ControllerGetCapabilities"}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.ControllerGetCapabilities)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerGetCapabilitiesResponse{Response: resp}, nil
}

// ControllerValidateVolume calls the plugin's ValidateVolumeCapabilities.
func (s *ClientCSI) ControllerValidateVolume(ctx context.Context, in *csisupdv1.ControllerValidateVolumeRequest) (*csisupdv1.ControllerValidateVolumeResponse, error) {
	m := method{name: "ControllerValidateVolume"}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.ValidateVolumeCapabilities)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerValidateVolumeResponse{Response: resp}, nil
}

// ControllerAttachVolume calls the plugin's ControllerPublishVolume.
func (s *ClientCSI) ControllerAttachVolume(ctx context.Context, in *csisupdv1.ControllerAttachVolumeRequest) (*csisupdv1.ControllerAttachVolumeResponse, error) {
	m := method{name: "ControllerAttachVolume", capability: capPublishUnpublish, destructive: true}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.ControllerPublishVolume)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerAttachVolumeResponse{Response: resp}, nil
}

// ControllerDetachVolume calls the plugin's ControllerUnpublishVolume.
func (s *ClientCSI) ControllerDetachVolume(ctx context.Context, in *csisupdv1.ControllerDetachVolumeRequest) (*csisupdv1.ControllerDetachVolumeResponse, error) {
	m := method{name: "ControllerDetachVolume", capability: capPublishUnpublish, destructive: true, notFoundIgnorable: true}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.ControllerUnpublishVolume)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerDetachVolumeResponse{Response: resp}, nil
}

// ControllerCreateVolume calls the plugin's CreateVolume.
func (s *ClientCSI) ControllerCreateVolume(ctx context.Context, in *csisupdv1.ControllerCreateVolumeRequest) (*csisupdv1.ControllerCreateVolumeResponse, error) {
	m := method{name: "ControllerCreateVolume", capability: capCreateDelete, destructive: true}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.CreateVolume)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerCreateVolumeResponse{Response: resp}, nil
}

// ControllerDeleteVolume calls the plugin's DeleteVolume.
func (s *ClientCSI) ControllerDeleteVolume(ctx context.Context, in *csisupdv1.ControllerDeleteVolumeRequest) (*csisupdv1.ControllerDeleteVolumeResponse, error) {
	m := method{name: "ControllerDeleteVolume", capability: capCreateDelete, destructive: true, notFoundIgnorable: true}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.DeleteVolume)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerDeleteVolumeResponse{Response: resp}, nil
}

// ControllerListVolumes calls the plugin's ListVolumes.
func (s *ClientCSI) ControllerListVolumes(ctx context.Context, in *csisupdv1.ControllerListVolumesRequest) (*csisupdv1.ControllerListVolumesResponse, error) {
	m := method{name: "ControllerListVolumes", capability: capListVolumes}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.ListVolumes)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerListVolumesResponse{Response: resp}, nil
}

// ControllerGetVolume calls the plugin's ControllerGetVolume.
func (s *ClientCSI) ControllerGetVolume(ctx context.Context, in *csisupdv1.ControllerGetVolumeRequest) (*csisupdv1.ControllerGetVolumeResponse, error) {
	m := method{name: "ControllerGetVolume", capability: capGetVolume}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.ControllerGetVolume)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerGetVolumeResponse{Response: resp}, nil
}

// ControllerExpandVolume calls the plugin's ControllerExpandVolume.
func (s *ClientCSI) ControllerExpandVolume(ctx context.Context, in *csisupdv1.ControllerExpandVolumeRequest) (*csisupdv1.ControllerExpandVolumeResponse, error) {
	m := method{name: "ControllerExpandVolume", capability: capExpandVolume, destructive: true}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.ControllerExpandVolume)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerExpandVolumeResponse{Response: resp}, nil
}

// ControllerGetCapacity calls the plugin's GetCapacity.
func (s *ClientCSI) ControllerGetCapacity(ctx context.Context, in *csisupdv1.ControllerGetCapacityRequest) (*csisupdv1.ControllerGetCapacityResponse, error) {
	m := method{name: "ControllerGetCapacity", capability: capGetCapacity}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.GetCapacity)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerGetCapacityResponse{Response: resp}, nil
}

// ControllerCreateSnapshot calls the plugin's CreateSnapshot.
func (s *ClientCSI) ControllerCreateSnapshot(ctx context.Context, in *csisupdv1.ControllerCreateSnapshotRequest) (*csisupdv1.ControllerCreateSnapshotResponse, error) {
	m := method{name: "ControllerCreateSnapshot", capability: capSnapshot, destructive: true}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.CreateSnapshot)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerCreateSnapshotResponse{Response: resp}, nil
}

// ControllerDeleteSnapshot calls the plugin's DeleteSnapshot.
func (s *ClientCSI) ControllerDeleteSnapshot(ctx context.Context, in *csisupdv1.ControllerDeleteSnapshotRequest) (*csisupdv1.ControllerDeleteSnapshotResponse, error) {
	m := method{name: "ControllerDeleteSnapshot", capability: capSnapshot, destructive: true, notFoundIgnorable: true}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.DeleteSnapshot)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerDeleteSnapshotResponse{Response: resp}, nil
}

// ControllerListSnapshots calls the plugin's ListSnapshots.
func (s *ClientCSI) ControllerListSnapshots(ctx context.Context, in *csisupdv1.ControllerListSnapshotsRequest) (*csisupdv1.ControllerListSnapshotsResponse, error) {
	m := method{name: "ControllerListSnapshots", capability: capListSnapshots}
	resp, err := invoke(ctx, s, m, in.GetPluginId(), in.GetRequest(), csi.ControllerClient.ListSnapshots)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ControllerListSnapshotsResponse{Response: resp}, nil
}

// invoke runs one ClientCSI request: it finds the plugin, checks that the
// plugin can serve m, applies the default deadline, and calls the plugin
// with retries. It finds the plugin again before each retry, and holds a
// destructive slot during each attempt when m is destructive. Plugin errors
// are returned as the plugin made them, except that secret values of req
// are removed from their message and a NotFound of an idempotent removal is
// marked Ignorable.
func invoke[Req, Resp proto.Message](
	ctx context.Context, s *ClientCSI, m method, pluginID string, req Req,
	rpc func(csi.ControllerClient, context.Context, Req, ...grpc.CallOption) (Resp, error),
) (Resp, error) {
	var zero Resp
	start := time.Now()
	client, err := s.resolve(m, pluginID)
	if err != nil {
		s.log.Debug("call refused", "method", m.name, "plugin", pluginID, "code", status.Code(err), "error", err)
		return zero, err
	}
	if s.log.IsTrace() {
		s.log.Trace("call", "method", m.name, "plugin", pluginID, "request", redactedJSON(req))
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.timeoutOf(m))
		defer cancel()
	}

	var retries *retry.BackOff // made at the first retry: most calls need none
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			// Look again: the plugin may have been replaced by a new
			// instance, or found unhealthy, since the last attempt.
			if client, err = s.resolve(m, pluginID); err != nil {
				s.log.Debug("retry refused", "method", m.name, "plugin", pluginID, "code", status.Code(err), "error", err)
				return zero, err
			}
		}
		var release func()
		if m.destructive {
			if release, err = s.acquire(ctx, pluginID); err != nil {
				s.log.Debug("call ended while waiting for a destructive slot",
					"method", m.name, "plugin", pluginID, "code", status.Code(err), "attempt", attempt)
				return zero, err
			}
		}
		var resp Resp
		resp, err = rpc(client.Controller, ctx, req)
		if release != nil {
			release()
		}
		if err == nil {
			if s.log.IsDebug() {
				s.log.Debug("call", "method", m.name, "plugin", pluginID, "code", codes.OK,
					"attempts", attempt, "duration", time.Since(start))
			}
			return resp, nil
		}
		code := status.Code(err)
		if attempt < MaxAttempts && RetryableCode(code) {
			if retries == nil {
				retries = s.retry.NewBackOff()
			}
			if delay := retries.NextBackOff(); deadlineAllows(ctx, delay) {
				if s.log.IsDebug() {
					s.log.Debug("attempt failed; retrying", "method", m.name, "plugin", pluginID, "code", code,
						"attempt", attempt, "backoff", delay, "error", RedactString(status.Convert(err).Message(), req))
				}
				if retry.Wait(ctx, delay) != nil {
					return zero, contextError(ctx)
				}
				continue
			}
		}
		err = redactError(err, req)
		if m.notFoundIgnorable && code == codes.NotFound {
			err = csisupdv1.MarkIgnorable(err, "already gone")
		}
		if s.log.IsDebug() {
			s.log.Debug("call", "method", m.name, "plugin", pluginID, "code", code,
				"attempts", attempt, "duration", time.Since(start), "error", status.Convert(err).Message())
		}
		return zero, err
	}
}

// resolve finds the plugin and checks that it can serve m. Its errors carry
// the typed details of the api package and never a request body.
func (s *ClientCSI) resolve(m method, pluginID string) (*csiclient.Client, error) {
	if pluginID == "" {
		return nil, status.Error(codes.InvalidArgument, "plugin_id is required")
	}
	p, client, ok := s.plugins.Lookup(pluginID)
	if !ok {
		return nil, csisupdv1.NewPluginNotFoundError(pluginID, s.node)
	}
	if !p.GetHealthy() {
		return nil, csisupdv1.NewPluginUnhealthyError(pluginID, p.GetHealthState(), p.GetHealthDescription())
	}
	if client == nil {
		// Healthy, but its capabilities are not known yet, or they are
		// another instance's (Lookup pairs a connection only with its own
		// instance's record).
		return nil, csisupdv1.NewPluginUnhealthyError(pluginID, string(heartbeat.Unknown), "not fingerprinted yet")
	}
	if !slices.Contains(p.GetPluginCapabilities(), controllerService) {
		return nil, csisupdv1.NewCapabilityMissingError(pluginID, m.name, controllerService)
	}
	if m.capability != "" && !slices.Contains(p.GetControllerCapabilities(), m.capability) {
		return nil, csisupdv1.NewCapabilityMissingError(pluginID, m.name, m.capability)
	}
	return client, nil
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
		return nil, contextError(ctx)
	}
}

func (s *ClientCSI) timeoutOf(m method) time.Duration {
	if d, ok := s.methodTimeouts[m.name]; ok {
		return d
	}
	return s.timeout
}

// deadlineAllows reports whether ctx leaves time for a wait of d and
// another attempt.
func deadlineAllows(ctx context.Context, d time.Duration) bool {
	if ctx.Err() != nil {
		return false
	}
	dl, ok := ctx.Deadline()
	return !ok || time.Until(dl) > d
}

// redactedJSON formats m for logs with its secrets redacted.
func redactedJSON(m proto.Message) string {
	if m == nil || !m.ProtoReflect().IsValid() {
		return "{}"
	}
	return protojson.MarshalOptions{UseProtoNames: true}.Format(Redact(m))
}

// methodNames returns the names of the ClientCSI methods.
func methodNames() []string {
	var names []string
	for _, m := range csisupdv1.ClientCSI_ServiceDesc.Methods {
		names = append(names, m.MethodName)
	}
	return names
}
