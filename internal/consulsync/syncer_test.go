package consulsync

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/csisupd/csisupd/internal/consulsync/consultest"
	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/registry"
	"github.com/csisupd/csisupd/internal/testutil"
)

func TestFirstRegistration(t *testing.T) {
	a := newAgent(t, consultest.Config{})
	reg := registry.New(registry.Config{})
	addPlugin(reg, "alpha", "1.2.0", plugin.TypeMonolith, heartbeat.Healthy, "probe ok")
	addPlugin(reg, "beta", "0.9", plugin.TypeNode, heartbeat.Unhealthy, "probe failed: not ready")
	reg.Register("gamma", socket("gamma", 7), nil) // not fingerprinted, not probed

	// A service of someone else must stay untouched.
	op := newClient(t, a, "")
	if err := op.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "web-1", Name: "web", Tags: []string{"x"}}); err != nil {
		t.Fatal(err)
	}

	logs := &logBuffer{}
	cfg := testConfig(reg, a.Addr(), logs)
	start(t, cfg)
	waitFor(t, "first sync", func() bool { return synced(a, reg) })

	agentSvc, _ := a.Service(AgentServiceID)
	if agentSvc.Service != "csisupd" || agentSvc.Port != 4780 || agentSvc.Address != "10.1.2.3" ||
		!slices.Equal(agentSvc.Tags, []string{"team-a"}) || agentSvc.EnableTagOverride {
		t.Errorf("agent service = %+v", agentSvc)
	}
	if want := map[string]string{"external-source": "csisupd", "node": "node-1"}; !maps.Equal(agentSvc.Meta, want) {
		t.Errorf("agent service meta = %v, want %v", agentSvc.Meta, want)
	}
	grpc, ok := a.Check(GRPCCheckID)
	def, _ := a.CheckDefinition(GRPCCheckID)
	if !ok || grpc.Type != "grpc" || grpc.ServiceID != AgentServiceID ||
		def.GRPC != "127.0.0.1:9" || def.Interval != cfg.GRPCCheckInterval.String() || def.Timeout != cfg.GRPCCheckTimeout.String() || def.GRPCUseTLS {
		t.Errorf("agent gRPC check = %+v, registered as %+v (found %v)", grpc, def, ok)
	}

	tests := []struct {
		id         string
		name       string
		tags       []string
		meta       map[string]string
		status     string
		output     string
		checkOwner string
	}{
		{
			id: "alpha", name: "csi-plugin-alpha",
			tags: []string{"monolith", "1.2.0", "team-a"},
			meta: map[string]string{
				"external-source": "csisupd", "node": "node-1", "plugin-id": "alpha", "plugin-type": "monolith",
				"vendor-name": "example.csi.io", "vendor-version": "1.2.0",
			},
			status: api.HealthPassing, output: "probe ok",
		},
		{
			id: "beta", name: "csi-plugin-beta",
			tags: []string{"node", "0.9", "team-a"},
			meta: map[string]string{
				"external-source": "csisupd", "node": "node-1", "plugin-id": "beta", "plugin-type": "node",
				"vendor-name": "example.csi.io", "vendor-version": "0.9",
			},
			status: api.HealthCritical, output: "probe failed: not ready",
		},
		{
			id: "gamma", name: "csi-plugin-gamma",
			tags:   []string{"unknown", "team-a"},
			meta:   map[string]string{"external-source": "csisupd", "node": "node-1", "plugin-id": "gamma", "plugin-type": "unknown"},
			status: api.HealthCritical, output: "plugin not probed yet",
		},
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			svc, ok := a.Service(PluginServiceID(tt.id))
			if !ok {
				t.Fatalf("service %s missing", PluginServiceID(tt.id))
			}
			if svc.Service != tt.name || svc.Address != "10.1.2.3" || svc.Port != 4780 {
				t.Errorf("service = %+v, want name %s at 10.1.2.3:4780", svc, tt.name)
			}
			if !slices.Equal(svc.Tags, tt.tags) {
				t.Errorf("tags = %v, want %v", svc.Tags, tt.tags)
			}
			if !maps.Equal(svc.Meta, tt.meta) {
				t.Errorf("meta = %v, want %v", svc.Meta, tt.meta)
			}
			chk, _ := a.Check(PluginCheckID(tt.id))
			if chk.Type != "ttl" || chk.ServiceID != PluginServiceID(tt.id) || chk.Status != tt.status || chk.Output != tt.output {
				t.Errorf("check = %+v, want ttl %s %q", chk, tt.status, tt.output)
			}
		})
	}
	if web, ok := a.Service("web-1"); !ok || !slices.Equal(web.Tags, []string{"x"}) {
		t.Errorf("foreign service changed: %+v (present %v)", web, ok)
	}
	// The catalog received the registrations too.
	if _, ok := a.CatalogService(PluginServiceID("alpha")); !ok {
		t.Error("plugin service missing from the catalog")
	}
}

