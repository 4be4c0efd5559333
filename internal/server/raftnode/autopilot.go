package raftnode

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	autopilot "github.com/hashicorp/raft-autopilot"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// autopilotDelegate lets raft-autopilot judge server health, promote
// healthy non-voters and remove dead servers. A server is failed when its
// ServerStats RPC has not answered for DeadServerTimeout.
type autopilotDelegate struct {
	n *Node

	mu       sync.Mutex
	lastSeen map[raft.ServerID]time.Time
	// answers holds each server's last ServerStats answer, so that a server
	// that stops answering is judged by how old its last answer is rather
	// than by stats autopilot would otherwise carry over unchanged.
	answers map[raft.ServerID]statsAnswer
}

// statsAnswer is one ServerStats answer and when it arrived.
type statsAnswer struct {
	stats autopilot.ServerStats
	at    time.Time
}

func (d *autopilotDelegate) AutopilotConfig() *autopilot.Config {
	m := time.Duration(d.n.cfg.RaftMultiplier)
	return &autopilot.Config{
		CleanupDeadServers:      true,
		LastContactThreshold:    200 * time.Millisecond * m,
		MaxTrailingLogs:         250,
		MinQuorum:               uint(d.n.cfg.BootstrapExpect),
		ServerStabilizationTime: d.n.cfg.ServerStabilizationTime,
	}
}

func (d *autopilotDelegate) NotifyState(*autopilot.State) {}

func (d *autopilotDelegate) KnownServers() map[raft.ServerID]*autopilot.Server {
	conf, err := d.n.Configuration()
	if err != nil {
		return nil
	}
	_, leader := d.n.raft.LeaderWithID()
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[raft.ServerID]*autopilot.Server{}
	present := make(map[raft.ServerID]bool, len(conf.Servers))
	for _, srv := range conf.Servers {
		present[srv.ID] = true
		seen, ok := d.lastSeen[srv.ID]
		if !ok {
			// Count from the first time this leader saw the server.
			seen = now
			d.lastSeen[srv.ID] = now
		}
		st := autopilot.NodeAlive
		if srv.ID != raft.ServerID(d.n.cfg.ID) && now.Sub(seen) > d.n.cfg.DeadServerTimeout {
			st = autopilot.NodeFailed
		}
		out[srv.ID] = &autopilot.Server{
			ID:          srv.ID,
			Name:        string(srv.ID),
			Address:     srv.Address,
			NodeStatus:  st,
			RaftVersion: raft.ProtocolVersionMax,
			IsLeader:    srv.ID == leader,
			// The type is what the server is meant to become, whatever its
			// suffrage now (autopilot reads that from the configuration):
			// every server is meant to vote once it proved stable.
			NodeType: autopilot.NodeVoter,
		}
	}
	// A server that left the configuration starts afresh if it comes back.
	for id := range d.lastSeen {
		if !present[id] {
			delete(d.lastSeen, id)
			delete(d.answers, id)
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
		if id != raft.ServerID(d.n.cfg.ID) {
			rec := d.n.State().Server(string(id))
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
				resp = d.n.ServerStats()
			} else {
				conn, err := d.n.cfg.Conn(addr)
				if err != nil {
					return
				}
				cctx, cancel := context.WithTimeout(ctx, d.n.cfg.RPCTimeout)
				defer cancel()
				resp, err = csisupdv1.NewClusterClient(conn).ServerStats(cctx, &csisupdv1.ServerStatsRequest{})
				if err != nil || resp.GetServerId() != string(id) {
					return
				}
			}
			stats := autopilot.ServerStats{
				LastTerm:    resp.GetLastTerm(),
				LastIndex:   resp.GetLastIndex(),
				LastContact: time.Duration(resp.GetLastContactMs()) * time.Millisecond,
			}
			if resp.GetLastContactMs() < 0 {
				stats.LastContact = -1
			}
			now := time.Now()
			d.mu.Lock()
			d.lastSeen[id] = now
			d.answers[id] = statsAnswer{stats: stats, at: now}
			d.mu.Unlock()
			mu.Lock()
			out[id] = &stats
			mu.Unlock()
		}()
	}
	wg.Wait()
	// A server that did not answer this round gets its last answer aged by
	// the time since: its contact with the leader is only known to be that
	// old. One that never answered has no known contact. Either way stale
	// stats cannot keep an unreachable server healthy, and so promotable.
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	for id := range servers {
		if _, ok := out[id]; ok {
			continue
		}
		a, ok := d.answers[id]
		if !ok || a.stats.LastContact < 0 {
			out[id] = &autopilot.ServerStats{LastTerm: a.stats.LastTerm, LastIndex: a.stats.LastIndex, LastContact: -1}
			continue
		}
		st := a.stats
		st.LastContact += now.Sub(a.at)
		out[id] = &st
	}
	return out
}

