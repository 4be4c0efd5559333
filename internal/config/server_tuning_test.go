package config

import (
	"strings"
	"testing"
	"time"
)

func TestServerTuningValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*ServerTuning)
		want   string // substring of the error; "" means valid
	}{
		{"defaults", func(*ServerTuning) {}, ""},
		{"zero RPC timeout", func(s *ServerTuning) { s.RPCTimeout = 0 }, "RPCTimeout must be positive"},
		{"negative grace", func(s *ServerTuning) { s.HeartbeatGrace = -time.Second }, "HeartbeatGrace must be positive"},
		{"no heartbeat rate", func(s *ServerTuning) { s.MaxHeartbeatsPerSecond = 0 }, "MaxHeartbeatsPerSecond"},
		{"no snapshot threshold", func(s *ServerTuning) { s.SnapshotThreshold = 0 }, "SnapshotThreshold"},
		{"no trailing logs", func(s *ServerTuning) { s.TrailingLogs = 0 }, "TrailingLogs"},
		{"small buffer", func(s *ServerTuning) { s.EventBufferSize, s.EventMaxLag = 2, 1 }, ""},
		{"lag as large as the buffer", func(s *ServerTuning) { s.EventBufferSize, s.EventMaxLag = 16, 16 }, "EventMaxLag = 16 with EventBufferSize = 16"},
		{"no lag", func(s *ServerTuning) { s.EventMaxLag = 0 }, "EventMaxLag = 0"},
		{"no claim gc grace", func(s *ServerTuning) { s.ClaimGCGrace = 0 }, "ClaimGCGrace must be positive"},
		{"no volume watch interval", func(s *ServerTuning) { s.VolumeWatchInterval = 0 }, "VolumeWatchInterval must be positive"},
		{"volume watch interval above the backoff cap", func(s *ServerTuning) { s.VolumeWatchInterval = time.Minute }, "VolumeWatchInterval = 1m0s is more than"},
		{"volume watch interval at the cap", func(s *ServerTuning) { s.VolumeWatchInterval = MaxVolumeWatchBackoff }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := DefaultServerTuning()
			tt.change(&s)
			err := s.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Validate: err = %v, want one naming %q", err, tt.want)
			}
		})
	}
	if d := DefaultServerTuning(); d.ClaimGCGrace != 5*time.Minute || d.VolumeWatchInterval != time.Second {
		t.Errorf("defaults: ClaimGCGrace %s, VolumeWatchInterval %s; want 5m and 1s", d.ClaimGCGrace, d.VolumeWatchInterval)
	}
	if err := (ServerTuning{}).Validate(); err == nil {
		t.Error("a zero ServerTuning is valid: the server would run on defaults of its own")
	}
}
