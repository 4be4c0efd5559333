package config

import (
	"errors"
	"fmt"
	"time"
)

// ServerTuning holds the server role's timings and sizes.
// DefaultServerTuning fills them in; the agent sets the ones that server
// keys configure (claim_gc_grace, the heartbeat keys,
// server_stabilization_time) and passes them to the server, which
// validates them and fills in none of its own. Tests shorten them.
type ServerTuning struct {
	// RPCTimeout bounds one server-to-server or ClientCSI call.
	RPCTimeout time.Duration
	// ApplyTimeout bounds one raft apply.
	ApplyTimeout time.Duration

	// MinHeartbeatTTL is the smallest node heartbeat TTL. It and the
	// other heartbeat fields come from the server keys of the same names
	// (server.min_heartbeat_ttl, ...).
	MinHeartbeatTTL time.Duration
	// HeartbeatGrace is added to the TTL before a node is marked down.
	HeartbeatGrace time.Duration
	// FailoverHeartbeatTTL is the TTL a new leader gives every node before
	// it has heard from them: generous, so that a failover does not mark
	// nodes down in bulk.
	FailoverHeartbeatTTL time.Duration
	// MaxHeartbeatsPerSecond scales the TTL with the node count.
	MaxHeartbeatsPerSecond float64

	// DeadServerTimeout is how long a server must be unreachable before
	// autopilot may remove it from the configuration.
	DeadServerTimeout time.Duration
	// ServerStabilizationTime is how long a server must be healthy before
	// autopilot considers it stable and promotes a non-voter to a voter
	// (server.server_stabilization_time).
	ServerStabilizationTime time.Duration

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

	// ClaimGCGrace is how long a node may be down before the leader
	// releases its volume claims without it: through the controller only,
	// leaving the node's agent to clean up its mounts when it returns.
	// The agent fills it from server.claim_gc_grace.
	ClaimGCGrace time.Duration
	// ClaimResumeTimeout is how long a claim may stay taken but not
	// mounted before the leader's volume watcher finishes it, or releases
	// it when a step fails: long enough for the caller that took it to
	// learn the outcome by claiming again. The agent fills it from
	// server.claim_resume_timeout.
	ClaimResumeTimeout time.Duration
	// VolumeWatchInterval is how often the leader's volume watcher looks
	// for releases to resume and claims to collect. It is also the first
	// delay of a claim whose release step failed; the delay doubles with
	// each failure, up to MaxVolumeWatchBackoff.
	VolumeWatchInterval time.Duration
	// VolumeHealthInterval is how often the leader lists the volumes'
	// health from the plugins' controllers; 0 turns it off. The agent
	// fills it from server.volume_health_interval.
	VolumeHealthInterval time.Duration
}

// MaxVolumeWatchBackoff caps the delay between two attempts of a failing
// release step.
const MaxVolumeWatchBackoff = 30 * time.Second

// DefaultServerTuning returns the production timings and sizes of the
// server role.
func DefaultServerTuning() ServerTuning {
	return ServerTuning{
		RPCTimeout:              10 * time.Second,
		ApplyTimeout:            10 * time.Second,
		MinHeartbeatTTL:         DefaultMinHeartbeatTTL,
		HeartbeatGrace:          DefaultHeartbeatGrace,
		FailoverHeartbeatTTL:    DefaultFailoverHeartbeatTTL,
		MaxHeartbeatsPerSecond:  DefaultMaxHeartbeatsPerSecond,
		DeadServerTimeout:       30 * time.Second,
		ServerStabilizationTime: DefaultServerStabilizationTime,
		SnapshotThreshold:       8192,
		SnapshotInterval:        120 * time.Second,
		TrailingLogs:            10240,
		EventBufferSize:         1024,
		EventMaxLag:             768,
		ClaimGCGrace:            DefaultClaimGCGrace,
		ClaimResumeTimeout:      DefaultClaimResumeTimeout,
		VolumeWatchInterval:     time.Second,
		VolumeHealthInterval:    DefaultVolumeHealthInterval,
	}
}

// Validate reports every field of t that is out of range, by name.
func (t ServerTuning) Validate() error {
	var errs []error
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