func TestSteadyStatePassMakesTwoGETs(t *testing.T) {
	tests := []struct {
		name        string
		plugins     int
		tagOverride bool
	}{
		{"no plugins", 0, false},
		{"three plugins", 3, false},
		{"three plugins with tag override", 3, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAgent(t, consultest.Config{})
			reg := registry.New(registry.Config{})
			for i := range tt.plugins {
				addPlugin(reg, "p"+string(rune('a'+i)), "1.0", plugin.TypeNode, heartbeat.Healthy, "ok")
			}
			cfg := testConfig(reg, a.Addr(), &logBuffer{})
			cfg.EnableTagOverride = tt.tagOverride
			s, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.client.close()
			ctx := context.Background()
			if err := s.pass(ctx); err != nil {
				t.Fatal(err)
			}
			if !synced(a, reg) {
				t.Fatal("first pass did not sync")
			}
			a.AntiEntropy()
			for pass := range 20 {
				a.ResetCounts()
				if err := s.pass(ctx); err != nil {
					t.Fatal(err)
				}
				want := map[string]int{consultest.RouteServices: 1, consultest.RouteChecks: 1}
				if got := a.Counts(); !maps.Equal(got, want) {
					t.Errorf("steady-state pass %d made requests %v, want %v", pass, got, want)
				}
			}
		})
	}
}

func TestSteadyStateUnderRunDoesNotWrite(t *testing.T) {
	a := newAgent(t, consultest.Config{})
	reg := registry.New(registry.Config{})
	addPlugin(reg, "alpha", "1.0", plugin.TypeController, heartbeat.Healthy, "ok")
	cfg := testConfig(reg, a.Addr(), &logBuffer{})
	cfg.SyncInterval = 5 * time.Millisecond
	start(t, cfg)
	waitFor(t, "first sync", func() bool { return synced(a, reg) })
	// The gRPC check of the agent service belongs to Consul: a status it
	// sets must not make csisupd write.
	if err := a.SetCheckStatus(GRPCCheckID, api.HealthPassing, "SERVING"); err != nil {
		t.Fatal(err)
	}
	a.ResetCounts()
	waitFor(t, "five periodic passes", func() bool { return a.Count(consultest.RouteChecks) >= 5 })
	if w := a.Writes(); w != 0 {
		t.Errorf("steady-state passes wrote %d times: %v", w, a.Counts())
	}
}

