package consultest

import (
	"errors"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newAgent starts an agent that is closed when the test ends.
func newAgent(t *testing.T, cfg Config) *Agent {
	t.Helper()
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return a
}

// newClient returns a consul/api client of a that sends token.
func newClient(t *testing.T, a *Agent, token string) *api.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c, err := api.NewClient(&api.Config{Address: a.Addr(), Token: token, Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// rawPut sends a PUT with a JSON body and extra headers, for requests the
// consul/api client refuses to build.
func rawPut(t *testing.T, a *Agent, path, body string, header map[string]string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, a.URL()+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func statusCode(err error) int {
	var se api.StatusError
	if errors.As(err, &se) {
		return se.Code
	}
	return 0
}

func TestServiceRegisterFillsDefaults(t *testing.T) {
	tests := []struct {
		name    string
		address string
		tagged  map[string]api.ServiceAddress
	}{
		{"ipv4", "10.0.0.5", map[string]api.ServiceAddress{
			"lan_ipv4": {Address: "10.0.0.5", Port: 4780},
			"wan_ipv4": {Address: "10.0.0.5", Port: 4780},
		}},
		{"ipv6", "fd00::5", map[string]api.ServiceAddress{
			"lan_ipv6": {Address: "fd00::5", Port: 4780},
			"wan_ipv6": {Address: "fd00::5", Port: 4780},
		}},
		{"hostname", "node1.example", nil},
		{"empty", "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAgent(t, Config{})
			c := newClient(t, a, "")
			err := c.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "s1", Name: "web", Address: tt.address, Port: 4780})
			if err != nil {
				t.Fatal(err)
			}
			svcs, err := c.Agent().Services()
			if err != nil {
				t.Fatal(err)
			}
			s := svcs["s1"]
			if s == nil {
				t.Fatalf("service s1 missing from %v", svcs)
			}
			if s.Tags == nil || len(s.Tags) != 0 {
				t.Errorf("Tags = %#v, want an empty non-nil list", s.Tags)
			}
			if s.Meta == nil || len(s.Meta) != 0 {
				t.Errorf("Meta = %#v, want an empty non-nil map", s.Meta)
			}
			if s.Weights != (api.AgentWeights{Passing: 1, Warning: 1}) {
				t.Errorf("Weights = %+v, want {1 1}", s.Weights)
			}
			if len(s.TaggedAddresses) != len(tt.tagged) {
				t.Errorf("TaggedAddresses = %v, want %v", s.TaggedAddresses, tt.tagged)
			}
			for k, v := range tt.tagged {
				if s.TaggedAddresses[k] != v {
					t.Errorf("TaggedAddresses[%s] = %v, want %v", k, s.TaggedAddresses[k], v)
				}
			}
		})
	}
}

func TestCheckStatusRules(t *testing.T) {
	ttl := func(id, status string) *api.AgentServiceCheck {
		return &api.AgentServiceCheck{CheckID: id, Name: id, TTL: "1h", Status: status}
	}
	tests := []struct {
		name string
		// steps run against the agent in order.
		steps []func(c *api.Client) error
		want  map[string]string // check id -> status; absent ids must not exist
	}{
		{
			name: "new check is critical",
			steps: []func(c *api.Client) error{func(c *api.Client) error {
				return c.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "s", Name: "s", Checks: api.AgentServiceChecks{ttl("c1", "")}})
			}},
			want: map[string]string{"c1": api.HealthCritical},
		},
		{
			name: "given status is used",
			steps: []func(c *api.Client) error{func(c *api.Client) error {
				return c.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "s", Name: "s", Checks: api.AgentServiceChecks{ttl("c1", api.HealthPassing)}})
			}},
			want: map[string]string{"c1": api.HealthPassing},
		},
		{
			name: "re-registration keeps status",
			steps: []func(c *api.Client) error{
				func(c *api.Client) error {
					return c.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "s", Name: "s", Checks: api.AgentServiceChecks{ttl("c1", "")}})
				},
				func(c *api.Client) error { return c.Agent().UpdateTTL("c1", "fine", api.HealthWarning) },
				func(c *api.Client) error {
					return c.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "s", Name: "s", Checks: api.AgentServiceChecks{ttl("c1", api.HealthPassing)}})
				},
			},
			want: map[string]string{"c1": api.HealthWarning},
		},
		{
			name: "check re-registration keeps status",
			steps: []func(c *api.Client) error{
				func(c *api.Client) error {
					return c.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "s", Name: "s", Checks: api.AgentServiceChecks{ttl("c1", api.HealthPassing)}})
				},
				func(c *api.Client) error {
					return c.Agent().CheckRegister(&api.AgentCheckRegistration{ID: "c1", Name: "c1", ServiceID: "s", AgentServiceCheck: api.AgentServiceCheck{TTL: "2h"}})
				},
			},
			want: map[string]string{"c1": api.HealthPassing},
		},
		{
			name: "without replace, missing checks stay",
			steps: []func(c *api.Client) error{
				func(c *api.Client) error {
					return c.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "s", Name: "s", Checks: api.AgentServiceChecks{ttl("c1", ""), ttl("c2", "")}})
				},
				func(c *api.Client) error {
					return c.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "s", Name: "s", Checks: api.AgentServiceChecks{ttl("c1", "")}})
				},
			},
			want: map[string]string{"c1": api.HealthCritical, "c2": api.HealthCritical},
		},
		{
			name: "replace-existing-checks removes missing checks",
			steps: []func(c *api.Client) error{
				func(c *api.Client) error {
					return c.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "s", Name: "s", Checks: api.AgentServiceChecks{ttl("c1", ""), ttl("c2", "")}})
				},
				func(c *api.Client) error {
					return c.Agent().ServiceRegisterOpts(&api.AgentServiceRegistration{ID: "s", Name: "s", Checks: api.AgentServiceChecks{ttl("c1", "")}},
						api.ServiceRegisterOpts{ReplaceExistingChecks: true})
				},
			},
			want: map[string]string{"c1": api.HealthCritical},
		},
		{
			name: "default check id and name",
			steps: []func(c *api.Client) error{func(c *api.Client) error {
				return c.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "s", Name: "s", Check: &api.AgentServiceCheck{TTL: "1m"}})
			}},
			want: map[string]string{"service:s": api.HealthCritical},
		},
		{
			name: "deregistering a service removes its checks",
			steps: []func(c *api.Client) error{
				func(c *api.Client) error {
					return c.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "s", Name: "s", Checks: api.AgentServiceChecks{ttl("c1", "")}})
				},
				func(c *api.Client) error { return c.Agent().ServiceDeregister("s") },
			},
			want: map[string]string{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAgent(t, Config{})
			c := newClient(t, a, "")
			for i, step := range tt.steps {
				if err := step(c); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
			}
			checks, err := c.Agent().Checks()
			if err != nil {
				t.Fatal(err)
			}
			if len(checks) != len(tt.want) {
				t.Errorf("got %d checks %v, want %v", len(checks), checks, tt.want)
			}
			for id, status := range tt.want {
				got, ok := checks[id]
				if !ok {
					t.Errorf("check %s missing", id)
					continue
				}
				if got.Status != status {
					t.Errorf("check %s status = %q, want %q", id, got.Status, status)
				}
				if got.Type != "ttl" {
					t.Errorf("check %s type = %q, want ttl", id, got.Type)
				}
			}
		})
	}
}

