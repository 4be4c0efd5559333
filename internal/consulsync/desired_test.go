package consulsync

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/fingerprint"
	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/registry"
)

func TestServiceMatches(t *testing.T) {
	reg := &api.AgentServiceRegistration{
		ID: "_csisupd-plugin-a", Name: "csi-plugin-a", Tags: []string{"node", "1.0"},
		Port: 4780, Address: "10.0.0.1", Meta: map[string]string{"plugin-id": "a"},
	}
	// asConsul is what a Consul agent returns for reg.
	asConsul := func() *api.AgentService {
		return &api.AgentService{
			ID: reg.ID, Service: reg.Name, Tags: slices.Clone(reg.Tags), Port: reg.Port, Address: reg.Address,
			Meta:    maps.Clone(reg.Meta),
			Weights: api.AgentWeights{Passing: 1, Warning: 1},
			TaggedAddresses: map[string]api.ServiceAddress{
				"lan_ipv4": {Address: "10.0.0.1", Port: 4780},
				"wan_ipv4": {Address: "10.0.0.1", Port: 4780},
			},
			CreateIndex: 10, ModifyIndex: 12, Datacenter: "dc1",
		}
	}
	tests := []struct {
		name   string
		change func(s *api.AgentService)
		want   bool
	}{
		{"as Consul returns it", func(*api.AgentService) {}, true},
		{"without default tagged addresses", func(s *api.AgentService) { s.TaggedAddresses = nil }, true},
		{"other tags", func(s *api.AgentService) { s.Tags = []string{"node"} }, false},
		{"tags reordered", func(s *api.AgentService) { s.Tags = []string{"1.0", "node"} }, false},
		{"other meta", func(s *api.AgentService) { s.Meta["plugin-id"] = "b" }, false},
		{"extra meta", func(s *api.AgentService) { s.Meta["x"] = "y" }, false},
		{"other port", func(s *api.AgentService) { s.Port = 1 }, false},
		{"other address", func(s *api.AgentService) { s.Address = "10.0.0.2" }, false},
		{"other name", func(s *api.AgentService) { s.Service = "x" }, false},
		{"tag override flipped", func(s *api.AgentService) { s.EnableTagOverride = true }, false},
		{"other weights", func(s *api.AgentService) { s.Weights.Passing = 3 }, false},
		{"default tagged address changed", func(s *api.AgentService) {
			s.TaggedAddresses["wan_ipv4"] = api.ServiceAddress{Address: "1.2.3.4", Port: 4780}
		}, false},
		{"extra tagged address", func(s *api.AgentService) {
			s.TaggedAddresses["virtual"] = api.ServiceAddress{Address: "1.2.3.4"}
		}, false},
		{"connect proxy kind", func(s *api.AgentService) { s.Kind = api.ServiceKindConnectProxy }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cur := asConsul()
			tt.change(cur)
			if got := serviceMatches(cur, reg); got != tt.want {
				t.Errorf("serviceMatches = %v, want %v", got, tt.want)
			}
		})
	}

	t.Run("empty tags and meta", func(t *testing.T) {
		r := &api.AgentServiceRegistration{Name: "csisupd", Port: 4780}
		cur := &api.AgentService{Service: "csisupd", Port: 4780, Tags: []string{}, Meta: map[string]string{},
			Weights: api.AgentWeights{Passing: 1, Warning: 1}}
		if !serviceMatches(cur, r) {
			t.Error("nil tags and meta do not match Consul's empty ones")
		}
	})
}

