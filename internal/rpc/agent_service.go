package rpc

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
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
	// MaxSubscribers caps the WatchEvents streams open at a time
	// (client.max_event_subscribers), MaxSubscribersPerConn those on one
	// transport connection (client.max_event_subscribers_per_connection).
	// A stream beyond either cap ends at once with ResourceExhausted. Zero
	// means the configuration default. Per connection means per HTTP/2
	// transport: see ConnTagger for how a connection is recognised.
	MaxSubscribers        int
	MaxSubscribersPerConn int
}

// AgentService implements csisupd.v1.Agent over the registry.
type AgentService struct {
	csisupdv1.UnimplementedAgentServer
	cfg  AgentServiceConfig
	log  hclog.Logger
	subs *subscriberLimits
	// Event stream counters, so that tests wait for a state instead of
	// sleeping: caughtUp counts the streams waiting for the next event,
	// sending those inside Send (a stream whose client does not read stays
	// there), sent the events sent.
	caughtUp, sending atomic.Int64
	sent              atomic.Uint64
	encoded           encodedEvents
}

// NewAgentService returns the Agent service.
func NewAgentService(cfg AgentServiceConfig) *AgentService {
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	return &AgentService{cfg: cfg, log: cfg.Logger,
		subs: newSubscriberLimits(cfg.MaxSubscribers, cfg.MaxSubscribersPerConn)}
}

// SetSubscriberLimits changes the caps on WatchEvents streams (see
// AgentServiceConfig.MaxSubscribers) for the streams opened from now on;
// open streams beyond a lowered cap are left to end on their own.
func (a *AgentService) SetSubscriberLimits(total, perConn int) { a.subs.set(total, perConn) }

// Subscribers returns the number of open WatchEvents streams and of
// transport connections that have one.
func (a *AgentService) Subscribers() (streams, conns int) { return a.subs.open() }

// Register adds the service to s.
func (a *AgentService) Register(s *grpc.Server) { csisupdv1.RegisterAgentServer(s, a) }

