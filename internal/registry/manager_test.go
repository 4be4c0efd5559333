package registry

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/retry"
	"github.com/csisupd/csisupd/internal/testutil"
)

func validManagerConfig(dir string) ManagerConfig {
	return ManagerConfig{
		PluginDir:           dir,
		ProbeInterval:       time.Second,
		ProbeTimeout:        time.Second,
		FingerprintInterval: time.Minute,
		DeregisterGrace:     time.Second,
		RescanInterval:      time.Second,
		PluginRedial:        testRetry.PluginRedial,
		FingerprintRetry:    testRetry.Fingerprint,
	}
}

func TestNewManagerValidates(t *testing.T) {
	tests := []struct {
		name    string
		change  func(*ManagerConfig)
		wantErr string // "" for valid
	}{
		{"valid", func(*ManagerConfig) {}, ""},
		{"zero grace", func(c *ManagerConfig) { c.DeregisterGrace = 0 }, ""},
		{"no plugin dir", func(c *ManagerConfig) { c.PluginDir = "" }, "PluginDir is required"},
		{"no probe interval", func(c *ManagerConfig) { c.ProbeInterval = 0 }, "probe interval"},
		{"timeout above interval", func(c *ManagerConfig) { c.ProbeTimeout = 2 * time.Second }, "probe timeout"},
		{"no probe timeout", func(c *ManagerConfig) { c.ProbeTimeout = 0 }, "probe timeout"},
		{"no fingerprint interval", func(c *ManagerConfig) { c.FingerprintInterval = 0 }, "fingerprint interval"},
		{"negative grace", func(c *ManagerConfig) { c.DeregisterGrace = -time.Second }, "DeregisterGrace"},
		{"no rescan interval", func(c *ManagerConfig) { c.RescanInterval = 0 }, "RescanInterval"},
		{"stop timeout and message cap", func(c *ManagerConfig) { c.StopTimeout, c.MaxPluginMessageSize = time.Second, 1<<10 }, ""},
		{"negative stop timeout", func(c *ManagerConfig) { c.StopTimeout = -time.Second }, "StopTimeout must not be negative, got -1s"},
		{"negative message cap", func(c *ManagerConfig) { c.MaxPluginMessageSize = -1 }, "MaxPluginMessageSize must not be negative, got -1"},
		{"no redial policy", func(c *ManagerConfig) { c.PluginRedial = retry.Policy{} }, "PluginRedial: retry: Base must be positive"},
		{"no fingerprint retry policy", func(c *ManagerConfig) { c.FingerprintRetry = retry.Policy{} }, "FingerprintRetry: retry: Base must be positive"},
		{"fingerprint retry without growth", func(c *ManagerConfig) { c.FingerprintRetry.Multiplier = 0.5 }, "FingerprintRetry: retry: Multiplier"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := validManagerConfig("plugins")
			tt.change(&cfg)
			m, err := NewManager(cfg)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("NewManager: %v", err)
				}
				if m.Registry() == nil || !filepath.IsAbs(m.cfg.PluginDir) {
					t.Errorf("manager = %+v, want a registry and an absolute plugin dir", m.cfg)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestNewManagerReportsEveryProblem(t *testing.T) {
	_, err := NewManager(ManagerConfig{})
	for _, want := range []string{"PluginDir", "probe interval", "RescanInterval"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error = %v, want it to mention %s", err, want)
		}
	}
}

func TestManagerPassesBoundsOn(t *testing.T) {
	tests := []struct {
		name            string
		stopTimeout     time.Duration
		maxMessage      int
		wantStopTimeout time.Duration
	}{
		{"defaults", 0, 0, DefaultStopTimeout},
		{"given", 300 * time.Millisecond, 64 << 10, 300 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := validManagerConfig("plugins")
			cfg.StopTimeout, cfg.MaxPluginMessageSize = tt.stopTimeout, tt.maxMessage
			m, err := NewManager(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if m.rec.stopTimeout != tt.wantStopTimeout || m.rec.maxMessage != tt.maxMessage {
				t.Errorf("reconciler stop timeout %s, message cap %d; want %s, %d",
					m.rec.stopTimeout, m.rec.maxMessage, tt.wantStopTimeout, tt.maxMessage)
			}
			if got := m.AbandonedSupervisors(); got != 0 {
				t.Errorf("AbandonedSupervisors() = %d before Run", got)
			}
		})
	}
}

func TestManagerUsesGivenRegistry(t *testing.T) {
	reg := New(Config{})
	cfg := validManagerConfig("plugins")
	cfg.Registry = reg
	m, err := NewManager(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if m.Registry() != reg {
		t.Error("Registry() is not the configured registry")
	}
}

func TestManagerSetTimingValidates(t *testing.T) {
	m, err := NewManager(validManagerConfig("plugins"))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SetTiming(time.Second, 2*time.Second, time.Minute); err == nil {
		t.Error("SetTiming accepted a timeout above the interval")
	}
	if err := m.SetTiming(2*time.Second, time.Second, time.Minute); err != nil {
		t.Errorf("SetTiming: %v", err)
	}
	if got := m.rec.timing.get().ProbeInterval; got != 2*time.Second {
		t.Errorf("probe interval after SetTiming = %s, want 2s", got)
	}
}

func TestManagerRunFailsOnUnusablePluginDir(t *testing.T) {
	dir := testutil.TempDir(t)
	file := filepath.Join(dir, "file")
	writeFile(t, file)
	m, err := NewManager(validManagerConfig(filepath.Join(file, "plugins")))
	if err != nil {
		t.Fatal(err)
	}
	err = m.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), filepath.Join(file, "plugins")) {
		t.Fatalf("Run error = %v, want one naming the plugin directory", err)
	}
}

func TestManagerRunOnlyOnce(t *testing.T) {
	cfg := validManagerConfig(filepath.Join(testutil.TempDir(t), "plugins"))
	m, err := NewManager(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	<-m.Ready()
	if err := m.Run(ctx); err == nil {
		t.Error("a second Run succeeded")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}
