package rpc

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Limits of the gRPC server. ports.rpc is reachable by whatever can reach
// the node, so no client may make the agent hold more than these:
//
//   - MaxConcurrentStreams 1024: streams open at a time on one connection
//     (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS). A well-behaved client
//     queues beyond it; the event stream caps (client.max_event_subscribers
//     and _per_connection) are far lower and apply on top.
//   - Keepalive enforcement, MinTime 10s, PermitWithoutStream: a client may
//     ping, with or without open streams, at most every 10 s; one that
//     pings more often gets GOAWAY (too_many_pings) instead of costing a
//     reply per ping.
//   - Keepalive, Time 1m, Timeout 20s: the agent pings a connection that
//     was silent for a minute and closes it when no answer comes in 20 s,
//     so streams of a client that vanished (host gone, cable pulled) and
//     the event stream slots they hold are freed within about 80 s rather
//     than when TCP gives up, minutes to hours later.
//   - MaxConnectionIdle 15m: a connection without a stream for 15 minutes
//     is closed with GOAWAY; gRPC clients reconnect on their next call.
//   - MaxRecvMsgSize 4 MiB: the largest request the agent reads (gRPC's
//     default, stated so that it stays a decision); larger ones fail with
//     ResourceExhausted before they are buffered whole.
//
// And two of cost:
//   - NumStreamWorkers 16 serves calls on 16 goroutines that stay, rather
//     than on a new goroutine per call, whose stack grows through the
//     interceptors on every call (8 % of a leader's CPU on heartbeats at
//     10,000 nodes went to copying stacks). A call that finds every worker
//     busy (event streams hold theirs while they last) still gets a
//     goroutine of its own, so no call waits for a worker.
//   - Static flow-control windows of 1 MiB, per stream and per connection.
//     gRPC's dynamic windows measure each connection's bandwidth with a
//     PING, and a WINDOW_UPDATE before it, after a request that arrives
//     while no such PING is in flight: on the connections of agents that
//     heartbeat every few seconds, after many calls, each of which then
//     costs the leader the read of the ack, its wake-up and at times a
//     write of its own. Requests are small (MaxRecvMsgSize bounds them at
//     4 MiB), so the windows of many MiB that dynamic flow control grows
//     for bulk uploads serve no call here; a fixed 1 MiB passes the
//     largest request in four windows, and lets no client make the agent
//     buffer more than the 16 MiB that dynamic windows can reach.
const (
	streamWorkers        = 16
	flowControlWindow    = 1 << 20
	MaxConcurrentStreams = 1024
	keepaliveMinTime     = 10 * time.Second
	keepaliveTime        = time.Minute
	keepaliveTimeout     = 20 * time.Second
	maxConnectionIdle    = 15 * time.Minute
	MaxRecvMsgSize       = 4 << 20
)

// ServerOptions returns the options of the agent's gRPC server that act on
// every call, but for TLS and the agent's start gate: the metrics m
// (first, so that refused calls are counted with their code), the
// TransportOptions, and auth's interceptors. The listener they serve on
// should come from TagConns. The benchmarks of a leader and of ClientCSI
// serve with them too, so that they measure what a real agent spends on a
// call.
func ServerOptions(m *GRPCMetrics, auth *Authorizer) []grpc.ServerOption {
	opts := append(m.ServerOptions(), TransportOptions()...)
	return append(opts, auth.ServerOptions()...)
}

// TransportOptions are the options of the agent's gRPC server that shape
// its transport (limits, keepalives, stream workers, flow-control
// windows), without TLS and without interceptors. The leader's benchmark
// serves a bare server with them as the floor of any gRPC server
// answering the same calls.
func TransportOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(MaxConcurrentStreams),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             keepaliveMinTime,
			PermitWithoutStream: true,
		}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time:              keepaliveTime,
			Timeout:           keepaliveTimeout,
			MaxConnectionIdle: maxConnectionIdle,
		}),
		grpc.MaxRecvMsgSize(MaxRecvMsgSize),
		grpc.NumStreamWorkers(streamWorkers),
		grpc.StaticStreamWindowSize(flowControlWindow),
		grpc.StaticConnWindowSize(flowControlWindow),
	}
}
