package config

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestTokenRedaction(t *testing.T) {
	const token = "s3cr3t-t0ken"
	c := Default()
	c.Consul.Token = token
	if string(c.Consul.Token) != token {
		t.Fatalf("string(Token) = %q, want the token", string(c.Consul.Token))
	}
	js, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	outputs := map[string]string{
		"String()":          c.String(),
		"GoString()":        c.GoString(),
		"%v":                fmt.Sprintf("%v", c),
		"%v pointer":        fmt.Sprintf("%v", &c),
		"%+v":               fmt.Sprintf("%+v", c),
		"%#v":               fmt.Sprintf("%#v", c),
		"%#v pointer":       fmt.Sprintf("%#v", &c),
		"%s":                fmt.Sprintf("%s", c), //lint:ignore S1025 the test checks what each verb prints
		"%q":                fmt.Sprintf("%q", c),
		"consul %v":         fmt.Sprintf("%v", c.Consul),
		"consul %+v":        fmt.Sprintf("%+v", c.Consul),
		"consul %#v":        fmt.Sprintf("%#v", c.Consul),
		"token %v":          fmt.Sprintf("%v", c.Consul.Token),
		"token %s":          fmt.Sprintf("%s", c.Consul.Token), //lint:ignore S1025 the test checks what each verb prints
		"token %x":          fmt.Sprintf("%x", c.Consul.Token),
		"json":              string(js),
		"consul in a slice": fmt.Sprint([]ConsulConfig{c.Consul}),
	}
	for name, out := range outputs {
		if strings.Contains(out, token) {
			t.Errorf("%s shows the token: %s", name, out)
		}
		if !strings.Contains(out, "redacted") && !strings.Contains(out, fmt.Sprintf("%x", redacted)) {
			t.Errorf("%s does not say the token is redacted: %s", name, out)
		}
	}
	if !strings.HasPrefix(c.GoString(), "config.Config{") {
		t.Errorf("GoString() = %s, want a config.Config literal", c.GoString())
	}
	if !strings.Contains(c.String(), "  token = \"[redacted]\"\n") {
		t.Errorf("String() lacks the redacted token line:\n%s", c.String())
	}

	// An empty token prints as empty, so "not set" stays visible.
	c.Consul.Token = ""
	if !strings.Contains(c.String(), "  token = \"\"\n") {
		t.Errorf("String() with no token:\n%s", c.String())
	}
}

func TestString(t *testing.T) {
	c := Default()
	c.Name = "node-1"
	c.Client.Servers = []string{"a:1", "b:2"}
	out := c.String()
	for _, want := range []string{
		"name = \"node-1\"\n",
		"ports {\n  rpc = 4780\n  http = 4782\n  raft = 4781\n}\n",
		"  probe_interval = \"5s\"\n",
		"  servers = [\"a:1\", \"b:2\"]\n",
		"  plugin_service_name = \"csi-plugin-{{id}}\"\n",
		"  claim_gc_grace = \"5m0s\"\n  claim_resume_timeout = \"2m0s\"\n  volume_health_interval = \"1m0s\"\n  heartbeat_grace = \"10s\"\n  min_heartbeat_ttl = \"10s\"\n  max_heartbeats_per_second = 50\n" +
			"  failover_heartbeat_ttl = \"5m0s\"\n  server_stabilization_time = \"10s\"\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("String() lacks %q:\n%s", want, out)
		}
	}
}

func TestSuggest(t *testing.T) {
	fields := map[string]any{"probe_interval": nil, "probe_timeout": nil, "plugin_dir": nil}
	blocks := map[string]map[string]any{"client": nil, "consul": nil}
	tests := []struct{ name, want string }{
		{"probe_intervall", `; did you mean "probe_interval"?`},
		{"clinet", `; did you mean "client"?`},
		{"consol", `; did you mean "consul"?`},
		{"plugin_dirs", `; did you mean "plugin_dir"?`},
		{"probe_timeout_seconds", ""}, // more than two edits from any name
		{"tls", ""},
	}
	for _, tt := range tests {
		if got := suggest(tt.name, fields, blocks); got != tt.want {
			t.Errorf("suggest(%q) = %q, want %q", tt.name, got, tt.want)
		}
	}
}

