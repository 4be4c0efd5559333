package server

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// runJoin forms or joins the cluster, then keeps this server's address
// record current in the replicated state. Its attempts are spaced by the
// Join backoff, which starts again from its base once the cluster formed.
func (s *Server) runJoin() {
	base, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		select {
		case <-s.shutdownCh:
			stop()
		case <-base.Done():
		}
	}()
	loop := s.cfg.Watchdog.Loop("server join")
	defer loop.Done()
	retries := s.cfg.Join.NewBackOff()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		loop.Beat()
		select {
		case <-base.Done():
			return
		case <-loop.C():
			continue
		case <-t.C:
		}
		// One attempt is bounded by RPCTimeout (twice when it asks the
		// peers who leads).
		ctx, cancel := context.WithTimeout(base, s.cfg.RPCTimeout)
		if !s.bootstrapped.Load() && !s.hasRaftState() {
			s.tryJoinOrBootstrap(ctx)
			if s.bootstrapped.Load() {
				retries.Reset() // joined: the record checks start afresh
			}
		} else {
			s.bootstrapped.Store(true)
			s.ensureRecorded(ctx)
		}
		cancel()
		t.Reset(retries.NextBackOff())
	}
}

// peerInfo is what one retry_join address answered.
type peerInfo struct {
	addr string
	info *csisupdv1.PeerInfoResponse
	err  error
}

func (s *Server) selfInfo() *csisupdv1.PeerInfoResponse {
	out := &csisupdv1.PeerInfoResponse{
		ServerId:        s.cfg.ID,
		RaftAddress:     s.raftAddr,
		RpcAddress:      s.cfg.RPCAddr,
		BootstrapExpect: uint32(s.cfg.BootstrapExpect),
		HasRaftState:    s.hasRaftState(),
		KnownServerIds:  s.boot.knownIDs(s.cfg.ID),
	}
	if addr, id := s.raft.LeaderWithID(); addr != "" {
		out.LeaderId = string(id)
		if id == raft.ServerID(s.cfg.ID) {
			out.LeaderRpcAddress = s.cfg.RPCAddr
		} else if rec := s.State().Server(string(id)); rec != nil {
			out.LeaderRpcAddress = rec.GetRpcAddress()
		}
	}
	return out
}

// joinAddrs returns the addresses to ask about the cluster: retry_join, or
// what DiscoverServers finds, without this server's own address.
func (s *Server) joinAddrs(ctx context.Context) []string {
	if len(s.cfg.RetryJoin) > 0 || s.cfg.DiscoverServers == nil {
		return s.cfg.RetryJoin
	}
	found, err := s.cfg.DiscoverServers(ctx)
	if err != nil {
		s.logger.Warn("discover servers failed; will retry", "error", err)
		return nil
	}
	addrs := make([]string, 0, len(found))
	for _, a := range found {
		if a != s.cfg.RPCAddr {
			addrs = append(addrs, a)
		}
	}
	s.peersMu.Lock()
	changed := !slices.Equal(addrs, s.lastDiscovered)
	s.lastDiscovered = addrs
	s.peersMu.Unlock()
	if changed {
		s.logger.Info("discovered servers", "servers", strings.Join(addrs, ","))
	}
	return addrs
}

func (s *Server) queryPeers(ctx context.Context) []peerInfo {
	addrs := s.joinAddrs(ctx)
	out := make([]peerInfo, len(addrs))
	var wg sync.WaitGroup
	for i, addr := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i].addr = addr
			conn, err := s.conns.get(addr)
			if err != nil {
				out[i].err = err
				return
			}
			out[i].info, out[i].err = csisupdv1.NewClusterClient(conn).PeerInfo(ctx, &csisupdv1.PeerInfoRequest{})
			if out[i].err == nil {
				s.peersMu.Lock()
				s.peerAddrs[out[i].info.GetServerId()] = out[i].info.GetRpcAddress()
				s.peersMu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out
}

// tryJoinOrBootstrap makes one attempt: join a cluster that has a leader,
// else bootstrap when decideBootstrap says so.
func (s *Server) tryJoinOrBootstrap(ctx context.Context) {
	peers := s.queryPeers(ctx)

	// A cluster with a leader exists: join it.
	for _, p := range peers {
		if p.err != nil || p.info.GetLeaderRpcAddress() == "" {
			continue
		}
		if err := s.joinVia(ctx, p.info.GetLeaderRpcAddress()); err != nil {
			s.logger.Warn("join cluster failed", "leader", p.info.GetLeaderRpcAddress(), "error", err)
			continue
		}
		s.logger.Info("joined cluster", "leader", p.info.GetLeaderId())
		s.bootstrapped.Store(true)
		return
	}

	self := s.selfInfo()
	var reports []*csisupdv1.PeerInfoResponse
	var unreachable []string
	for _, p := range peers {
		if p.err != nil {
			unreachable = append(unreachable, p.addr)
			continue
		}
		reports = append(reports, p.info)
	}
	d, known := decideBootstrap(self, reports)
	s.boot.setKnown(known)
	switch d.Action {
	case bootstrapRefuse:
		// The operator has to act: say so once per change, not at
		// every attempt.
		if s.boot.refusalChanged(d) {
			s.logger.Error(d.Reason, d.Args...)
		} else {
			s.logger.Debug(d.Reason, d.Args...)
		}
		return
	case bootstrapWait:
		s.logger.Info(d.Reason, append(d.Args, "unreachable", strings.Join(unreachable, ","))...)
		return
	}
	s.logger.Info(d.Reason, d.Args...)
	conf := raft.Configuration{Servers: d.Servers}
	if err := s.raftOp(func() raft.Future { return s.raft.BootstrapCluster(conf) }); err != nil && err != raft.ErrCantBootstrap {
		s.logger.Error("bootstrap failed", "error", err)
		return
	}
	s.bootstrapped.Store(true)
}

