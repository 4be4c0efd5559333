package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"

	"github.com/csisupd/csisupd/internal/retry"
)

// Discover returns the gRPC addresses (host:port) of the servers as they
// are known now, for servers and agents that find them through a catalog
// instead of a fixed list.
type Discover func(ctx context.Context) ([]string, error)

// DefaultRaftPort is the default raft port of a server.
const DefaultRaftPort = 4781

// DefaultEventBufferSize is the default of Config.EventBufferSize.
const DefaultEventBufferSize = 1024

// Config configures one server. Zero durations take the production defaults
// listed on each field; tests shrink them.
type Config struct {
	// ID is the raft server id; it must be unique in the cluster and stable
	// across restarts.
	ID string
	// Name is a human name for logs; defaults to ID.
	Name string
	// DataDir holds the raft log, stable store and snapshots.
	DataDir string
	// RaftAddr is the host:port raft binds to and advertises.
	RaftAddr string
	// RaftLayer, when set, carries raft traffic instead of a TCP transport
	// bound to RaftAddr. Its Addr() is advertised. Tests use it to partition.
	RaftLayer raft.StreamLayer
	// RPCAddr is the advertised gRPC address of this server (Control and
	// Cluster services).
	RPCAddr string
	// BootstrapExpect is the number of servers that must be reachable before
	// the cluster bootstraps. It is immutable config.
	BootstrapExpect int
	// RetryJoin lists the gRPC addresses of the other servers; they are
	// retried until the cluster forms.
	RetryJoin []string
	// DiscoverServers, when RetryJoin is empty, returns the gRPC addresses
	// of the servers at each join attempt (Consul's catalog, for example).
	// Addresses may include this server's own. BootstrapExpect still
	// decides when the cluster forms.
	DiscoverServers Discover
	// RaftMultiplier scales raft timings (1 fastest .. 10); default 5, which
	// gives a 1 s heartbeat timeout.
	RaftMultiplier int

	// Join spaces the join and bootstrap attempts, then the checks of this
	// server's address record, and a new leader's barrier retries, with
	// jitter so that servers started together do not ask each other in
	// step. Its Base is also autopilot's reconcile and update interval.
	// Required: config.Retry.ServerJoin; no default here.
	Join retry.Policy
	// RPCTimeout bounds one server-to-server or ClientCSI call (default 10 s).
	RPCTimeout time.Duration
	// ApplyTimeout bounds one raft apply (default 10 s).
	ApplyTimeout time.Duration

	// MinHeartbeatTTL is the smallest node heartbeat TTL (default 10 s).
	MinHeartbeatTTL time.Duration
	// HeartbeatGrace is added to the TTL before a node is marked down
	// (default 10 s).
	HeartbeatGrace time.Duration
	// FailoverHeartbeatTTL is the TTL a new leader gives every node before
	// it has heard from them (default 5 min).
	FailoverHeartbeatTTL time.Duration
	// MaxHeartbeatsPerSecond scales the TTL with the node count (default 50).
	MaxHeartbeatsPerSecond float64

	// DeadServerTimeout is how long a server must be unreachable before
	// autopilot may remove it from the configuration (default 30 s).
	DeadServerTimeout time.Duration
	// ServerStabilizationTime is how long a server must be healthy before
	// autopilot considers it stable (default 10 s).
	ServerStabilizationTime time.Duration

	// SnapshotThreshold is the number of log entries between raft snapshots
	// (default 8192).
	SnapshotThreshold uint64
	// SnapshotInterval is how often raft checks whether to snapshot
	// (default 120 s).
	SnapshotInterval time.Duration
	// TrailingLogs is how many log entries stay after a snapshot, so a
	// slow follower can catch up without a snapshot (default 10240).
	TrailingLogs uint64

	// EventBufferSize is how many applied raft entries with cluster events
	// the server keeps for WatchEvents to replay and to resume from
	// (default 1024). Entries without events take no room.
	EventBufferSize int
	// EventMaxLag is how many entries a WatchEvents stream that followed
	// the newest may trail them by before it is ended with the
	// EventsFellBehind error naming the index to resume from (default three
	// quarters of EventBufferSize, 768). It must be less than
	// EventBufferSize, so that the entries after the resume index are still
	// buffered when a stream is ended.
	EventMaxLag int

	// Controllers calls controller RPCs on a node's agent. Defaults to the
	// gRPC ClientCSI client.
	Controllers ControllerClient
	// IsRetryable reports whether a ClientCSI error means the next
	// controller candidate should be tried. Defaults to DefaultIsRetryable.
	IsRetryable func(error) bool
	// DialOptions are used for every outgoing gRPC connection (servers and
	// agents). Defaults to insecure transport credentials.
	DialOptions []grpc.DialOption
}

