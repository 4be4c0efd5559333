package consulsync

import (
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"

	"github.com/csisupd/csisupd/internal/registry"
	"github.com/csisupd/csisupd/internal/retry"
)

func TestConfigValidate(t *testing.T) {
	reg := registry.New(registry.Config{})
	valid := func() Config {
		c := baseConfig()
		c.Plugins = reg.Source()
		return c
	}
	tests := []struct {
		name   string
		change func(c *Config)
		want   string // substring of the error; "" means valid
	}{
		{"the configuration's defaults", func(*Config) {}, ""},
		{"no plugin source", func(c *Config) { c.Plugins = nil }, "Plugins"},
		{"no port", func(c *Config) { c.ServicePort = 0 }, "ServicePort"},
		{"port too large", func(c *Config) { c.ServicePort = 70000 }, "ServicePort"},
		{"blank service name", func(c *Config) { c.ServiceName = "  " }, "ServiceName"},
		{"no plugin service name", func(c *Config) { c.PluginServiceName = nil }, "PluginServiceName is required"},
		{"blank plugin service name", func(c *Config) { c.PluginServiceName = func(string) string { return " " } }, "PluginServiceName"},
		{"plugin service name without the ID", func(c *Config) { c.PluginServiceName = func(string) string { return "csi" } }, `PluginServiceName gives plugins a and b the same service name "csi"`},
		{"server service without a name", func(c *Config) { c.ServerService, c.ServerServiceName = true, " " }, "ServerServiceName"},
		{"discovery wait above Consul's limit", func(c *Config) { c.DiscoveryWait = 11 * time.Minute }, "DiscoveryWait 11m0s exceeds 10m0s"},
		{"no gRPC check address", func(c *Config) { c.GRPCCheck = "" }, "GRPCCheck is required"},
		{"gRPC check address without port", func(c *Config) { c.GRPCCheck = "10.0.0.1" }, "GRPCCheck"},
		{"gRPC check address with a bad port", func(c *Config) { c.GRPCCheck = "10.0.0.1:0" }, "GRPCCheck"},
		{"gRPC check timeout above its interval", func(c *Config) { c.GRPCCheckInterval, c.GRPCCheckTimeout = time.Second, 2*time.Second }, "GRPCCheckTimeout 2s exceeds GRPCCheckInterval 1s"},
		{"TTL too short", func(c *Config) { c.SyncInterval = time.Minute; c.CheckTTL = 90 * time.Second }, "CheckTTL"},
		{"no retry policy: none of its own", func(c *Config) { c.Retry = retry.Policy{} }, "Retry: retry: Base must be positive"},
		{"retry cap below base", func(c *Config) { c.Retry.Base = time.Second; c.Retry.Cap = time.Millisecond }, "Retry: retry: Cap"},
		{"negative duration", func(c *Config) { c.Probation = -time.Second }, "negative"},
		{"unspecified address", func(c *Config) { c.ServiceAddress = "0.0.0.0" }, "ServiceAddress"},
		{"blank tag", func(c *Config) { c.Tags = []string{"a", ""} }, "Tags"},
		{"long sync interval with a TTL of four intervals", func(c *Config) { c.SyncInterval, c.CheckTTL = time.Hour, 4*time.Hour }, ""},
	}
	// A zero duration is missing, never a default.
	durations := map[string]func(c *Config) *time.Duration{
		"GRPCCheckInterval":    func(c *Config) *time.Duration { return &c.GRPCCheckInterval },
		"GRPCCheckTimeout":     func(c *Config) *time.Duration { return &c.GRPCCheckTimeout },
		"SyncInterval":         func(c *Config) *time.Duration { return &c.SyncInterval },
		"CheckTTL":             func(c *Config) *time.Duration { return &c.CheckTTL },
		"Probation":            func(c *Config) *time.Duration { return &c.Probation },
		"RequestTimeout":       func(c *Config) *time.Duration { return &c.RequestTimeout },
		"DiscoveryWait":        func(c *Config) *time.Duration { return &c.DiscoveryWait },
		"DiscoveryMinInterval": func(c *Config) *time.Duration { return &c.DiscoveryMinInterval },
		"ShutdownTimeout":      func(c *Config) *time.Duration { return &c.ShutdownTimeout },
	}
	for _, field := range slices.Sorted(maps.Keys(durations)) {
		tests = append(tests, struct {
			name   string
			change func(c *Config)
			want   string
		}{"zero " + field, func(c *Config) { *durations[field](c) = 0 }, field + " is required"})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid()
			tt.change(&c)
			err := c.validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("unexpected error: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("err = %v, want one naming %s", err, tt.want)
			}
		})
	}
}

