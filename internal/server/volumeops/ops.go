package volumeops

import (
	"errors"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/csisupd/csisupd/internal/keylock"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// Config names what the volume operations use, and nothing else.
type Config struct {
	// State returns the replicated state the operations read. Required.
	State func() *state.Store
	// Apply writes one command through raft on this leader and returns
	// its index; a LogBatch is one raft entry whose commands the FSM
	// applies in order, and its error is the first that a command was
	// refused with. Its errors are gRPC status errors: the caller maps
	// raft's (a lost leadership is NoLeader). Required.
	Apply func(e *statepb.LogEntry) (uint64, error)
	// ConfirmLeader checks with a quorum that this server still leads,
	// for an answer given from its own state without a raft write; its
	// error is a gRPC status. Required.
	ConfirmLeader func() error
	// Controllers calls controller RPCs through a node's agent. Required.
	Controllers ControllerClient
	// NodeVolumes mounts, unmounts, expands and lists volumes through a
	// node's agent. Required.
	NodeVolumes NodeVolumesClient
	// Nodes tells which nodes this leader heard from, and is told of the
	// nodes that answered a call. Required.
	Nodes Nodes
	// IsRetryable reports whether a controller call's error means the
	// next candidate should be tried. Defaults to DefaultIsRetryable.
	IsRetryable func(error) bool
	// KickWatcher wakes the leader's volume watcher before its next
	// interval: a failed claim and a draining volume leave it work.
	// Required.
	KickWatcher func()
	// AddLease gives a leased claim the leader took (or that a caller
	// claimed again) a full lease in the leader's lease table (package
	// leader's Leases.Add). Required.
	AddLease func(ref rules.Ref, claimIndex uint64, ttl time.Duration)
	// RPCTimeout bounds each call to a controller or a node's agent
	// (config.ServerTuning.RPCTimeout). Required.
	RPCTimeout time.Duration
	// ApplyTimeout bounds one raft write (config.ServerTuning.ApplyTimeout);
	// the volume watcher's loop is told it is busy for that long before
	// each. Required.
	ApplyTimeout time.Duration
}

// Ops runs the volume operations of a leader: create, register, delete,
// claim, release, snapshots, expansion, modification, health, drain and
// availability, capacity and the external listings, each through the
// controllers and node agents it routes to. Its methods are safe for
// concurrent use; the leader's volume watcher calls the steps it resumes
// (see package leader's VolumeWork).
type Ops struct {
	cfg    Config
	logger hclog.Logger

	// pluginLocks serialise create, register and delete per plugin.
	pluginLocks keylock.Set
	// volumeLocks serialise the work on one volume: claims, releases, the
	// volume watcher, and the writes of create, register and delete.
	volumeLocks keylock.Set
	// snapshotLocks serialise the work on one volume snapshot: its
	// create, its delete and the volume watcher.
	snapshotLocks keylock.Set
}

// New checks cfg and returns the volume operations over it, logging to
// logger (nil: nowhere).
func New(cfg Config, logger hclog.Logger) (*Ops, error) {
	var errs []error
	required := func(missing bool, field string) {
		if missing {
			errs = append(errs, errors.New("volume operations: "+field+" is required"))
		}
	}
	required(cfg.State == nil, "State")
	required(cfg.Apply == nil, "Apply")
	required(cfg.ConfirmLeader == nil, "ConfirmLeader")
	required(cfg.Controllers == nil, "Controllers")
	required(cfg.NodeVolumes == nil, "NodeVolumes")
	required(cfg.Nodes == nil, "Nodes")
	required(cfg.KickWatcher == nil, "KickWatcher")
	required(cfg.AddLease == nil, "AddLease")
	required(cfg.RPCTimeout <= 0, "a positive RPCTimeout")
	required(cfg.ApplyTimeout <= 0, "a positive ApplyTimeout")
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.IsRetryable == nil {
		cfg.IsRetryable = DefaultIsRetryable
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Ops{cfg: cfg, logger: logger}, nil
}

// VolumeLocks returns the locks of volumes, which the volume watcher
// takes before it calls a step of a volume's claims or expansion.
func (o *Ops) VolumeLocks() *keylock.Set { return &o.volumeLocks }
