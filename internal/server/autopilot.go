package server

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	autopilot "github.com/hashicorp/raft-autopilot"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// autopilotDelegate lets raft-autopilot judge server health and remove dead
// servers. A server is failed when its ServerStats RPC has not answered for
// DeadServerTimeout.
type autopilotDelegate struct {
	s *Server

	mu       sync.Mutex
	lastSeen map[raft.ServerID]time.Time
}

func (d *autopilotDelegate) AutopilotConfig() *autopilot.Config {
	m := time.Duration(d.s.cfg.RaftMultiplier)
	return &autopilot.Config{
		CleanupDeadServers:      true,
		LastContactThreshold:    200 * time.Millisecond * m,
		MaxTrailingLogs:         250,
		MinQuorum:               uint(d.s.cfg.BootstrapExpect),
		ServerStabilizationTime: d.s.cfg.ServerStabilizationTime,
	}
}

func (d *autopilotDelegate) NotifyState(*autopilot.State) {}

func (d *autopilotDelegate) KnownServers() map[raft.ServerID]*autopilot.Server {
	conf, err := d.s.Configuration()
	if err != nil {
		return nil
	}
	_, leader := d.s.raft.LeaderWithID()
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[raft.ServerID]*autopilot.Server{}
	for _, srv := range conf.Servers {
		seen, ok := d.lastSeen[srv.ID]
		if !ok {
			// Count from the first time this leader saw the server.
			seen = now
			d.lastSeen[srv.ID] = now
		}
		st := autopilot.NodeAlive
		if srv.ID != raft.ServerID(d.s.cfg.ID) && now.Sub(seen) > d.s.cfg.DeadServerTimeout {
			st = autopilot.NodeFailed
		}
		out[srv.ID] = &autopilot.Server{
			ID:          srv.ID,
			Name:        string(srv.ID),
			Address:     srv.Address,
			NodeStatus:  st,
			RaftVersion: raft.ProtocolVersionMax,
			IsLeader:    srv.ID == leader,
			NodeType:    autopilot.NodeVoter,
		}
	}
	return out
}

func (d *autopilotDelegate) FetchServerStats(ctx context.Context, servers map[raft.ServerID]*autopilot.Server) map[raft.ServerID]*autopilot.ServerStats {
	out := map[raft.ServerID]*autopilot.ServerStats{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for id := range servers {
		var addr string
		if id != raft.ServerID(d.s.cfg.ID) {
			rec := d.s.State().Server(string(id))
			if rec == nil {
				continue
			}
			addr = rec.GetRpcAddress()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var resp *csisupdv1.ServerStatsResponse
			if addr == "" {
				resp = d.s.serverStats()
			} else {
				conn, err := d.s.conns.get(addr)
				if err != nil {
					return
				}
				cctx, cancel := context.WithTimeout(ctx, d.s.cfg.RPCTimeout)
				defer cancel()
				resp, err = csisupdv1.NewClusterClient(conn).ServerStats(cctx, &csisupdv1.ServerStatsRequest{})
				if err != nil || resp.GetServerId() != string(id) {
					return
				}
			}
			d.mu.Lock()
			d.lastSeen[id] = time.Now()
			d.mu.Unlock()
			stats := &autopilot.ServerStats{
				LastTerm:    resp.GetLastTerm(),
				LastIndex:   resp.GetLastIndex(),
				LastContact: time.Duration(resp.GetLastContactMs()) * time.Millisecond,
			}
			if resp.GetLastContactMs() < 0 {
				stats.LastContact = -1
			}
			mu.Lock()
			out[id] = stats
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

func (d *autopilotDelegate) RemoveFailedServer(srv *autopilot.Server) {
	d.s.logger.Warn("removing dead server", "id", srv.ID, "address", srv.Address)
	if err := d.s.raftOp(func() raft.Future { return d.s.raft.RemoveServer(srv.ID, 0, 0) }); err != nil {
		d.s.logger.Error("remove dead server failed", "id", srv.ID, "error", err)
		return
	}
	d.mu.Lock()
	delete(d.lastSeen, srv.ID)
	d.mu.Unlock()
}

// reset forgets when servers were last seen; a new leader starts counting
// from its own first look.
func (d *autopilotDelegate) reset() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lastSeen = map[raft.ServerID]time.Time{}
}
