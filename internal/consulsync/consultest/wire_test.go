package consultest

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/hashicorp/consul/api"
)

// checkKeys is the field set of structs.HealthCheck as a Consul 1.21 agent
// serves it.
var checkKeys = []string{
	"CheckID", "CreateIndex", "Definition", "ExposedPort", "Interval", "ModifyIndex", "Name", "Node",
	"Notes", "Output", "ServiceID", "ServiceName", "ServiceTags", "Status", "Timeout", "Type",
}

// registerMix registers a service with tags and checks of every kind the
// double runs, a service without tags, and a node check.
func registerMix(t *testing.T, c *api.Client) {
	t.Helper()
	err := c.Agent().ServiceRegister(&api.AgentServiceRegistration{
		ID: "web-1", Name: "web", Tags: []string{"v1"}, Address: "10.0.0.1", Port: 80,
		Checks: api.AgentServiceChecks{
			{CheckID: "web:grpc", GRPC: "127.0.0.1:1/web", GRPCUseTLS: true, Interval: "10s", Timeout: "3s"},
			{CheckID: "web:ttl", TTL: "1h", Status: api.HealthPassing},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Agent().ServiceRegister(&api.AgentServiceRegistration{
		ID: "side", Name: "side", Address: "db.example", Port: 81,
		Check: &api.AgentServiceCheck{CheckID: "side:alias", AliasService: "web-1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Agent().CheckRegister(&api.AgentCheckRegistration{ID: "mem", Name: "mem", AgentServiceCheck: api.AgentServiceCheck{TTL: "1m", Status: api.HealthPassing}})
	if err != nil {
		t.Fatal(err)
	}
}

func TestAgentChecksWireFormat(t *testing.T) {
	a := newAgent(t, Config{NodeName: "n1", ManualChecks: true})
	registerMix(t, newClient(t, a, ""))

	var got map[string]map[string]json.RawMessage
	rawJSON(t, a, "/v1/agent/checks", &got)

	tests := []struct {
		id, typ, interval, timeout, serviceID, tags, status string
	}{
		{"web:grpc", "grpc", "10s", "3s", "web-1", `["v1"]`, api.HealthCritical},
		{"web:ttl", "ttl", "", "", "web-1", `["v1"]`, api.HealthPassing},
		{"side:alias", "alias", "", "", "side", `[]`, api.HealthCritical},
		{"mem", "ttl", "", "", "", `[]`, api.HealthPassing},
	}
	if len(got) != len(tests) {
		t.Errorf("got %d checks, want %d", len(got), len(tests))
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			c, ok := got[tt.id]
			if !ok {
				t.Fatalf("check %s missing from %v", tt.id, got)
			}
			if k := keys(c); !slices.Equal(k, checkKeys) {
				t.Errorf("keys = %v, want %v", k, checkKeys)
			}
			str := func(k string) string {
				var s string
				if err := json.Unmarshal(c[k], &s); err != nil {
					t.Fatalf("%s = %s: %v", k, c[k], err)
				}
				return s
			}
			for k, want := range map[string]string{
				"Type": tt.typ, "Interval": tt.interval, "Timeout": tt.timeout,
				"ServiceID": tt.serviceID, "Status": tt.status, "Node": "n1", "CheckID": tt.id,
			} {
				if got := str(k); got != want {
					t.Errorf("%s = %q, want %q", k, got, want)
				}
			}
			// Definition is always {}: a Consul agent does not serve what
			// a check was registered with.
			for k, want := range map[string]string{
				"Definition": "{}", "ServiceTags": tt.tags, "ExposedPort": "0", "CreateIndex": "0", "ModifyIndex": "0",
			} {
				if got := string(c[k]); got != want {
					t.Errorf("%s = %s, want %s", k, got, want)
				}
			}
		})
	}
}

func TestAgentServicesWireFormat(t *testing.T) {
	a := newAgent(t, Config{ManualChecks: true})
	registerMix(t, newClient(t, a, ""))

	var got map[string]map[string]json.RawMessage
	rawJSON(t, a, "/v1/agent/services", &got)
	base := []string{"Address", "Datacenter", "EnableTagOverride", "ID", "Meta", "Port", "Service", "Tags", "Weights"}
	tests := []struct {
		id       string
		wantKeys []string
		tags     string
	}{
		{"web-1", slices.Sorted(slices.Values(append(slices.Clone(base), "TaggedAddresses"))), `["v1"]`},
		{"side", base, `[]`},
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			s, ok := got[tt.id]
			if !ok {
				t.Fatalf("service %s missing", tt.id)
			}
			if k := keys(s); !slices.Equal(k, tt.wantKeys) {
				t.Errorf("keys = %v, want %v", k, tt.wantKeys)
			}
			for k, want := range map[string]string{
				"Tags": tt.tags, "Meta": `{}`, "Weights": `{"Passing":1,"Warning":1}`, "Datacenter": `"dc1"`,
			} {
				if string(s[k]) != want {
					t.Errorf("%s = %s, want %s", k, s[k], want)
				}
			}
		})
	}
	svc, _ := a.Service("web-1")
	if svc.CreateIndex != 0 || svc.ModifyIndex != 0 {
		t.Errorf("Service() carries indexes %d/%d; the agent serves none", svc.CreateIndex, svc.ModifyIndex)
	}
}

func TestCatalogWireFormat(t *testing.T) {
	a := newAgent(t, Config{NodeName: "n1", NodeAddress: "192.0.2.1", ManualChecks: true})
	c := newClient(t, a, "")
	registerMix(t, c)
	// A catalog registration keeps the definition it was given, as the
	// servers do.
	_, err := c.Catalog().Register(&api.CatalogRegistration{
		Node: "ext", Address: "192.0.2.9",
		Service: &api.AgentService{ID: "web-x", Service: "web", Port: 80},
		Checks: api.HealthChecks{{
			CheckID: "ext:http", Name: "ext http", Status: api.HealthPassing, ServiceID: "web-x", Type: "http",
			Definition: api.HealthCheckDefinition{HTTP: "http://192.0.2.9/", IntervalDuration: 10e9},
		}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}

	var entries []struct {
		Node    map[string]json.RawMessage
		Service map[string]json.RawMessage
		Checks  []map[string]json.RawMessage
	}
	rawJSON(t, a, "/v1/health/service/web", &entries)
	if len(entries) != 2 {
		t.Fatalf("got %d health entries, want 2", len(entries))
	}
	wantNode := []string{"Address", "CreateIndex", "Datacenter", "ID", "Meta", "ModifyIndex", "Node", "TaggedAddresses"}
	wantService := []string{"Address", "Connect", "CreateIndex", "EnableTagOverride", "ID", "Meta", "ModifyIndex",
		"Port", "Proxy", "Service", "TaggedAddresses", "Tags", "Weights"}
	tests := []struct {
		node       string
		checks     []string
		definition map[string]string
	}{
		{"ext", []string{"ext:http"}, map[string]string{"ext:http": `{"HTTP":"http://192.0.2.9/","Interval":"10s"}`}},
		{"n1", []string{"mem", "serfHealth", "web:grpc", "web:ttl"}, map[string]string{"mem": "{}", "serfHealth": "{}", "web:grpc": "{}", "web:ttl": "{}"}},
	}
	for i, tt := range tests {
		t.Run(tt.node, func(t *testing.T) {
			e := entries[i]
			if string(e.Node["Node"]) != `"`+tt.node+`"` {
				t.Fatalf("entry %d is node %s, want %s", i, e.Node["Node"], tt.node)
			}
			if k := keys(e.Node); !slices.Equal(k, wantNode) {
				t.Errorf("node keys = %v, want %v", k, wantNode)
			}
			if k := keys(e.Service); !slices.Equal(k, wantService) && tt.node == "n1" {
				t.Errorf("service keys = %v, want %v", k, wantService)
			}
			var ids []string
			for _, chk := range e.Checks {
				var id string
				_ = json.Unmarshal(chk["CheckID"], &id)
				ids = append(ids, id)
				if k := keys(chk); !slices.Equal(k, checkKeys) {
					t.Errorf("check %s keys = %v, want %v", id, k, checkKeys)
				}
				if got, want := string(chk["Definition"]), tt.definition[id]; got != want {
					t.Errorf("check %s Definition = %s, want %s", id, got, want)
				}
				if string(chk["ServiceTags"]) == "null" {
					t.Errorf("check %s ServiceTags = null, want a list", id)
				}
			}
			if !slices.Equal(ids, tt.checks) {
				t.Errorf("checks = %v, want %v", ids, tt.checks)
			}
		})
	}
	if got := string(entries[1].Checks[2]["Interval"]); got != `"10s"` {
		t.Errorf("catalog Interval of web:grpc = %s, want \"10s\"", got)
	}

	var nodes []map[string]json.RawMessage
	rawJSON(t, a, "/v1/catalog/service/web", &nodes)
	wantKeys := []string{"Address", "CreateIndex", "Datacenter", "ID", "ModifyIndex", "Node", "NodeMeta",
		"ServiceAddress", "ServiceConnect", "ServiceEnableTagOverride", "ServiceID", "ServiceKind", "ServiceMeta",
		"ServiceName", "ServicePort", "ServiceProxy", "ServiceTaggedAddresses", "ServiceTags", "ServiceWeights",
		"TaggedAddresses"}
	if len(nodes) != 2 {
		t.Fatalf("catalog service has %d instances, want 2", len(nodes))
	}
	if k := keys(nodes[1]); !slices.Equal(k, wantKeys) {
		t.Errorf("catalog service keys = %v, want %v", k, wantKeys)
	}
	if got := string(nodes[1]["TaggedAddresses"]); got != `{"lan":"192.0.2.1","lan_ipv4":"192.0.2.1","wan":"192.0.2.1","wan_ipv4":"192.0.2.1"}` {
		t.Errorf("node tagged addresses = %s", got)
	}
}
