package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	autopilot "github.com/hashicorp/raft-autopilot"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/keylock"
	"github.com/csisupd/csisupd/internal/server/fsm"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/stream"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// Server is one csisupd server: a raft member with the replicated state
// store, the Control, Cluster and ACL gRPC services, node heartbeat timers
// while it leads, and controller routing for volume operations.
type Server struct {
	cfg    Config
	logger hclog.Logger

	raft      *raft.Raft
	fsm       *fsm.FSM
	events    *fsm.Events
	logStore  *raftboltdb.BoltStore
	trans     *raft.NetworkTransport
	raftAddr  string
	hadState  bool
	leaderCh  chan bool
	autopilot *autopilot.Autopilot
	ap        *autopilotDelegate

	peersMu        sync.Mutex
	peerAddrs      map[string]string // server id -> rpc address, from PeerInfo
	lastDiscovered []string          // what DiscoverServers found last, for logs
	boot           bootstrapState    // known set and logged refusals, until formed

	bootstrapped atomic.Bool
	leaderReady  atomic.Bool

	conns       *connPool // to the other servers
	agentConns  *connPool // to agents (ClientCSI)
	heartbeats  *heartbeats
	controllers ControllerClient
	nodeVolumes NodeVolumesClient
	pluginLocks keylock.Set
	// volumeLocks serialise the work on one volume: claims, releases, the
	// volume watcher, and the writes of create, register and delete.
	volumeLocks keylock.Set
	// volumeKick wakes the volume watcher before its next interval.
	volumeKick chan struct{}

	// opsMu, closing and ops let Shutdown wait for callers blocked on raft
	// futures before raft stops: a future queued at the moment raft shuts
	// down is never answered.
	opsMu   sync.RWMutex
	closing bool
	ops     sync.WaitGroup

	batchCh chan batchReq

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
	events, err := fsm.NewEvents(stream.Config{Size: cfg.EventBufferSize, MaxLag: cfg.EventMaxLag}, logger.Named("events"))
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}

	s := &Server{
		cfg:        cfg,
		logger:     logger,
		events:     events,
		leaderCh:   make(chan bool, 10),
		conns:      newConnPool(cfg.Connect, cfg.DialOptions),
		agentConns: newConnPool(cfg.Connect, cfg.agentDialOptions()),
		volumeKick: make(chan struct{}, 1),
		shutdownCh: make(chan struct{}),
		peerAddrs:  map[string]string{},
		batchCh:    make(chan batchReq),
	}
	s.controllers = cfg.Controllers
	if s.controllers == nil {
		s.controllers = &grpcControllers{conns: s.agentConns}
	}
	s.nodeVolumes = cfg.NodeVolumes
	if s.nodeVolumes == nil {
		s.nodeVolumes = &grpcNodeVolumes{conns: s.agentConns}
	}
	s.heartbeats = newHeartbeats(s)
	// Before raft starts, so raft's first metrics reach the sink.
	if s.metrics, err = newServerMetrics(s, cfg.Metrics); err != nil {
		return nil, err
	}
	if err := s.setupRaft(); err != nil {
		s.metrics.close()
		return nil, err
	}
	s.ap = &autopilotDelegate{s: s, lastSeen: map[raft.ServerID]time.Time{}, answers: map[raft.ServerID]statsAnswer{}}
	s.autopilot = autopilot.New(s.raft, s.ap,
		autopilot.WithLogger(logger.Named("autopilot")),
		autopilot.WithPromoter(&stablePromoter{}),
		autopilot.WithReconcileInterval(s.cfg.Join.Base),
		autopilot.WithUpdateInterval(s.cfg.Join.Base),
	)
	return s, nil
}

