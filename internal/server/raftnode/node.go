package raftnode

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
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/retry"
	"github.com/csisupd/csisupd/internal/server/fsm"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
	"github.com/csisupd/csisupd/internal/stream"
	"github.com/csisupd/csisupd/internal/tlsutil"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// Discover returns the gRPC addresses (host:port) of the servers as they
// are known now, for servers that find them through a catalog instead of
// a fixed list.
type Discover func(ctx context.Context) ([]string, error)

// ErrNoLeader is returned (wrapped) when no cluster leader is known.
var ErrNoLeader = errors.New("no cluster leader")

// Config configures a Node. The server fills it from its own config,
// which it has validated; fields marked optional may be left zero.
type Config struct {
	// ServerSettings are the server's settings, as the server holds them:
	// BootstrapExpect, RetryJoin and RaftMultiplier; RPCTimeout bounds one
	// call to another server, ApplyTimeout one raft apply and how long a
	// shutdown waits for the callers blocked on raft; SnapshotThreshold,
	// SnapshotInterval and TrailingLogs are raft's; autopilot gives a
	// joined server a vote after ServerStabilizationTime and removes one
	// that has not answered for DeadServerTimeout.
	config.ServerSettings

	// ID is the raft server id, unique in the cluster and stable across
	// restarts.
	ID string
	// DataDir holds the raft directory (RaftDir).
	DataDir string
	// RaftAddr is the host:port raft binds to and advertises, unless
	// RaftLayer is set.
	RaftAddr string
	// RaftLayer, optional, carries raft traffic instead of a TCP transport
	// bound to RaftAddr. Its Addr() is advertised.
	RaftLayer raft.StreamLayer
	// TLS, optional, makes every raft connection TLS with server
	// certificates.
	TLS *tlsutil.Configurator
	// RPCAddr is the advertised gRPC address of this server.
	RPCAddr string
	// DiscoverServers, optional, finds the other servers at each attempt
	// when RetryJoin is empty.
	DiscoverServers Discover
	// Join spaces the join and bootstrap attempts and the checks of this
	// server's address record; its Base is also autopilot's interval.
	Join retry.Policy
	// RaftLogLevel, optional, is the least level of the raft library's own
	// lines (its core, transport and snapshot store): lines below it are
	// dropped whatever the logger's level. NoLevel, the zero value, leaves
	// them to the logger's level.
	RaftLogLevel hclog.Level

	// FSM is the state machine raft applies the log to. Required.
	FSM *fsm.FSM
	// ScratchEvents sizes the event buffer of the scratch FSM a peers.json
	// recovery replays the log into.
	ScratchEvents stream.Config
	// Conn returns a connection to the server at a gRPC address, for the
	// Cluster calls of joins and autopilot. Required.
	Conn func(addr string) (grpc.ClientConnInterface, error)
	// Watchdog, optional, tracks the write batcher and the join loop.
	Watchdog *watchdog.Monitor
}

// Node is one server's raft member: the raft instance over its stores
// and transport, the join and bootstrap loop, the write batcher, and the
// leader's autopilot.
type Node struct {
	cfg    Config
	logger hclog.Logger

	raft      *raft.Raft
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

	// opsMu, closing and ops let Shutdown wait for callers blocked on raft
	// futures before raft stops: a future queued at the moment raft shuts
	// down is never answered.
	opsMu   sync.RWMutex
	closing bool
	ops     sync.WaitGroup

	batchCh chan batchReq

	startOnce sync.Once
	stopOnce  sync.Once
	stopCh    chan struct{}
	wg        sync.WaitGroup
}