func TestHealthAndLifecycleReachConsul(t *testing.T) {
	a := newAgent(t, consultest.Config{})
	reg := registry.New(registry.Config{})
	inst := addPlugin(reg, "alpha", "1.0", plugin.TypeNode, heartbeat.Healthy, "ok")
	cfg := testConfig(reg, a.Addr(), &logBuffer{})
	// No periodic passes: only registry changes can trigger what follows.
	cfg.SyncInterval = time.Hour
	start(t, cfg)
	waitFor(t, "first sync", func() bool { return synced(a, reg) })
	checkIs := func(status, output string) func() bool {
		return func() bool {
			c, ok := a.Check(PluginCheckID("alpha"))
			return ok && c.Status == status && c.Output == output
		}
	}

	reg.SetHealth("alpha", inst, heartbeat.Result{State: heartbeat.Unhealthy, Description: "probe: deadline exceeded"})
	waitFor(t, "check critical", checkIs(api.HealthCritical, "probe: deadline exceeded"))

	reg.SetHealth("alpha", inst, heartbeat.Result{State: heartbeat.Healthy, Description: "ok again"})
	waitFor(t, "check passing", checkIs(api.HealthPassing, "ok again"))

	reg.Deregister("alpha", inst, "socket gone")
	waitFor(t, "service removed", func() bool {
		_, svc := a.Service(PluginServiceID("alpha"))
		_, chk := a.Check(PluginCheckID("alpha"))
		return !svc && !chk
	})

	inst2 := socket("alpha", 2)
	reg.Register("alpha", inst2, fprint("1.1", plugin.TypeNode))
	reg.SetHealth("alpha", inst2, heartbeat.Result{State: heartbeat.Healthy, Description: "back"})
	waitFor(t, "plugin registered again", func() bool { return synced(a, reg) })
	if svc, _ := a.Service(PluginServiceID("alpha")); !slices.Contains(svc.Tags, "1.1") {
		t.Errorf("re-registered plugin tags = %v, want version 1.1", svc.Tags)
	}
}

func TestTagOverride(t *testing.T) {
	ours := []string{"monolith", "1.0", "team-a"}
	tests := []struct {
		name     string
		override bool
	}{
		{"enabled: catalog tags survive", true},
		{"disabled: csisupd's tags are restored", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAgent(t, consultest.Config{})
			reg := registry.New(registry.Config{})
			addPlugin(reg, "alpha", "1.0", plugin.TypeMonolith, heartbeat.Healthy, "ok")
			cfg := testConfig(reg, a.Addr(), &logBuffer{})
			cfg.EnableTagOverride = tt.override
			cfg.SyncInterval = 5 * time.Millisecond
			start(t, cfg)
			waitFor(t, "first sync", func() bool { return synced(a, reg) })
			id := PluginServiceID("alpha")
			registrations := a.Count(consultest.RouteServiceRegister)

			// An operator changes the tags through the catalog.
			op := newClient(t, a, "")
			svc, _ := a.CatalogService(id)
			svc.Tags = []string{"blue"}
			if _, err := op.Catalog().Register(&api.CatalogRegistration{Node: a.NodeName(), Address: "127.0.0.1", Service: &svc}, nil); err != nil {
				t.Fatal(err)
			}
			a.AntiEntropy()

			want := ours
			if tt.override {
				want = []string{"blue"}
			}
			base := a.Count(consultest.RouteChecks)
			waitFor(t, "ten periodic passes", func() bool { return a.Count(consultest.RouteChecks) >= base+10 })
			a.AntiEntropy()
			local, _ := a.Service(id)
			catalog, _ := a.CatalogService(id)
			if !slices.Equal(local.Tags, want) || !slices.Equal(catalog.Tags, want) {
				t.Errorf("after ten passes and anti-entropy: local tags %v, catalog tags %v, want %v", local.Tags, catalog.Tags, want)
			}
			if got := a.Count(consultest.RouteServiceRegister); got != registrations {
				t.Errorf("periodic passes registered %d times", got-registrations)
			}

			if !tt.override {
				// A change of the local service itself is restored by
				// the next pass.
				local.Tags = []string{"green"}
				err := op.Agent().ServiceRegister(&api.AgentServiceRegistration{
					ID: id, Name: local.Service, Tags: local.Tags, Port: local.Port, Address: local.Address, Meta: local.Meta,
				})
				if err != nil {
					t.Fatal(err)
				}
				waitFor(t, "tags restored", func() bool {
					s, _ := a.Service(id)
					return slices.Equal(s.Tags, ours)
				})
			}
		})
	}
}

