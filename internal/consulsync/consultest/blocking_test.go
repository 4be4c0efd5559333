package consultest

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// blockingAnswer is the outcome of one blocking catalog query.
type blockingAnswer struct {
	ids   []string
	index uint64
	err   error
}

// blockCatalog starts a blocking query of service at index with wait and
// returns the channel its answer arrives on. It returns once the agent
// counted the request, so the query is being served.
func blockCatalog(t *testing.T, a *Agent, c *api.Client, service string, index uint64, wait time.Duration) <-chan blockingAnswer {
	t.Helper()
	before := a.Count(RouteCatalogService)
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan blockingAnswer, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		list, meta, err := c.Catalog().Service(service, "", (&api.QueryOptions{WaitIndex: index, WaitTime: wait}).WithContext(ctx))
		ans := blockingAnswer{err: err}
		if err == nil {
			ans.index = meta.LastIndex
			for _, s := range list {
				ans.ids = append(ans.ids, s.ServiceID)
			}
		}
		out <- ans
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	waitFor(t, a, "the blocking query to arrive", func() bool { return a.Count(RouteCatalogService) > before })
	return out
}

// stillBlocked fails the test if the query answered: it makes round trips
// to the agent first, long enough for an answer that did not block to
// have arrived.
func stillBlocked(t *testing.T, a *Agent, c *api.Client, answer <-chan blockingAnswer, what string) {
	t.Helper()
	for range 3 {
		if _, err := c.Agent().Self(); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case ans := <-answer:
		t.Fatalf("%s: the blocking query answered %+v; it should still block", what, ans)
	default:
	}
}

func receive(t *testing.T, answer <-chan blockingAnswer, what string) blockingAnswer {
	t.Helper()
	select {
	case ans := <-answer:
		if ans.err != nil {
			t.Fatalf("%s: %v", what, ans.err)
		}
		return ans
	case <-time.After(waitTimeout):
		t.Fatalf("%s: the blocking query did not answer", what)
		return blockingAnswer{}
	}
}

func register(t *testing.T, c *api.Client, id, name string) {
	t.Helper()
	if err := c.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: id, Name: name, Port: 4780}); err != nil {
		t.Fatal(err)
	}
}

