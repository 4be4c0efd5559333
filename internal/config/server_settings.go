package config

import (
	"errors"
	"fmt"
	"net"
	"time"
)

// ServerSettings holds every setting of the server role, as one struct:
// what the server block's keys set (ServerKeys) and the timings and sizes
// no key sets (ServerTuning). Config.ServerSettings builds it from a
// loaded configuration; the server and its raft member take it as it is,
// validate it with Validate and fill in none of it. Tests start from
// DefaultServerSettings and shorten the timings.
type ServerSettings struct {
	ServerKeys
	ServerTuning
}

// ServerKeys are the settings of the server block (server.bootstrap_expect,
// ...): ServerConfig embeds them, so that Load fills them and Config.Validate
// checks them by key, naming where each was set.
type ServerKeys struct {
	// BootstrapExpect is the number of servers that must be reachable
	// before the cluster bootstraps (server.bootstrap_expect). It is
	// immutable config. Required (>= 1) when the server is enabled: no
	// default.
	BootstrapExpect int
	// RetryJoin lists the gRPC addresses (host:port) of the other servers
	// (server.retry_join); they are retried until the cluster forms.
	RetryJoin []string
	// RaftMultiplier scales raft's timings, from 1 (fastest) to 10
	// (server.raft_multiplier).
	RaftMultiplier int

	// ClaimGCGrace is how long a node may be down before the leader
	// releases its volume claims without it: through the controller only,
	// leaving the node's agent to clean up its mounts when it returns
	// (server.claim_gc_grace).
	ClaimGCGrace time.Duration
	// ClaimResumeTimeout is how long a claim the current leader took may
	// stay taken but not mounted before the leader's volume watcher
	// finishes it, or releases it when a step fails: long enough for the
	// caller that took it to learn the outcome by claiming again
	// (server.claim_resume_timeout). A claim an earlier leader took is
	// resumed at once.
	ClaimResumeTimeout time.Duration
	// VolumeHealthInterval is how often the leader lists the volumes'
	// health from the plugins' controllers
	// (ControllerListVolumeHealth); 0 turns it off
	// (server.volume_health_interval).
	VolumeHealthInterval time.Duration

	// HeartbeatGrace is added to a node's heartbeat TTL before the leader
	// marks the node down (server.heartbeat_grace).
	HeartbeatGrace time.Duration
	// MinHeartbeatTTL is the smallest heartbeat TTL the leader gives a
	// node; MaxHeartbeatsPerSecond is the rate of heartbeats the leader
	// scales the TTLs to as the node count grows
	// (server.min_heartbeat_ttl, server.max_heartbeats_per_second).
	MinHeartbeatTTL        time.Duration
	MaxHeartbeatsPerSecond float64
	// FailoverHeartbeatTTL is the TTL a new leader gives every node before
	// it has heard from it: generous, so that a failover does not mark
	// nodes down in bulk (server.failover_heartbeat_ttl).
	FailoverHeartbeatTTL time.Duration
	// ServerStabilizationTime is how long a joining server must be healthy
	// before autopilot promotes it to a voter
	// (server.server_stabilization_time).
	ServerStabilizationTime time.Duration
}

// ServerTuning holds the server role's timings and sizes that no key
// sets. Like Retry, they are no part of Config: DefaultServerTuning
// returns them.
type ServerTuning struct {
	// RPCTimeout bounds one server-to-server or ClientCSI call.
	RPCTimeout time.Duration
	// ApplyTimeout bounds one raft apply.
	ApplyTimeout time.Duration
	// DeadServerTimeout is how long a server must be unreachable before
	// autopilot may remove it from the configuration.
	DeadServerTimeout time.Duration

	// SnapshotThreshold is the number of log entries between raft
	// snapshots; SnapshotInterval how often raft checks whether to take
	// one; TrailingLogs how many entries stay after a snapshot, so that a
	// slow follower catches up without one.
	SnapshotThreshold uint64
	SnapshotInterval  time.Duration
	TrailingLogs      uint64

	// EventBufferSize is how many applied raft entries with cluster events
	// the server keeps for WatchEvents to replay and to resume from.
	// Entries without events take no room.
	EventBufferSize int
	// EventMaxLag is how many entries a WatchEvents stream that followed
	// the newest may trail them by before it is ended with the
	// EventsFellBehind error naming the index to resume from. It is less
	// than EventBufferSize, so that the entries after the resume index are
	// still buffered when a stream is ended.
	EventMaxLag int

	// VolumeWatchInterval is how often the leader's volume watcher looks
	// for releases to resume and claims to collect. It is also the first
	// delay of a claim whose release step failed; the delay doubles with
	// each failure, up to MaxVolumeWatchBackoff.
	VolumeWatchInterval time.Duration
}

// MaxVolumeWatchBackoff caps the delay between two attempts of a failing
// release step.
const MaxVolumeWatchBackoff = 30 * time.Second