// New opens the raft stores in the data dir, applies a pending peers.json
// and starts the raft instance. The node does not join or bootstrap a
// cluster until Start.
func New(cfg Config, logger hclog.Logger) (*Node, error) {
	if cfg.FSM == nil || cfg.Conn == nil {
		return nil, errors.New("raftnode: FSM and Conn are required")
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	n := &Node{
		cfg:       cfg,
		logger:    logger,
		leaderCh:  make(chan bool, 10),
		peerAddrs: map[string]string{},
		batchCh:   make(chan batchReq),
		stopCh:    make(chan struct{}),
	}
	if err := n.setupRaft(); err != nil {
		return nil, err
	}
	n.ap = &autopilotDelegate{n: n, lastSeen: map[raft.ServerID]time.Time{}, answers: map[raft.ServerID]statsAnswer{}}
	n.autopilot = autopilot.New(n.raft, n.ap,
		autopilot.WithLogger(logger.Named("autopilot")),
		autopilot.WithPromoter(&stablePromoter{}),
		autopilot.WithReconcileInterval(cfg.Join.Base),
		autopilot.WithUpdateInterval(cfg.Join.Base),
	)
	return n, nil
}

func (n *Node) setupRaft() (err error) {
	dir := RaftDir(n.cfg.DataDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("server: create raft dir %s: %w", dir, err)
	}
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
	n.logStore = store
	logs, err := raft.NewLogCache(1024, store)
	if err != nil {
		return fmt.Errorf("server: raft log cache: %w", err)
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(dir, 2, newRaftLogger(n.logger.Named("snapshot"), n.cfg.RaftLogLevel))
	if err != nil {
		return fmt.Errorf("server: open snapshot store in %s: %w", dir, err)
	}
	n.hadState, err = raft.HasExistingState(logs, store, snaps)
	if err != nil {
		return fmt.Errorf("server: read raft state in %s: %w", dir, err)
	}

	layer := n.cfg.RaftLayer
	if layer == nil {
		if layer, err = newTCPLayer(n.cfg.RaftAddr); err != nil {
			return err
		}
	}
	if n.cfg.TLS != nil {
		layer = newTLSLayer(layer, n.cfg.TLS, n.logger.Named("raft-tls"))
	}
	n.trans = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:  newClosingLayer(layer),
		MaxPool: 3,
		Timeout: n.cfg.RPCTimeout,
		Logger:  newRaftLogger(n.logger.Named("raft-net"), n.cfg.RaftLogLevel),
	})
	n.raftAddr = string(n.trans.LocalAddr())

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(n.cfg.ID)
	rc.Logger = newRaftLogger(n.logger.Named("raft"), n.cfg.RaftLogLevel)
	m := time.Duration(n.cfg.RaftMultiplier)
	rc.HeartbeatTimeout = 200 * time.Millisecond * m
	rc.ElectionTimeout = 200 * time.Millisecond * m
	rc.LeaderLeaseTimeout = 100 * time.Millisecond * m
	rc.SnapshotThreshold = n.cfg.SnapshotThreshold
	rc.SnapshotInterval = n.cfg.SnapshotInterval
	rc.TrailingLogs = n.cfg.TrailingLogs
	rc.BatchApplyCh = true
	rc.MaxAppendEntries = 512
	rc.NotifyCh = n.leaderCh
	// Only the labelled form of raft's per-peer metrics: the legacy form
	// puts the peer's server id into the metric's name.
	rc.NoLegacyTelemetry = true
	// A peers.json replaces the configuration before raft reads it.
	if err := n.recoverFromPeersFile(rc, dir, logs, store, snaps); err != nil {
		n.trans.Close()
		return err
	}
	r, err := raft.NewRaft(rc, n.cfg.FSM, logs, store, snaps, n.trans)
	if err != nil {
		n.trans.Close()
		return fmt.Errorf("server: start raft: %w", err)
	}
	n.raft = r
	if n.hadState {
		n.bootstrapped.Store(true)
	}
	return nil
}

// Start begins the write batcher and joining or bootstrapping the cluster.
func (n *Node) Start() {
	n.startOnce.Do(func() {
		n.wg.Add(2)
		go func() {
			defer n.wg.Done()
			n.runBatcher()
		}()
		go func() {
			defer n.wg.Done()
			n.runJoin()
		}()
	})
}