func TestTagOverrideLifecycleChangeRestoresTags(t *testing.T) {
	tests := []struct {
		name      string
		failFirst bool
	}{
		{"registration succeeds", false},
		{"first registration answers 500", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAgent(t, consultest.Config{})
			reg := registry.New(registry.Config{})
			inst := addPlugin(reg, "alpha", "1.0", plugin.TypeMonolith, heartbeat.Healthy, "ok")
			cfg := testConfig(reg, a.Addr(), &logBuffer{})
			cfg.EnableTagOverride = true
			cfg.SyncInterval = 5 * time.Millisecond
			start(t, cfg)
			waitFor(t, "first sync", func() bool { return synced(a, reg) })
			id := PluginServiceID("alpha")

			op := newClient(t, a, "")
			svc, _ := a.CatalogService(id)
			svc.Tags = []string{"blue"}
			if _, err := op.Catalog().Register(&api.CatalogRegistration{Node: a.NodeName(), Address: "127.0.0.1", Service: &svc}, nil); err != nil {
				t.Fatal(err)
			}
			a.AntiEntropy()
			base := a.Count(consultest.RouteChecks)
			waitFor(t, "passes with adopted tags", func() bool { return a.Count(consultest.RouteChecks) >= base+3 })
			if s, _ := a.Service(id); !slices.Equal(s.Tags, []string{"blue"}) {
				t.Fatalf("tags before the upgrade = %v, want [blue]", s.Tags)
			}

			registrations := a.Count(consultest.RouteServiceRegister)
			if tt.failFirst {
				a.FailNext(consultest.RouteServiceRegister, 1, 500)
			}
			// The plugin is upgraded in place: a new vendor version.
			reg.SetFingerprint("alpha", inst, *fprint("1.1", plugin.TypeMonolith))

			want := []string{"monolith", "1.1", "team-a"}
			waitFor(t, "csisupd's tags restored", func() bool {
				s, _ := a.Service(id)
				return slices.Equal(s.Tags, want) && s.Meta[metaVendorVersion] == "1.1"
			})
			wantRegs := 1
			if tt.failFirst {
				wantRegs = 2
			}
			if got := a.Count(consultest.RouteServiceRegister) - registrations; got != wantRegs {
				t.Errorf("registrations after the upgrade = %d, want %d", got, wantRegs)
			}
			a.AntiEntropy()
			base = a.Count(consultest.RouteChecks)
			waitFor(t, "more passes", func() bool { return a.Count(consultest.RouteChecks) >= base+3 })
			local, _ := a.Service(id)
			catalog, _ := a.CatalogService(id)
			if !slices.Equal(local.Tags, want) || !slices.Equal(catalog.Tags, want) {
				t.Errorf("after anti-entropy: local %v, catalog %v, want %v", local.Tags, catalog.Tags, want)
			}
		})
	}
}

func TestReloadedConfigIsLifecycleChange(t *testing.T) {
	a := newAgent(t, consultest.Config{})
	reg := registry.New(registry.Config{})
	addPlugin(reg, "alpha", "1.0", plugin.TypeMonolith, heartbeat.Healthy, "ok")
	cfg := testConfig(reg, a.Addr(), &logBuffer{})
	cfg.EnableTagOverride = true
	r := start(t, cfg)
	waitFor(t, "first sync", func() bool { return synced(a, reg) })
	id := PluginServiceID("alpha")

	op := newClient(t, a, "")
	svc, _ := a.CatalogService(id)
	svc.Tags = []string{"blue"}
	if _, err := op.Catalog().Register(&api.CatalogRegistration{Node: a.NodeName(), Address: "127.0.0.1", Service: &svc}, nil); err != nil {
		t.Fatal(err)
	}
	a.AntiEntropy()

	// Reloading the same configuration is no lifecycle change.
	base := a.Count(consultest.RouteChecks)
	if err := r.s.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the reload's pass", func() bool { return a.Count(consultest.RouteChecks) > base })
	if s, _ := a.Service(id); !slices.Equal(s.Tags, []string{"blue"}) {
		t.Fatalf("tags after an unchanged reload = %v, want [blue]", s.Tags)
	}

	cfg.Tags = []string{"team-b"}
	if err := r.s.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "new configured tags", func() bool {
		s, _ := a.Service(id)
		ag, _ := a.Service(AgentServiceID)
		return slices.Equal(s.Tags, []string{"monolith", "1.0", "team-b"}) && slices.Equal(ag.Tags, []string{"team-b"})
	})
}