// DefaultServerSettings returns the production settings of the server
// role: the keys' defaults and DefaultServerTuning. BootstrapExpect is
// zero: the operator says how many servers form the cluster.
func DefaultServerSettings() ServerSettings {
	return ServerSettings{
		ServerKeys: ServerKeys{
			RaftMultiplier:          DefaultRaftMultiplier,
			ClaimGCGrace:            DefaultClaimGCGrace,
			ClaimResumeTimeout:      DefaultClaimResumeTimeout,
			VolumeHealthInterval:    DefaultVolumeHealthInterval,
			HeartbeatGrace:          DefaultHeartbeatGrace,
			MinHeartbeatTTL:         DefaultMinHeartbeatTTL,
			MaxHeartbeatsPerSecond:  DefaultMaxHeartbeatsPerSecond,
			FailoverHeartbeatTTL:    DefaultFailoverHeartbeatTTL,
			ServerStabilizationTime: DefaultServerStabilizationTime,
		},
		ServerTuning: DefaultServerTuning(),
	}
}

// DefaultServerTuning returns the production timings and sizes of the
// server role that no key sets.
func DefaultServerTuning() ServerTuning {
	return ServerTuning{
		RPCTimeout:          10 * time.Second,
		ApplyTimeout:        10 * time.Second,
		DeadServerTimeout:   30 * time.Second,
		SnapshotThreshold:   8192,
		SnapshotInterval:    120 * time.Second,
		TrailingLogs:        10240,
		EventBufferSize:     1024,
		EventMaxLag:         768,
		VolumeWatchInterval: time.Second,
	}
}

// ServerSettings returns the server role's settings of c: its server
// block's keys and DefaultServerTuning.
func (c *Config) ServerSettings() ServerSettings {
	return ServerSettings{ServerKeys: c.Server.ServerKeys, ServerTuning: DefaultServerTuning()}
}

// Validate reports every setting of t that is out of range, by name.
func (t ServerSettings) Validate() error {
	var errs []error
	if t.BootstrapExpect < 1 {
		errs = append(errs, fmt.Errorf("server: bootstrap_expect = %d, must be at least 1", t.BootstrapExpect))
	}
	for _, a := range t.RetryJoin {
		if _, _, err := net.SplitHostPort(a); err != nil {
			errs = append(errs, fmt.Errorf("server: retry_join address %q: %w", a, err))
		}
	}
	if t.RaftMultiplier < 1 || t.RaftMultiplier > 10 {
		errs = append(errs, fmt.Errorf("server: raft_multiplier = %d, must be between 1 and 10", t.RaftMultiplier))
	}
	for _, d := range []struct {
		name  string
		value time.Duration
	}{
		{"RPCTimeout", t.RPCTimeout}, {"ApplyTimeout", t.ApplyTimeout},
		{"MinHeartbeatTTL", t.MinHeartbeatTTL}, {"HeartbeatGrace", t.HeartbeatGrace},
		{"FailoverHeartbeatTTL", t.FailoverHeartbeatTTL}, {"DeadServerTimeout", t.DeadServerTimeout},
		{"ServerStabilizationTime", t.ServerStabilizationTime}, {"SnapshotInterval", t.SnapshotInterval},
		{"ClaimGCGrace", t.ClaimGCGrace}, {"ClaimResumeTimeout", t.ClaimResumeTimeout},
		{"VolumeWatchInterval", t.VolumeWatchInterval},
	} {
		if d.value <= 0 {
			errs = append(errs, fmt.Errorf("server tuning: %s must be positive, got %s", d.name, d.value))
		}
	}
	if !(t.MaxHeartbeatsPerSecond > 0) {
		errs = append(errs, fmt.Errorf("server tuning: MaxHeartbeatsPerSecond must be positive, got %v", t.MaxHeartbeatsPerSecond))
	}
	if t.VolumeHealthInterval < 0 {
		errs = append(errs, fmt.Errorf("server tuning: VolumeHealthInterval must not be negative, got %s", t.VolumeHealthInterval))
	}
	if t.SnapshotThreshold == 0 {
		errs = append(errs, errors.New("server tuning: SnapshotThreshold must be positive"))
	}
	if t.TrailingLogs == 0 {
		errs = append(errs, errors.New("server tuning: TrailingLogs must be positive"))
	}
	if t.VolumeWatchInterval > MaxVolumeWatchBackoff {
		errs = append(errs, fmt.Errorf("server tuning: VolumeWatchInterval = %s is more than the watcher's backoff cap %s", t.VolumeWatchInterval, MaxVolumeWatchBackoff))
	}
	if t.EventMaxLag < 1 || t.EventMaxLag >= t.EventBufferSize {
		errs = append(errs, fmt.Errorf("server tuning: EventMaxLag = %d with EventBufferSize = %d: the lag must be at least 1 and less than the buffer, so that a stream ended for lagging can resume without a gap", t.EventMaxLag, t.EventBufferSize))
	}
	return errors.Join(errs...)
}