// Shutdown stops the node's loops and raft; Close closes its store once
// nothing uses raft any more. When this node leads a cluster with other
// voters and ctx is not done, it first transfers leadership. Callers
// blocked on raft are given ApplyTimeout to finish.
func (n *Node) Shutdown(ctx context.Context) error {
	var err error
	n.stopOnce.Do(func() {
		if ctx.Err() == nil && n.IsLeader() && n.voterCount() > 1 {
			n.logger.Info("transferring leadership before shutdown")
			done := make(chan error, 1)
			go func() { done <- n.raft.LeadershipTransfer().Error() }()
			select {
			case terr := <-done:
				if terr != nil {
					n.logger.Warn("leadership transfer failed", "error", terr)
				}
			case <-ctx.Done():
				n.logger.Warn("leadership transfer abandoned", "error", ctx.Err())
				<-done
			}
		}
		n.opsMu.Lock()
		n.closing = true
		n.opsMu.Unlock()
		drained := make(chan struct{})
		go func() {
			n.ops.Wait()
			close(drained)
		}()
		select {
		case <-drained:
		case <-time.After(n.cfg.ApplyTimeout):
			n.logger.Warn("raft operations still running at shutdown")
		}
		close(n.stopCh)
		if ferr := n.raft.Shutdown().Error(); ferr != nil {
			err = fmt.Errorf("server: raft shutdown: %w", ferr)
		}
		n.wg.Wait()
	})
	return err
}

// Close closes the raft store; call it after Shutdown.
func (n *Node) Close() error {
	if err := n.logStore.Close(); err != nil {
		return fmt.Errorf("server: close raft store: %w", err)
	}
	return nil
}

// LeaderCh reports this node's leadership changes: true when it becomes
// leader, false when it stops being leader.
func (n *Node) LeaderCh() <-chan bool { return n.leaderCh }

// Stopped is closed when Shutdown begins to stop the node.
func (n *Node) Stopped() <-chan struct{} { return n.stopCh }

// State returns the local replicated state.
func (n *Node) State() *state.Store { return n.cfg.FSM.State() }

// RaftAddr returns the advertised raft address.
func (n *Node) RaftAddr() string { return n.raftAddr }

// IsLeader reports whether this node is the raft leader.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader }

// Raft returns the raft instance.
func (n *Node) Raft() *raft.Raft { return n.raft }

// Leader returns the id of the current leader, or "" when none is known.
func (n *Node) Leader() string {
	_, id := n.raft.LeaderWithID()
	return string(id)
}

// Term returns the current raft term.
func (n *Node) Term() uint64 {
	t, _ := strconv.ParseUint(n.raft.Stats()["term"], 10, 64)
	return t
}

// Bootstrapped reports whether this node has taken part in a formed
// cluster: it bootstrapped, joined, or started with raft state.
func (n *Node) Bootstrapped() bool {
	if n.bootstrapped.Load() {
		return true
	}
	if n.hasRaftState() {
		n.bootstrapped.Store(true)
		return true
	}
	return false
}

// MarkBootstrapped records that the cluster formed: this node leads it.
func (n *Node) MarkBootstrapped() { n.bootstrapped.Store(true) }

// Configuration returns the current raft configuration.
func (n *Node) Configuration() (raft.Configuration, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return raft.Configuration{}, fmt.Errorf("server: raft configuration: %w", err)
	}
	return f.Configuration(), nil
}

func (n *Node) voterCount() int {
	c, err := n.Configuration()
	if err != nil {
		return 0
	}
	count := 0
	for _, srv := range c.Servers {
		if srv.Suffrage == raft.Voter {
			count++
		}
	}
	return count
}

// hasRaftState reports whether raft has a configuration or any log.
func (n *Node) hasRaftState() bool {
	if n.raft.LastIndex() > 0 {
		return true
	}
	c, err := n.Configuration()
	return err == nil && len(c.Servers) > 0
}

// BeginOp registers a caller that will wait on raft; it fails once
// Shutdown has begun. The caller calls the returned func when done.
func (n *Node) BeginOp() (func(), error) {
	n.opsMu.RLock()
	defer n.opsMu.RUnlock()
	if n.closing {
		return nil, raft.ErrRaftShutdown
	}
	n.ops.Add(1)
	return n.ops.Done, nil
}