func TestTokenSources(t *testing.T) {
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("file-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		token string
		env   map[string]string
		want  string
	}{
		{"CONSUL_HTTP_TOKEN", "", map[string]string{"CONSUL_HTTP_TOKEN": "env-secret"}, "env-secret"},
		{"CONSUL_HTTP_TOKEN_FILE", "", map[string]string{"CONSUL_HTTP_TOKEN_FILE": tokenFile}, "file-secret"},
		{"configured token wins", "conf-secret", map[string]string{"CONSUL_HTTP_TOKEN": "env-secret", "CONSUL_HTTP_TOKEN_FILE": tokenFile}, "conf-secret"},
		{"token file before token", "", map[string]string{"CONSUL_HTTP_TOKEN": "env-secret", "CONSUL_HTTP_TOKEN_FILE": tokenFile}, "file-secret"},
		{"no token", "", nil, ""},
		{"CONSUL_TOKEN is not read", "", map[string]string{"CONSUL_TOKEN": "ct-secret"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAgent(t, consultest.Config{ACL: &consultest.ACL{
				Tokens:    map[string]consultest.Policy{"env-secret": consultest.AllowAll(), "conf-secret": consultest.AllowAll(), "file-secret": consultest.AllowAll()},
				Anonymous: consultest.AllowAll(),
			}})
			reg := registry.New(registry.Config{})
			addPlugin(reg, "alpha", "1.0", plugin.TypeNode, heartbeat.Healthy, "ok")
			cfg := testConfig(reg, a.Addr(), &logBuffer{})
			cfg.Token = tt.token
			setEnv(t, tt.env)
			start(t, cfg)
			waitFor(t, "sync", func() bool { return synced(a, reg) })
			seen := a.TokensSeen()
			if len(seen) != 1 || seen[tt.want] == 0 {
				t.Errorf("tokens received = %v, want only %q", seen, tt.want)
			}
		})
	}
}

func TestTokenFromProcessEnvironment(t *testing.T) {
	t.Setenv("CONSUL_HTTP_TOKEN", "proc-secret")
	t.Setenv("CONSUL_HTTP_TOKEN_FILE", "")
	a := newAgent(t, consultest.Config{ACL: &consultest.ACL{Tokens: map[string]consultest.Policy{"proc-secret": consultest.AllowAll()}}})
	reg := registry.New(registry.Config{})
	addPlugin(reg, "alpha", "1.0", plugin.TypeNode, heartbeat.Healthy, "ok")
	cfg := testConfig(reg, a.Addr(), &logBuffer{})
	start(t, cfg)
	waitFor(t, "sync", func() bool { return synced(a, reg) })
	if seen := a.TokensSeen(); len(seen) != 1 || seen["proc-secret"] == 0 {
		t.Errorf("tokens received = %v, want only the CONSUL_HTTP_TOKEN value", seen)
	}
}

