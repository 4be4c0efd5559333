package leader

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// Heartbeats keeps one in-memory TTL timer per node while this server
// leads. Heartbeats themselves are never written to raft; only a node's
// transition to down (timer fired) or back to ready is.
//
// It also knows which nodes have heartbeated (or registered) to this
// server, or answered one of its calls (Confirm), since it became leader
// and since the last snapshot restore: the stored status of the others,
// ready, is what an earlier leader or a backup said, not what this leader
// has seen. That knowledge is kept in memory only, so that steady-state
// heartbeats never write to raft.
type Heartbeats struct {
	cfg    HeartbeatConfig
	logger hclog.Logger

	mu      sync.Mutex
	timers  map[string]*hbTimer
	enabled bool
	wg      sync.WaitGroup
	// confirmed holds the nodes heard from since since.
	confirmed map[string]struct{}
	// since is when this server took over or last restored a snapshot,
	// and sinceWhat says which, for the status description.
	since     time.Time
	sinceWhat string
}

// HeartbeatConfig configures the heartbeat timers.
type HeartbeatConfig struct {
	// MinTTL is the least TTL handed out; MaxPerSecond caps the heartbeats
	// the leader sees, by scaling the TTL with the node count.
	MinTTL       time.Duration
	MaxPerSecond float64
	// FailoverTTL is what a new leader gives the nodes it has not heard
	// from (see failoverTTL).
	FailoverTTL time.Duration
	// Grace is added to every TTL before a node is marked down.
	Grace time.Duration
	// State returns the current replicated state. Required.
	State func() *state.Store
	// Apply writes a command through raft, grouped with other node
	// writes; the timers mark nodes down with it. Required.
	Apply func(e *statepb.LogEntry) (uint64, error)
}

// NewHeartbeats returns the heartbeat timers, disabled until Initialize.
func NewHeartbeats(cfg HeartbeatConfig, logger hclog.Logger) *Heartbeats {
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Heartbeats{cfg: cfg, logger: logger, timers: map[string]*hbTimer{}, confirmed: map[string]struct{}{}}
}

// Initialize starts a timer with the failover TTL for every node that is
// not down, so nodes get time to find the new leader, and forgets which
// nodes were heard from: a new leader has heard from none.
func (h *Heartbeats) Initialize() {
	h.rearm(true, "it became leader")
}

// Restored is called after the state was replaced by a snapshot. On the
// leader it restarts the timers for the restored nodes and forgets which
// nodes were heard from: the restored state may hold nodes that are long
// gone, recorded ready. Elsewhere it does nothing.
func (h *Heartbeats) Restored() {
	h.rearm(false, "the snapshot restore")
}

// rearm stops every timer, forgets the confirmed nodes and starts a
// failover timer for every node not down. It enables the timers when
// enable is set; otherwise it acts only when they are enabled already.
func (h *Heartbeats) rearm(enable bool, why string) {
	nodes := h.cfg.State().Nodes()
	h.mu.Lock()
	defer h.mu.Unlock()
	if !enable && !h.enabled {
		return
	}
	h.enabled = true
	h.stopAllLocked()
	clear(h.confirmed)
	h.since, h.sinceWhat = time.Now(), why
	ttl := failoverTTL(h.cfg.FailoverTTL, h.cfg.MaxPerSecond, h.cfg.MinTTL, len(nodes))
	for _, n := range nodes {
		if n.GetStatus() == state.NodeStatusDown {
			continue
		}
		h.resetLocked(n.GetId(), ttl)
	}
	h.logger.Debug("heartbeat timers initialized", "after", why, "nodes", len(h.timers), "ttl", ttl)
}

// failoverTTL is the TTL a new leader, or a leader that restored a
// snapshot, gives every node it has not heard from: the configured
// failover TTL, but never less than the longest TTL a previous leader can
// have handed out to n nodes, which is twice the rate-scaled TTL (reset
// adds a random stagger of up to the same again). A node that heartbeats
// on time is therefore never marked down by a leader change. The grace is
// added to it like to any TTL.
func failoverTTL(failover time.Duration, rate float64, min time.Duration, n int) time.Duration {
	return max(failover, 2*rateScaledInterval(rate, min, n))
}

