package rpc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/stream"
)

// AgentServiceConfig configures the Agent service.
type AgentServiceConfig struct {
	// Plugins is the node's plugin state. Required.
	Plugins plugin.Source
	// Events is the node's plugin event log. Required.
	Events plugin.EventLog
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
	// Mounts, when set, lists the node's volume mounts for Status.
	Mounts func() []*csisupdv1.Mount
	// Logger is optional.
	Logger hclog.Logger
	// MaxSubscribers caps the WatchEvents streams open at a time
	// (client.max_event_subscribers), MaxSubscribersPerConn those on one
	// transport connection (client.max_event_subscribers_per_connection).
	// A stream beyond either cap ends at once with ResourceExhausted.
	// Both are required. Per connection means per HTTP/2
	// transport: see TagConns for how a connection is recognised.
	MaxSubscribers        int
	MaxSubscribersPerConn int
	// Metrics receives the event stream series (csisupd_event_subscribers,
	// csisupd_event_subscribers_dropped_total). Nil registers nothing;
	// the series are kept all the same.
	Metrics prometheus.Registerer

	// The debugging methods (agent_debug.go); each one whose field is
	// unset fails with FailedPrecondition.

	// Logs are the agent's log sinks that Monitor streams from: its root
	// logger as an hclog.InterceptLogger.
	Logs LogSinks
	// LogLevels are the levels a Monitor stream may ask for, as the
	// configuration's log_level takes them (config.LogLevels). Required
	// with Logs.
	LogLevels []string
	// Gatherer is the agent's Prometheus registry, which Metrics returns.
	Gatherer prometheus.Gatherer
	// Config renders the effective configuration with secrets redacted
	// (config.Config's String), for Config.
	Config func() string
	// EnableDebug reports whether the configuration has enable_debug =
	// true: with ACLs off, Profile answers only then.
	EnableDebug func() bool
	// ACL is true when ACLs are on: the Authorizer then lets only tokens
	// with agent:write (or servers) call Profile.
	ACL bool

	// Leases, when set, holds leases for local workloads (HoldLease,
	// DropLease); unset, an agent that reports to no servers, they fail
	// with FailedPrecondition.
	Leases Leases
	// LocalClaims, when set, claims volumes for workloads on this node
	// through the servers and holds their leases (ClaimVolume,
	// ReleaseVolume); unset, an agent that reports to no servers, they
	// fail with FailedPrecondition.
	LocalClaims LocalClaims
}

// Leases holds the leases of claims for local workloads: the agent's
// nodeclient.Leases.
type Leases interface {
	// Hold renews the lease of volumeID's claim for workloadID on this
	// node from now on. Its errors may be gRPC statuses (InvalidArgument
	// for the arguments), which are passed on as they are.
	Hold(volumeID, workloadID string, lease time.Duration) error
	// Drop stops renewing the leases of workloadID.
	Drop(workloadID string) error
}

// AgentService implements csisupd.v1.Agent over the node's plugin state.
type AgentService struct {
	csisupdv1.UnimplementedAgentServer
	cfg     AgentServiceConfig
	log     hclog.Logger
	subs    *subscriberLimits
	metrics *subscriberMetrics
	// Event stream counters, so that tests wait for a state instead of
	// sleeping: caughtUp counts the streams waiting for the next event,
	// sending those inside Send (a stream whose client does not read stays
	// there), sent the events sent.
	caughtUp, sending atomic.Int64
	sent              atomic.Uint64
	encoded           encodedEvents

	// monitors counts the Monitor streams admitted (for MaxMonitors),
	// monitoring those whose sink is registered (for tests).
	monitors, monitoring atomic.Int64
	// cpuProfiling is held while Profile takes a CPU profile.
	cpuProfiling sync.Mutex
}

// NewAgentService validates cfg and returns the Agent service.
func NewAgentService(cfg AgentServiceConfig) (*AgentService, error) {
	var errs []error
	if cfg.Plugins == nil {
		errs = append(errs, errors.New("rpc: AgentServiceConfig.Plugins is required"))
	}
	if cfg.Events == nil {
		errs = append(errs, errors.New("rpc: AgentServiceConfig.Events is required"))
	}
	if cfg.Logs != nil && len(cfg.LogLevels) == 0 {
		errs = append(errs, errors.New("rpc: AgentServiceConfig.LogLevels is required with Logs"))
	}
	if err := validateSubscriberLimits(cfg.MaxSubscribers, cfg.MaxSubscribersPerConn); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	subs := newSubscriberLimits(cfg.MaxSubscribers, cfg.MaxSubscribersPerConn)
	a := &AgentService{cfg: cfg, log: cfg.Logger, subs: subs, metrics: newSubscriberMetrics(subs)}
	if err := a.metrics.register(cfg.Metrics); err != nil {
		return nil, err
	}
	return a, nil
}