func TestWrongTokenIsRetriedUntilReload(t *testing.T) {
	tests := []struct {
		name    string
		token   string
		wantLog string
	}{
		{"unknown token", "wrong-secret-123", `list services: Consul does not know the ACL token (HTTP 403: ACL not found)`},
		{"token without write", "reader-secret-456", `register service \"csisupd\" (id _csisupd-agent): permission denied by Consul ACLs (HTTP 403: Permission denied`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAgent(t, consultest.Config{ACL: &consultest.ACL{Tokens: map[string]consultest.Policy{
				"good-secret-000":   consultest.AllowAll(),
				"reader-secret-456": {ServiceRead: []string{""}},
			}}})
			reg := registry.New(registry.Config{})
			addPlugin(reg, "alpha", "1.0", plugin.TypeNode, heartbeat.Healthy, "ok")
			logs := &logBuffer{}
			cfg := testConfig(reg, a.Addr(), logs)
			cfg.Token = tt.token
			r := start(t, cfg)

			waitFor(t, "three denied requests", func() bool { return a.Denied() >= 3 })
			waitFor(t, "the failure logged", func() bool { return logs.Count(tt.wantLog) > 0 })
			if len(a.Services()) != 0 {
				t.Errorf("services registered with a bad token: %v", a.Services())
			}
			if n := logs.Count("consul sync failed; will retry"); n != 1 {
				t.Errorf("the same failure was logged %d times at error level, want 1:\n%s", n, logs)
			}
			select {
			case err := <-r.done:
				t.Fatalf("Run returned on a 403: %v", err)
			default:
			}

			cfg.Token = "good-secret-000"
			if err := r.s.Reload(cfg); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "sync with the fixed token", func() bool { return synced(a, reg) })
			waitFor(t, "recovery logged", func() bool { return logs.Count("consul sync recovered") == 1 })
			for _, secret := range []string{tt.token, "good-secret-000"} {
				if strings.Contains(logs.String(), secret) {
					t.Errorf("the logs show a token:\n%s", logs)
				}
			}
		})
	}
}

func TestConsulTokenWarning(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("file-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		token string
		env   map[string]string
		want  int
	}{
		{"CONSUL_TOKEN alone", "", map[string]string{"CONSUL_TOKEN": "ct-secret-789"}, 1},
		{"with CONSUL_HTTP_TOKEN", "", map[string]string{"CONSUL_TOKEN": "ct-secret-789", "CONSUL_HTTP_TOKEN": "h"}, 0},
		{"with CONSUL_HTTP_TOKEN_FILE", "", map[string]string{"CONSUL_TOKEN": "ct-secret-789", "CONSUL_HTTP_TOKEN_FILE": tokenFile}, 0},
		{"with consul.token", "conf", map[string]string{"CONSUL_TOKEN": "ct-secret-789"}, 0},
		{"neither", "", nil, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logs := &logBuffer{}
			cfg := testConfig(registry.New(registry.Config{}), "127.0.0.1:1", logs)
			cfg.Token = tt.token
			setEnv(t, tt.env)
			s, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.client.close()
			if err := s.Reload(cfg); err != nil {
				t.Fatal(err)
			}
			if got := logs.Count("CONSUL_TOKEN is set but not read"); got != tt.want {
				t.Errorf("warnings = %d, want %d:\n%s", got, tt.want, logs)
			}
			if tt.want > 0 {
				for _, w := range []string{"consul-template", "without a token", "consul.token", "CONSUL_HTTP_TOKEN", "CONSUL_HTTP_TOKEN_FILE"} {
					if logs.Count(w) == 0 {
						t.Errorf("the warning does not say %q:\n%s", w, logs)
					}
				}
			}
			if strings.Contains(logs.String(), "ct-secret-789") {
				t.Errorf("the logs show CONSUL_TOKEN's value:\n%s", logs)
			}
		})
	}
}

func TestConsulDownAtStart(t *testing.T) {
	addr := testutil.FreeAddr(t)
	reg := registry.New(registry.Config{})
	addPlugin(reg, "alpha", "1.0", plugin.TypeNode, heartbeat.Healthy, "ok")
	logs := &logBuffer{}
	cfg := testConfig(reg, addr, logs)
	r := start(t, cfg)
	waitFor(t, "repeated failures", func() bool { return logs.Count("consul sync still failing") >= 2 })
	if n := logs.Count("consul sync failed; will retry"); n != 1 {
		t.Errorf("an unchanged failure was logged %d times at error level, want 1", n)
	}
	select {
	case err := <-r.done:
		t.Fatalf("Run returned while Consul was down: %v", err)
	default:
	}
	a := newAgent(t, consultest.Config{Addr: addr})
	waitFor(t, "sync after Consul came up", func() bool { return synced(a, reg) })
}

