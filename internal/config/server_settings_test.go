package config

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestServerSettingsValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*ServerSettings)
		want   string // substring of the error; "" means valid
	}{
		{"defaults", func(*ServerSettings) {}, ""},
		{"no bootstrap_expect", func(s *ServerSettings) { s.BootstrapExpect = 0 }, "bootstrap_expect = 0, must be at least 1"},
		{"three servers", func(s *ServerSettings) {
			s.BootstrapExpect, s.RetryJoin = 3, []string{"10.0.0.2:4780", "[fd00::2]:4780"}
		}, ""},
		{"bad retry_join address", func(s *ServerSettings) { s.RetryJoin = []string{"x"} }, `retry_join address "x"`},
		{"no raft multiplier", func(s *ServerSettings) { s.RaftMultiplier = 0 }, "raft_multiplier = 0, must be between 1 and 10"},
		{"raft multiplier too big", func(s *ServerSettings) { s.RaftMultiplier = 11 }, "raft_multiplier = 11"},
		{"zero RPC timeout", func(s *ServerSettings) { s.RPCTimeout = 0 }, "RPCTimeout must be positive"},
		{"negative grace", func(s *ServerSettings) { s.HeartbeatGrace = -time.Second }, "HeartbeatGrace must be positive"},
		{"no heartbeat rate", func(s *ServerSettings) { s.MaxHeartbeatsPerSecond = 0 }, "MaxHeartbeatsPerSecond"},
		{"no snapshot threshold", func(s *ServerSettings) { s.SnapshotThreshold = 0 }, "SnapshotThreshold"},
		{"no trailing logs", func(s *ServerSettings) { s.TrailingLogs = 0 }, "TrailingLogs"},
		{"small buffer", func(s *ServerSettings) { s.EventBufferSize, s.EventMaxLag = 2, 1 }, ""},
		{"lag as large as the buffer", func(s *ServerSettings) { s.EventBufferSize, s.EventMaxLag = 16, 16 }, "EventMaxLag = 16 with EventBufferSize = 16"},
		{"no lag", func(s *ServerSettings) { s.EventMaxLag = 0 }, "EventMaxLag = 0"},
		{"no claim gc grace", func(s *ServerSettings) { s.ClaimGCGrace = 0 }, "ClaimGCGrace must be positive"},
		{"no claim resume timeout", func(s *ServerSettings) { s.ClaimResumeTimeout = 0 }, "ClaimResumeTimeout must be positive"},
		{"no volume watch interval", func(s *ServerSettings) { s.VolumeWatchInterval = 0 }, "VolumeWatchInterval must be positive"},
		{"volume watch interval above the backoff cap", func(s *ServerSettings) { s.VolumeWatchInterval = time.Minute }, "VolumeWatchInterval = 1m0s is more than"},
		{"volume watch interval at the cap", func(s *ServerSettings) { s.VolumeWatchInterval = MaxVolumeWatchBackoff }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := DefaultServerSettings()
			s.BootstrapExpect = 1
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
	if d := DefaultServerSettings(); d.ClaimGCGrace != 5*time.Minute || d.VolumeWatchInterval != time.Second || d.BootstrapExpect != 0 {
		t.Errorf("defaults: ClaimGCGrace %s, VolumeWatchInterval %s, BootstrapExpect %d; want 5m, 1s and none", d.ClaimGCGrace, d.VolumeWatchInterval, d.BootstrapExpect)
	}
	if err := (ServerSettings{}).Validate(); err == nil {
		t.Error("a zero ServerSettings is valid: the server would run on defaults of its own")
	}
}

// The server block's keys set the server's settings, which read back from
// the config's printed form; the settings no key sets are the defaults;
// and the settings of a server a config enables are ones the server
// accepts as they are.
func TestServerKeys(t *testing.T) {
	src := "server {\n  enabled = true\n  bootstrap_expect = 3\n  retry_join = [\"10.0.0.2:4780\"]\n  raft_multiplier = 2\n" +
		"  claim_gc_grace = \"1m\"\n  claim_resume_timeout = \"30s\"\n  volume_health_interval = \"0s\"\n" +
		"  heartbeat_grace = \"3s\"\n  min_heartbeat_ttl = \"4s\"\n  max_heartbeats_per_second = 0.25\n" +
		"  failover_heartbeat_ttl = \"6s\"\n  server_stabilization_time = \"7s\"\n}\n"
	c := mustLoad(t, input{files: map[string]string{"a.hcl": src}, paths: []string{"a.hcl"}})
	again := mustLoad(t, input{files: map[string]string{"b.hcl": c.String()}, paths: []string{"b.hcl"}})
	want := DefaultServerSettings()
	want.BootstrapExpect, want.RetryJoin, want.RaftMultiplier = 3, []string{"10.0.0.2:4780"}, 2
	want.ClaimGCGrace, want.ClaimResumeTimeout, want.VolumeHealthInterval = time.Minute, 30*time.Second, 0
	want.HeartbeatGrace, want.MinHeartbeatTTL, want.MaxHeartbeatsPerSecond = 3*time.Second, 4*time.Second, 0.25
	want.FailoverHeartbeatTTL, want.ServerStabilizationTime = 6*time.Second, 7*time.Second
	if got, printed := c.ServerSettings(), again.ServerSettings(); !reflect.DeepEqual(got, want) || !reflect.DeepEqual(printed, want) {
		t.Errorf("server settings load as\n%+v\ntheir printed form as\n%+v\nwant\n%+v", got, printed, want)
	}
	if err := c.ServerSettings().Validate(); err != nil {
		t.Errorf("the settings of a valid config: %v", err)
	}
}
