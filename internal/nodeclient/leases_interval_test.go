package nodeclient

import (
	"testing"
	"time"
)

// TestLeaseInterval checks the time between renewals: a third of the
// smallest lease held, or reported by the servers when that is smaller.
func TestLeaseInterval(t *testing.T) {
	type holds = map[string]map[string]time.Duration
	tests := []struct {
		name     string
		holds    holds
		reported map[string]time.Duration
		want     time.Duration
		held     bool
	}{
		{"nothing held", holds{}, nil, 0, false},
		{"one lease", holds{"w": {"v": 30 * time.Second}}, nil, 10 * time.Second, true},
		{"the smallest of many", holds{"w1": {"v1": time.Hour, "v2": 9 * time.Second}, "w2": {"v3": time.Minute}}, nil, 3 * time.Second, true},
		{"the servers report less", holds{"w": {"v": time.Minute}}, map[string]time.Duration{"w": 15 * time.Second}, 5 * time.Second, true},
		{"the servers report more", holds{"w": {"v": 15 * time.Second}}, map[string]time.Duration{"w": time.Minute}, 5 * time.Second, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := &Leases{holds: tt.holds, reported: tt.reported}
			got, held := l.interval()
			if got != tt.want || held != tt.held {
				t.Errorf("interval() = %v, %v; want %v, %v", got, held, tt.want, tt.held)
			}
		})
	}
}
