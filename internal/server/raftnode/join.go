package raftnode

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
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// runJoin forms or joins the cluster, then keeps this server's address
// record current in the replicated state. Its attempts are spaced by the
// Join backoff, which starts again from its base once the cluster formed.
func (n *Node) runJoin() {
	base, stop := context.WithCancel(context.Background())
	defer stop()
	go func() {
		select {
		case <-n.stopCh:
			stop()
		case <-base.Done():
		}
	}()
	loop := n.cfg.Watchdog.Loop("server join")
	defer loop.Done()
	retries := n.cfg.Join.NewBackOff()
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
		ctx, cancel := context.WithTimeout(base, n.cfg.RPCTimeout)
		loop.Busy(time.Now().Add(2 * n.cfg.RPCTimeout))
		if !n.bootstrapped.Load() && !n.hasRaftState() {
			n.tryJoinOrBootstrap(ctx)
			if n.bootstrapped.Load() {
				retries.Reset() // joined: the record checks start afresh
			}
		} else {
			n.bootstrapped.Store(true)
			n.ensureRecorded(ctx)
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

// SelfInfo is this server's PeerInfo answer.
func (n *Node) SelfInfo() *csisupdv1.PeerInfoResponse {
	out := &csisupdv1.PeerInfoResponse{
		ServerId:        n.cfg.ID,
		RaftAddress:     n.raftAddr,
		RpcAddress:      n.cfg.RPCAddr,
		BootstrapExpect: uint32(n.cfg.BootstrapExpect),
		HasRaftState:    n.hasRaftState(),
		KnownServerIds:  n.boot.knownIDs(n.cfg.ID),
	}
	if addr, id := n.raft.LeaderWithID(); addr != "" {
		out.LeaderId = string(id)
		if id == raft.ServerID(n.cfg.ID) {
			out.LeaderRpcAddress = n.cfg.RPCAddr
		} else if rec := n.State().Server(string(id)); rec != nil {
			out.LeaderRpcAddress = rec.GetRpcAddress()
		}
	}
	return out
}

// joinAddrs returns the addresses to ask about the cluster: retry_join, or
// what DiscoverServers finds, without this server's own address.
func (n *Node) joinAddrs(ctx context.Context) []string {
	if len(n.cfg.RetryJoin) > 0 || n.cfg.DiscoverServers == nil {
		return n.cfg.RetryJoin
	}
	found, err := n.cfg.DiscoverServers(ctx)
	if err != nil {
		n.logger.Warn("discover servers failed; will retry", "error", err)
		return nil
	}
	addrs := make([]string, 0, len(found))
	for _, a := range found {
		if a != n.cfg.RPCAddr {
			addrs = append(addrs, a)
		}
	}
	n.peersMu.Lock()
	changed := !slices.Equal(addrs, n.lastDiscovered)
	n.lastDiscovered = addrs
	n.peersMu.Unlock()
	if changed {
		n.logger.Info("discovered servers", "servers", strings.Join(addrs, ","))
	}
	return addrs
}

func (n *Node) queryPeers(ctx context.Context) []peerInfo {
	addrs := n.joinAddrs(ctx)
	out := make([]peerInfo, len(addrs))
	var wg sync.WaitGroup
	for i, addr := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i].addr = addr
			conn, err := n.cfg.Conn(addr)
			if err != nil {
				out[i].err = err
				return
			}
			out[i].info, out[i].err = csisupdv1.NewClusterClient(conn).PeerInfo(ctx, &csisupdv1.PeerInfoRequest{})
			if out[i].err == nil {
				n.peersMu.Lock()
				n.peerAddrs[out[i].info.GetServerId()] = out[i].info.GetRpcAddress()
				n.peersMu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out
}

// tryJoinOrBootstrap makes one attempt: join a cluster that has a leader,
// else bootstrap when decideBootstrap says so.
func (n *Node) tryJoinOrBootstrap(ctx context.Context) {
	peers := n.queryPeers(ctx)

	// A cluster with a leader exists: join it.
	for _, p := range peers {
		if p.err != nil || p.info.GetLeaderRpcAddress() == "" {
			continue
		}
		if err := n.joinVia(ctx, p.info.GetLeaderRpcAddress()); err != nil {
			n.logger.Warn("join cluster failed", "leader", p.info.GetLeaderRpcAddress(), "error", err)
			continue
		}
		n.logger.Info("joined cluster", "leader", p.info.GetLeaderId())
		n.bootstrapped.Store(true)
		return
	}

	self := n.SelfInfo()
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
	n.boot.setKnown(known)
	switch d.Action {
	case bootstrapRefuse:
		// The operator has to act: say so once per change, not at
		// every attempt.
		if n.boot.refusalChanged(d) {
			n.logger.Error(d.Reason, d.Args...)
		} else {
			n.logger.Debug(d.Reason, d.Args...)
		}
		return
	case bootstrapWait:
		n.logger.Info(d.Reason, append(d.Args, "unreachable", strings.Join(unreachable, ","))...)
		return
	}
	n.logger.Info(d.Reason, d.Args...)
	conf := raft.Configuration{Servers: d.Servers}
	if err := n.RaftOp(func() raft.Future { return n.raft.BootstrapCluster(conf) }); err != nil && err != raft.ErrCantBootstrap {
		n.logger.Error("bootstrap failed", "error", err)
		return
	}
	n.bootstrapped.Store(true)
}

// joinVia asks the leader at addr to add this server (as a non-voter, until
// autopilot finds it stable) or to update its addresses.
func (n *Node) joinVia(ctx context.Context, addr string) error {
	if addr == n.cfg.RPCAddr {
		return fmt.Errorf("leader address %s is this server", addr)
	}
	conn, err := n.cfg.Conn(addr)
	if err != nil {
		return err
	}
	_, err = csisupdv1.NewClusterClient(conn).Join(ctx, &csisupdv1.JoinRequest{
		ServerId: n.cfg.ID, RaftAddress: n.raftAddr, RpcAddress: n.cfg.RPCAddr,
	})
	if err != nil {
		return fmt.Errorf("join via %s: %w", addr, err)
	}
	return nil
}

// ensureRecorded makes sure the replicated state holds this server's
// current addresses, asking the leader when it does not.
func (n *Node) ensureRecorded(ctx context.Context) {
	if proto.Equal(n.State().Server(n.cfg.ID), n.selfRecord()) || n.IsLeader() {
		return
	}
	addr, err := n.LeaderRPCAddr()
	if err != nil {
		// This server may have come back at a new raft address the leader
		// cannot reach: ask the peers who leads.
		for _, p := range n.queryPeers(ctx) {
			if p.err == nil && p.info.GetLeaderRpcAddress() != "" && p.info.GetLeaderId() != n.cfg.ID {
				addr = p.info.GetLeaderRpcAddress()
				break
			}
		}
		if addr == "" {
			return
		}
	}
	if err := n.joinVia(ctx, addr); err != nil {
		n.logger.Debug("record server address via leader", "error", err)
	}
}

// HandleJoin runs on the leader: add a joining server as a non-voter, or
// update a stale entry, and record its addresses. A new server gets no vote
// here: autopilot promotes it once it has been healthy for
// ServerStabilizationTime, so that a join naming an address that does not
// answer, or a server that cannot keep up, never counts toward the quorum.
// A server already in the configuration at the same address keeps its
// suffrage.
func (n *Node) HandleJoin(req *csisupdv1.JoinRequest) error {
	id, addr := raft.ServerID(req.GetServerId()), raft.ServerAddress(req.GetRaftAddress())
	if id == "" || addr == "" || req.GetRpcAddress() == "" {
		return fmt.Errorf("join: server_id, raft_address and rpc_address are required")
	}
	conf, err := n.Configuration()
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
			if err := n.RaftOp(func() raft.Future { return n.raft.RemoveServer(srv.ID, 0, 0) }); err != nil {
				return fmt.Errorf("join: remove stale server %s: %w", srv.ID, err)
			}
		}
	}
	if !present {
		if err := n.RaftOp(func() raft.Future { return n.raft.AddNonvoter(id, addr, 0, 0) }); err != nil {
			return fmt.Errorf("join: add non-voter %s at %s: %w", id, addr, err)
		}
		n.logger.Info("added server as a non-voter; autopilot promotes it once it is stable",
			"id", id, "raft_address", addr, "server_stabilization_time", n.cfg.ServerStabilizationTime)
	}
	rec := &statepb.ServerRecord{Id: req.GetServerId(), RaftAddress: req.GetRaftAddress(), RpcAddress: req.GetRpcAddress()}
	if !proto.Equal(n.State().Server(rec.Id), rec) {
		if _, err := n.Apply(&statepb.LogEntry{Command: &statepb.LogEntry_ServerUpsert{ServerUpsert: rec}}); err != nil {
			return fmt.Errorf("join: record server %s: %w", rec.Id, err)
		}
	}
	return nil
}