func TestAutoJoin(t *testing.T) {
	tests := []struct {
		name               string
		set                func(c *Config)
		wantServer, wantCl bool
	}{
		{"client with no servers", func(c *Config) {}, false, true},
		{"client with servers", func(c *Config) { c.Client.Servers = []string{"127.0.0.1:4780"} }, false, false},
		{"client_auto_join off", func(c *Config) { c.Consul.ClientAutoJoin = false }, false, false},
		{"consul off", func(c *Config) { c.Consul.Enabled = false }, false, false},
		{"server with no retry_join", func(c *Config) { c.Server.Enabled = true }, true, false},
		{"server with retry_join", func(c *Config) {
			c.Server.Enabled, c.Server.RetryJoin = true, []string{"127.0.0.1:4780"}
		}, false, false},
		{"server_auto_join off", func(c *Config) { c.Server.Enabled, c.Consul.ServerAutoJoin = true, false }, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			tt.set(&c)
			if got := c.ServerAutoJoin(); got != tt.wantServer {
				t.Errorf("ServerAutoJoin = %v, want %v", got, tt.wantServer)
			}
			if got := c.ClientAutoJoin(); got != tt.wantCl {
				t.Errorf("ClientAutoJoin = %v, want %v", got, tt.wantCl)
			}
		})
	}
}

func TestConsulPluginService(t *testing.T) {
	tests := []struct {
		template, id, want string
	}{
		{DefaultConsulPluginServiceName, "ebs", "csi-plugin-ebs"},
		{"storage-{{id}}-csi", "nfs.example.com", "storage-nfs.example.com-csi"},
		{"{{id}}-{{id}}", "a", "a-a"},
		{"csi-{{ID}}-{{id}}", "b", "csi-{{ID}}-b"}, // the placeholder is lower case only
	}
	for _, tt := range tests {
		t.Run(tt.template, func(t *testing.T) {
			c := ConsulConfig{PluginServiceName: tt.template}
			if got := c.PluginService(tt.id); got != tt.want {
				t.Errorf("PluginService(%q) = %q, want %q", tt.id, got, tt.want)
			}
		})
	}
}

func TestConsulDerivedDurations(t *testing.T) {
	tests := []struct {
		name                   string
		syncInterval, interval time.Duration
		wantTTL, wantTimeout   time.Duration
	}{
		{"defaults", DefaultConsulSyncInterval, DefaultConsulCheckInterval, 10 * time.Minute, 5 * time.Second},
		{"long sync interval raises the TTL", time.Hour, DefaultConsulCheckInterval, 4 * time.Hour, 5 * time.Second},
		{"short check interval bounds the timeout", DefaultConsulSyncInterval, 2 * time.Second, 10 * time.Minute, 2 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := ConsulConfig{SyncInterval: tt.syncInterval, CheckInterval: tt.interval}
			if got := c.CheckTTL(); got != tt.wantTTL {
				t.Errorf("CheckTTL = %s, want %s", got, tt.wantTTL)
			}
			if got := c.CheckTimeout(); got != tt.wantTimeout {
				t.Errorf("CheckTimeout = %s, want %s", got, tt.wantTimeout)
			}
		})
	}
}

func TestEndpointDirs(t *testing.T) {
	tests := []struct {
		name string
		c    ClientConfig
		want []string
	}{
		{"registration off", ClientConfig{PluginDir: "/run/csi", KubeletEndpointDirs: []string{"/x"}}, nil},
		{"default: the plugin directory and the registration directory's parent",
			ClientConfig{PluginDir: "/run/csi", KubeletRegistrationDir: KubeletRegistrationDir},
			[]string{"/run/csi", "/var/lib/kubelet"}},
		{"configured", ClientConfig{PluginDir: "/run/csi", KubeletRegistrationDir: KubeletRegistrationDir, KubeletEndpointDirs: []string{"/srv/csi"}},
			[]string{"/srv/csi"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.c.EndpointDirs(); !slices.Equal(got, tt.want) {
				t.Errorf("EndpointDirs() = %v, want %v", got, tt.want)
			}
		})
	}
}
