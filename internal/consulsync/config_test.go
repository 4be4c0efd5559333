package consulsync

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/csisupd/csisupd/internal/registry"
	"github.com/csisupd/csisupd/internal/retry"
)

func TestConfigValidate(t *testing.T) {
	reg := registry.New(registry.Config{})
	valid := func() Config { return Config{Registry: reg, ServicePort: 4780, Retry: shortRetry} }
	tests := []struct {
		name   string
		change func(c *Config)
		want   string // substring of the error; "" means valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"no registry", func(c *Config) { c.Registry = nil }, "Registry"},
		{"no port", func(c *Config) { c.ServicePort = 0 }, "ServicePort"},
		{"port too large", func(c *Config) { c.ServicePort = 70000 }, "ServicePort"},
		{"blank service name", func(c *Config) { c.ServiceName = "  " }, "ServiceName"},
		{"blank plugin service name", func(c *Config) { c.PluginServiceName = " " }, "PluginServiceName"},
		{"TTL too short", func(c *Config) { c.SyncInterval = time.Minute; c.CheckTTL = 90 * time.Second }, "CheckTTL"},
		{"no retry policy: none of its own", func(c *Config) { c.Retry = retry.Policy{} }, "Retry: retry: Base must be positive"},
		{"retry cap below base", func(c *Config) { c.Retry.Base = time.Second; c.Retry.Cap = time.Millisecond }, "Retry: retry: Cap"},
		{"negative duration", func(c *Config) { c.Probation = -time.Second }, "negative"},
		{"unspecified address", func(c *Config) { c.ServiceAddress = "0.0.0.0" }, "ServiceAddress"},
		{"blank tag", func(c *Config) { c.Tags = []string{"a", ""} }, "Tags"},
		{"long sync interval raises the default TTL", func(c *Config) { c.SyncInterval = time.Hour }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid()
			tt.change(&c)
			err := c.withDefaults().validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("unexpected error: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("err = %v, want one naming %s", err, tt.want)
			}
		})
	}
}

func TestConfigDefaults(t *testing.T) {
	c := Config{ServicePort: 4780, ServiceAddress: "10.0.0.1"}.withDefaults()
	if c.ServiceName != "csisupd" || c.pluginServiceName("x") != "csi-plugin-x" || c.SyncInterval != 30*time.Second ||
		c.Probation != time.Minute || c.CheckTTL != DefaultCheckTTL {
		t.Errorf("defaults = %+v", c)
	}
	if c.GRPCCheck != "10.0.0.1:4780" {
		t.Errorf("GRPCCheck = %q, want the service address and port", c.GRPCCheck)
	}
	if c.Retry != (retry.Policy{}) {
		t.Errorf("withDefaults filled in Retry %v, want it left to the caller (the config package)", c.Retry)
	}
	if got := (Config{ServicePort: 1}).withDefaults().GRPCCheck; got != "127.0.0.1:1" {
		t.Errorf("GRPCCheck without address = %q, want 127.0.0.1:1", got)
	}
}

func TestResolveToken(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(good, []byte("  file-token \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		token      string
		env        map[string]string
		want       string
		wantSource tokenSource
		wantErr    string
	}{
		{"none", "", nil, "", tokenNone, ""},
		{"config", "c", map[string]string{envHTTPToken: "e", envHTTPTokenFile: good}, "c", tokenFromConfig, ""},
		{"file", "", map[string]string{envHTTPToken: "e", envHTTPTokenFile: good}, "file-token", tokenFromFile, ""},
		{"env", "", map[string]string{envHTTPToken: "e"}, "e", tokenFromEnv, ""},
		{"CONSUL_TOKEN ignored", "", map[string]string{envConsulToken: "ct"}, "", tokenNone, ""},
		{"missing file", "", map[string]string{envHTTPTokenFile: filepath.Join(dir, "nope")}, "", "", envHTTPTokenFile},
		{"empty file", "", map[string]string{envHTTPTokenFile: empty}, "", "", "is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tok, src, err := resolveToken(Config{Token: tt.token, Env: env(tt.env)})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one mentioning %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tok != tt.want || src != tt.wantSource {
				t.Errorf("token %q from %q, want %q from %q", tok, src, tt.want, tt.wantSource)
			}
		})
	}

	t.Run("missing file error wraps the cause", func(t *testing.T) {
		_, _, err := resolveToken(Config{Env: env(map[string]string{envHTTPTokenFile: filepath.Join(dir, "nope")})})
		if !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("err = %v, want it to wrap fs.ErrNotExist", err)
		}
	})
}

func TestNewConsulClientAddress(t *testing.T) {
	tests := []struct {
		name string
		addr string
		env  map[string]string
		want string
	}{
		{"configured", "10.0.0.9:8500", map[string]string{envHTTPAddr: "10.0.0.8:8500"}, "10.0.0.9:8500"},
		{"from CONSUL_HTTP_ADDR", "", map[string]string{envHTTPAddr: "10.0.0.8:8500"}, "10.0.0.8:8500"},
		{"https scheme", "https://consul.example:8501", nil, "consul.example:8501"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Config{ServicePort: 1, Address: tt.addr, Env: env(tt.env)}.withDefaults()
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
