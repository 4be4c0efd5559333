package server

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"google.golang.org/grpc"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/server/fsm"
	"github.com/csisupd/csisupd/internal/server/leader"
	"github.com/csisupd/csisupd/internal/server/raftnode"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
	"github.com/csisupd/csisupd/internal/server/volumeops"
)

// Server is one csisupd server: a raft member with the replicated state
// store, the Control, Cluster and ACL gRPC services, node heartbeat timers
// while it leads, and controller routing for volume operations.
type Server struct {
	cfg    Config
	logger hclog.Logger

	node   *raftnode.Node
	fwd    *forwarder
	fsm    *fsm.FSM
	events *fsm.Events

	leaderReady atomic.Bool

	conns      *connPool // to the other servers
	agentConns *connPool // to agents (ClientCSI)
	heartbeats *leader.Heartbeats
	// leases are the claim leases' timers while this server leads.
	leases  *leader.Leases
	watcher *leader.Watcher
	// ops runs the volume operations, for the Control service and the
	// volume watcher.
	ops *volumeops.Ops

	metrics *serverMetrics

	startOnce    sync.Once
	shutdownOnce sync.Once
	shutdownCh   chan struct{}
	wg           sync.WaitGroup
}

// New validates cfg, opens the raft stores in cfg.DataDir and starts the
// raft instance. The server does not join or bootstrap a cluster until Start.
func New(cfg Config, logger hclog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	logger = logger.Named("server").With("server", cfg.Name)
	events, err := fsm.NewEvents(cfg.eventBuffer(), logger.Named("events"))
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}

	s := &Server{
		cfg:        cfg,
		logger:     logger,
		events:     events,
		conns:      newConnPool(cfg.Connect, cfg.DialOptions),
		agentConns: newConnPool(cfg.Connect, cfg.agentDialOptions()),
		shutdownCh: make(chan struct{}),
	}
	// A restore on the leader (an operator's snapshot restore) must make
	// the leader forget which nodes it heard from.
	// The timers exist before raft starts, which may restore a snapshot;
	// they write through the raft node once it exists.
	s.heartbeats = leader.NewHeartbeats(leader.HeartbeatConfig{
		MinTTL:       cfg.MinHeartbeatTTL,
		MaxPerSecond: cfg.MaxHeartbeatsPerSecond,
		FailoverTTL:  cfg.FailoverHeartbeatTTL,
		Grace:        cfg.HeartbeatGrace,
		State:        s.State,
		Apply:        func(e *statepb.LogEntry) (uint64, error) { return s.node.ApplyBatched(e) },
	}, logger)
	if s.ops, err = volumeops.New(s.volumeOpsConfig(), logger); err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	// An expiry may wait for the volume's lock while a claim mounts (one
	// agent call), then writes once.
	s.leases = leader.NewLeases(leader.LeaseConfig{
		State:         s.State,
		Work:          s.ops,
		RetryInterval: cfg.VolumeWatchInterval,
		ExpireTimeout: cfg.RPCTimeout + cfg.ApplyTimeout,
	}, logger)
	s.watcher = leader.NewWatcher(leader.WatcherConfig{
		Interval:           cfg.VolumeWatchInterval,
		MaxBackoff:         config.MaxVolumeWatchBackoff,
		ClaimGCGrace:       cfg.ClaimGCGrace,
		State:              s.State,
		Locks:              s.ops.VolumeLocks(),
		ClaimResumeTimeout: cfg.ClaimResumeTimeout,
		Term:               func() uint64 { return s.node.Term() }, // read once leading; s.node is made below
		Work:               s.ops,
		Watchdog:           cfg.Watchdog,
	}, logger)
	// Before raft starts, so raft's first metrics reach the sink.
	if s.metrics, err = newServerMetrics(s, cfg.Metrics); err != nil {
		return nil, err
	}
	if s.fsm, err = fsm.New(fsm.Config{Events: events, OnRestore: func() {
		s.heartbeats.Restored()
		s.leases.Restored()
	}}); err != nil {
		s.metrics.close()
		return nil, fmt.Errorf("server: %w", err)
	}
	if s.node, err = raftnode.New(cfg.raftNode(s.fsm, s.serverConn), logger); err != nil {
		s.metrics.close()
		return nil, err
	}
	s.fwd = &forwarder{id: cfg.ID, leader: cfg.Name + " at " + cfg.RPCAddr, node: s.node, ready: &s.leaderReady, conns: s.conns, count: s.metrics.countForwarded}
	return s, nil
}