// joinVia asks the leader at addr to add this server (as a non-voter, until
// autopilot finds it stable) or to update its addresses.
func (s *Server) joinVia(ctx context.Context, addr string) error {
	if addr == s.cfg.RPCAddr {
		return fmt.Errorf("leader address %s is this server", addr)
	}
	conn, err := s.conns.get(addr)
	if err != nil {
		return err
	}
	_, err = csisupdv1.NewClusterClient(conn).Join(ctx, &csisupdv1.JoinRequest{
		ServerId: s.cfg.ID, RaftAddress: s.raftAddr, RpcAddress: s.cfg.RPCAddr,
	})
	if err != nil {
		return fmt.Errorf("join via %s: %w", addr, err)
	}
	return nil
}

// ensureRecorded makes sure the replicated state holds this server's
// current addresses, asking the leader when it does not.
func (s *Server) ensureRecorded(ctx context.Context) {
	want := &csisupdv1.ServerRecord{Id: s.cfg.ID, RaftAddress: s.raftAddr, RpcAddress: s.cfg.RPCAddr}
	if proto.Equal(s.State().Server(s.cfg.ID), want) || s.IsLeader() {
		return
	}
	addr, err := s.leaderRPCAddr()
	if err != nil {
		// This server may have come back at a new raft address the leader
		// cannot reach: ask the peers who leads.
		for _, p := range s.queryPeers(ctx) {
			if p.err == nil && p.info.GetLeaderRpcAddress() != "" && p.info.GetLeaderId() != s.cfg.ID {
				addr = p.info.GetLeaderRpcAddress()
				break
			}
		}
		if addr == "" {
			return
		}
	}
	if err := s.joinVia(ctx, addr); err != nil {
		s.logger.Debug("record server address via leader", "error", err)
	}
}

// handleJoin runs on the leader: add a joining server as a non-voter, or
// update a stale entry, and record its addresses. A new server gets no vote
// here: autopilot promotes it once it has been healthy for
// ServerStabilizationTime, so that a join naming an address that does not
// answer, or a server that cannot keep up, never counts toward the quorum.
// A server already in the configuration at the same address keeps its
// suffrage.
func (s *Server) handleJoin(req *csisupdv1.JoinRequest) error {
	id, addr := raft.ServerID(req.GetServerId()), raft.ServerAddress(req.GetRaftAddress())
	if id == "" || addr == "" || req.GetRpcAddress() == "" {
		return fmt.Errorf("join: server_id, raft_address and rpc_address are required")
	}
	conf, err := s.Configuration()
	if err != nil {
		return err
	}
	present := false
	for _, srv := range conf.Servers {
		switch {
		case srv.ID == id && srv.Address == addr:
			present = true
		case srv.ID == id || srv.Address == addr:
			// A server came back with a new address or another server took
			// this address: drop the stale entry first.
			if err := s.raftOp(func() raft.Future { return s.raft.RemoveServer(srv.ID, 0, 0) }); err != nil {
				return fmt.Errorf("join: remove stale server %s: %w", srv.ID, err)
			}
		}
	}
	if !present {
		if err := s.raftOp(func() raft.Future { return s.raft.AddNonvoter(id, addr, 0, 0) }); err != nil {
			return fmt.Errorf("join: add non-voter %s at %s: %w", id, addr, err)
		}
		s.logger.Info("added server as a non-voter; autopilot promotes it once it is stable",
			"id", id, "raft_address", addr, "server_stabilization_time", s.cfg.ServerStabilizationTime)
	}
	rec := &csisupdv1.ServerRecord{Id: req.GetServerId(), RaftAddress: req.GetRaftAddress(), RpcAddress: req.GetRpcAddress()}
	if !proto.Equal(s.State().Server(rec.Id), rec) {
		if _, err := s.apply(&csisupdv1.LogEntry{Command: &csisupdv1.LogEntry_ServerUpsert{ServerUpsert: rec}}); err != nil {
			return fmt.Errorf("join: record server %s: %w", rec.Id, err)
		}
	}
	return nil
}
