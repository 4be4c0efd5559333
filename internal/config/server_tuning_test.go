package config

import (
	"reflect"
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
		{"no claim resume timeout", func(s *ServerTuning) { s.ClaimResumeTimeout = 0 }, "ClaimResumeTimeout must be positive"},
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

// The server keys default to DefaultServerTuning's values, and what a
// config sets of them reads back from its printed form.
func TestServerHeartbeatKeys(t *testing.T) {
	d, tuning := Default().Server, DefaultServerTuning()
	for _, c := range []struct {
		key       string
		got, want any
	}{
		{"heartbeat_grace", d.HeartbeatGrace, tuning.HeartbeatGrace},
		{"min_heartbeat_ttl", d.MinHeartbeatTTL, tuning.MinHeartbeatTTL},
		{"max_heartbeats_per_second", d.MaxHeartbeatsPerSecond, tuning.MaxHeartbeatsPerSecond},
		{"failover_heartbeat_ttl", d.FailoverHeartbeatTTL, tuning.FailoverHeartbeatTTL},
		{"server_stabilization_time", d.ServerStabilizationTime, tuning.ServerStabilizationTime},
		{"claim_gc_grace", d.ClaimGCGrace, tuning.ClaimGCGrace},
		{"claim_resume_timeout", d.ClaimResumeTimeout, tuning.ClaimResumeTimeout},
	} {
		if c.got != c.want {
			t.Errorf("server.%s defaults to %v, the server tuning to %v", c.key, c.got, c.want)
		}
	}

	src := "server {\n  heartbeat_grace = \"3s\"\n  min_heartbeat_ttl = \"4s\"\n  max_heartbeats_per_second = 0.25\n" +
		"  failover_heartbeat_ttl = \"6s\"\n  server_stabilization_time = \"7s\"\n}\n"
	c := mustLoad(t, input{files: map[string]string{"a.hcl": src}, paths: []string{"a.hcl"}})
	again := mustLoad(t, input{files: map[string]string{"b.hcl": c.String()}, paths: []string{"b.hcl"}})
	keys := func(s ServerConfig) []any {
		return []any{s.HeartbeatGrace, s.MinHeartbeatTTL, s.MaxHeartbeatsPerSecond, s.FailoverHeartbeatTTL, s.ServerStabilizationTime}
	}
	want := []any{3 * time.Second, 4 * time.Second, 0.25, 6 * time.Second, 7 * time.Second}
	if !reflect.DeepEqual(keys(c.Server), want) || !reflect.DeepEqual(keys(again.Server), want) {
		t.Errorf("server keys load as %v, their printed form as %v, want %v", keys(c.Server), keys(again.Server), want)
	}
}