func TestErrorsLikeConsul(t *testing.T) {
	tests := []struct {
		name string
		do   func(t *testing.T, a *Agent, c *api.Client) int
		want int
	}{
		{"deregister unknown service", func(t *testing.T, a *Agent, c *api.Client) int {
			return statusCode(c.Agent().ServiceDeregister("nope"))
		}, 404},
		{"update with bad status", func(t *testing.T, a *Agent, c *api.Client) int {
			return rawPut(t, a, "/v1/agent/check/update/ttl", `{"Status":"bogus"}`, nil)
		}, 400},
		{"update of a non-TTL check", func(t *testing.T, a *Agent, c *api.Client) int {
			return statusCode(c.Agent().UpdateTTL("grpc", "x", api.HealthPassing))
		}, 500},
		{"update of an unknown check", func(t *testing.T, a *Agent, c *api.Client) int {
			return statusCode(c.Agent().UpdateTTL("nope", "x", api.HealthPassing))
		}, 404},
		{"register without a name", func(t *testing.T, a *Agent, c *api.Client) int {
			return statusCode(c.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "x"}))
		}, 400},
		{"register a check without a type", func(t *testing.T, a *Agent, c *api.Client) int {
			return statusCode(c.Agent().ServiceRegister(&api.AgentServiceRegistration{Name: "x", Check: &api.AgentServiceCheck{GRPC: "1.2.3.4:5"}}))
		}, 400},
		{"register a check with a bad status", func(t *testing.T, a *Agent, c *api.Client) int {
			return statusCode(c.Agent().ServiceRegister(&api.AgentServiceRegistration{Name: "x", Check: &api.AgentServiceCheck{TTL: "1s", Status: "up"}}))
		}, 400},
		{"register reserved meta", func(t *testing.T, a *Agent, c *api.Client) int {
			return statusCode(c.Agent().ServiceRegister(&api.AgentServiceRegistration{Name: "x", Meta: map[string]string{"consul-x": "y"}}))
		}, 400},
		{"register an unspecified address", func(t *testing.T, a *Agent, c *api.Client) int {
			return statusCode(c.Agent().ServiceRegister(&api.AgentServiceRegistration{Name: "x", Address: "0.0.0.0"}))
		}, 400},
		{"check for an unknown service", func(t *testing.T, a *Agent, c *api.Client) int {
			return statusCode(c.Agent().CheckRegister(&api.AgentCheckRegistration{Name: "x", ServiceID: "nope", AgentServiceCheck: api.AgentServiceCheck{TTL: "1s"}}))
		}, 404},
		{"interval and TTL", func(t *testing.T, a *Agent, c *api.Client) int {
			return statusCode(c.Agent().CheckRegister(&api.AgentCheckRegistration{Name: "x", AgentServiceCheck: api.AgentServiceCheck{TTL: "1s", Interval: "1s"}}))
		}, 400},
		{"alias with an interval", func(t *testing.T, a *Agent, c *api.Client) int {
			return statusCode(c.Agent().CheckRegister(&api.AgentCheckRegistration{Name: "x", AgentServiceCheck: api.AgentServiceCheck{AliasService: "s", GRPC: "x:1", Interval: "1s"}}))
		}, 400},
		{"script check through the API", func(t *testing.T, a *Agent, c *api.Client) int {
			return statusCode(c.Agent().CheckRegister(&api.AgentCheckRegistration{Name: "x", AgentServiceCheck: api.AgentServiceCheck{Args: []string{"true"}, Interval: "1s"}}))
		}, 500},
		{"bad passing parameter", func(t *testing.T, a *Agent, c *api.Client) int {
			resp, err := http.Get(a.URL() + "/v1/health/service/s?passing=maybe")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp.StatusCode
		}, 400},
		{"unsupported endpoint", func(t *testing.T, a *Agent, c *api.Client) int {
			_, err := c.Agent().Members(false)
			return statusCode(err)
		}, 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAgent(t, Config{})
			c := newClient(t, a, "")
			err := c.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "s", Name: "s", Checks: api.AgentServiceChecks{
				{CheckID: "ttl", TTL: "1m"},
				{CheckID: "grpc", GRPC: "127.0.0.1:1", Interval: "10s"},
			}})
			if err != nil {
				t.Fatal(err)
			}
			if got := tt.do(t, a, c); got != tt.want {
				t.Errorf("status = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestACL(t *testing.T) {
	acl := &ACL{Tokens: map[string]Policy{
		"admin":  AllowAll(),
		"writer": {ServiceWrite: []string{"web"}},
		"reader": {ServiceRead: []string{"web"}},
	}}
	tests := []struct {
		name     string
		header   map[string]string
		path     string
		want     int
		wantBody string
	}{
		{"header token", map[string]string{"X-Consul-Token": "admin"}, "/v1/agent/service/register", 200, ""},
		{"bearer token", map[string]string{"Authorization": "Bearer admin"}, "/v1/agent/service/register", 200, ""},
		{"query token", nil, "/v1/agent/service/register?token=admin", 200, ""},
		{"prefix write", map[string]string{"X-Consul-Token": "writer"}, "/v1/agent/service/register", 200, ""},
		{"unknown token", map[string]string{"X-Consul-Token": "who"}, "/v1/agent/service/register", 403, "ACL not found"},
		{"read-only token", map[string]string{"X-Consul-Token": "reader"}, "/v1/agent/service/register", 403, "Permission denied"},
		{"anonymous", nil, "/v1/agent/service/register", 403, "Permission denied"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAgent(t, Config{ACL: acl})
			got := rawPut(t, a, tt.path, `{"ID":"w1","Name":"web-1"}`, tt.header)
			if got != tt.want {
				t.Fatalf("status = %d, want %d", got, tt.want)
			}
			_, registered := a.Service("w1")
			if registered != (tt.want == 200) {
				t.Errorf("service registered = %v, want %v", registered, tt.want == 200)
			}
			wantDenied := 0
			if tt.want == 403 {
				wantDenied = 1
			}
			if a.Denied() != wantDenied {
				t.Errorf("Denied() = %d, want %d", a.Denied(), wantDenied)
			}
		})
	}

	t.Run("error body", func(t *testing.T) {
		a := newAgent(t, Config{ACL: acl})
		err := newClient(t, a, "reader").Agent().ServiceRegister(&api.AgentServiceRegistration{Name: "web"})
		if statusCode(err) != 403 || !strings.Contains(err.Error(), "Permission denied") {
			t.Errorf("err = %v, want 403 Permission denied", err)
		}
		err = newClient(t, a, "who").Agent().ServiceRegister(&api.AgentServiceRegistration{Name: "web"})
		if statusCode(err) != 403 || !strings.Contains(err.Error(), "ACL not found") {
			t.Errorf("err = %v, want 403 ACL not found", err)
		}
		if _, err := newClient(t, a, "reader").Agent().Self(); statusCode(err) != 403 {
			t.Errorf("self without agent:read: err = %v, want 403", err)
		}
	})

	t.Run("reads are filtered", func(t *testing.T) {
		a := newAgent(t, Config{ACL: acl})
		admin := newClient(t, a, "admin")
		for _, name := range []string{"web", "db"} {
			err := admin.Agent().ServiceRegister(&api.AgentServiceRegistration{Name: name, Check: &api.AgentServiceCheck{TTL: "1m"}})
			if err != nil {
				t.Fatal(err)
			}
		}
		reader := newClient(t, a, "reader")
		svcs, err := reader.Agent().Services()
		if err != nil {
			t.Fatal(err)
		}
		if len(svcs) != 1 || svcs["web"] == nil {
			t.Errorf("reader sees services %v, want only web", svcs)
		}
		checks, err := reader.Agent().Checks()
		if err != nil {
			t.Fatal(err)
		}
		if len(checks) != 1 || checks["service:web"] == nil {
			t.Errorf("reader sees checks %v, want only service:web", checks)
		}
		anon, err := newClient(t, a, "").Agent().Services()
		if err != nil || len(anon) != 0 {
			t.Errorf("anonymous sees %v, %v; want nothing and no error", anon, err)
		}
		seen := a.TokensSeen()
		if seen["admin"] != 2 || seen["reader"] != 2 || seen[""] != 1 {
			t.Errorf("TokensSeen = %v", seen)
		}
	})

	t.Run("token added at runtime", func(t *testing.T) {
		a := newAgent(t, Config{ACL: acl})
		c := newClient(t, a, "late")
		if _, err := c.Agent().Services(); statusCode(err) != 403 {
			t.Fatalf("unknown token: err = %v, want 403", err)
		}
		a.SetToken("late", AllowAll())
		if _, err := c.Agent().Services(); err != nil {
			t.Fatalf("after SetToken: %v", err)
		}
		a.DeleteToken("late")
		if _, err := c.Agent().Services(); statusCode(err) != 403 {
			t.Fatalf("after DeleteToken: err = %v, want 403", err)
		}
	})
}