// SetSubscriberLimits changes the caps on WatchEvents streams (see
// AgentServiceConfig.MaxSubscribers) for the streams opened from now on;
// open streams beyond a lowered cap are left to end on their own. It
// changes nothing when a cap is not positive.
func (a *AgentService) SetSubscriberLimits(total, perConn int) error {
	if err := validateSubscriberLimits(total, perConn); err != nil {
		return err
	}
	a.subs.set(total, perConn)
	return nil
}

func validateSubscriberLimits(total, perConn int) error {
	var errs []error
	if total <= 0 {
		errs = append(errs, fmt.Errorf("rpc: the cap of event streams (client.max_event_subscribers) must be positive, got %d", total))
	}
	if perConn <= 0 {
		errs = append(errs, fmt.Errorf("rpc: the cap of event streams per connection (client.max_event_subscribers_per_connection) must be positive, got %d", perConn))
	}
	return errors.Join(errs...)
}

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
		PluginDir: plugin.WireString(a.cfg.PluginDir),
		Plugins:   a.cfg.Plugins.List(),
	}
	if a.cfg.Cluster != nil {
		resp.Cluster = a.cfg.Cluster()
	}
	if a.cfg.Mounts != nil {
		resp.Mounts = a.cfg.Mounts()
	}
	for _, ig := range a.cfg.Plugins.Ignored() {
		resp.Ignored = append(resp.Ignored, &csisupdv1.IgnoredEntry{Path: plugin.WireString(ig.Path), Reason: plugin.WireString(ig.Reason)})
	}
	return resp, nil
}

// ListPlugins returns every plugin sorted by id.
func (a *AgentService) ListPlugins(context.Context, *csisupdv1.ListPluginsRequest) (*csisupdv1.ListPluginsResponse, error) {
	return &csisupdv1.ListPluginsResponse{Plugins: a.cfg.Plugins.List()}, nil
}

// GetPlugin returns one plugin or NotFound.
func (a *AgentService) GetPlugin(_ context.Context, req *csisupdv1.GetPluginRequest) (*csisupdv1.GetPluginResponse, error) {
	if req.GetId() == "" {
		return nil, status.Error(codes.InvalidArgument, "plugin id is required")
	}
	p, ok := a.cfg.Plugins.Get(req.GetId())
	if !ok {
		return nil, status.Errorf(codes.NotFound, "plugin %q is not registered on this node", req.GetId())
	}
	return &csisupdv1.GetPluginResponse{Plugin: p}, nil
}

// WatchEvents replays buffered events, then follows new ones until the
// caller goes away.
//
// A stream is a subscription to the node's event log (package stream): it
// holds its position and one event, however long the backlog is, also
// while it is blocked in Send on a client that does not read (gRPC then
// holds at most its per-stream write quota of encoded messages, 64 KiB).
// The log never waits for a stream. A stream that falls more than the
// log's lag limit behind ends with ResourceExhausted, "fell behind ...
// resume from index N" and the EventsFellBehind detail: a new stream with
// from_index N continues without a gap. One whose next events have left
// the log ends with OutOfRange and the EventsGone detail; it never
// silently skips.
//
// Streams beyond client.max_event_subscribers, or beyond
// client.max_event_subscribers_per_connection on one connection, are
// refused at once with ResourceExhausted.
//
// With no_follow the stream ends (OK) once nothing buffered is left to
// send, instead of waiting for new events.
func (a *AgentService) WatchEvents(req *csisupdv1.WatchEventsRequest, out grpc.ServerStreamingServer[csisupdv1.Event]) error {
	ctx := out.Context()
	release, err := a.subs.acquire(ctx)
	if err != nil {
		return err
	}
	defer release()

	sub, err := a.cfg.Events.Subscribe(a.subscription(req))
	if err != nil {
		return eventsError(err)
	}
	defer sub.Close()
	shared := sharedEncoding(ctx)
	// With no_follow, Next is given a done context, which makes it a poll:
	// it returns what is buffered, or the context's error when nothing is
	// left.
	next := ctx
	if req.GetNoFollow() {
		poll, cancel := context.WithCancel(ctx)
		cancel()
		next = poll
	}
	// One event at a time: a stream holds no batch while it waits or
	// while it is blocked in Send, and reading the log is a few
	// nanoseconds per event.
	var one [1]stream.Event[plugin.Event]
	for {
		_, latest := a.cfg.Events.Range()
		caughtUp := sub.Index() >= latest
		if caughtUp {
			a.caughtUp.Add(1)
		}
		evs, err := sub.Next(next, one[:0])
		if caughtUp {
			a.caughtUp.Add(-1)
		}
		switch {
		case ctx.Err() != nil:
			return nil
		case req.GetNoFollow() && errors.Is(err, context.Canceled):
			return nil // the poll found nothing left
		case errors.Is(err, stream.ErrClosed):
			return status.Error(codes.Unavailable, "the agent is shutting down; reconnect with from_index to continue")
		case err != nil:
			if fellBehind(err) {
				a.metrics.dropped.Inc()
			}
			return eventsError(err)
		}
		for _, e := range evs {
			if err := a.send(out, shared, e.Payload); err != nil {
				return err
			}
		}
	}
}

