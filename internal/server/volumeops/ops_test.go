package volumeops

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// noNodes is a Nodes that has heard from no node.
type noNodes struct{}

func (noNodes) Confirm(string)        {}
func (noNodes) Confirmed(string) bool { return false }

// fullConfig returns a Config with every required field set; its clients
// are nil interfaces of the right types, which New does not call.
func fullConfig() Config {
	type controllers struct{ ControllerClient }
	type nodeVolumes struct{ NodeVolumesClient }
	return Config{
		State:         func() *state.Store { return nil },
		Apply:         func(*statepb.LogEntry) (uint64, error) { return 0, nil },
		ConfirmLeader: func() error { return nil },
		Controllers:   controllers{},
		NodeVolumes:   nodeVolumes{},
		Nodes:         noNodes{},
		KickWatcher:   func() {},
		AddLease:      func(rules.Ref, uint64, time.Duration) {},
		RPCTimeout:    time.Second,
		ApplyTimeout:  time.Second,
	}
}

// TestNewNamesWhatIsMissing: New refuses a Config without a field it
// needs, naming the field, and fills in the retry rule.
func TestNewNamesWhatIsMissing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"state", func(c *Config) { c.State = nil }, "State is required"},
		{"apply", func(c *Config) { c.Apply = nil }, "Apply is required"},
		{"leadership check", func(c *Config) { c.ConfirmLeader = nil }, "ConfirmLeader is required"},
		{"controllers", func(c *Config) { c.Controllers = nil }, "Controllers is required"},
		{"node volumes", func(c *Config) { c.NodeVolumes = nil }, "NodeVolumes is required"},
		{"nodes", func(c *Config) { c.Nodes = nil }, "Nodes is required"},
		{"watcher kick", func(c *Config) { c.KickWatcher = nil }, "KickWatcher is required"},
		{"lease table", func(c *Config) { c.AddLease = nil }, "AddLease is required"},
		{"rpc timeout", func(c *Config) { c.RPCTimeout = 0 }, "a positive RPCTimeout is required"},
		{"apply timeout", func(c *Config) { c.ApplyTimeout = -time.Second }, "a positive ApplyTimeout is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := fullConfig()
			tc.change(&cfg)
			_, err := New(cfg, nil)
			if err == nil || !strings.Contains(err.Error(), "volume operations: "+tc.want) {
				t.Fatalf("New = %v, want an error holding %q", err, tc.want)
			}
		})
	}
	o, err := New(fullConfig(), nil)
	if err != nil {
		t.Fatalf("New with every field: %v", err)
	}
	if o.cfg.IsRetryable == nil {
		t.Fatal("New left IsRetryable nil")
	}
	// The default moves on from an agent that cannot be reached, not
	// from a refusal.
	if !o.cfg.IsRetryable(status.Error(codes.Unavailable, "connection refused")) || o.cfg.IsRetryable(status.Error(codes.InvalidArgument, "bad name")) {
		t.Fatal("New's default retry rule is not DefaultIsRetryable")
	}
}