func (s *Server) setupRaft() (err error) {
	dir := RaftDir(s.cfg.DataDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("server: create raft dir %s: %w", dir, err)
	}
	// A restore on the leader (an operator's snapshot restore) must make
	// the leader forget which nodes it heard from.
	f, err := fsm.New(fsm.Config{Events: s.events, OnRestore: s.heartbeats.restored})
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	s.fsm = f

	dbPath := filepath.Join(dir, raftDBName)
	store, err := raftboltdb.New(raftboltdb.Options{Path: dbPath})
	if err != nil {
		return fmt.Errorf("server: open raft store %s: %w", dbPath, err)
	}
	defer func() {
		if err != nil {
			store.Close()
		}
	}()
	s.logStore = store
	logs, err := raft.NewLogCache(1024, store)
	if err != nil {
		return fmt.Errorf("server: raft log cache: %w", err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, 2, s.logger.Named("snapshot"))
	if err != nil {
		return fmt.Errorf("server: open snapshot store in %s: %w", dir, err)
	}
	s.hadState, err = raft.HasExistingState(logs, store, snaps)
	if err != nil {
		return fmt.Errorf("server: read raft state in %s: %w", dir, err)
	}

	layer := s.cfg.RaftLayer
	if layer == nil {
		if layer, err = newTCPLayer(s.cfg.RaftAddr); err != nil {
			return err
		}
	}
	if s.cfg.TLS != nil {
		layer = newTLSLayer(layer, s.cfg.TLS, s.logger.Named("raft-tls"))
	}
	s.trans = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  newClosingLayer(layer),
		MaxPool: 3,
		Timeout: s.cfg.RPCTimeout,
		Logger:  s.logger.Named("raft-net"),
	})
	s.raftAddr = string(s.trans.LocalAddr())

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(s.cfg.ID)
	rc.Logger = raftLogger{s.logger.Named("raft")}
	m := time.Duration(s.cfg.RaftMultiplier)
	rc.HeartbeatTimeout = 200 * time.Millisecond * m
	rc.ElectionTimeout = 200 * time.Millisecond * m
	rc.LeaderLeaseTimeout = 100 * time.Millisecond * m
	rc.SnapshotThreshold = s.cfg.SnapshotThreshold
	rc.SnapshotInterval = s.cfg.SnapshotInterval
	rc.TrailingLogs = s.cfg.TrailingLogs
	rc.BatchApplyCh = true
	rc.MaxAppendEntries = 512
	rc.NotifyCh = s.leaderCh
	// Only the labelled form of raft's per-peer metrics: the legacy form
	// puts the peer's server id into the metric's name.
	rc.NoLegacyTelemetry = true
	// A peers.json replaces the configuration before raft reads it.
	if err := s.recoverFromPeersFile(rc, dir, logs, store, snaps); err != nil {
		s.trans.Close()
		return err
	}
	r, err := raft.NewRaft(rc, s.fsm, logs, store, snaps, s.trans)
	if err != nil {
		s.trans.Close()
		return fmt.Errorf("server: start raft: %w", err)
	}
	s.raft = r
	if s.hadState {
		s.bootstrapped.Store(true)
	}
	return nil
}

// Register registers the Control, Cluster and ACL services on g.
func (s *Server) Register(g *grpc.Server) {
	csisupdv1.RegisterControlServer(g, &controlService{s: s})
	csisupdv1.RegisterClusterServer(g, &clusterService{s: s})
	csisupdv1.RegisterACLServer(g, &aclService{s: s})
}

// Start begins joining or bootstrapping the cluster and watching
// leadership. It returns immediately; ctx bounds nothing beyond the call.
func (s *Server) Start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.startOnce.Do(func() {
		s.wg.Add(3)
		go func() {
			defer s.wg.Done()
			s.monitorLeadership()
		}()
		go func() {
			defer s.wg.Done()
			s.runBatcher()
		}()
		go func() {
			defer s.wg.Done()
			s.runJoin()
		}()
	})
	return nil
}