// withDefaults returns a copy of c with defaults filled in.
func (c Config) withDefaults() Config {
	if c.Name == "" {
		c.Name = c.ID
	}
	if c.RaftMultiplier == 0 {
		c.RaftMultiplier = 5
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.RPCTimeout, 10*time.Second)
	def(&c.ApplyTimeout, 10*time.Second)
	def(&c.MinHeartbeatTTL, 10*time.Second)
	def(&c.HeartbeatGrace, 10*time.Second)
	def(&c.FailoverHeartbeatTTL, 5*time.Minute)
	def(&c.DeadServerTimeout, 30*time.Second)
	def(&c.ServerStabilizationTime, 10*time.Second)
	def(&c.SnapshotInterval, 120*time.Second)
	if c.MaxHeartbeatsPerSecond == 0 {
		c.MaxHeartbeatsPerSecond = 50
	}
	if c.SnapshotThreshold == 0 {
		c.SnapshotThreshold = 8192
	}
	if c.TrailingLogs == 0 {
		c.TrailingLogs = 10240
	}
	if c.EventBufferSize == 0 {
		c.EventBufferSize = DefaultEventBufferSize
	}
	if c.EventMaxLag == 0 {
		c.EventMaxLag = c.EventBufferSize * 3 / 4
	}
	if c.IsRetryable == nil {
		c.IsRetryable = DefaultIsRetryable
	}
	return c
}

// Validate reports every problem with the config, naming the field.
func (c Config) Validate() error {
	var errs []error
	if c.ID == "" {
		errs = append(errs, errors.New("server: id is required"))
	}
	if c.DataDir == "" {
		errs = append(errs, errors.New("server: data_dir is required"))
	}
	if c.RaftLayer == nil {
		if _, _, err := net.SplitHostPort(c.RaftAddr); err != nil {
			errs = append(errs, fmt.Errorf("server: raft address %q: %w", c.RaftAddr, err))
		}
	}
	if _, _, err := net.SplitHostPort(c.RPCAddr); err != nil {
		errs = append(errs, fmt.Errorf("server: rpc address %q: %w", c.RPCAddr, err))
	}
	if c.BootstrapExpect < 1 {
		errs = append(errs, fmt.Errorf("server: bootstrap_expect = %d, must be at least 1", c.BootstrapExpect))
	}
	if c.BootstrapExpect > 1 && len(c.RetryJoin) == 0 && c.DiscoverServers == nil {
		errs = append(errs, fmt.Errorf("server: bootstrap_expect = %d needs retry_join addresses of the other servers, or a way to discover them", c.BootstrapExpect))
	}
	for _, a := range c.RetryJoin {
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("server: retry_join address %q: %w", a, err))
		}
	}
	if c.RaftMultiplier < 0 || c.RaftMultiplier > 10 {
		errs = append(errs, fmt.Errorf("server: raft_multiplier = %d, must be between 1 and 10", c.RaftMultiplier))
	}
	if err := c.Join.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("server: Join: %w", err))
	}
	if c.MaxHeartbeatsPerSecond < 0 {
		errs = append(errs, fmt.Errorf("server: max heartbeats per second = %v, must not be negative", c.MaxHeartbeatsPerSecond))
	}
	if c.EventBufferSize < 0 {
		errs = append(errs, fmt.Errorf("server: event_buffer_size = %d, must not be negative", c.EventBufferSize))
	}
	if c.EventMaxLag < 0 {
		errs = append(errs, fmt.Errorf("server: event_max_lag = %d, must not be negative", c.EventMaxLag))
	}
	if d := c.withDefaults(); c.EventBufferSize >= 0 && c.EventMaxLag >= 0 && (d.EventMaxLag < 1 || d.EventMaxLag >= d.EventBufferSize) {
		errs = append(errs, fmt.Errorf("server: event_max_lag = %d with event_buffer_size = %d, must be at least 1 and less than the buffer size, so that a stream ended for lagging can resume without a gap", d.EventMaxLag, d.EventBufferSize))
	}
	return errors.Join(errs...)
}