// subscription is where a stream starts: after from_index when the request
// has one; else the latest event for a negative replay (follow only), the
// oldest buffered one for 0 (all), or the last n events. plugin_id limits
// it to one plugin's events.
func (a *AgentService) subscription(req *csisupdv1.WatchEventsRequest) stream.Request {
	var r stream.Request
	switch replay := req.GetReplay(); {
	case req.FromIndex != nil:
		r.After = req.GetFromIndex()
	case replay < 0:
		_, r.After = a.cfg.Events.Range()
	case replay > 0:
		r.After = a.cfg.Events.AfterLast(int(replay))
	}
	if id := req.GetPluginId(); id != "" {
		r.Topics = map[string][]string{plugin.EventTopic: {id}}
	}
	return r
}

// fellBehind reports whether err, from Next, ends a stream that could not
// keep up: it trailed the newest event by more than the log's lag limit,
// or its next event left the log before it read it.
func fellBehind(err error) bool {
	var fell *stream.FellBehindError
	var gone *stream.GoneError
	return errors.As(err, &fell) || errors.As(err, &gone)
}

// eventsError is the status that ends a stream for an error of the log.
func eventsError(err error) error {
	var fell *stream.FellBehindError
	var gone *stream.GoneError
	switch {
	case errors.As(err, &fell):
		return csisupdv1.NewEventsFellBehindError(fell.ResumeIndex, uint64(fell.Lag), uint64(fell.MaxLag))
	case errors.As(err, &gone):
		return csisupdv1.NewEventsGoneError(gone.After, gone.Oldest)
	default:
		return status.Errorf(codes.Internal, "event log: %v", err)
	}
}

// send sends one event, encoded once for all streams when shared.
func (a *AgentService) send(stream grpc.ServerStreamingServer[csisupdv1.Event], shared bool, e plugin.Event) error {
	a.sending.Add(1)
	defer a.sending.Add(-1)
	var err error
	if msg := a.encoded.get(stream, shared, e); msg != nil {
		err = stream.SendMsg(msg)
	} else {
		err = stream.Send(e.Proto())
	}
	if err == nil {
		a.sent.Add(1)
	}
	return err
}

// encodedEventSlots is how many encoded events encodedEvents keeps: as
// many as the registry's default event log, so that streams replaying it and
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
func (c *encodedEvents) get(stream grpc.ServerStream, shared bool, e plugin.Event) *grpc.PreparedMsg {
	if !shared {
		return nil
	}
	slot := &c.slots[e.Index%encodedEventSlots]
	if p := slot.Load(); p != nil && p.index == e.Index {
		return p.msg
	}
	msg := new(grpc.PreparedMsg)
	if err := msg.Encode(stream, e.Proto()); err != nil {
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

// HoldLease makes the agent renew the lease of a claim for a local
// workload (AgentServiceConfig.Leases).
func (a *AgentService) HoldLease(_ context.Context, req *csisupdv1.HoldLeaseRequest) (*csisupdv1.HoldLeaseResponse, error) {
	if a.cfg.Leases == nil {
		return nil, errNoLeases
	}
	if err := req.GetLease().CheckValid(); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "hold lease: lease: %v", err)
	}
	if err := a.cfg.Leases.Hold(req.GetVolumeId(), req.GetWorkloadId(), req.GetLease().AsDuration()); err != nil {
		return nil, leaseError(err)
	}
	return &csisupdv1.HoldLeaseResponse{}, nil
}

// DropLease stops renewing the leases of a local workload.
func (a *AgentService) DropLease(_ context.Context, req *csisupdv1.DropLeaseRequest) (*csisupdv1.DropLeaseResponse, error) {
	if a.cfg.Leases == nil {
		return nil, errNoLeases
	}
	if req.GetWorkloadId() == "" {
		return nil, status.Error(codes.InvalidArgument, "drop lease: workload_id is required")
	}
	if err := a.cfg.Leases.Drop(req.GetWorkloadId()); err != nil {
		return nil, leaseError(err)
	}
	return &csisupdv1.DropLeaseResponse{}, nil
}

// errNoLeases answers the lease methods of an agent that holds none.
var errNoLeases = status.Error(codes.FailedPrecondition, "this agent reports to no servers: it holds no leases")

// leaseError passes a gRPC status of Leases or LocalClaims on as it is
// (one they wrap included); any other error (the lease file could not be
// written) is Internal.
func leaseError(err error) error {
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codes.Internal, err.Error())
}
