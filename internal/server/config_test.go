package server

import (
	"strings"
	"testing"

	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/retry"
)

func TestConfigValidate(t *testing.T) {
	settings := config.DefaultServerSettings()
	settings.BootstrapExpect = 1
	ok := Config{ServerSettings: settings, ID: "s1", DataDir: "d", RaftAddr: "127.0.0.1:4781", RPCAddr: "127.0.0.1:4780",
		Join: config.DefaultRetry().ServerJoin, Connect: config.DefaultRetry().ServerConnect}
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string // "" means valid
	}{
		{"valid single server", func(*Config) {}, ""},
		{"missing id", func(c *Config) { c.ID = "" }, "id is required"},
		{"missing data dir", func(c *Config) { c.DataDir = "" }, "data_dir"},
		{"bad raft address", func(c *Config) { c.RaftAddr = "nope" }, "raft address"},
		{"bad rpc address", func(c *Config) { c.RPCAddr = "" }, "rpc address"},
		{"zero bootstrap_expect", func(c *Config) { c.BootstrapExpect = 0 }, "bootstrap_expect = 0"},
		{"expect 3 without retry_join", func(c *Config) { c.BootstrapExpect = 3 }, "retry_join"},
		{"bad retry_join address", func(c *Config) { c.BootstrapExpect = 3; c.RetryJoin = []string{"x"} }, `retry_join address "x"`},
		{"raft multiplier too big", func(c *Config) { c.RaftMultiplier = 11 }, "raft_multiplier"},
		{"no join policy: none of its own", func(c *Config) { c.Join = retry.Policy{} }, "Join: retry: Base must be positive"},
		{"join jitter of one", func(c *Config) { c.Join.Jitter = 1 }, "Join: retry: Jitter"},
		{"no raft multiplier: none of its own", func(c *Config) { c.RaftMultiplier = 0 }, "raft_multiplier = 0"},
		{"no settings: none of its own", func(c *Config) { c.ServerSettings = config.ServerSettings{} }, "server tuning: RPCTimeout must be positive"},
		{"event buffer and lag", func(c *Config) { c.EventBufferSize, c.EventMaxLag = 16, 15 }, ""},
		{"event lag as large as the buffer", func(c *Config) { c.EventBufferSize, c.EventMaxLag = 16, 16 }, "EventMaxLag = 16 with EventBufferSize = 16"},
		{"event lag beyond the default buffer", func(c *Config) { c.EventMaxLag = 2000 }, "EventMaxLag = 2000 with EventBufferSize = 1024"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.mutate(&c)
			err := c.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want it to mention %q", err, tt.want)
			}
		})
	}
}