func catalogIndex(t *testing.T, c *api.Client, service string) uint64 {
	t.Helper()
	_, meta, err := c.Catalog().Service(service, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if meta.LastIndex == 0 {
		t.Fatalf("catalog service %s answered X-Consul-Index 0", service)
	}
	return meta.LastIndex
}

// A blocking query waits for its service's index to move past the given
// one and answers at once when it does; changes to other services do not
// wake it.
func TestBlockingQueryAnswersWhenTheServiceChanges(t *testing.T) {
	a := newAgent(t, Config{ManualChecks: true})
	c := newClient(t, a, "")
	register(t, c, "srv-0", "srv")
	idx := catalogIndex(t, c, "srv")

	answer := blockCatalog(t, a, c, "srv", idx, time.Hour)
	stillBlocked(t, a, c, answer, "nothing changed")
	register(t, c, "other-1", "other")
	if got := catalogIndex(t, c, "srv"); got != idx {
		t.Errorf("registering another service moved the index of srv from %d to %d", idx, got)
	}
	stillBlocked(t, a, c, answer, "another service registered")

	register(t, c, "srv-1", "srv")
	ans := receive(t, answer, "srv registered")
	if ans.index <= idx || len(ans.ids) != 2 || ans.ids[1] != "srv-1" {
		t.Fatalf("answer after registering srv-1 = %+v, want srv-0 and srv-1 at an index past %d", ans, idx)
	}

	// A check of the service moves its index too (Consul's health
	// queries share it).
	idx = ans.index
	answer = blockCatalog(t, a, c, "srv", idx, time.Hour)
	if err := c.Agent().CheckRegister(&api.AgentCheckRegistration{Name: "ttl", ServiceID: "srv-1",
		AgentServiceCheck: api.AgentServiceCheck{TTL: "1h"}}); err != nil {
		t.Fatal(err)
	}
	if ans := receive(t, answer, "check registered"); ans.index <= idx {
		t.Errorf("answer after a check of srv-1 changed has index %d, want past %d", ans.index, idx)
	}

	// The last instance going away wakes the query, with an empty list.
	if err := c.Agent().ServiceDeregister("srv-0"); err != nil {
		t.Fatal(err)
	}
	idx = catalogIndex(t, c, "srv")
	answer = blockCatalog(t, a, c, "srv", idx, time.Hour)
	if err := c.Agent().ServiceDeregister("srv-1"); err != nil {
		t.Fatal(err)
	}
	ans = receive(t, answer, "srv-1 deregistered")
	if ans.index <= idx || len(ans.ids) != 0 {
		t.Errorf("answer after deregistering srv-1 = %+v, want no instances at an index past %d", ans, idx)
	}

	// A service without instances answers the extinction index, which
	// changes to other services do not move.
	idx = ans.index
	answer = blockCatalog(t, a, c, "srv", idx, time.Hour)
	register(t, c, "other-2", "other")
	stillBlocked(t, a, c, answer, "another service registered after srv went away")
	register(t, c, "srv-3", "srv")
	if ans := receive(t, answer, "srv registered again"); len(ans.ids) != 1 || ans.ids[0] != "srv-3" {
		t.Errorf("answer after registering srv-3 = %+v, want srv-3", ans)
	}
}

// A service that never had an instance answers the index of the last
// change to any node or service, as Consul falls back to, so such a
// change wakes its query.
func TestBlockingQueryOfAServiceThatNeverExisted(t *testing.T) {
	a := newAgent(t, Config{ManualChecks: true})
	c := newClient(t, a, "")
	idx := catalogIndex(t, c, "srv")
	answer := blockCatalog(t, a, c, "srv", idx, time.Hour)
	register(t, c, "other-1", "other")
	if ans := receive(t, answer, "another service registered"); ans.index <= idx || len(ans.ids) != 0 {
		t.Errorf("answer = %+v, want no instances at an index past %d", ans, idx)
	}
}

// A change through another agent of the same catalog wakes the query, as
// the servers' catalog does.
func TestBlockingQuerySeesOtherAgents(t *testing.T) {
	cat := NewCatalog()
	a1 := newAgent(t, Config{Catalog: cat, NodeName: "n1", ManualChecks: true})
	a2 := newAgent(t, Config{Catalog: cat, NodeName: "n2", NodeAddress: "127.0.0.2", ManualChecks: true})
	c1, c2 := newClient(t, a1, ""), newClient(t, a2, "")
	answer := blockCatalog(t, a1, c1, "srv", catalogIndex(t, c1, "srv"), time.Hour)
	register(t, c2, "srv-2", "srv")
	if ans := receive(t, answer, "srv registered on n2"); len(ans.ids) != 1 || ans.ids[0] != "srv-2" {
		t.Errorf("answer = %+v, want srv-2", ans)
	}
}

// With nothing changing the query answers after its wait with the same
// index.
func TestBlockingQueryTimesOut(t *testing.T) {
	a := newAgent(t, Config{ManualChecks: true})
	c := newClient(t, a, "")
	register(t, c, "srv-1", "srv")
	idx := catalogIndex(t, c, "srv")
	const wait = 50 * time.Millisecond
	began := time.Now()
	ans := receive(t, blockCatalog(t, a, c, "srv", idx, wait), "the wait passed")
	if elapsed := time.Since(began); elapsed < wait {
		t.Errorf("the query answered after %s, before its wait of %s", elapsed, wait)
	}
	if ans.index != idx || len(ans.ids) != 1 {
		t.Errorf("answer after the wait = %+v, want srv-1 at the same index %d", ans, idx)
	}
	// An index ahead of the catalog's (a restored Consul) blocks too, and
	// answers the smaller index.
	ans = receive(t, blockCatalog(t, a, c, "srv", idx+1000, wait), "an index ahead")
	if ans.index != idx {
		t.Errorf("answer to an index ahead = %d, want the catalog's %d", ans.index, idx)
	}
}

// Closing the agent ends a query that blocks.
func TestBlockingQueryEndsAtClose(t *testing.T) {
	a, err := New(Config{ManualChecks: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	c := newClient(t, a, "")
	answer := blockCatalog(t, a, c, "srv", catalogIndex(t, c, "srv"), time.Hour)
	closed := make(chan struct{})
	go func() {
		a.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(waitTimeout):
		t.Fatal("Close waited for a blocking query")
	}
	<-answer
}

// Invalid ?wait= and ?index= are answered 400 as Consul answers them, on
// both endpoints that block.
func TestBlockingQueryBadParameters(t *testing.T) {
	a := newAgent(t, Config{ManualChecks: true})
	for _, path := range []string{"/v1/catalog/service/srv", "/v1/health/service/srv"} {
		for query, want := range map[string]string{
			"?index=1&wait=soon": "Invalid wait time",
			"?index=x":           "Invalid index",
			"?index=-1":          "Invalid index",
		} {
			code, body := rawGet(t, a, path+query)
			if code != http.StatusBadRequest || !strings.Contains(string(body), want) {
				t.Errorf("GET %s%s = %d %q, want 400 %q", path, query, code, body, want)
			}
		}
	}
}

// The health endpoint blocks on the same index.
func TestBlockingHealthQuery(t *testing.T) {
	a := newAgent(t, Config{ManualChecks: true})
	c := newClient(t, a, "")
	_, meta, err := c.Health().Service("srv", "", false, nil)
	if err != nil {
		t.Fatal(err)
	}
	idx := meta.LastIndex
	out := make(chan error, 1)
	go func() {
		entries, meta, err := c.Health().Service("srv", "", false, &api.QueryOptions{WaitIndex: idx, WaitTime: time.Hour})
		if err == nil && (len(entries) != 1 || meta.LastIndex <= idx) {
			err = fmt.Errorf("answer %d entries at index %d, want 1 past %d", len(entries), meta.LastIndex, idx)
		}
		out <- err
	}()
	waitFor(t, a, "the health query", func() bool { return a.Count(RouteHealthService) == 1 })
	register(t, c, "srv-1", "srv")
	select {
	case err := <-out:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("the health query did not answer")
	}
}

// QueryWait applies Consul's default, limit and stagger of up to wait/16.
func TestQueryWait(t *testing.T) {
	for _, tt := range []struct {
		value string
		base  time.Duration
	}{
		{"", DefaultQueryWait},
		{"0s", DefaultQueryWait},
		{"-5s", DefaultQueryWait},
		{"2s", 2 * time.Second},
		{"2000ms", 2 * time.Second},
		{"10m", MaxQueryWait},
		{"20m", MaxQueryWait},
	} {
		spread := false
		first, _ := QueryWait(tt.value)
		for range 200 {
			got, ok := QueryWait(tt.value)
			if !ok || got < tt.base || got >= tt.base+tt.base/16 {
				t.Fatalf("QueryWait(%q) = %s, %v; want in [%s, %s)", tt.value, got, ok, tt.base, tt.base+tt.base/16)
			}
			spread = spread || got != first
		}
		if !spread {
			t.Errorf("QueryWait(%q) gave %s 200 times: no stagger", tt.value, first)
		}
	}
	if _, ok := QueryWait("5"); ok {
		t.Error(`QueryWait("5") accepted a duration without a unit`)
	}
}
