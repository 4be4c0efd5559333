package leader

import (
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// storeWithNodes returns a store holding ready nodes with the given ids.
func storeWithNodes(t *testing.T, ids ...string) *state.Store {
	t.Helper()
	var nodes []*statepb.ClusterNode
	for _, id := range ids {
		nodes = append(nodes, &statepb.ClusterNode{Id: id, Status: state.NodeStatusReady})
	}
	return storeOf(t, nodes...)
}

func storeOf(t *testing.T, nodes ...*statepb.ClusterNode) *state.Store {
	t.Helper()
	st, err := state.New()
	if err != nil {
		t.Fatal(err)
	}
	txn := st.Write()
	for _, n := range nodes {
		if err := txn.PutNode(n); err != nil {
			t.Fatal(err)
		}
	}
	txn.Commit()
	return st
}

// longTTLs never expire while a test runs.
func longTTLs(st *state.Store, apply func(*statepb.LogEntry) (uint64, error)) HeartbeatConfig {
	return HeartbeatConfig{MinTTL: time.Hour, MaxPerSecond: 50, FailoverTTL: time.Hour, Grace: time.Hour,
		State: func() *state.Store { return st }, Apply: apply}
}

func refuseApply(*statepb.LogEntry) (uint64, error) { panic("no write expected") }

func TestHeartbeatConfirm(t *testing.T) {
	node := &statepb.ClusterNode{Id: "n1", Status: state.NodeStatusReady}
	for _, tc := range []struct {
		name string
		// before runs before Confirm("n1").
		before        func(h *Heartbeats)
		wantConfirmed bool
		wantTimers    int
	}{
		{"not leading", func(h *Heartbeats) {}, false, 0},
		{"leading", func(h *Heartbeats) { h.Initialize() }, true, 2},
		{"after losing leadership", func(h *Heartbeats) { h.Initialize(); h.Clear() }, false, 0},
		{"after a restore", func(h *Heartbeats) { h.Initialize(); h.Restored() }, true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHeartbeats(longTTLs(storeWithNodes(t, "n1", "n2"), refuseApply), nil)
			defer h.Stop()
			tc.before(h)
			if h.Confirmed("n1") {
				t.Fatal("n1 confirmed before any heartbeat or call")
			}
			h.Confirm("n1")
			if got := h.Confirmed("n1"); got != tc.wantConfirmed {
				t.Fatalf("Confirmed(n1) after Confirm = %v, want %v", got, tc.wantConfirmed)
			}
			if h.Confirmed("n2") {
				t.Fatal("confirming n1 confirmed n2")
			}
			if got := h.Count(); got != tc.wantTimers {
				t.Fatalf("%d timers, want %d", got, tc.wantTimers)
			}
			// status shows what Confirmed says: ready once confirmed,
			// initializing until then.
			want := state.NodeStatusInitializing
			if tc.wantConfirmed || !h.View().Leading {
				want = state.NodeStatusReady
			}
			if got := h.View().Status(node); got != want {
				t.Fatalf("status of n1 = %q, want %q", got, want)
			}
		})
	}
}

// TestHeartbeatConfirmNeedsANodeStoredReady: a node stored down, or not
// stored, is not confirmed by a call: only a heartbeat brings a node back,
// through raft.
func TestHeartbeatConfirmNeedsANodeStoredReady(t *testing.T) {
	st := storeOf(t, &statepb.ClusterNode{Id: "down", Status: state.NodeStatusDown})
	h := NewHeartbeats(longTTLs(st, refuseApply), nil)
	defer h.Stop()
	h.Initialize()
	for _, id := range []string{"down", "unknown"} {
		h.Confirm(id)
		if h.Confirmed(id) || h.Count() != 0 {
			t.Fatalf("Confirm(%s): confirmed %v, %d timers; want neither", id, h.Confirmed(id), h.Count())
		}
	}
}