// consulsync fills in no value: a zero Config is rejected with every
// required field named, and New refuses it.
func TestConfigHasNoDefaults(t *testing.T) {
	err := Config{}.validate()
	if err == nil {
		t.Fatal("a zero Config is valid")
	}
	for _, field := range []string{"Plugins", "ServicePort", "ServiceName", "PluginServiceName", "GRPCCheck ",
		"GRPCCheckInterval", "GRPCCheckTimeout", "SyncInterval", "CheckTTL", "Probation", "Retry: retry: Base",
		"RequestTimeout", "ShutdownTimeout"} {
		if !strings.Contains(err.Error(), "consulsync: "+field) {
			t.Errorf("the error does not name %s:\n%v", field, err)
		}
	}
	if s, err := New(Config{}); err == nil || s != nil {
		t.Errorf("New(Config{}) = %v, %v; want an error", s, err)
	}
}

// The token comes from consul/api's own configuration, with the precedence
// the README documents: consul.token, else CONSUL_HTTP_TOKEN_FILE's file,
// else CONSUL_HTTP_TOKEN, else none; CONSUL_TOKEN is never read.
func TestTokenResolution(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	empty := filepath.Join(dir, "empty")
	missing := filepath.Join(dir, "missing")
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(good, []byte("  file-token \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const (
		envToken = api.HTTPTokenEnvName
		envFile  = api.HTTPTokenFileEnvName
	)
	tests := []struct {
		name       string
		token      string
		env        map[string]string
		want       string
		wantSource tokenSource
		wantErr    string
	}{
		{"none", "", nil, "", tokenNone, ""},
		{"config", "conf-token", nil, "conf-token", tokenFromConfig, ""},
		{"config over both variables", "conf-token", map[string]string{envToken: "env-token", envFile: good}, "conf-token", tokenFromConfig, ""},
		{"config, the token file is not read", "conf-token", map[string]string{envFile: missing}, "conf-token", tokenFromConfig, ""},
		{"CONSUL_HTTP_TOKEN", "", map[string]string{envToken: "env-token"}, "env-token", tokenFromEnv, ""},
		{"CONSUL_HTTP_TOKEN_FILE", "", map[string]string{envFile: good}, "file-token", tokenFromFile, ""},
		{"CONSUL_HTTP_TOKEN_FILE over CONSUL_HTTP_TOKEN", "", map[string]string{envToken: "env-token", envFile: good}, "file-token", tokenFromFile, ""},
		{"empty token file is skipped", "", map[string]string{envToken: "env-token", envFile: empty}, "env-token", tokenFromEnv, ""},
		{"empty token file alone", "", map[string]string{envFile: empty}, "", tokenNone, ""},
		// consul/api tells a configured token from the variable's by value.
		{"config equal to CONSUL_HTTP_TOKEN counts as it", "env-token", map[string]string{envToken: "env-token", envFile: good}, "file-token", tokenFromFile, ""},
		{"CONSUL_TOKEN is not read", "", map[string]string{envConsulToken: "ct-token"}, "", tokenNone, ""},
		{"missing token file", "", map[string]string{envToken: "env-token", envFile: missing}, "", "", missing},
		// A FIFO would block consul/api's open for good.
		{"token file a FIFO", "", map[string]string{envFile: fifo}, "", "", envFile + " " + fifo + ": not a regular file (a FIFO)"},
		{"config, the FIFO is not read", "conf-token", map[string]string{envFile: fifo}, "conf-token", tokenFromConfig, ""},
		{"CA file a FIFO", "", map[string]string{api.HTTPCAFile: fifo}, "", "", "consul TLS CA file " + fifo + ": not a regular file (a FIFO)"},
		{"key file a FIFO", "", map[string]string{api.HTTPClientCert: good, api.HTTPClientKey: fifo}, "", "", "consul TLS key file " + fifo + ": not a regular file (a FIFO)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setEnv(t, tt.env)
			c := baseConfig()
			c.Token = tt.token
			c.Logger = hclog.NewNullLogger()
			cc, err := newConsulClient(c)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one naming %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer cc.close()
			if cc.token != tt.want || cc.source != tt.wantSource {
				t.Errorf("token %q from %q, want %q from %q", cc.token, cc.source, tt.want, tt.wantSource)
			}
		})
	}
}