func TestProbationOfUnknownServices(t *testing.T) {
	tests := []struct {
		name      string
		probation time.Duration
		wantOld   bool
	}{
		{"within probation", time.Hour, true},
		{"after probation", time.Nanosecond, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAgent(t, consultest.Config{})
			op := newClient(t, a, "")
			// Left by a previous run: "old" and "back" with their checks,
			// plus a service of someone else.
			for _, id := range []string{"old", "back"} {
				err := op.Agent().ServiceRegister(&api.AgentServiceRegistration{
					ID: PluginServiceID(id), Name: "csi-plugin-" + id,
					Check: &api.AgentServiceCheck{CheckID: PluginCheckID(id), TTL: "1h", Status: api.HealthPassing},
				})
				if err != nil {
					t.Fatal(err)
				}
			}
			if err := op.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "web-1", Name: "web"}); err != nil {
				t.Fatal(err)
			}
			reg := registry.New(registry.Config{})
			addPlugin(reg, "back", "2.0", plugin.TypeNode, heartbeat.Healthy, "ok")
			cfg := testConfig(reg, a.Addr(), &logBuffer{})
			cfg.Probation = tt.probation
			cfg.SyncInterval = 5 * time.Millisecond
			start(t, cfg)
			waitFor(t, "sync of the known plugin", func() bool {
				s, ok := a.Service(PluginServiceID("back"))
				return ok && s.Meta[metaVendorVersion] == "2.0"
			})
			if tt.wantOld {
				base := a.Count(consultest.RouteChecks)
				waitFor(t, "five passes", func() bool { return a.Count(consultest.RouteChecks) >= base+5 })
			} else {
				waitFor(t, "old service removed", func() bool {
					_, ok := a.Service(PluginServiceID("old"))
					return !ok
				})
			}
			_, svc := a.Service(PluginServiceID("old"))
			_, chk := a.Check(PluginCheckID("old"))
			if svc != tt.wantOld || chk != tt.wantOld {
				t.Errorf("old service present %v, its check present %v; want %v", svc, chk, tt.wantOld)
			}
			if _, ok := a.Service("web-1"); !ok {
				t.Error("a foreign service was removed")
			}
		})
	}
}

func TestShutdownDeregistration(t *testing.T) {
	tests := []struct {
		name       string
		deregister bool
	}{
		{"deregister on shutdown", true},
		{"keep on shutdown", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAgent(t, consultest.Config{})
			op := newClient(t, a, "")
			if err := op.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "web-1", Name: "web"}); err != nil {
				t.Fatal(err)
			}
			reg := registry.New(registry.Config{})
			addPlugin(reg, "alpha", "1.0", plugin.TypeNode, heartbeat.Healthy, "ok")
			cfg := testConfig(reg, a.Addr(), &logBuffer{})
			cfg.DeregisterOnShutdown = tt.deregister
			r := start(t, cfg)
			waitFor(t, "sync", func() bool { return synced(a, reg) })
			if err := r.stop(t); err != nil {
				t.Fatalf("Run: %v", err)
			}
			own := 0
			for id := range a.Services() {
				if isOwn(id) {
					own++
				}
			}
			if want := map[bool]int{true: 0, false: 2}[tt.deregister]; own != want {
				t.Errorf("own services after shutdown = %d, want %d", own, want)
			}
			if _, ok := a.Service("web-1"); !ok {
				t.Error("a foreign service was removed at shutdown")
			}
		})
	}
}

func TestTTLRefreshOnlyWhenDue(t *testing.T) {
	a := newAgent(t, consultest.Config{})
	reg := registry.New(registry.Config{})
	for _, id := range []string{"a", "b", "c"} {
		addPlugin(reg, id, "1.0", plugin.TypeNode, heartbeat.Healthy, "ok")
	}
	cfg := testConfig(reg, a.Addr(), &logBuffer{})
	cfg.CheckTTL = 8 * time.Hour
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.client.close()
	now := time.Unix(1_000_000, 0)
	s.now = func() time.Time { return now }
	s.start = now
	ctx := context.Background()
	if err := s.pass(ctx); err != nil {
		t.Fatal(err)
	}

	steps := []struct {
		advance     time.Duration
		wantUpdates int
	}{
		{cfg.CheckTTL/4 - time.Second, 0}, // before any refresh is due
		{cfg.CheckTTL/4 + time.Second, 3}, // half the TTL after the registration: all due
		{time.Second, 0},                  // just refreshed
		{cfg.CheckTTL / 2, 3},
	}
	for i, st := range steps {
		now = now.Add(st.advance)
		a.ResetCounts()
		if err := s.pass(ctx); err != nil {
			t.Fatal(err)
		}
		if got := a.Count(consultest.RouteCheckUpdate); got != st.wantUpdates || a.Writes() != st.wantUpdates {
			t.Errorf("step %d: %d TTL updates, %d writes; want %d", i, got, a.Writes(), st.wantUpdates)
		}
	}
}

