package agent

import (
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/config"
)

// The server keys that tune the server reach its tuning; the rest of the
// tuning keeps its production values.
func TestServerTuningFromConfig(t *testing.T) {
	cfg := config.Default()
	cfg.Server.ClaimGCGrace = time.Minute
	cfg.Server.HeartbeatGrace = 3 * time.Second
	cfg.Server.MinHeartbeatTTL = 4 * time.Second
	cfg.Server.MaxHeartbeatsPerSecond = 7.5
	cfg.Server.FailoverHeartbeatTTL = 6 * time.Minute
	cfg.Server.ServerStabilizationTime = 20 * time.Second
	got := serverTuning(&cfg)
	want := config.DefaultServerTuning()
	want.ClaimGCGrace = time.Minute
	want.HeartbeatGrace, want.MinHeartbeatTTL, want.MaxHeartbeatsPerSecond = 3*time.Second, 4*time.Second, 7.5
	want.FailoverHeartbeatTTL, want.ServerStabilizationTime = 6*time.Minute, 20*time.Second
	if got != want {
		t.Fatalf("serverTuning =\n%+v\nwant\n%+v", got, want)
	}
	if err := got.Validate(); err != nil {
		t.Fatalf("tuning from a valid config: %v", err)
	}
}