func TestCheckMatches(t *testing.T) {
	ttl := wantCheck{id: "c", name: "n", notes: "x", serviceID: "s", ttl: time.Hour}
	grpc := wantCheck{id: "g", name: "n", serviceID: "s", grpc: "10.0.0.1:4780", interval: 10 * time.Second, timeout: 5 * time.Second}
	alias := wantCheck{id: "a", name: "a", serviceID: "s", alias: AgentServiceID}
	tests := []struct {
		name string
		cur  api.AgentCheck
		want wantCheck
		ok   bool
	}{
		{"ttl", api.AgentCheck{Name: "n", Notes: "x", ServiceID: "s", Type: "ttl", Status: "critical"}, ttl, true},
		{"ttl renamed", api.AgentCheck{Name: "m", Notes: "x", ServiceID: "s", Type: "ttl"}, ttl, false},
		{"ttl on another service", api.AgentCheck{Name: "n", Notes: "x", ServiceID: "t", Type: "ttl"}, ttl, false},
		{"ttl replaced by http", api.AgentCheck{Name: "n", Notes: "x", ServiceID: "s", Type: "http"}, ttl, false},
		// A Consul agent reports no definition: the check matches on what it
		// does report, whatever the definition csisupd wants.
		{"grpc as Consul reports it", api.AgentCheck{Name: "n", ServiceID: "s", Type: "grpc"}, grpc, true},
		{"grpc reported as ttl", api.AgentCheck{Name: "n", ServiceID: "s", Type: "ttl"}, grpc, false},
		{"alias", api.AgentCheck{Name: "a", ServiceID: "s", Type: "alias"}, alias, true},
		{"alias renamed", api.AgentCheck{Name: "b", ServiceID: "s", Type: "alias"}, alias, false},
		{"alias on another service", api.AgentCheck{Name: "a", ServiceID: "t", Type: "alias"}, alias, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := checkMatches(&tt.cur, tt.want); got != tt.ok {
				t.Errorf("checkMatches = %v, want %v", got, tt.ok)
			}
		})
	}
}