// Shutdown stops the server. When this server is the leader of a cluster
// with other voters and ctx is not done, it first transfers leadership.
func (s *Server) Shutdown(ctx context.Context) error {
	var err error
	s.shutdownOnce.Do(func() {
		if ctx.Err() == nil && s.IsLeader() && s.voterCount() > 1 {
			s.logger.Info("transferring leadership before shutdown")
			done := make(chan error, 1)
			go func() { done <- s.raft.LeadershipTransfer().Error() }()
			select {
			case terr := <-done:
				if terr != nil {
					s.logger.Warn("leadership transfer failed", "error", terr)
				}
			case <-ctx.Done():
				s.logger.Warn("leadership transfer abandoned", "error", ctx.Err())
				<-done
			}
		}
		s.opsMu.Lock()
		s.closing = true
		s.opsMu.Unlock()
		drained := make(chan struct{})
		go func() {
			s.ops.Wait()
			close(drained)
		}()
		select {
		case <-drained:
		case <-time.After(s.cfg.ApplyTimeout):
			s.logger.Warn("raft operations still running at shutdown")
		}
		close(s.shutdownCh)
		if ferr := s.raft.Shutdown().Error(); ferr != nil {
			err = fmt.Errorf("server: raft shutdown: %w", ferr)
		}
		s.wg.Wait()
		s.heartbeats.stop()
		s.events.Close()
		s.conns.close()
		s.agentConns.close()
		if cerr := s.logStore.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("server: close raft store: %w", cerr)
		}
		s.metrics.close()
	})
	return err
}

// ID returns the server id.
func (s *Server) ID() string { return s.cfg.ID }

// RaftAddr returns the advertised raft address.
func (s *Server) RaftAddr() string { return s.raftAddr }

// IsLeader reports whether this server is the raft leader.
func (s *Server) IsLeader() bool { return s.raft.State() == raft.Leader }

// Bootstrapped reports whether this server has taken part in a formed
// cluster: it bootstrapped, joined, or started with raft state.
func (s *Server) Bootstrapped() bool {
	if s.bootstrapped.Load() {
		return true
	}
	if s.hasRaftState() {
		s.bootstrapped.Store(true)
		return true
	}
	return false
}

// Leader returns the id of the current leader, or "" when none is known.
func (s *Server) Leader() string {
	_, id := s.raft.LeaderWithID()
	return string(id)
}

// State returns the local replicated state. Reads from it may be stale on
// a follower.
func (s *Server) State() *state.Store { return s.fsm.State() }

// RaftStats returns raft's own counters (term, applied_index, ...).
func (s *Server) RaftStats() map[string]string { return s.raft.Stats() }

// AppliedIndex returns the index of the last log applied to the state.
func (s *Server) AppliedIndex() uint64 { return s.raft.AppliedIndex() }

// Term returns the current raft term.
func (s *Server) Term() uint64 {
	t, _ := strconv.ParseUint(s.raft.Stats()["term"], 10, 64)
	return t
}

// Configuration returns the current raft configuration.
func (s *Server) Configuration() (raft.Configuration, error) {
	f := s.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return raft.Configuration{}, fmt.Errorf("server: raft configuration: %w", err)
	}
	return f.Configuration(), nil
}

func (s *Server) voterCount() int {
	c, err := s.Configuration()
	if err != nil {
		return 0
	}
	n := 0
	for _, srv := range c.Servers {
		if srv.Suffrage == raft.Voter {
			n++
		}
	}
	return n
}

// hasRaftState reports whether raft has a configuration or any log.
func (s *Server) hasRaftState() bool {
	if s.raft.LastIndex() > 0 {
		return true
	}
	c, err := s.Configuration()
	return err == nil && len(c.Servers) > 0
}

// beginOp registers a caller that will wait on a raft future; it fails
// once Shutdown has begun.
func (s *Server) beginOp() (func(), error) {
	s.opsMu.RLock()
	defer s.opsMu.RUnlock()
	if s.closing {
		return nil, raft.ErrRaftShutdown
	}
	s.ops.Add(1)
	return s.ops.Done, nil
}