// volumeOpsConfig is what the volume operations use of this server: its
// state, its raft writes and leadership check, the clients of the agents
// (gRPC over the pool of connections to agents unless the config gives
// its own), the heartbeat timers' record of the nodes heard from, and the
// volume watcher's wake-up.
func (s *Server) volumeOpsConfig() volumeops.Config {
	cfg := volumeops.Config{
		State: s.State,
		// Grouped with the concurrent writes of other volumes, node
		// updates and heartbeats into one raft entry: each caller still
		// returns only once its own command is committed and applied.
		Apply: func(e *statepb.LogEntry) (uint64, error) {
			index, err := s.node.ApplyBatched(e)
			return index, toStatus(err)
		},
		ConfirmLeader: func() error { return s.fwd.consistentRead() },
		Controllers:   s.cfg.Controllers,
		NodeVolumes:   s.cfg.NodeVolumes,
		Nodes:         s.heartbeats,
		IsRetryable:   s.cfg.IsRetryable,
		KickWatcher:   func() { s.watcher.Kick() },
		AddLease:      func(ref rules.Ref, claimIndex uint64, ttl time.Duration) { s.leases.Add(ref, claimIndex, ttl) },
		RPCTimeout:    s.cfg.RPCTimeout,
		ApplyTimeout:  s.cfg.ApplyTimeout,
	}
	if cfg.Controllers == nil {
		cfg.Controllers = &grpcControllers{conns: s.agentConns}
	}
	if cfg.NodeVolumes == nil {
		cfg.NodeVolumes = &grpcNodeVolumes{conns: s.agentConns}
	}
	return cfg
}

// serverConn returns the pooled connection to the server at addr.
func (s *Server) serverConn(addr string) (grpc.ClientConnInterface, error) {
	return s.conns.get(addr)
}

// Register registers the Control, Cluster and ACL services on g.
func (s *Server) Register(g *grpc.Server) {
	csisupdv1.RegisterControlServer(g, &controlService{s: s, ops: s.ops})
	csisupdv1.RegisterClusterServer(g, &clusterService{id: s.cfg.ID, fwd: s.fwd, node: s.node, state: s.State,
		heartbeats: s.heartbeats, beats: s.metrics.heartbeats, ops: s.ops, leases: s.leases})
	csisupdv1.RegisterACLServer(g, &aclService{fwd: s.fwd, node: s.node, state: s.State, logger: s.logger,
		resetPath: filepath.Join(s.cfg.DataDir, ACLBootstrapResetFile)})
}

// Start begins joining or bootstrapping the cluster and watching
// leadership. It returns immediately; ctx bounds nothing beyond the call.
func (s *Server) Start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.startOnce.Do(func() {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.monitorLeadership()
		}()
		s.node.Start()
	})
	return nil
}

// Shutdown stops the server. When this server is the leader of a cluster
// with other voters and ctx is not done, it first transfers leadership.
func (s *Server) Shutdown(ctx context.Context) error {
	var err error
	s.shutdownOnce.Do(func() {
		err = s.node.Shutdown(ctx)
		close(s.shutdownCh)
		s.wg.Wait()
		s.heartbeats.Stop()
		s.leases.Stop()
		s.events.Close()
		s.conns.close()
		s.agentConns.close()
		if cerr := s.node.Close(); cerr != nil && err == nil {
			err = cerr
		}
		s.metrics.close()
	})
	return err
}

// ID returns the server id.
func (s *Server) ID() string { return s.cfg.ID }

// RaftAddr returns the advertised raft address.
func (s *Server) RaftAddr() string { return s.node.RaftAddr() }

// IsLeader reports whether this server is the raft leader.
func (s *Server) IsLeader() bool { return s.node.IsLeader() }

// Bootstrapped reports whether this server has taken part in a formed
// cluster: it bootstrapped, joined, or started with raft state.
func (s *Server) Bootstrapped() bool { return s.node.Bootstrapped() }

// Leader returns the id of the current leader, or "" when none is known.
func (s *Server) Leader() string { return s.node.Leader() }

// State returns the local replicated state. Reads from it may be stale on
// a follower.
func (s *Server) State() *state.Store { return s.fsm.State() }

// RaftStats returns raft's own counters (term, applied_index, ...).
func (s *Server) RaftStats() map[string]string { return s.node.Raft().Stats() }

// AppliedIndex returns the index of the last log applied to the state.
func (s *Server) AppliedIndex() uint64 { return s.node.Raft().AppliedIndex() }

// Term returns the current raft term.
func (s *Server) Term() uint64 { return s.node.Term() }

// Configuration returns the current raft configuration.
func (s *Server) Configuration() (raft.Configuration, error) { return s.node.Configuration() }

// Ready reports whether this server is the leader and ready to serve
// leader-only requests: it has applied everything committed before it took
// over and started its heartbeat timers.
func (s *Server) Ready() bool { return s.IsLeader() && s.leaderReady.Load() }

// Raft returns the raft instance, for operator tooling and benchmarks of
// the raw raft path. Commands applied through it must be statepb.LogEntry
// messages encoded by fsm.Encode.
func (s *Server) Raft() *raft.Raft { return s.node.Raft() }
