package nodeclient

import (
	"testing"
	"time"
)

func TestEarlyHeartbeatDelay(t *testing.T) {
	for _, ttl := range []time.Duration{0, time.Nanosecond, 10 * time.Second, 200 * time.Second} {
		window := ttl / earlyHeartbeatSpread
		var longest time.Duration
		for range 1000 {
			d := earlyHeartbeatDelay(ttl)
			if d < 0 || d > 0 && d >= window {
				t.Fatalf("ttl %v: delay %v outside [0, %v)", ttl, d, window)
			}
			longest = max(longest, d)
		}
		// The delay is spread over the window, not bunched at its start:
		// 1000 draws reach its second half with certainty in practice.
		if window > time.Microsecond && longest < window/2 {
			t.Fatalf("ttl %v: longest of 1000 delays %v, under half the window %v", ttl, longest, window)
		}
	}
}