// RaftOp runs fn, which creates a raft future, and waits for it, unless
// Shutdown has begun.
func (n *Node) RaftOp(fn func() raft.Future) error {
	done, err := n.BeginOp()
	if err != nil {
		return err
	}
	defer done()
	return fn().Error()
}

// Apply writes one entry through raft on the leader and returns its index
// and the FSM's error; for a LogBatch, the first error of its entries (the
// others were applied).
func (n *Node) Apply(e *statepb.LogEntry) (uint64, error) {
	res, err := n.ApplyRaw(e)
	if err != nil {
		return 0, err
	}
	if res.Err == nil {
		for _, err := range res.Errs {
			if err != nil {
				return res.Index, err
			}
		}
	}
	return res.Index, res.Err
}

// ApplyRaw writes one entry through raft and returns the FSM's result.
func (n *Node) ApplyRaw(e *statepb.LogEntry) (fsm.Result, error) {
	if e.Time == nil {
		e.Time = timestamppb.Now()
	}
	data, err := fsm.Encode(e)
	if err != nil {
		return fsm.Result{}, err
	}
	done, err := n.BeginOp()
	if err != nil {
		return fsm.Result{}, fmt.Errorf("raft apply: %w", err)
	}
	defer done()
	f := n.raft.Apply(data, n.cfg.ApplyTimeout)
	if err := f.Error(); err != nil {
		return fsm.Result{}, fmt.Errorf("raft apply: %w", err)
	}
	res, ok := f.Response().(fsm.Result)
	if !ok {
		return fsm.Result{Index: f.Index()}, nil
	}
	return res, nil
}

// RecordSelf writes this server's address record when the state's
// differs; the leader calls it once per term.
func (n *Node) RecordSelf() error {
	rec := n.selfRecord()
	if proto.Equal(n.State().Server(n.cfg.ID), rec) {
		return nil
	}
	_, err := n.Apply(&statepb.LogEntry{Command: &statepb.LogEntry_ServerUpsert{ServerUpsert: rec}})
	return err
}

// selfRecord is the address record of this server.
func (n *Node) selfRecord() *statepb.ServerRecord {
	return &statepb.ServerRecord{Id: n.cfg.ID, RaftAddress: n.raftAddr, RpcAddress: n.cfg.RPCAddr}
}

// LeaderRPCAddr returns the gRPC address of the current leader.
func (n *Node) LeaderRPCAddr() (string, error) {
	_, id := n.raft.LeaderWithID()
	if id == "" {
		return "", ErrNoLeader
	}
	if id == raft.ServerID(n.cfg.ID) {
		return n.cfg.RPCAddr, nil
	}
	if rec := n.State().Server(string(id)); rec != nil && rec.GetRpcAddress() != "" {
		return rec.GetRpcAddress(), nil
	}
	// The leader has not replicated its address record yet: ask the
	// retry_join peers who they are.
	if addr := n.peerAddr(string(id)); addr != "" {
		return addr, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), n.cfg.RPCTimeout)
	defer cancel()
	n.queryPeers(ctx)
	if addr := n.peerAddr(string(id)); addr != "" {
		return addr, nil
	}
	return "", fmt.Errorf("leader %s has no known rpc address yet: %w", id, ErrNoLeader)
}

// peerAddr returns the rpc address a retry_join peer reported for id.
func (n *Node) peerAddr(id string) string {
	n.peersMu.Lock()
	defer n.peersMu.Unlock()
	return n.peerAddrs[id]
}

// ServerStats returns this server's raft progress as the ServerStats RPC
// answers it, for the leader's autopilot.
func (n *Node) ServerStats() *csisupdv1.ServerStatsResponse {
	stats := n.raft.Stats()
	term, _ := strconv.ParseUint(stats["last_log_term"], 10, 64)
	out := &csisupdv1.ServerStatsResponse{
		ServerId:      n.cfg.ID,
		LastTerm:      term,
		LastIndex:     n.raft.LastIndex(),
		LastContactMs: -1,
	}
	if n.raft.State() == raft.Leader {
		out.LastContactMs = 0
	} else if lc := n.raft.LastContact(); !lc.IsZero() {
		out.LastContactMs = time.Since(lc).Milliseconds()
	}
	return out
}