// raftOp runs fn, which creates a raft future, and waits for it, unless
// Shutdown has begun.
func (s *Server) raftOp(fn func() raft.Future) error {
	done, err := s.beginOp()
	if err != nil {
		return err
	}
	defer done()
	return fn().Error()
}

// apply writes one entry through raft on the leader and returns its index.
func (s *Server) apply(e *csisupdv1.LogEntry) (uint64, error) {
	res, err := s.applyRaw(e)
	if err != nil {
		return 0, err
	}
	return res.Index, res.Err
}

// applyRaw writes one entry through raft and returns the FSM's result.
func (s *Server) applyRaw(e *csisupdv1.LogEntry) (fsm.Result, error) {
	if e.Time == nil {
		e.Time = timestamppb.Now()
	}
	data, err := proto.Marshal(e)
	if err != nil {
		return fsm.Result{}, fmt.Errorf("encode log entry: %w", err)
	}
	done, err := s.beginOp()
	if err != nil {
		return fsm.Result{}, fmt.Errorf("raft apply: %w", err)
	}
	defer done()
	f := s.raft.Apply(data, s.cfg.ApplyTimeout)
	if err := f.Error(); err != nil {
		return fsm.Result{}, fmt.Errorf("raft apply: %w", err)
	}
	res, ok := f.Response().(fsm.Result)
	if !ok {
		return fsm.Result{Index: f.Index()}, nil
	}
	return res, nil
}

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
	for {
		loop.Beat()
		select {
		case <-loop.C():
		case isLeader := <-s.leaderCh:
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
// current, record this server, start heartbeat timers, autopilot and the
// volume watcher.
func (s *Server) leaderLoop(ctx context.Context) {
	s.logger.Info("cluster leadership acquired")
	defer s.logger.Info("cluster leadership lost")
	// Registered for this term only; Done runs after the teardown below,
	// so a teardown that hangs is seen.
	loop := s.cfg.Watchdog.Loop("server leader loop")
	defer loop.Done()
	retries := s.cfg.Join.NewBackOff()
	for {
		loop.Beat()
		if err := s.raftOp(func() raft.Future { return s.raft.Barrier(s.cfg.ApplyTimeout) }); err == nil {
			break
		} else {
			s.logger.Warn("leader barrier failed", "error", err)
		}
		if waitBeating(ctx, loop, retries.NextBackOff()) != nil {
			return
		}
	}
	rec := &csisupdv1.ServerRecord{Id: s.cfg.ID, RaftAddress: s.raftAddr, RpcAddress: s.cfg.RPCAddr}
	if cur := s.State().Server(s.cfg.ID); !proto.Equal(cur, rec) {
		if _, err := s.apply(&csisupdv1.LogEntry{Command: &csisupdv1.LogEntry_ServerUpsert{ServerUpsert: rec}}); err != nil {
			s.logger.Warn("record own server address", "error", err)
		}
	}
	s.bootstrapped.Store(true)
	s.ap.reset()
	s.heartbeats.initialize()
	s.leaderReady.Store(true)
	s.autopilot.Start(ctx)
	watcherDone := make(chan struct{})
	go func() {
		defer close(watcherDone)
		s.runVolumeWatcher(ctx)
	}()

	for ctx.Err() == nil {
		loop.Beat()
		select {
		case <-ctx.Done():
		case <-loop.C():
		}
	}
	s.leaderReady.Store(false)
	s.heartbeats.clear()
	<-s.autopilot.Stop()
	<-watcherDone
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

var errNoLeader = errors.New("no cluster leader")

// Ready reports whether this server is the leader and ready to serve
// leader-only requests: it has applied everything committed before it took
// over and started its heartbeat timers.
func (s *Server) Ready() bool { return s.IsLeader() && s.leaderReady.Load() }

// Raft returns the raft instance, for operator tooling and benchmarks of
// the raw raft path. Commands applied through it must be encoded
// csisupd.v1.LogEntry messages.
func (s *Server) Raft() *raft.Raft { return s.raft }