// Clear stops every timer and forgets the confirmed nodes; called when
// leadership is lost.
func (h *Heartbeats) Clear() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.enabled = false
	h.stopAllLocked()
	clear(h.confirmed)
}

func (h *Heartbeats) stopAllLocked() {
	for id, t := range h.timers {
		if t.t.Stop() {
			h.wg.Done()
		}
		delete(h.timers, id)
	}
}

// Count returns the number of timers held.
func (h *Heartbeats) Count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.timers)
}

// Stop clears the timers and waits for running expiry handlers.
func (h *Heartbeats) Stop() {
	h.Clear()
	h.wg.Wait()
}

// Reset restarts the node's timer, records that the node was heard from,
// and returns the TTL the node must heartbeat within. The TTL grows with
// the node count so the leader sees at most MaxHeartbeatsPerSecond
// heartbeats, with a random stagger.
func (h *Heartbeats) Reset(nodeID string) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	ttl := rateScaledInterval(h.cfg.MaxPerSecond, h.cfg.MinTTL, len(h.timers))
	ttl += time.Duration(rand.Int64N(int64(ttl)))
	if h.enabled {
		h.resetLocked(nodeID, ttl)
		h.confirmed[nodeID] = struct{}{}
	}
	return ttl
}

// Confirm records that this leader has heard from the node through a
// successful call to its agent (ClientCSI or NodeVolumes), as a heartbeat
// would: a node that answers is alive, and waiting for its heartbeat
// would stop volume work after every leader change for up to a TTL. Call
// it only after the call succeeded; a failed call proves nothing.
//
// A node already confirmed keeps the timer its last heartbeat set. Any
// other node gets the failover TTL rather than one Reset would compute:
// the agent was not told a TTL by this call, and keeps heartbeating on the
// one an earlier leader gave it, which the failover TTL covers. It does
// nothing on a server that does not lead, nor for a node not stored ready:
// only a heartbeat brings a node back from down, through raft.
func (h *Heartbeats) Confirm(nodeID string) {
	if h.cfg.State().Node(nodeID).GetStatus() != state.NodeStatusReady {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.enabled {
		return
	}
	_, confirmed := h.confirmed[nodeID]
	_, armed := h.timers[nodeID]
	if confirmed && armed {
		return
	}
	h.confirmed[nodeID] = struct{}{}
	h.resetLocked(nodeID, failoverTTL(h.cfg.FailoverTTL, h.cfg.MaxPerSecond, h.cfg.MinTTL, len(h.timers)))
	h.logger.Debug("node confirmed by a call to its agent", "node", nodeID)
}

// Confirmed reports whether this server leads and has heard from the
// node since it took over and since its last snapshot restore.
func (h *Heartbeats) Confirmed(nodeID string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.confirmed[nodeID]
	return h.enabled && ok
}

// ConfirmedWhy is Confirmed with, for a node not confirmed, since when
// this leader has waited to hear from it (rules.Confirmed).
func (h *Heartbeats) ConfirmedWhy(nodeID string) (bool, string) {
	if h.Confirmed(nodeID) {
		return true, ""
	}
	return false, h.View().Desc
}

// View is what the leader knows of the nodes' heartbeats, for answers
// from the state: Leading is false on a server that does not lead, whose
// answers keep the stored status.
type View struct {
	// Leading is set while this server leads.
	Leading bool
	heard   func(nodeID string) bool
	// Desc says since when this leader has heard from the nodes: the
	// status description of a node it has not heard from.
	Desc  string
	since time.Time
}

// View returns what this server knows of the nodes' heartbeats, for one
// answer. It reads the confirmed nodes as they are when asked, rather than
// copying them: an answer over 10,000 nodes would copy them on every call.
func (h *Heartbeats) View() View {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.enabled {
		return View{}
	}
	return View{
		Leading: true,
		heard:   h.Confirmed,
		Desc:    fmt.Sprintf("no heartbeat to the current leader since %s at %s", h.sinceWhat, h.since.UTC().Format(time.RFC3339)),
		since:   h.since,
	}
}

// Initializing reports whether a node is stored ready but the leader has
// not heard from it yet.
func (u View) Initializing(n *statepb.ClusterNode) bool {
	return u.Leading && n.GetStatus() == state.NodeStatusReady && !u.heard(n.GetId())
}

// Status returns the status of n as this view tells it.
func (u View) Status(n *statepb.ClusterNode) string {
	if u.Initializing(n) {
		return state.NodeStatusInitializing
	}
	return n.GetStatus()
}

// Nodes returns nodes with the status this leader knows: a node stored
// ready that has not heartbeated to it since it took over or restored a
// snapshot is initializing. The stored nodes are not modified; changed
// ones are copies. A server that does not lead returns nodes as they are:
// a stale read on a follower shows the stored status.
func (u View) Nodes(nodes ...*statepb.ClusterNode) []*statepb.ClusterNode {
	if !u.Leading {
		return nodes
	}
	out := nodes
	copied := false
	for i, n := range nodes {
		if !u.Initializing(n) {
			continue
		}
		if !copied {
			out = append([]*statepb.ClusterNode(nil), nodes...)
			copied = true
		}
		c := state.CopyNode(n)
		c.Status = state.NodeStatusInitializing
		c.StatusDescription = u.Desc
		c.StatusUpdatedAt = timestamppb.New(u.since)
		out[i] = c
	}
	return out
}

// Plugins marks the instances on nodes this leader has not heard from
// unhealthy and takes them out of the healthy counts. The plugins must be
// fresh from the state store (built for this answer), since they are
// changed in place. A server that does not lead leaves them as stored.
func (u View) Plugins(plugins ...*state.ClusterPlugin) {
	if !u.Leading {
		return
	}
	for _, p := range plugins {
		for _, inst := range p.Instances {
			// A healthy instance's node is stored ready.
			if !inst.Healthy || u.heard(inst.NodeID) {
				continue
			}
			inst.Healthy = false
			inst.HealthDescription = "node is initializing: " + u.Desc
			controller, nodeService := plugin.Type(inst.Plugin.GetType()).Roles()
			if controller {
				p.ControllersHealthy--
			}
			if nodeService {
				p.NodesHealthy--
			}
		}
	}
}

func (h *Heartbeats) resetLocked(nodeID string, ttl time.Duration) {
	if old, ok := h.timers[nodeID]; ok && old.t.Stop() {
		// A timer stopped before firing never runs its function, and
		// re-armed it runs it once, as its wg count stands: every
		// heartbeat of a tracked node reuses its timer rather than
		// allocating one.
		old.t.Reset(ttl + h.cfg.Grace)
		old.armed++
		return
	}
	// The node is new, or its timer fired: its function runs or ran, and
	// ignores the new entry (expire checks which one it was).
	e := &hbTimer{armed: 1}
	h.wg.Add(1)
	e.t = time.AfterFunc(ttl+h.cfg.Grace, func() {
		defer h.wg.Done()
		h.expire(nodeID, e)
	})
	h.timers[nodeID] = e
}

func (h *Heartbeats) expire(nodeID string, t *hbTimer) {
	h.mu.Lock()
	if cur, ok := h.timers[nodeID]; !ok || cur != t || !h.enabled {
		h.mu.Unlock()
		return
	}
	delete(h.timers, nodeID)
	h.mu.Unlock()
	// The node stays confirmed until it is stored down: forgetting it first
	// would show it initializing, as if this leader had just taken over,
	// until the write applies. Once stored down, confirmation no longer
	// changes what is shown, and a heartbeat confirms it again.
	h.logger.Warn("node missed its heartbeat; marking it down", "node", nodeID)
	_, err := h.cfg.Apply(&statepb.LogEntry{Command: &statepb.LogEntry_NodeStatus{NodeStatus: &statepb.NodeStatusCommand{
		NodeId: nodeID, Status: state.NodeStatusDown, Description: "missed heartbeat",
	}}})
	if err == nil {
		return
	}
	h.logger.Warn("mark node down failed; retrying after the grace", "node", nodeID, "error", err)
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.timers[nodeID]; ok || !h.enabled {
		// The node heartbeated meanwhile, or this server no longer leads.
		return
	}
	// Not heard from and not stored down: it is no longer confirmed, and
	// the write is tried again.
	delete(h.confirmed, nodeID)
	h.resetLocked(nodeID, 0)
}

// hbTimer is one node's timer; its identity tells a fired timer whether it
// is still current.
type hbTimer struct {
	t *time.Timer
	// armed counts the times t was armed (under Heartbeats.mu): a timer
	// is reused, so that tests tell one re-armed from one kept by it.
	armed int
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