func (d *autopilotDelegate) RemoveFailedServer(srv *autopilot.Server) {
	d.n.logger.Warn("removing dead server", "id", srv.ID, "address", srv.Address)
	if err := d.n.RaftOp(func() raft.Future { return d.n.raft.RemoveServer(srv.ID, 0, 0) }); err != nil {
		d.n.logger.Error("remove dead server failed", "id", srv.ID, "error", err)
		return
	}
	d.mu.Lock()
	delete(d.lastSeen, srv.ID)
	delete(d.answers, srv.ID)
	d.mu.Unlock()
}

// StartAutopilot starts the leader's autopilot for one term, until ctx
// ends or StopAutopilot: it forgets when servers were last seen, so a new
// leader starts counting from its own first look.
func (n *Node) StartAutopilot(ctx context.Context) {
	n.ap.reset()
	n.autopilot.Start(ctx)
}

// StopAutopilot stops the autopilot; the channel is closed once it has
// stopped.
func (n *Node) StopAutopilot() <-chan struct{} { return n.autopilot.Stop() }

// reset forgets when servers were last seen; a new leader starts counting
// from its own first look.
func (d *autopilotDelegate) reset() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lastSeen = map[raft.ServerID]time.Time{}
	d.answers = map[raft.ServerID]statsAnswer{}
}

// stablePromoter promotes a non-voter once autopilot has seen it healthy
// for ServerStabilizationTime, and never demotes. It differs from
// autopilot's StablePromoter in one way: that one waits for no time at all
// while its autopilot has run for less than the stabilization time, so a
// server joining a freshly elected leader would vote after a single
// healthy look. A joiner must prove itself first; a voter keeps its vote
// across elections either way.
type stablePromoter struct {
	autopilot.StablePromoter
}

func (stablePromoter) CalculatePromotionsAndDemotions(c *autopilot.Config, s *autopilot.State) autopilot.RaftChanges {
	var changes autopilot.RaftChanges
	now := time.Now()
	for id, srv := range s.Servers {
		if srv.State == autopilot.RaftNonVoter && srv.Health.IsStable(now, c.ServerStabilizationTime) {
			changes.Promotions = append(changes.Promotions, id)
		}
	}
	return changes
}

// Health is what the leader's autopilot last saw of one server.
type Health struct {
	Healthy     bool
	StableSince time.Time
	LastContact time.Duration
	LastIndex   uint64
	LastTerm    uint64
}

// PeerHealth returns autopilot's view of every server in its state; empty
// before its first look, and on a server that does not lead.
func (n *Node) PeerHealth() map[raft.ServerID]Health {
	st := n.autopilot.GetState()
	if st == nil {
		return nil
	}
	out := make(map[raft.ServerID]Health, len(st.Servers))
	for id, srv := range st.Servers {
		out[id] = Health{
			Healthy:     srv.Health.Healthy,
			StableSince: srv.Health.StableSince,
			LastContact: srv.Stats.LastContact,
			LastIndex:   srv.Stats.LastIndex,
			LastTerm:    srv.Stats.LastTerm,
		}
	}
	return out
}