// Status returns the agent's identity, plugins and ignored directory entries.
func (a *AgentService) Status(context.Context, *csisupdv1.StatusRequest) (*csisupdv1.StatusResponse, error) {
	resp := &csisupdv1.StatusResponse{
		Name:      a.cfg.Name,
		Version:   a.cfg.Version,
		StartedAt: timestamppb.New(a.cfg.StartedAt),
		PluginDir: wireString(a.cfg.PluginDir),
		Plugins:   PluginsToProto(a.cfg.Registry.List()),
	}
	if a.cfg.Cluster != nil {
		resp.Cluster = a.cfg.Cluster()
	}
	for _, ig := range a.cfg.Registry.Ignored() {
		resp.Ignored = append(resp.Ignored, &csisupdv1.IgnoredEntry{Path: wireString(ig.Path), Reason: wireString(ig.Reason)})
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
// caller goes away.
//
// A stream reads the registry's event ring one batch of at most
// registry.DefaultEventBatch events at a time, so it holds one small batch
// however long the backlog is, also while it is blocked in Send on a client
// that does not read (gRPC then holds at most its per-stream write quota
// of encoded messages, 64 KiB). The registry never waits for a stream: it
// only closes a channel when it emits. A stream whose next event was
// overwritten in the ring before it read it ends with ResourceExhausted
// naming the dropped indexes (see fellBehind); it never silently skips.
//
// Streams beyond client.max_event_subscribers, or beyond
// client.max_event_subscribers_per_connection on one connection, are
// refused at once with ResourceExhausted.
func (a *AgentService) WatchEvents(req *csisupdv1.WatchEventsRequest, stream grpc.ServerStreamingServer[csisupdv1.Event]) error {
	ctx := stream.Context()
	release, err := a.subs.acquire(ctx)
	if err != nil {
		return err
	}
	defer release()

	shared := sharedEncoding(ctx)
	// after is the index of the last event this stream has dealt with
	// (sent, or skipped by the plugin filter).
	after := a.replayFrom(req.GetReplay())
	for {
		// Take the channel before reading, so an event emitted in between
		// wakes the wait below.
		next := a.cfg.Registry.NextEvent()
		latest, err := a.sendBatch(stream, shared, req.GetPluginId(), &after)
		if err != nil {
			return err
		}
		if after < latest {
			continue // more backlog: read the next batch without waiting
		}
		a.caughtUp.Add(1)
		select {
		case <-ctx.Done():
			a.caughtUp.Add(-1)
			return nil
		case <-next:
			a.caughtUp.Add(-1)
		}
	}
}

// replayFrom is the index after which a stream asking for replay starts:
// the latest for a negative replay (follow only), before the oldest
// buffered event for 0 (all), else n events before the latest, but not
// before the oldest buffered one.
func (a *AgentService) replayFrom(replay int32) uint64 {
	_, oldest, latest := a.cfg.Registry.EventsAfter(0, 0)
	switch {
	case replay < 0:
		return latest
	case replay == 0:
		return oldest - 1
	default:
		return max(latest-min(uint64(replay), latest), oldest-1)
	}
}

// batchPool holds the buffers streams read the event ring into: a stream
// holds one only while it sends a batch, so an idle stream holds none and
// a stream blocked in Send holds its own batch and nothing else.
var batchPool = sync.Pool{New: func() any { return new([registry.DefaultEventBatch]registry.Event) }}

// sendBatch sends the next batch of events after *after that match
// pluginID (all when empty), advances *after past every event it read, and
// returns the latest index at the time of the read. It returns the
// fell-behind status when the ring no longer holds the event after *after.
// With shared, each event goes out encoded once for all streams.
func (a *AgentService) sendBatch(stream grpc.ServerStreamingServer[csisupdv1.Event], shared bool, pluginID string, after *uint64) (latest uint64, err error) {
	buf := batchPool.Get().(*[registry.DefaultEventBatch]registry.Event)
	defer func() {
		clear(buf[:]) // drop the strings before the buffer is reused
		batchPool.Put(buf)
	}()
	n, oldest, latest := a.cfg.Registry.ReadEvents(buf[:], *after)
	if *after+1 < oldest {
		return latest, fellBehind(*after+1, oldest-1)
	}
	for _, e := range buf[:n] {
		*after = e.Index
		if pluginID != "" && e.PluginID != pluginID {
			continue
		}
		if err := a.send(stream, shared, e); err != nil {
			return latest, err
		}
	}
	return latest, nil
}

// send sends one event, encoded once for all streams when shared.
func (a *AgentService) send(stream grpc.ServerStreamingServer[csisupdv1.Event], shared bool, e registry.Event) error {
	a.sending.Add(1)
	defer a.sending.Add(-1)
	var err error
	if msg := a.encoded.get(stream, shared, e); msg != nil {
		err = stream.SendMsg(msg)
	} else {
		err = stream.Send(EventToProto(e))
	}
	if err == nil {
		a.sent.Add(1)
	}
	return err
}

// encodedEventSlots is how many encoded events encodedEvents keeps: as
// many as the registry's default ring, so that streams replaying it and
// streams following new events rarely evict each other's entries.
const encodedEventSlots = 1024

// encodedEvents keeps recent events encoded as gRPC messages, shared by
// every stream that sends them. Encoding once saves each stream a
// conversion and a marshal per event, and a message queued by gRPC for a
// client that does not read then costs that stream only gRPC's frame
// bookkeeping (about 150 bytes), not a copy of the message: the queue of a
// stalled stream is bounded by gRPC's write quota (64 KiB of messages),
// its memory by that and by the size of events.
//
// A slot is replaced without a lock; two streams encoding the same event
// at once both store a valid message.
type encodedEvents struct {
	slots [encodedEventSlots]atomic.Pointer[encodedEvent]
}

type encodedEvent struct {
	index uint64
	msg   *grpc.PreparedMsg
}

// get returns e encoded on stream's behalf, or nil when the stream must
// encode it itself: when shared is false or encoding fails.
func (c *encodedEvents) get(stream grpc.ServerStream, shared bool, e registry.Event) *grpc.PreparedMsg {
	if !shared {
		return nil
	}
	slot := &c.slots[e.Index%encodedEventSlots]
	if p := slot.Load(); p != nil && p.index == e.Index {
		return p.msg
	}
	msg := new(grpc.PreparedMsg)
	if err := msg.Encode(stream, EventToProto(e)); err != nil {
		return nil
	}
	slot.Store(&encodedEvent{index: e.Index, msg: msg})
	return msg
}

// sharedEncoding reports whether the stream of ctx encodes messages the
// way every such stream does, with the proto codec and no compression, so
// that one stream's encoded message is valid on all of them. gRPC
// compresses responses when the server has a compressor option or the
// request came compressed; either sets the stream's send compressor. The
// codec follows the request's content subtype (the agent's server forces
// none with grpc.ForceServerCodec). A stream whose transport does not say
// (another gRPC version) is not shared.
func sharedEncoding(ctx context.Context) bool {
	ts, ok := grpc.ServerTransportStreamFromContext(ctx).(interface {
		SendCompress() string
		ContentSubtype() string
	})
	if !ok {
		return false
	}
	comp, sub := ts.SendCompress(), ts.ContentSubtype()
	return (comp == "" || comp == encoding.Identity) && (sub == "" || sub == "proto")
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
	// Names, paths and descriptions come from the file system and from
	// errors; maps and capabilities come from the plugin's own gRPC
	// answers, which are valid UTF-8 already.
	m := &csisupdv1.Plugin{
		Id:                     wireString(p.ID),
		Type:                   wireString(string(fp.Type)),
		Healthy:                p.Healthy(),
		HealthState:            wireString(string(p.Health.State)),
		HealthDescription:      wireString(p.Health.Description),
		Socket:                 wireString(p.Instance.Path),
		VendorName:             wireString(fp.VendorName),
		VendorVersion:          wireString(fp.VendorVersion),
		Manifest:               fp.Manifest,
		NodeId:                 wireString(fp.NodeID),
		MaxVolumes:             int32(min(max(fp.MaxVolumes, -1<<31), 1<<31-1)), // clamped to the int32 range
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
		Type:        wireString(string(e.Type)),
		PluginId:    wireString(e.PluginID),
		Description: wireString(e.Description),
	}
}

// wireString returns s as valid UTF-8, which proto3 requires of every
// string field: the marshaller refuses a message with an invalid one, so a
// single plugin directory with a name that is not UTF-8 (Linux file names
// are bytes) would fail Status and ListPlugins and end every event stream
// at its event, again on each reconnect. Each invalid byte becomes the
// text \xNN, so the name stays recognisable; valid strings, the usual
// case, are returned as they are.
func wireString(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			fmt.Fprintf(&b, `\x%02x`, s[i])
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}
