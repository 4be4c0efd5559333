package leader

import (
	"fmt"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/config"
)

func TestHeartbeatFailoverTTL(t *testing.T) {
	for _, tc := range []struct {
		failover time.Duration
		rate     float64
		min      time.Duration
		nodes    int
		want     time.Duration
	}{
		// The defaults: 5 minutes is far above twice the 10 s minimum.
		{5 * time.Minute, 50, 10 * time.Second, 10, 5 * time.Minute},
		{5 * time.Minute, 50, 10 * time.Second, 0, 5 * time.Minute},
		// 10000 nodes at 50/s: TTLs of 200 s plus a stagger of up to as
		// much again were handed out, up to 400 s.
		{5 * time.Minute, 50, 10 * time.Second, 10000, 400 * time.Second},
		// A short failover TTL never undercuts twice the minimum.
		{time.Second, 50, 10 * time.Second, 10, 20 * time.Second},
		// No rate scaling: twice the minimum.
		{time.Second, 0, 3 * time.Second, 100000, 6 * time.Second},
	} {
		t.Run(fmt.Sprintf("%v/%v/%v/%d", tc.failover, tc.rate, tc.min, tc.nodes), func(t *testing.T) {
			if got := failoverTTL(tc.failover, tc.rate, tc.min, tc.nodes); got != tc.want {
				t.Fatalf("failoverTTL = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestHeartbeatFailoverTTLCoversEveryHandedOutTTL checks failoverTTL
// against the TTLs Reset hands out: for any node count, a new leader's
// timer outlasts the longest TTL the previous leader can have given.
func TestHeartbeatFailoverTTLCoversEveryHandedOutTTL(t *testing.T) {
	tuning := config.DefaultServerSettings()
	tuning.FailoverHeartbeatTTL = time.Second // shorter than any TTL, so the bound is the scaled one
	for _, nodes := range []int{0, 1, 499, 500, 501, 5000, 20000} {
		h := NewHeartbeats(HeartbeatConfig{MinTTL: tuning.MinHeartbeatTTL, MaxPerSecond: tuning.MaxHeartbeatsPerSecond,
			FailoverTTL: tuning.FailoverHeartbeatTTL, Grace: tuning.HeartbeatGrace}, nil)
		// Reset scales with the timers held; disabled, it starts none.
		for i := range nodes {
			h.timers[fmt.Sprint(i)] = &hbTimer{}
		}
		limit := failoverTTL(tuning.FailoverHeartbeatTTL, tuning.MaxHeartbeatsPerSecond, tuning.MinHeartbeatTTL, nodes)
		var longest time.Duration
		for range 2000 {
			longest = max(longest, h.Reset("n"))
		}
		if longest >= limit {
			t.Fatalf("%d nodes: a TTL of %v was handed out, the failover TTL is %v", nodes, longest, limit)
		}
		// The stagger really reaches past the scaled TTL, so the factor 2
		// is needed: 2000 draws land above 1.5x with certainty in practice.
		if scaled := rateScaledInterval(tuning.MaxHeartbeatsPerSecond, tuning.MinHeartbeatTTL, nodes); longest < scaled*3/2 {
			t.Fatalf("%d nodes: longest TTL %v of 2000 is under 1.5x the scaled %v", nodes, longest, scaled)
		}
		if h.Count() != nodes || h.Confirmed("n") {
			t.Fatalf("a disabled reset changed the timers (%d) or confirmed the node", h.Count())
		}
	}
}

func TestRateScaledInterval(t *testing.T) {
	tests := []struct {
		rate float64
		min  time.Duration
		n    int
		want time.Duration
	}{
		{50, 10 * time.Second, 0, 10 * time.Second},
		{50, 10 * time.Second, 500, 10 * time.Second},
		{50, 10 * time.Second, 2000, 40 * time.Second},
		{0, time.Second, 1000, time.Second},
	}
	for _, tt := range tests {
		if got := rateScaledInterval(tt.rate, tt.min, tt.n); got != tt.want {
			t.Errorf("rateScaledInterval(%v, %v, %d) = %v, want %v", tt.rate, tt.min, tt.n, got, tt.want)
		}
	}
}
