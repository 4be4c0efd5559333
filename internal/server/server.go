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
	"github.com/csisupd/csisupd/internal/keylock"
	"github.com/csisupd/csisupd/internal/server/fsm"
	"github.com/csisupd/csisupd/internal/server/leader"
	"github.com/csisupd/csisupd/internal/server/raftnode"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
	"github.com/csisupd/csisupd/internal/watchdog"
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

	conns       *connPool // to the other servers
	agentConns  *connPool // to agents (ClientCSI)
	heartbeats  *leader.Heartbeats
	watcher     *leader.Watcher
	controllers ControllerClient
	nodeVolumes NodeVolumesClient
	pluginLocks keylock.Set
	// volumeLocks serialise the work on one volume: claims, releases, the
	// volume watcher, and the writes of create, register and delete.
	volumeLocks keylock.Set
	// snapshotLocks serialise the work on one volume snapshot: its
	// create, its delete and the volume watcher.
	snapshotLocks keylock.Set

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
	s.controllers = cfg.Controllers
	if s.controllers == nil {
		s.controllers = &grpcControllers{conns: s.agentConns}
	}
	s.nodeVolumes = cfg.NodeVolumes
	if s.nodeVolumes == nil {
		s.nodeVolumes = &grpcNodeVolumes{conns: s.agentConns}
	}
	s.watcher = leader.NewWatcher(leader.WatcherConfig{
		Interval:           cfg.VolumeWatchInterval,
		MaxBackoff:         config.MaxVolumeWatchBackoff,
		ClaimGCGrace:       cfg.ClaimGCGrace,
		State:              s.State,
		Locks:              &s.volumeLocks,
		ClaimResumeTimeout: cfg.ClaimResumeTimeout,
		ReleaseWithoutNode: s.releaseWithoutNode,
		StartRelease:       s.startRelease,
		Release:            s.resumeRelease,
		Finish:             s.resumeClaim,
		FollowSnapshot:     s.followSnapshot,
		ResumeExpansion:    s.resumeExpansion,
		Watchdog:           cfg.Watchdog,
	}, logger)
	// Before raft starts, so raft's first metrics reach the sink.
	if s.metrics, err = newServerMetrics(s, cfg.Metrics); err != nil {
		return nil, err
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
	if s.fsm, err = fsm.New(fsm.Config{Events: events, OnRestore: s.heartbeats.Restored}); err != nil {
		s.metrics.close()
		return nil, fmt.Errorf("server: %w", err)
	}
	if s.node, err = raftnode.New(cfg.raftNode(s.fsm, s.serverConn), logger); err != nil {
		s.metrics.close()
		return nil, err
	}
	s.fwd = &forwarder{id: cfg.ID, node: s.node, ready: &s.leaderReady, conns: s.conns, count: s.metrics.countForwarded}
	return s, nil
}

// serverConn returns the pooled connection to the server at addr.
func (s *Server) serverConn(addr string) (grpc.ClientConnInterface, error) {
	return s.conns.get(addr)
}

// Register registers the Control, Cluster and ACL services on g.
func (s *Server) Register(g *grpc.Server) {
	csisupdv1.RegisterControlServer(g, &controlService{s: s})
	csisupdv1.RegisterClusterServer(g, &clusterService{id: s.cfg.ID, fwd: s.fwd, node: s.node, state: s.State,
		heartbeats: s.heartbeats, beats: s.metrics.heartbeats})
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

func (s *Server) monitorLeadership() {
	loop := s.cfg.Watchdog.Loop("server leadership monitor")
	defer loop.Done()
	type run struct {
		cancel context.CancelFunc
		done   chan struct{}
	}
	var cur *run
	stop := func() {
		if cur != nil {
			cur.cancel()
			<-cur.done
			cur = nil
		}
	}
	defer stop()
	// A follower's watcher keeps its observations current, so that the
	// grace periods go on counting if this server takes over.
	observe := time.NewTicker(s.cfg.VolumeWatchInterval)
	defer observe.Stop()
	for {
		loop.Beat()
		select {
		case <-loop.C():
		case <-observe.C:
			if cur == nil {
				s.watcher.Observe(time.Now())
			}
		case isLeader := <-s.node.LeaderCh():
			if isLeader && cur == nil {
				ctx, cancel := context.WithCancel(context.Background())
				cur = &run{cancel: cancel, done: make(chan struct{})}
				go func(done chan struct{}) {
					defer close(done)
					s.leaderLoop(ctx)
				}(cur.done)
			} else if !isLeader {
				stop()
			}
		case <-s.shutdownCh:
			return
		}
	}
}

// leaderLoop runs the leader's duties until ctx ends: make the state
// current, record this server, start heartbeat timers, autopilot, the
// volume watcher and the volume health monitor.
func (s *Server) leaderLoop(ctx context.Context) {
	s.logger.Info("cluster leadership acquired")
	defer s.logger.Info("cluster leadership lost")
	// Registered for this term only; Done runs after the teardown below,
	// so a teardown that hangs is seen.
	loop := s.cfg.Watchdog.Loop("server leader loop")
	defer loop.Done()
	retries := s.cfg.Join.NewBackOff()
	for {
		loop.Busy(time.Now().Add(s.cfg.ApplyTimeout))
		if err := s.node.RaftOp(func() raft.Future { return s.node.Raft().Barrier(s.cfg.ApplyTimeout) }); err == nil {
			break
		} else {
			s.logger.Warn("leader barrier failed", "error", err)
		}
		if waitBeating(ctx, loop, retries.NextBackOff()) != nil {
			return
		}
	}
	loop.Busy(time.Now().Add(s.cfg.ApplyTimeout))
	if err := s.node.RecordSelf(); err != nil {
		s.logger.Warn("record own server address", "error", err)
	}
	s.node.MarkBootstrapped()
	s.heartbeats.Initialize()
	s.leaderReady.Store(true)
	s.node.StartAutopilot(ctx)
	watcherDone := make(chan struct{})
	go func() {
		defer close(watcherDone)
		s.watcher.Run(ctx)
	}()
	healthDone := make(chan struct{})
	go func() {
		defer close(healthDone)
		s.runHealthMonitor(ctx)
	}()

	for ctx.Err() == nil {
		loop.Beat()
		select {
		case <-ctx.Done():
		case <-loop.C():
		}
	}
	s.leaderReady.Store(false)
	s.heartbeats.Clear()
	<-s.node.StopAutopilot()
	<-watcherDone
	<-healthDone
}

// waitBeating waits for d like retry.Wait, beating loop meanwhile.
func waitBeating(ctx context.Context, loop *watchdog.Loop, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		loop.Beat()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			return nil
		case <-loop.C():
		}
	}
}

// Ready reports whether this server is the leader and ready to serve
// leader-only requests: it has applied everything committed before it took
// over and started its heartbeat timers.
func (s *Server) Ready() bool { return s.IsLeader() && s.leaderReady.Load() }

// Raft returns the raft instance, for operator tooling and benchmarks of
// the raw raft path. Commands applied through it must be statepb.LogEntry
// messages encoded by fsm.Encode.
func (s *Server) Raft() *raft.Raft { return s.node.Raft() }