func TestCatalogAndAntiEntropy(t *testing.T) {
	tests := []struct {
		name         string
		tagOverride  bool
		wantAfterAE  []string
		wantCatalog  []string
		wantHealthOK bool
	}{
		{"tag override adopts catalog tags", true, []string{"operator"}, []string{"operator"}, true},
		{"no tag override restores the catalog", false, []string{"ours"}, []string{"ours"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAgent(t, Config{NodeName: "n1"})
			c := newClient(t, a, "")
			err := c.Agent().ServiceRegister(&api.AgentServiceRegistration{
				ID: "s1", Name: "web", Tags: []string{"ours"}, Address: "10.0.0.1", Port: 80,
				EnableTagOverride: tt.tagOverride,
				Check:             &api.AgentServiceCheck{CheckID: "s1:ttl", TTL: "1h", Status: api.HealthPassing},
			})
			if err != nil {
				t.Fatal(err)
			}
			// Agent writes reach the catalog at once.
			cs, ok := a.CatalogService("s1")
			if !ok || !slices.Equal(cs.Tags, []string{"ours"}) {
				t.Fatalf("catalog after register = %+v (%v), want tags [ours]", cs, ok)
			}
			svc, _ := a.Service("s1")
			svc.Tags = []string{"operator"}
			_, err = c.Catalog().Register(&api.CatalogRegistration{Node: "n1", Address: "127.0.0.1", Service: &svc}, nil)
			if err != nil {
				t.Fatal(err)
			}
			list, _, err := c.Catalog().Service("web", "operator", nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(list) != 1 || list[0].ServiceID != "s1" {
				t.Fatalf("catalog service by tag = %+v, want s1", list)
			}
			if local, _ := a.Service("s1"); !slices.Equal(local.Tags, []string{"ours"}) {
				t.Fatalf("a catalog write changed local tags to %v before anti-entropy", local.Tags)
			}

			a.AntiEntropy()

			local, _ := a.Service("s1")
			if !slices.Equal(local.Tags, tt.wantAfterAE) {
				t.Errorf("local tags after anti-entropy = %v, want %v", local.Tags, tt.wantAfterAE)
			}
			cs, _ = a.CatalogService("s1")
			if !slices.Equal(cs.Tags, tt.wantCatalog) {
				t.Errorf("catalog tags after anti-entropy = %v, want %v", cs.Tags, tt.wantCatalog)
			}
			entries, _, err := c.Health().Service("web", "", true, nil)
			if err != nil {
				t.Fatal(err)
			}
			if (len(entries) == 1) != tt.wantHealthOK {
				t.Errorf("passing health entries = %d, want healthy %v", len(entries), tt.wantHealthOK)
			}

			if err := c.Agent().UpdateTTL("s1:ttl", "down", api.HealthCritical); err != nil {
				t.Fatal(err)
			}
			entries, _, err = c.Health().Service("web", "", true, nil)
			if err != nil || len(entries) != 0 {
				t.Errorf("passing entries after failing check = %d (%v), want 0", len(entries), err)
			}
			if err := c.Agent().ServiceDeregister("s1"); err != nil {
				t.Fatal(err)
			}
			if _, ok := a.CatalogService("s1"); ok {
				t.Error("deregistered service still in the catalog")
			}
		})
	}
}

func TestCountersAndFaults(t *testing.T) {
	a := newAgent(t, Config{})
	c := newClient(t, a, "tok")
	a.FailNext(RouteServiceRegister, 1, http.StatusInternalServerError)
	reg := &api.AgentServiceRegistration{Name: "web"}
	if err := c.Agent().ServiceRegister(reg); statusCode(err) != 500 {
		t.Fatalf("first register: err = %v, want injected 500", err)
	}
	if _, ok := a.Service("web"); ok {
		t.Fatal("a failed register stored the service")
	}
	if err := c.Agent().ServiceRegister(reg); err != nil {
		t.Fatalf("second register: %v", err)
	}
	if _, err := c.Agent().Services(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Agent().Checks(); err != nil {
		t.Fatal(err)
	}
	if got := a.Count(RouteServiceRegister); got != 2 {
		t.Errorf("Count(register) = %d, want 2", got)
	}
	if a.Reads() != 2 || a.Writes() != 2 {
		t.Errorf("Reads, Writes = %d, %d; want 2, 2", a.Reads(), a.Writes())
	}
	if a.TokensSeen()["tok"] != 4 {
		t.Errorf("TokensSeen = %v, want tok 4 times", a.TokensSeen())
	}
	a.ResetCounts()
	if a.Reads() != 0 || a.Writes() != 0 || len(a.Counts()) != 0 {
		t.Errorf("counters after reset: %v", a.Counts())
	}
}

func TestTTLExpiry(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }

	a := newAgent(t, Config{Now: clock})
	c := newClient(t, a, "")
	err := c.Agent().ServiceRegister(&api.AgentServiceRegistration{Name: "s", Check: &api.AgentServiceCheck{CheckID: "t", TTL: "1m", Status: api.HealthPassing}})
	if err != nil {
		t.Fatal(err)
	}
	advance(59 * time.Second)
	if chk, _ := a.Check("t"); chk.Status != api.HealthPassing {
		t.Fatalf("before TTL: status %q", chk.Status)
	}
	if err := c.Agent().UpdateTTL("t", "ok", api.HealthPassing); err != nil {
		t.Fatal(err)
	}
	advance(59 * time.Second)
	if chk, _ := a.Check("t"); chk.Status != api.HealthPassing {
		t.Fatalf("an update did not reset the TTL: status %q", chk.Status)
	}
	advance(2 * time.Second)
	checks, err := c.Agent().Checks()
	if err != nil {
		t.Fatal(err)
	}
	want := "TTL expired (last output before timeout follows): ok"
	if got := checks["t"]; got == nil || got.Status != api.HealthCritical || got.Output != want {
		t.Fatalf("after TTL: %+v, want critical %q", got, want)
	}
	// A re-registration restarts the TTL and forgets the last output.
	err = c.Agent().ServiceRegister(&api.AgentServiceRegistration{Name: "s", Check: &api.AgentServiceCheck{CheckID: "t", TTL: "1m"}})
	if err != nil {
		t.Fatal(err)
	}
	if chk, _ := a.Check("t"); chk.Output != want {
		t.Fatalf("re-registration changed the output to %q", chk.Output)
	}
	advance(time.Minute)
	if chk, _ := a.Check("t"); chk.Status != api.HealthCritical || chk.Output != "TTL expired" {
		t.Fatalf("after TTL without update: %+v, want critical TTL expired", chk)
	}
	// An update revives an expired check.
	if err := c.Agent().UpdateTTL("t", "back", api.HealthPassing); err != nil {
		t.Fatal(err)
	}
	if chk, _ := a.Check("t"); chk.Status != api.HealthPassing || chk.Output != "back" {
		t.Fatalf("after reviving update: %+v", chk)
	}
}

func TestChangedAndSelf(t *testing.T) {
	a := newAgent(t, Config{NodeName: "node-7"})
	ch := a.Changed()
	select {
	case <-ch:
		t.Fatal("Changed closed before any request")
	default:
	}
	name, err := newClient(t, a, "").Agent().NodeName()
	if err != nil {
		t.Fatal(err)
	}
	if name != "node-7" {
		t.Errorf("NodeName = %q, want node-7", name)
	}
	select {
	case <-ch:
	default:
		t.Error("Changed not closed after a request")
	}
	if a.Count(RouteSelf) != 1 {
		t.Errorf("Count(self) = %d, want 1", a.Count(RouteSelf))
	}
}

func TestSetCheckStatusAndCheckDefinition(t *testing.T) {
	a := newAgent(t, Config{ManualChecks: true})
	c := newClient(t, a, "")
	err := c.Agent().ServiceRegister(&api.AgentServiceRegistration{Name: "s", Check: &api.AgentServiceCheck{
		CheckID: "g", GRPC: "127.0.0.1:4780", GRPCUseTLS: true, TLSServerName: "n.test", Interval: "10s", Timeout: "3s",
	}})
	if err != nil {
		t.Fatal(err)
	}
	checks, err := c.Agent().Checks()
	if err != nil {
		t.Fatal(err)
	}
	g := checks["g"]
	if g == nil || g.Type != "grpc" || g.Definition.GRPC != "" || g.Definition.IntervalDuration != 0 {
		t.Fatalf("grpc check through the API = %+v, want type grpc and an empty definition", g)
	}
	if chk, _ := a.Check("g"); chk.Definition.GRPC != "" || chk.Type != "grpc" {
		t.Fatalf("Check() = %+v, want an empty definition", chk)
	}
	def, ok := a.CheckDefinition("g")
	want := api.AgentServiceCheck{
		CheckID: "g", Name: "Service 's' check", GRPC: "127.0.0.1:4780", GRPCUseTLS: true,
		TLSServerName: "n.test", Interval: "10s", Timeout: "3s",
	}
	if !ok || !reflect.DeepEqual(def, want) {
		t.Fatalf("CheckDefinition = %+v, %v; want %+v", def, ok, want)
	}
	if _, ok := a.CheckDefinition("nope"); ok {
		t.Error("CheckDefinition of an unknown check succeeded")
	}
	if err := a.SetCheckStatus("g", api.HealthPassing, "SERVING"); err != nil {
		t.Fatal(err)
	}
	if chk, _ := a.Check("g"); chk.Status != api.HealthPassing || chk.Output != "SERVING" {
		t.Errorf("after SetCheckStatus: %+v", chk)
	}
	if err := a.SetCheckStatus("nope", api.HealthPassing, ""); err == nil {
		t.Error("SetCheckStatus of an unknown check succeeded")
	}
	if err := a.SetCheckStatus("g", "up", ""); err == nil {
		t.Error("SetCheckStatus with a bad status succeeded")
	}
}