func TestNewConsulClientAddress(t *testing.T) {
	tests := []struct {
		name string
		addr string
		env  map[string]string
		want string
	}{
		{"configured", "10.0.0.9:8500", map[string]string{api.HTTPAddrEnvName: "10.0.0.8:8500"}, "10.0.0.9:8500"},
		{"from CONSUL_HTTP_ADDR", "", map[string]string{api.HTTPAddrEnvName: "10.0.0.8:8500"}, "10.0.0.8:8500"},
		{"consul/api's default", "", nil, "localhost:8500"},
		{"https scheme", "https://consul.example:8501", nil, "consul.example:8501"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			setEnv(t, tt.env)
			c := baseConfig()
			c.Address = tt.addr
			c.Logger = hclog.NewNullLogger()
			cc, err := newConsulClient(c)
			if err != nil {
				t.Fatal(err)
			}
			defer cc.close()
			if cc.address != tt.want {
				t.Errorf("address = %q, want %q", cc.address, tt.want)
			}
		})
	}
}

func TestOpError(t *testing.T) {
	const token = "s3cr3t-token-value"
	tests := []struct {
		name     string
		err      error
		want     []string
		denied   bool
		wantCode int
	}{
		{"unknown token", api.StatusError{Code: 403, Body: "ACL not found"},
			[]string{"consul: list services:", "does not know the ACL token", "CONSUL_HTTP_TOKEN"}, true, 403},
		{"permission denied", api.StatusError{Code: 403, Body: `Permission denied: token lacks permission 'service:write' on "x"`},
			[]string{"permission denied by Consul ACLs", "service:write"}, true, 403},
		{"server error", api.StatusError{Code: 500, Body: "boom"}, []string{"500", "boom"}, false, 500},
		{"token echoed", errors.New("dial failed for " + token), []string{"dial failed for [redacted]"}, false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := error(&OpError{Op: "list services", Err: tt.err, token: token})
			msg := err.Error()
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q lacks %q", msg, w)
				}
			}
			if strings.Contains(msg, token) {
				t.Errorf("message shows the token: %q", msg)
			}
			var oe *OpError
			if !errors.As(err, &oe) || oe.PermissionDenied() != tt.denied {
				t.Errorf("PermissionDenied = %v, want %v", oe.PermissionDenied(), tt.denied)
			}
			if statusCode(err) != tt.wantCode {
				t.Errorf("wrapped status code = %d, want %d", statusCode(err), tt.wantCode)
			}
		})
	}
}

func TestPassErrorSummary(t *testing.T) {
	var errs []error
	for i := range 5 {
		errs = append(errs, &OpError{Op: "register service " + string(rune('a'+i)), Err: api.StatusError{Code: 500, Body: "x"}})
	}
	err := error(&passError{errs: errs})
	msg := err.Error()
	if !strings.Contains(msg, "register service a") || !strings.Contains(msg, "register service c") ||
		strings.Contains(msg, "register service d") || !strings.HasSuffix(msg, "and 2 more") {
		t.Errorf("summary = %q", msg)
	}
	var oe *OpError
	if !errors.As(err, &oe) || oe.Op != "register service a" {
		t.Errorf("errors.As did not find the first OpError: %v", oe)
	}
}