func TestPluginService(t *testing.T) {
	base := baseConfig()
	base.Tags, base.CheckTTL = []string{"team", "node"}, time.Hour
	long := strings.Repeat("v", 600) + "é"
	tests := []struct {
		name       string
		cfg        func(c *Config)
		plugin     registry.Plugin
		wantName   string
		wantTags   []string
		wantStatus string
		wantOutput string
		check      func(t *testing.T, w *wantService)
	}{
		{
			name:     "tags deduplicated",
			plugin:   registry.Plugin{ID: "a", Fingerprint: fingerprint.Fingerprint{Type: plugin.TypeNode, VendorVersion: "1.0"}, Health: heartbeat.Health{State: heartbeat.Healthy, Description: "ok"}},
			wantName: "csi-plugin-a", wantTags: []string{"node", "1.0", "team"},
			wantStatus: api.HealthPassing, wantOutput: "ok",
		},
		{
			name: "custom template",
			cfg: func(c *Config) {
				c.PluginServiceName = config.ConsulConfig{PluginServiceName: "storage-{{id}}-csi"}.PluginService
			},
			plugin:   registry.Plugin{ID: "b", Fingerprint: fingerprint.Fingerprint{Type: plugin.TypeController}, Health: heartbeat.Health{State: heartbeat.Unhealthy, Description: "down"}},
			wantName: "storage-b-csi", wantTags: []string{"controller", "team", "node"},
			wantStatus: api.HealthCritical, wantOutput: "down",
		},
		{
			name:     "unprobed plugin is critical",
			plugin:   registry.Plugin{ID: "c", Health: heartbeat.Health{State: heartbeat.Unknown}},
			wantName: "csi-plugin-c", wantTags: []string{"unknown", "team", "node"},
			wantStatus: api.HealthCritical, wantOutput: "plugin not probed yet",
		},
		{
			name:     "long meta is clipped",
			plugin:   registry.Plugin{ID: "d", Fingerprint: fingerprint.Fingerprint{Type: plugin.TypeNode, VendorName: long}, Health: heartbeat.Health{State: heartbeat.Healthy, Description: strings.Repeat("x", 5000)}},
			wantName: "csi-plugin-d", wantTags: []string{"node", "team"},
			wantStatus: api.HealthPassing, wantOutput: strings.Repeat("x", maxOutput),
			check: func(t *testing.T, w *wantService) {
				if v := w.reg.Meta[metaVendorName]; len(v) > maxMetaValue || !strings.HasPrefix(long, v) {
					t.Errorf("vendor-name meta has %d bytes, want a prefix of at most %d", len(v), maxMetaValue)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := base
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			w := pluginService(cfg, tt.plugin.Proto())
			if w.id != PluginServiceID(tt.plugin.ID) || !strings.HasPrefix(w.id, ServiceIDPrefix) {
				t.Errorf("id = %q", w.id)
			}
			if w.reg.Name != tt.wantName || !slices.Equal(w.reg.Tags, tt.wantTags) {
				t.Errorf("name %q tags %v, want %q %v", w.reg.Name, w.reg.Tags, tt.wantName, tt.wantTags)
			}
			c := w.checks[0]
			if c.status != tt.wantStatus || c.output != tt.wantOutput || c.ttl != time.Hour {
				t.Errorf("check = %s %q ttl %s, want %s %q 1h", c.status, c.output, c.ttl, tt.wantStatus, tt.wantOutput)
			}
			if w.reg.Meta[metaExternalSource] != "csisupd" || w.reg.Meta[metaPluginID] != tt.plugin.ID {
				t.Errorf("meta = %v", w.reg.Meta)
			}
			if tt.check != nil {
				tt.check(t, w)
			}
		})
	}
}

func TestIdentity(t *testing.T) {
	cfg := baseConfig()
	p := registry.Plugin{ID: "a", Instance: socket("a", 1), RegisteredAt: time.Unix(1e9, 0), Fingerprint: fingerprint.Fingerprint{Type: plugin.TypeNode, VendorVersion: "1.0"},
		Health: heartbeat.Health{State: heartbeat.Healthy, Description: "ok"}}
	base := pluginService(cfg, p.Proto()).identity
	tests := []struct {
		name    string
		change  func(c *Config, p *registry.Plugin)
		changed bool
	}{
		{"health", func(_ *Config, p *registry.Plugin) {
			p.Health = heartbeat.Health{State: heartbeat.Unhealthy, Description: "down"}
		}, false},
		{"new instance", func(_ *Config, p *registry.Plugin) {
			// As Registry.Register records a replaced socket.
			p.Instance, p.RegisteredAt = socket("a", 2), p.RegisteredAt.Add(time.Second)
		}, true},
		{"new socket path", func(_ *Config, p *registry.Plugin) { p.Instance.Path = "/run/csi/a.sock" }, true},
		{"vendor version", func(_ *Config, p *registry.Plugin) { p.Fingerprint.VendorVersion = "1.1" }, true},
		{"plugin type", func(_ *Config, p *registry.Plugin) { p.Fingerprint.Type = plugin.TypeMonolith }, true},
		{"configured tags", func(c *Config, _ *registry.Plugin) { c.Tags = []string{"x"} }, true},
		{"check TTL", func(c *Config, _ *registry.Plugin) { c.CheckTTL = time.Hour }, true},
		{"tag override", func(c *Config, _ *registry.Plugin) { c.EnableTagOverride = true }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, pp := cfg, p
			tt.change(&c, &pp)
			if got := pluginService(c, pp.Proto()).identity != base; got != tt.changed {
				t.Errorf("identity changed = %v, want %v", got, tt.changed)
			}
		})
	}
}

func TestRefreshAfter(t *testing.T) {
	const ttl = 10 * time.Minute
	seen := map[time.Duration]bool{}
	for i := range 100 {
		d := refreshAfter(ttl, PluginCheckID(strings.Repeat("p", i+1)))
		if d < ttl/4 || d > ttl/2 {
			t.Fatalf("refreshAfter = %s, want within [%s, %s]", d, ttl/4, ttl/2)
		}
		seen[d] = true
	}
	if len(seen) < 50 {
		t.Errorf("refreshAfter spreads 100 checks over only %d values", len(seen))
	}
}