// TestHeartbeatConfirmKeepsAHeartbeatsTimer: a node confirmed by its
// heartbeat keeps the TTL that heartbeat was given, while a node confirmed
// by a call gets a timer of its own, as a heartbeat would.
func TestHeartbeatConfirmKeepsAHeartbeatsTimer(t *testing.T) {
	h := NewHeartbeats(longTTLs(storeWithNodes(t, "n1", "n2"), refuseApply), nil)
	defer h.Stop()
	h.Initialize()
	h.Reset("n1")
	h.mu.Lock()
	beat, failover := h.timers["n1"], h.timers["n2"]
	beatArmed, failoverArmed := beat.armed, failover.armed
	h.mu.Unlock()
	h.Confirm("n1")
	h.Confirm("n2")
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.timers["n1"] != beat || beat.armed != beatArmed {
		t.Fatal("Confirm replaced or re-armed the timer the heartbeat of a confirmed node set")
	}
	if n2 := h.timers["n2"]; n2 == nil || (n2 == failover && n2.armed == failoverArmed) {
		t.Fatal("Confirm did not arm a timer of its own for a node not heard from")
	}
}

// TestHeartbeatConfirmArmsTheTimer: a node confirmed by a call and then
// never heard from again is marked down when its timer runs out, as after
// a heartbeat.
func TestHeartbeatConfirmArmsTheTimer(t *testing.T) {
	st := storeWithNodes(t, "n1")
	down, apply := recordStatus()
	cfg := HeartbeatConfig{MinTTL: time.Millisecond, FailoverTTL: time.Millisecond, State: func() *state.Store { return st }, Apply: apply}
	h := NewHeartbeats(cfg, nil)
	defer h.Stop()
	// Not leading: Confirm arms nothing, so nothing is marked down.
	h.Confirm("n1")
	if h.Count() != 0 {
		t.Fatalf("%d timers armed while not leading", h.Count())
	}
	h.Initialize()
	awaitDown(t, down, "n1", "the failover timer of n1 never fired")
	h.Confirm("n1")
	if !h.Confirmed("n1") {
		t.Fatal("n1 not confirmed")
	}
	awaitDown(t, down, "n1", "the timer Confirm armed never marked n1 down")
}

// TestHeartbeatReArmsItsTimer: a heartbeat re-arms the node's timer
// rather than making another, and the re-armed timer still marks the node
// down once, when the last TTL runs out; Stop then finds nothing pending.
func TestHeartbeatReArmsItsTimer(t *testing.T) {
	st := storeWithNodes(t, "n1")
	down, apply := recordStatus()
	cfg := HeartbeatConfig{MinTTL: 50 * time.Millisecond, FailoverTTL: time.Hour, State: func() *state.Store { return st }, Apply: apply}
	h := NewHeartbeats(cfg, nil)
	h.Initialize()
	h.mu.Lock()
	failover := h.timers["n1"]
	h.mu.Unlock()
	h.Reset("n1")
	h.mu.Lock()
	if h.timers["n1"] != failover || failover.armed != 2 {
		t.Errorf("the heartbeat made timer %p (armed %d times), want the failover timer %p re-armed", h.timers["n1"], h.timers["n1"].armed, failover)
	}
	h.mu.Unlock()
	h.Reset("n1")
	h.Reset("n1")
	awaitDown(t, down, "n1", "the re-armed timer of n1 never fired")
	if h.Count() != 0 {
		t.Fatalf("%d timers held after n1 was marked down, want none", h.Count())
	}
	stopped := make(chan struct{})
	go func() { h.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop waited for a timer that never runs")
	}
	if len(down) != 0 {
		t.Fatalf("n1 marked down again: %q", <-down)
	}
}

// recordStatus returns an Apply that records each node status write as
// "ID STATUS" on the channel it returns too.
func recordStatus() (<-chan string, func(*statepb.LogEntry) (uint64, error)) {
	writes := make(chan string, 4)
	return writes, func(e *statepb.LogEntry) (uint64, error) {
		writes <- e.GetNodeStatus().GetNodeId() + " " + e.GetNodeStatus().GetStatus()
		return 1, nil
	}
}

// awaitDown waits for the next status write, which must mark node id
// down; failing says what did not happen.
func awaitDown(t *testing.T, writes <-chan string, id, failing string) {
	t.Helper()
	select {
	case got := <-writes:
		if got != id+" "+state.NodeStatusDown {
			t.Fatalf("write %q, want %s down", got, id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal(failing)
	}
}
