package rpc

import (
	"context"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/registry"
)

// AgentServiceConfig configures the Agent service.
type AgentServiceConfig struct {
	// Registry is the node's plugin registry. Required.
	Registry *registry.Registry
	// Name is the agent's node name.
	Name string
	// Version is the agent's build version.
	Version string
	// PluginDir is the watched plugin directory.
	PluginDir string
	// StartedAt is when the agent started.
	StartedAt time.Time
	// Cluster, when set, summarises the agent's place in the cluster for
	// Status.
	Cluster func() *csisupdv1.ClusterSummary
	// Logger is optional.
	Logger hclog.Logger
}

// AgentService implements csisupd.v1.Agent over the registry.
type AgentService struct {
	csisupdv1.UnimplementedAgentServer
	cfg AgentServiceConfig
	log hclog.Logger
}

// NewAgentService returns the Agent service.
func NewAgentService(cfg AgentServiceConfig) *AgentService {
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	return &AgentService{cfg: cfg, log: cfg.Logger}
}

// Register adds the service to s.
func (a *AgentService) Register(s *grpc.Server) { csisupdv1.RegisterAgentServer(s, a) }

// Status returns the agent's identity, plugins and ignored directory entries.
func (a *AgentService) Status(context.Context, *csisupdv1.StatusRequest) (*csisupdv1.StatusResponse, error) {
	resp := &csisupdv1.StatusResponse{
		Name:      a.cfg.Name,
		Version:   a.cfg.Version,
		StartedAt: timestamppb.New(a.cfg.StartedAt),
		PluginDir: a.cfg.PluginDir,
		Plugins:   PluginsToProto(a.cfg.Registry.List()),
	}
	if a.cfg.Cluster != nil {
		resp.Cluster = a.cfg.Cluster()
	}
	for _, ig := range a.cfg.Registry.Ignored() {
		resp.Ignored = append(resp.Ignored, &csisupdv1.IgnoredEntry{Path: ig.Path, Reason: ig.Reason})
	}
	return resp, nil
}

// ListPlugins returns every plugin sorted by id.
func (a *AgentService) ListPlugins(context.Context, *csisupdv1.ListPluginsRequest) (*csisupdv1.ListPluginsResponse, error) {
	return &csisupdv1.ListPluginsResponse{Plugins: PluginsToProto(a.cfg.Registry.List())}, nil
}

// GetPlugin returns one plugin or NotFound.
func (a *AgentService) GetPlugin(_ context.Context, req *csisupdv1.GetPluginRequest) (*csisupdv1.GetPluginResponse, error) {
	if req.GetId() == "" {
		return nil, status.Error(codes.InvalidArgument, "plugin id is required")
	}
	p, ok := a.cfg.Registry.Get(req.GetId())
	if !ok {
		return nil, status.Errorf(codes.NotFound, "plugin %q is not registered on this node", req.GetId())
	}
	return &csisupdv1.GetPluginResponse{Plugin: PluginToProto(p)}, nil
}

// WatchEvents replays buffered events, then follows new ones until the
// caller goes away. A slow caller never blocks the registry: it reads from
// the event ring at its own pace, and if it falls behind further than the
// ring holds it continues from the oldest buffered event.
func (a *AgentService) WatchEvents(req *csisupdv1.WatchEventsRequest, stream grpc.ServerStreamingServer[csisupdv1.Event]) error {
	reg := a.cfg.Registry
	ctx := stream.Context()

	// Take the change channel before reading, so nothing slips in between.
	changed := reg.Changed()
	var backlog []registry.Event
	switch n := req.GetReplay(); {
	case n < 0:
		// Follow only.
	case n == 0:
		backlog, _ = reg.Events(0)
	default:
		backlog = reg.LastEvents(int(n))
	}
	var after uint64
	if len(backlog) == 0 {
		_, after = reg.Events(^uint64(0))
	}
	for {
		for _, e := range backlog {
			after = e.Index
			if req.GetPluginId() != "" && e.PluginID != req.GetPluginId() {
				continue
			}
			if err := stream.Send(EventToProto(e)); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
		changed = reg.Changed()
		backlog, _ = reg.Events(after)
	}
}

// PluginsToProto converts registry records to API messages.
func PluginsToProto(ps []registry.Plugin) []*csisupdv1.Plugin {
	out := make([]*csisupdv1.Plugin, 0, len(ps))
	for _, p := range ps {
		out = append(out, PluginToProto(p))
	}
	return out
}

// PluginToProto converts one registry record to its API message.
func PluginToProto(p registry.Plugin) *csisupdv1.Plugin {
	fp := p.Fingerprint
	m := &csisupdv1.Plugin{
		Id:                     p.ID,
		Type:                   string(fp.Type),
		Healthy:                p.Healthy(),
		HealthState:            string(p.Health.State),
		HealthDescription:      p.Health.Description,
		Socket:                 p.Instance.Path,
		VendorName:             fp.VendorName,
		VendorVersion:          fp.VendorVersion,
		Manifest:               fp.Manifest,
		NodeId:                 fp.NodeID,
		MaxVolumes:             fp.MaxVolumes,
		AccessibleTopology:     fp.AccessibleTopology,
		PluginCapabilities:     fp.PluginCapabilities,
		ControllerCapabilities: fp.ControllerCapabilities,
		NodeCapabilities:       fp.NodeCapabilities,
		RegisteredAt:           timestamppb.New(p.RegisteredAt),
		HealthSince:            timestamppb.New(p.Health.Since),
	}
	if m.Type == "" {
		m.Type = "unknown"
	}
	if !p.Health.LastProbe.IsZero() {
		m.LastProbe = timestamppb.New(p.Health.LastProbe)
	}
	return m
}

// EventToProto converts a registry event to its API message.
func EventToProto(e registry.Event) *csisupdv1.Event {
	return &csisupdv1.Event{
		Index:       e.Index,
		Time:        timestamppb.New(e.Time),
		Type:        string(e.Type),
		PluginId:    e.PluginID,
		Description: e.Description,
	}
}
