package consulsync

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"

	"github.com/csisupd/csisupd/internal/consulsync/consultest"
	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/registry"
	"github.com/csisupd/csisupd/internal/testutil"
)

// These tests run against the test agent answering as a Consul agent does:
// /v1/agent/checks carries no check definitions, gRPC checks run, alias
// checks follow the services they alias.

// newSyncer returns a Syncer for cfg that tests drive pass by pass.
func newSyncer(t *testing.T, cfg Config) *Syncer {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.client.close() })
	return s
}

func mustPass(t *testing.T, s *Syncer) {
	t.Helper()
	if err := s.pass(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A reloaded configuration that changes the agent's check definition (a new
// gRPC address) re-registers the agent service once, with its checks; the
// passes after it write nothing again.
func TestChangedCheckDefinitionWritesOnce(t *testing.T) {
	a := newAgent(t, consultest.Config{})
	reg := registry.New(registry.Config{})
	addPlugin(reg, "alpha", "1.0", plugin.TypeNode, heartbeat.Healthy, "ok")
	addPlugin(reg, "beta", "1.0", plugin.TypeController, heartbeat.Healthy, "ok")
	cfg := testConfig(reg, a.Addr(), &logBuffer{})
	s := newSyncer(t, cfg)
	mustPass(t, s)

	next := cfg
	next.GRPCCheck = "127.0.0.1:10"
	if err := s.Reload(next); err != nil {
		t.Fatal(err)
	}
	a.ResetCounts()
	mustPass(t, s)
	want := map[string]int{consultest.RouteServices: 1, consultest.RouteServiceRegister: 1, consultest.RouteChecks: 1}
	if got := a.Counts(); !maps.Equal(got, want) {
		t.Errorf("pass after the reload made requests %v, want %v", got, want)
	}
	if def, ok := a.CheckDefinition(GRPCCheckID); !ok || def.GRPC != "127.0.0.1:10" {
		t.Errorf("gRPC check dials %q (present %v), want the reloaded address", def.GRPC, ok)
	}
	a.ResetCounts()
	for range 20 {
		mustPass(t, s)
	}
	if w := a.Writes(); w != 0 {
		t.Errorf("20 passes after the change wrote %d times: %v", w, a.Counts())
	}
}

// Every plugin service carries an alias check of the agent service: when
// Consul's gRPC check of the agent fails, all of them turn critical at once
// with no write from csisupd, and they pass again with it.
func TestPluginServicesFollowTheAgentCheck(t *testing.T) {
	a := newAgent(t, consultest.Config{ManualChecks: true})
	reg := registry.New(registry.Config{})
	ids := []string{"alpha", "beta", "gamma"}
	for _, id := range ids {
		addPlugin(reg, id, "1.0", plugin.TypeNode, heartbeat.Healthy, "ok")
	}
	cfg := testConfig(reg, a.Addr(), &logBuffer{})
	s := newSyncer(t, cfg)
	mustPass(t, s)

	aliasStatus := func(status string) bool {
		for _, id := range ids {
			c, ok := a.Check(AliasCheckID(PluginServiceID(id)))
			if !ok || c.Type != "alias" || c.Status != status {
				return false
			}
		}
		return true
	}
	for _, id := range ids {
		def, ok := a.CheckDefinition(AliasCheckID(PluginServiceID(id)))
		if !ok || def.AliasService != AgentServiceID {
			t.Fatalf("plugin %s: alias check %+v (present %v), want an alias of %s", id, def, ok, AgentServiceID)
		}
	}
	a.ResetCounts()
	for _, step := range []struct{ agent, plugins string }{
		{api.HealthPassing, api.HealthPassing},
		{api.HealthCritical, api.HealthCritical},
		{api.HealthPassing, api.HealthPassing},
	} {
		if err := a.SetCheckStatus(GRPCCheckID, step.agent, "gRPC check"); err != nil {
			t.Fatal(err)
		}
		if !aliasStatus(step.plugins) {
			t.Fatalf("agent check %s: plugin alias checks are not all %s: %v", step.agent, step.plugins, a.Checks())
		}
	}
	if w := a.Writes(); w != 0 {
		t.Errorf("csisupd wrote %d times while Consul changed check statuses", w)
	}
}

// The server role registers its service with the agent's gRPC port;
// Servers finds every server of the datacenter in the catalog, each at
// its service address or else its node's, and follows deregistrations.
func TestServerServiceAndServers(t *testing.T) {
	catalog := consultest.NewCatalog()
	nodes := []struct {
		node, nodeAddr, svcAddr string
		port                    int
	}{
		{"node-1", "127.0.0.1", "", 4780},
		{"node-2", "127.0.0.2", "127.0.0.5", 5780},
	}
	var runs []*running
	for _, n := range nodes {
		a := newAgent(t, consultest.Config{NodeName: n.node, NodeAddress: n.nodeAddr, Catalog: catalog, ManualChecks: true})
		cfg := testConfig(registry.New(registry.Config{}), a.Addr(), &logBuffer{})
		cfg.ServiceAddress, cfg.ServicePort, cfg.ServerService = n.svcAddr, n.port, true
		cfg.DeregisterOnShutdown = true
		r := start(t, cfg)
		waitFor(t, "server service of "+n.node, func() bool {
			svc, ok := a.Service(ServerServiceID)
			_, alias := a.Check(AliasCheckID(ServerServiceID))
			return ok && alias && svc.Service == "csisupd-server" && svc.Port == n.port
		})
		runs = append(runs, r)
	}

	// The first call waits for the watch's first answer, which lists both.
	addrs, err := runs[0].s.Servers(context.Background())
	if want := []string{"127.0.0.1:4780", "127.0.0.5:5780"}; err != nil || !slices.Equal(addrs, want) {
		t.Fatalf("Servers = %v, %v; want %v", addrs, err, want)
	}
	if err := runs[1].stop(t); err != nil {
		t.Fatal(err)
	}
	want := []string{"127.0.0.1:4780"}
	waitFor(t, "Servers to follow the deregistration", func() bool {
		addrs, err = runs[0].s.Servers(context.Background())
		return err == nil && slices.Equal(addrs, want)
	})
}

func TestServersErrors(t *testing.T) {
	reg := registry.New(registry.Config{})
	cfg := testConfig(reg, testutil.FreeAddr(t), &logBuffer{})
	cfg.Token = "secret-token"
	r := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	_, err := r.s.Servers(ctx)
	if err == nil || !strings.Contains(err.Error(), `list servers (catalog service "csisupd-server")`) {
		t.Errorf("Servers with Consul down: %v, want an error naming the lookup", err)
	}
	if err != nil && strings.Contains(err.Error(), "secret-token") {
		t.Errorf("the error shows the token: %v", err)
	}
}

// A stop whose deregistration cannot reach Consul succeeds and warns,
// naming every service left behind.
func TestShutdownWithConsulUnreachable(t *testing.T) {
	a := newAgent(t, consultest.Config{ManualChecks: true})
	reg := registry.New(registry.Config{})
	addPlugin(reg, "alpha", "1.0", plugin.TypeNode, heartbeat.Healthy, "ok")
	logs := &logBuffer{}
	cfg := testConfig(reg, a.Addr(), logs)
	cfg.DeregisterOnShutdown = true
	r := start(t, cfg)
	waitFor(t, "sync", func() bool { return synced(a, reg) })
	a.Close() // Consul goes away

	if err := r.stop(t); err != nil {
		t.Fatalf("Run returned %v, want nil: a failed deregistration does not fail the stop", err)
	}
	var warning string
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "[WARN]") && strings.Contains(line, "could not deregister") {
			warning = line
		}
	}
	for _, id := range []string{AgentServiceID, PluginServiceID("alpha")} {
		if !strings.Contains(warning, id) {
			t.Errorf("warning %q does not name %s; log:\n%s", warning, id, logs)
		}
	}
}