func TestRunOnceAndReloadChecks(t *testing.T) {
	reg := registry.New(registry.Config{})
	cfg := testConfig(reg, "127.0.0.1:1", &logBuffer{})
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Run(ctx); err != nil {
		t.Fatalf("Run with an ended context: %v", err)
	}
	if err := s.Run(ctx); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("second Run: err = %v, want an error", err)
	}
	other := cfg
	other.Plugins = registry.New(registry.Config{}).Source()
	if err := s.Reload(other); err == nil || !strings.Contains(err.Error(), "Plugins") {
		t.Errorf("Reload with another registry: err = %v", err)
	}
	bad := cfg
	bad.ServicePort = 0
	if err := s.Reload(bad); err == nil || !strings.Contains(err.Error(), "ServicePort") {
		t.Errorf("Reload with a bad config: err = %v", err)
	}
}

// retryWaits returns the retry_in values of the failure lines in logs.
func retryWaits(t *testing.T, logs *logBuffer) []time.Duration {
	t.Helper()
	return retryWaitsOf(t, logs, "")
}

// retryWaitsOf returns the retry_in values of the failure lines in logs
// that contain substr.
func retryWaitsOf(t *testing.T, logs *logBuffer, substr string) []time.Duration {
	t.Helper()
	var out []time.Duration
	for _, line := range strings.Split(logs.String(), "\n") {
		_, after, ok := strings.Cut(line, "retry_in=")
		if !ok || !strings.Contains(line, substr) {
			continue
		}
		d, err := time.ParseDuration(strings.Trim(strings.Fields(after)[0], `"`))
		if err != nil {
			t.Fatalf("retry_in of %q: %v", line, err)
		}
		out = append(out, d)
	}
	return out
}

func TestSyncersOfAgentsDoNotRetryInLockstep(t *testing.T) {
	// The agents of a cluster lose their Consul agent together: their
	// retries must spread, each wait within Jitter of its interval either
	// way, growing from Retry.Base to Retry.Cap. The waits are read from
	// the failure lines, not timed.
	const want = 4 // waits per syncer: 10, 20, 40 and 50 ms before jitter
	addr := testutil.FreeAddr(t)
	var logs [2]*logBuffer
	for i := range logs {
		logs[i] = &logBuffer{}
		start(t, testConfig(registry.New(registry.Config{}), addr, logs[i]))
	}
	var waits [2][]time.Duration
	waitFor(t, "four failed passes of each syncer", func() bool {
		for i := range logs {
			if waits[i] = retryWaits(t, logs[i]); len(waits[i]) < want {
				return false
			}
		}
		return true
	})
	for i := range waits {
		for n, d := range waits[i][:want] {
			around := min(shortRetry.Base<<n, shortRetry.Cap)
			lo := time.Duration(float64(around) * (1 - shortRetry.Jitter))
			hi := time.Duration(float64(around)*(1+shortRetry.Jitter)) + 1
			if d < lo || d > hi {
				t.Errorf("syncer %d: wait %d = %s, want one in [%s, %s]", i, n+1, d, lo, hi)
			}
		}
	}
	same := 0
	for n := range want {
		if waits[0][n] == waits[1][n] {
			same++
		}
	}
	if same == want {
		t.Errorf("two syncers waited %v and %v: in lockstep", waits[0][:want], waits[1][:want])
	}
}
