package consultest

import (
	"fmt"
	"slices"
	"testing"

	"github.com/hashicorp/consul/api"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// instance names a service instance of the catalog.
type instance struct{ node, address, id string }

func catalogInstances(t *testing.T, c *api.Client, service string) []instance {
	t.Helper()
	list, _, err := c.Catalog().Service(service, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []instance
	for _, s := range list {
		out = append(out, instance{s.Node, s.Address, s.ServiceID})
	}
	return out
}

func healthInstances(t *testing.T, c *api.Client, service string, passingOnly bool) []instance {
	t.Helper()
	entries, _, err := c.Health().Service(service, "", passingOnly, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []instance
	for _, e := range entries {
		out = append(out, instance{e.Node.Node, e.Node.Address, e.Service.ID})
	}
	return out
}

func TestSharedCatalog(t *testing.T) {
	cat := NewCatalog()
	nodes := []struct{ name, address string }{{"n2", "10.0.0.2"}, {"n1", "10.0.0.1"}}
	agents := make(map[string]*Agent)
	clients := make(map[string]*api.Client)
	for _, n := range nodes {
		a := newAgent(t, Config{Catalog: cat, NodeName: n.name, NodeAddress: n.address, ManualChecks: true})
		if a.Catalog() != cat {
			t.Fatal("Catalog() is not the configured catalog")
		}
		agents[n.name], clients[n.name] = a, newClient(t, a, "")
	}
	if _, err := New(Config{Catalog: cat, NodeName: "n1"}); err == nil {
		t.Fatal("a second agent for node n1 was created")
	}
	if agents["n1"].Addr() == agents["n2"].Addr() {
		t.Fatal("the agents share a listener")
	}

	changed := agents["n1"].Changed()
	for _, n := range []string{"n2", "n1"} {
		for _, id := range []string{"web-b", "web-a"} {
			err := clients[n].Agent().ServiceRegister(&api.AgentServiceRegistration{
				ID: id, Name: "web", Port: 80,
				Check: &api.AgentServiceCheck{CheckID: id + ":ttl", TTL: "1h", Status: api.HealthPassing},
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	select {
	case <-changed:
	default:
		t.Error("n1's Changed was not closed by writes through n2")
	}

	all := []instance{
		{"n1", "10.0.0.1", "web-a"}, {"n1", "10.0.0.1", "web-b"},
		{"n2", "10.0.0.2", "web-a"}, {"n2", "10.0.0.2", "web-b"},
	}
	for _, via := range []string{"n1", "n2"} {
		t.Run("catalog via "+via, func(t *testing.T) {
			c := clients[via]
			if got := catalogInstances(t, c, "web"); !slices.Equal(got, all) {
				t.Errorf("catalog service = %v, want %v", got, all)
			}
			if got := healthInstances(t, c, "web", true); !slices.Equal(got, all) {
				t.Errorf("passing health = %v, want %v", got, all)
			}
			// The agent endpoints stay local.
			svcs, err := c.Agent().Services()
			if err != nil || len(svcs) != 2 {
				t.Errorf("agent services via %s = %v, %v; want the 2 local ones", via, svcs, err)
			}
		})
	}

	// An alias of a service of another node follows the catalog. It
	// belongs to a service of its own: as a node check it would make
	// every instance of n1 critical with it.
	err := clients["n1"].Agent().ServiceRegister(&api.AgentServiceRegistration{
		ID: "proxy", Name: "proxy",
		Check: &api.AgentServiceCheck{CheckID: "remote", AliasNode: "n2", AliasService: "web-a"},
	})
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name       string
		do         func(t *testing.T)
		wantStatus string
		wantOutput string
		wantHealth []instance
	}{
		{"all passing", func(t *testing.T) {}, api.HealthPassing, "All checks passing.", all},
		{"remote check critical", func(t *testing.T) {
			if err := clients["n2"].Agent().UpdateTTL("web-a:ttl", "down", api.HealthCritical); err != nil {
				t.Fatal(err)
			}
		}, api.HealthCritical, `Aliased check "Service 'web' check" failing: down`, []instance{all[0], all[1], all[3]}},
		{"remote check passing", func(t *testing.T) {
			if err := clients["n2"].Agent().UpdateTTL("web-a:ttl", "up", api.HealthPassing); err != nil {
				t.Fatal(err)
			}
		}, api.HealthPassing, "All checks passing.", all},
		{"anti-entropy of n1 leaves n2 alone", func(t *testing.T) { agents["n1"].AntiEntropy() }, api.HealthPassing, "All checks passing.", all},
		{"remote agent closed", func(t *testing.T) { agents["n2"].Close() }, api.HealthCritical,
			fmt.Sprintf("Aliased check %q failing: %s", serfHealthName, serfFailedOutput), all[:2]},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			st.do(t)
			chk, _ := agents["n1"].Check("remote")
			if chk.Status != st.wantStatus || chk.Output != st.wantOutput {
				t.Errorf("alias of n2/web-a = %s %q, want %s %q", chk.Status, chk.Output, st.wantStatus, st.wantOutput)
			}
			if got := healthInstances(t, clients["n1"], "web", true); !slices.Equal(got, st.wantHealth) {
				t.Errorf("passing health via n1 = %v, want %v", got, st.wantHealth)
			}
			wantProxy := []instance{{"n1", "10.0.0.1", "proxy"}}
			if st.wantStatus != api.HealthPassing {
				wantProxy = nil
			}
			if got := healthInstances(t, clients["n1"], "proxy", true); !slices.Equal(got, wantProxy) {
				t.Errorf("passing proxy instances = %v, want %v", got, wantProxy)
			}
		})
	}
	// A failed node stays in the catalog.
	if got := catalogInstances(t, clients["n1"], "web"); !slices.Equal(got, all) {
		t.Errorf("catalog after n2 closed = %v, want %v", got, all)
	}

	t.Run("unknown node", func(t *testing.T) {
		err := clients["n1"].Agent().CheckRegister(&api.AgentCheckRegistration{
			ID: "ghost", Name: "ghost", ServiceID: "proxy", AgentServiceCheck: api.AgentServiceCheck{AliasNode: "n9", AliasService: "web"},
		})
		if err != nil {
			t.Fatal(err)
		}
		chk, _ := agents["n1"].Check("ghost")
		if want := "Service web could not be found on node n9"; chk.Status != api.HealthCritical || chk.Output != want {
			t.Errorf("alias of an unknown node = %s %q, want critical %q", chk.Status, chk.Output, want)
		}
	})
}

func TestAliasFollowsRunningGRPCCheck(t *testing.T) {
	s := startHealthServer(t, nil)
	a := newAgent(t, Config{NodeName: "n1"})
	c := newClient(t, a, "")
	registerGRPC(t, c, api.AgentServiceCheck{GRPC: s.addr, Interval: "50ms"})
	err := c.Agent().ServiceRegister(&api.AgentServiceRegistration{
		ID: "side", Name: "side", Check: &api.AgentServiceCheck{CheckID: "alias", AliasService: "s"},
	})
	if err != nil {
		t.Fatal(err)
	}
	waitCheck(t, a, "alias", "passing", passing)
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	chk := waitCheck(t, a, "alias", "critical", critical)
	if want := fmt.Sprintf("Aliased check \"Service 's' check\" failing: gRPC %s serving status: NOT_SERVING", s.addr); chk.Output != want {
		t.Errorf("alias output = %q, want %q", chk.Output, want)
	}
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	waitCheck(t, a, "alias", "passing again", passing)
}
