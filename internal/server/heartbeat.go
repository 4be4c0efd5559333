package server

import (
	"math/rand/v2"
	"sync"
	"time"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// heartbeats keeps one in-memory TTL timer per node while this server
// leads. Heartbeats themselves are never written to raft; only a node's
// transition to down (timer fired) or back to ready is.
type heartbeats struct {
	s *Server

	mu      sync.Mutex
	timers  map[string]*hbTimer
	enabled bool
	wg      sync.WaitGroup
}

func newHeartbeats(s *Server) *heartbeats {
	return &heartbeats{s: s, timers: map[string]*hbTimer{}}
}

// initialize starts a timer with the failover TTL for every node that is
// not down, so nodes get time to find the new leader.
func (h *heartbeats) initialize() {
	nodes := h.s.State().Nodes()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.enabled = true
	for _, n := range nodes {
		if n.GetStatus() == NodeStatusDown {
			continue
		}
		h.resetLocked(n.GetId(), h.s.cfg.FailoverHeartbeatTTL)
	}
	h.s.logger.Debug("heartbeat timers initialized", "nodes", len(h.timers), "ttl", h.s.cfg.FailoverHeartbeatTTL)
}

// clear stops every timer; called when leadership is lost.
func (h *heartbeats) clear() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.enabled = false
	for id, t := range h.timers {
		if t.t.Stop() {
			h.wg.Done()
		}
		delete(h.timers, id)
	}
}

// count returns the number of timers held.
func (h *heartbeats) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.timers)
}

// stop clears the timers and waits for running expiry handlers.
func (h *heartbeats) stop() {
	h.clear()
	h.wg.Wait()
}

// reset restarts the node's timer and returns the TTL the node must
// heartbeat within. The TTL grows with the node count so the leader sees at
// most MaxHeartbeatsPerSecond heartbeats, with a random stagger.
func (h *heartbeats) reset(nodeID string) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	ttl := rateScaledInterval(h.s.cfg.MaxHeartbeatsPerSecond, h.s.cfg.MinHeartbeatTTL, len(h.timers))
	ttl += time.Duration(rand.Int64N(int64(ttl)))
	if h.enabled {
		h.resetLocked(nodeID, ttl)
	}
	return ttl
}

func (h *heartbeats) resetLocked(nodeID string, ttl time.Duration) {
	if old, ok := h.timers[nodeID]; ok && old.t.Stop() {
		// A timer stopped before firing never runs its function.
		h.wg.Done()
	}
	e := &hbTimer{}
	h.wg.Add(1)
	e.t = time.AfterFunc(ttl+h.s.cfg.HeartbeatGrace, func() {
		defer h.wg.Done()
		h.expire(nodeID, e)
	})
	h.timers[nodeID] = e
}

func (h *heartbeats) expire(nodeID string, t *hbTimer) {
	h.mu.Lock()
	if cur, ok := h.timers[nodeID]; !ok || cur != t || !h.enabled {
		h.mu.Unlock()
		return
	}
	delete(h.timers, nodeID)
	h.mu.Unlock()
	h.s.logger.Warn("node missed its heartbeat; marking it down", "node", nodeID)
	_, err := h.s.applyBatched(&csisupdv1.LogEntry{Command: &csisupdv1.LogEntry_NodeStatus{NodeStatus: &csisupdv1.NodeStatusCommand{
		NodeId: nodeID, Status: NodeStatusDown, Description: "missed heartbeat",
	}}})
	if err != nil {
		h.s.logger.Warn("mark node down failed", "node", nodeID, "error", err)
	}
}

// hbTimer is one node's timer; its identity tells a fired timer whether it
// is still current.
type hbTimer struct {
	t *time.Timer
}

// rateScaledInterval returns the interval that keeps n events at or below
// rate per second, and at least min.
func rateScaledInterval(rate float64, min time.Duration, n int) time.Duration {
	if rate <= 0 {
		return min
	}
	d := time.Duration(float64(n) / rate * float64(time.Second))
	if d < min {
		return min
	}
	return d
}
