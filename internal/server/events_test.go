package server

import (
	"testing"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

func TestEventBrokerRingAndLag(t *testing.T) {
	b := newEventBroker(3)
	for i := uint64(1); i <= 5; i++ {
		b.publish([]*csisupdv1.ClusterEvent{{Index: i}})
	}
	tests := []struct {
		from     uint64
		noReplay bool
		want     []uint64
	}{
		{0, false, []uint64{3, 4, 5}},
		{3, false, []uint64{4, 5}},
		{5, false, nil},
		{0, true, nil},
	}
	for _, tt := range tests {
		replay, sub := b.subscribe(tt.from, tt.noReplay)
		b.unsubscribe(sub)
		var got []uint64
		for _, e := range replay {
			got = append(got, e.GetIndex())
		}
		if len(got) != len(tt.want) {
			t.Fatalf("from %d: replay %v, want %v", tt.from, got, tt.want)
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Fatalf("from %d: replay %v, want %v", tt.from, got, tt.want)
			}
		}
	}

	// A subscriber that never reads is dropped, not waited for.
	_, slow := b.subscribe(0, true)
	for i := range 300 {
		b.publish([]*csisupdv1.ClusterEvent{{Index: uint64(10 + i)}})
	}
	n := 0
	for range slow.ch {
		n++
	}
	if !b.isLagged(slow) || n != cap(slow.ch) {
		t.Fatalf("slow subscriber: lagged %v after %d events, want dropped after %d", b.isLagged(slow), n, cap(slow.ch))
	}
	b.close()
}
