package consultest

import (
	"crypto/tls"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
)

// Routes name the handled endpoints: the method and path pattern, as counted
// by Agent.Count and selected by Agent.FailNext.
const (
	RouteSelf              = "GET /v1/agent/self"
	RouteServices          = "GET /v1/agent/services"
	RouteChecks            = "GET /v1/agent/checks"
	RouteServiceRegister   = "PUT /v1/agent/service/register"
	RouteServiceDeregister = "PUT /v1/agent/service/deregister/{id}"
	RouteCheckRegister     = "PUT /v1/agent/check/register"
	RouteCheckDeregister   = "PUT /v1/agent/check/deregister/{id}"
	RouteCheckUpdate       = "PUT /v1/agent/check/update/{id}"
	RouteCatalogRegister   = "PUT /v1/catalog/register"
	RouteCatalogService    = "GET /v1/catalog/service/{name}"
	RouteHealthService     = "GET /v1/health/service/{name}"
	// RouteOther counts requests to endpoints the Agent does not serve.
	RouteOther = "other"
)

// checkBufSize is the longest check output Consul keeps; longer output is
// truncated with a note, as Consul does.
const checkBufSize = 4 * 1024

// defaultCheckTimeout is the timeout of a gRPC check registered without
// one, as in Consul.
const defaultCheckTimeout = 10 * time.Second

// Config configures an Agent. The zero value is a ready-to-use agent
// without ACLs, with a catalog of its own, that runs gRPC checks.
type Config struct {
	// Addr is the TCP address to listen on (default "127.0.0.1:0").
	Addr string
	// NodeName is the agent's node (default "consultest"). It must be
	// unique among the agents of a Catalog.
	NodeName string
	// NodeAddress is the node's address in the catalog (default
	// "127.0.0.1").
	NodeAddress string
	// Datacenter is reported by /v1/agent/self (default "dc1").
	Datacenter string
	// ACL enables ACLs when set.
	ACL *ACL
	// Now returns the current time, for TTL expiry (default time.Now).
	Now func() time.Time
	// Catalog is the catalog the agent pushes its node, services and
	// checks to and answers catalog and health queries from. Agents
	// created with the same Catalog behave like the agents of the nodes of
	// one datacenter. Nil gives the agent a catalog of its own.
	Catalog *Catalog
	// CheckTLS is the TLS configuration gRPC checks with GRPCUseTLS start
	// from, like the agent TLS configuration Consul uses for checks
	// (enable_agent_tls_for_checks). It is cloned for each check, which
	// sets ServerName from TLSServerName when given and
	// InsecureSkipVerify from TLSSkipVerify. Nil verifies with the system
	// roots.
	CheckTLS *tls.Config
	// ManualChecks keeps the agent from running gRPC checks: their status
	// changes only through SetCheckStatus, for tests that drive statuses
	// themselves. A real Consul agent always runs them.
	ManualChecks bool
}

// Agent is a fake Consul agent served over HTTP. It is safe for concurrent
// use.
type Agent struct {
	srv      *httptest.Server
	cat      *Catalog
	now      func() time.Time
	node     string
	addr     string
	dc       string
	checkTLS *tls.Config
	manual   bool

	// wg counts the gRPC check runners and armed TTL timers.
	wg sync.WaitGroup
	// quit is closed when Close starts: blocking queries answer at once.
	quit     chan struct{}
	quitOnce sync.Once

	// The fields below are guarded by cat.mu.
	closed   bool
	acl      *ACL
	services map[string]*localService
	checks   map[string]*localCheck
	counts   map[string]int
	denied   int
	tokens   map[string]int
	faults   map[string]*fault
	changed  chan struct{}
	// checksRemoved is set when a check went away since the last
	// evaluation of the local alias checks: removals leave no unsynced
	// record behind, so every local alias is evaluated again.
	checksRemoved bool
}

type localService struct {
	svc    api.AgentService // as /v1/agent/services shows it
	inSync bool
}

type fault struct {
	remaining int
	code      int
}

// New starts an Agent and registers its node in the catalog. Close it when
// done.
func New(cfg Config) (*Agent, error) {
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.NodeName == "" {
		cfg.NodeName = "consultest"
	}
	if cfg.NodeAddress == "" {
		cfg.NodeAddress = "127.0.0.1"
	}
	if cfg.Datacenter == "" {
		cfg.Datacenter = "dc1"
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Catalog == nil {
		cfg.Catalog = NewCatalog()
	}
	a := &Agent{
		cat:      cfg.Catalog,
		now:      cfg.Now,
		node:     cfg.NodeName,
		addr:     cfg.NodeAddress,
		dc:       cfg.Datacenter,
		manual:   cfg.ManualChecks,
		acl:      cloneACL(cfg.ACL),
		services: make(map[string]*localService),
		checks:   make(map[string]*localCheck),
		counts:   make(map[string]int),
		tokens:   make(map[string]int),
		faults:   make(map[string]*fault),
		changed:  make(chan struct{}),
		quit:     make(chan struct{}),
	}
	if cfg.CheckTLS != nil {
		a.checkTLS = cfg.CheckTLS.Clone()
	}
	l, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("consultest: listen on %s: %w", cfg.Addr, err)
	}
	cat := a.cat
	cat.mu.Lock()
	if _, dup := cat.agents[a.node]; dup {
		cat.mu.Unlock()
		l.Close()
		return nil, fmt.Errorf("consultest: node %q already has an agent in this catalog", a.node)
	}
	cat.registerAgentLocked(a)
	cat.notifyAllLocked()
	cat.mu.Unlock()

	mux := http.NewServeMux()
	for route, h := range map[string]handler{
		RouteSelf:              a.handleSelf,
		RouteServices:          a.handleServices,
		RouteChecks:            a.handleChecks,
		RouteServiceRegister:   a.handleServiceRegister,
		RouteServiceDeregister: a.handleServiceDeregister,
		RouteCheckRegister:     a.handleCheckRegister,
		RouteCheckDeregister:   a.handleCheckDeregister,
		RouteCheckUpdate:       a.handleCheckUpdate,
		RouteCatalogRegister:   a.handleCatalogRegister,
		RouteCatalogService:    a.handleCatalogService,
		RouteHealthService:     a.handleHealthService,
		"/":                    a.handleOther,
	} {
		mux.Handle(route, a.wrap(h))
	}
	a.srv = httptest.NewUnstartedServer(mux)
	a.srv.Listener.Close()
	a.srv.Listener = l
	a.srv.Start()
	return a, nil
}

// Close stops the server, closes its connections, stops the agent's check
// runners and TTL timers and waits for them to finish. Blocking queries in
// progress answer at once. The node stays in the catalog with a critical
// serfHealth check, as a failed node does until the servers reap it. Close
// is idempotent.
func (a *Agent) Close() {
	a.quitOnce.Do(func() { close(a.quit) })
	a.srv.Close()
	cat := a.cat
	cat.mu.Lock()
	if a.closed {
		cat.mu.Unlock()
		return
	}
	idx0 := cat.index
	a.closed = true
	for _, c := range a.checks {
		a.stopCheckLocked(c)
	}
	delete(cat.agents, a.node)
	if n, ok := cat.nodes[a.node]; ok {
		if h, ok := n.checks[serfHealthID]; ok {
			cat.index++
			f := *h
			f.Status, f.Output = api.HealthCritical, serfFailedOutput
			cat.putCheckLocked(n, &f)
		}
	}
	cat.finishLocked(idx0)
	a.notifyLocked()
	cat.mu.Unlock()
	a.wg.Wait()
}

// Addr returns the host:port the Agent listens on, as consul/api's
// Config.Address takes it.
func (a *Agent) Addr() string { return a.srv.Listener.Addr().String() }

// URL returns the base URL of the Agent.
func (a *Agent) URL() string { return a.srv.URL }

// NodeName returns the agent's node name.
func (a *Agent) NodeName() string { return a.node }

// Catalog returns the catalog the agent pushes to.
func (a *Agent) Catalog() *Catalog { return a.cat }

// Changed returns a channel that is closed at the next request to this
// agent or the next state change of its catalog (a write through any
// agent, a check result, a TTL expiry). Wait on it instead of sleeping.
func (a *Agent) Changed() <-chan struct{} {
	a.cat.mu.Lock()
	defer a.cat.mu.Unlock()
	return a.changed
}

// Count returns how many requests hit route (one of the Route constants)
// since the start or the last ResetCounts, including failed ones.
func (a *Agent) Count(route string) int {
	a.cat.mu.Lock()
	defer a.cat.mu.Unlock()
	return a.counts[route]
}

// Counts returns the request counters by route.
func (a *Agent) Counts() map[string]int {
	a.cat.mu.Lock()
	defer a.cat.mu.Unlock()
	return maps.Clone(a.counts)
}

// Reads returns how many GET requests were made.
func (a *Agent) Reads() int {
	a.cat.mu.Lock()
	defer a.cat.mu.Unlock()
	n := 0
	for route, c := range a.counts {
		if strings.HasPrefix(route, "GET ") {
			n += c
		}
	}
	return n
}

// Writes returns how many requests other than GETs were made.
func (a *Agent) Writes() int {
	a.cat.mu.Lock()
	defer a.cat.mu.Unlock()
	n := 0
	for route, c := range a.counts {
		if !strings.HasPrefix(route, "GET ") {
			n += c
		}
	}
	return n
}

// Denied returns how many requests were answered 403.
func (a *Agent) Denied() int {
	a.cat.mu.Lock()
	defer a.cat.mu.Unlock()
	return a.denied
}

// TokensSeen returns how many requests carried each token; requests
// without a token count under "".
func (a *Agent) TokensSeen() map[string]int {
	a.cat.mu.Lock()
	defer a.cat.mu.Unlock()
	return maps.Clone(a.tokens)
}

// ResetCounts zeroes the request, denial and token counters.
func (a *Agent) ResetCounts() {
	a.cat.mu.Lock()
	defer a.cat.mu.Unlock()
	clear(a.counts)
	clear(a.tokens)
	a.denied = 0
}

// FailNext makes the next n requests to route fail with the HTTP status
// code, before any other processing. A later call replaces an earlier one.
func (a *Agent) FailNext(route string, n, code int) {
	a.cat.mu.Lock()
	defer a.cat.mu.Unlock()
	a.faults[route] = &fault{remaining: n, code: code}
}

// Service returns a copy of a local service as /v1/agent/services shows it
// (without CreateIndex and ModifyIndex, which the agent does not serve).
func (a *Agent) Service(id string) (api.AgentService, bool) {
	a.cat.mu.Lock()
	defer a.cat.mu.Unlock()
	s, ok := a.services[id]
	if !ok {
		return api.AgentService{}, false
	}
	return cloneService(s.svc), true
}

// Services returns copies of all local services by id.
func (a *Agent) Services() map[string]api.AgentService {
	a.cat.mu.Lock()
	defer a.cat.mu.Unlock()
	out := make(map[string]api.AgentService, len(a.services))
	for id, s := range a.services {
		out[id] = cloneService(s.svc)
	}
	return out
}

// Check returns a local check as /v1/agent/checks shows it and consul/api
// decodes it: in particular its Definition is empty, since a Consul agent
// does not serve the definitions of its checks. Use CheckDefinition for
// what was registered.
func (a *Agent) Check(id string) (api.AgentCheck, bool) {
	a.cat.mu.Lock()
	defer a.cat.mu.Unlock()
	a.cat.refreshLocked()
	c, ok := a.checks[id]
	if !ok {
		return api.AgentCheck{}, false
	}
	return a.agentCheckLocked(c), true
}

// Checks returns all local checks by id, as Check returns them.
func (a *Agent) Checks() map[string]api.AgentCheck {
	a.cat.mu.Lock()
	defer a.cat.mu.Unlock()
	a.cat.refreshLocked()
	out := make(map[string]api.AgentCheck, len(a.checks))
	for id, c := range a.checks {
		out[id] = a.agentCheckLocked(c)
	}
	return out
}

// CheckDefinition returns the definition of a local check as it was
// registered, with CheckID and Name set to the ones the agent used. A
// Consul agent keeps it only in its data dir and serves it nowhere; this
// is the test-only view of it, to assert what a client registered.
func (a *Agent) CheckDefinition(id string) (api.AgentServiceCheck, bool) {
	a.cat.mu.Lock()
	defer a.cat.mu.Unlock()
	c, ok := a.checks[id]
	if !ok {
		return api.AgentServiceCheck{}, false
	}
	return cloneServiceCheck(c.def), true
}

// CatalogService returns a copy of a service of the agent's node as the
// catalog holds it.
func (a *Agent) CatalogService(id string) (api.AgentService, bool) {
	a.cat.mu.Lock()
	defer a.cat.mu.Unlock()
	a.cat.refreshLocked()
	n, ok := a.cat.nodes[a.node]
	if !ok {
		return api.AgentService{}, false
	}
	s, ok := n.services[id]
	if !ok {
		return api.AgentService{}, false
	}
	out := cloneService(s.svc)
	out.CreateIndex, out.ModifyIndex, out.Datacenter = s.createIndex, s.modifyIndex, n.node.Datacenter
	return out, true
}

// SetCheckStatus sets the status and output of a local check of any type,
// as if the agent had run it. A running gRPC check overwrites it with its
// next result; see Config.ManualChecks.
func (a *Agent) SetCheckStatus(id, status, output string) error {
	a.cat.mu.Lock()
	defer a.cat.mu.Unlock()
	c, ok := a.checks[id]
	if !ok {
		return fmt.Errorf("consultest: unknown check %q", id)
	}
	if !validStatus(status) {
		return fmt.Errorf("consultest: invalid check status %q", status)
	}
	idx0 := a.cat.index
	a.cat.index++
	c.status, c.output, c.inSync = status, output, false
	a.cat.finishLocked(idx0)
	a.notifyLocked()
	return nil
}

// AntiEntropy runs one full anti-entropy pass for the agent's node, as a
// Consul agent does periodically: the node's address, tagged addresses and
// meta are restored; a local service that enables tag override takes the
// tags the catalog holds for it; then the catalog's services and checks of
// the node are replaced by the local ones (serfHealth, which the servers
// own, stays). A closed agent runs no anti-entropy.
func (a *Agent) AntiEntropy() {
	cat := a.cat
	cat.mu.Lock()
	defer cat.mu.Unlock()
	if a.closed {
		return
	}
	cat.refreshLocked()
	idx0 := cat.index
	cat.index++
	n := cat.nodeLocked(a.node, a.dc)
	cat.setNodeInfoLocked(n, agentNode(a))
	for id, s := range a.services {
		if rs, ok := n.services[id]; ok && s.svc.EnableTagOverride && !slices.Equal(s.svc.Tags, rs.svc.Tags) {
			s.svc.Tags = nonNilTags(rs.svc.Tags)
		}
		s.inSync = false
	}
	for id := range n.services {
		if _, ok := a.services[id]; !ok {
			cat.removeServiceLocked(n, id)
		}
	}
	for _, c := range a.checks {
		c.inSync = false
	}
	for id := range n.checks {
		if _, ok := a.checks[id]; !ok && id != serfHealthID {
			cat.removeCheckLocked(n, id)
		}
	}
	a.syncLocked()
	cat.finishLocked(idx0)
	a.notifyLocked()
}

// dirtyLocked reports whether the agent has local changes the catalog has
// not seen.
func (a *Agent) dirtyLocked() bool {
	for _, s := range a.services {
		if !s.inSync {
			return true
		}
	}
	for _, c := range a.checks {
		if !c.inSync {
			return true
		}
	}
	return false
}

// syncLocked pushes local changes to the catalog, as a Consul agent does
// right after each write through its API and after each check result.
func (a *Agent) syncLocked() {
	n := a.cat.nodeLocked(a.node, a.dc)
	var services, checks []string
	for id, s := range a.services {
		if !s.inSync {
			services = append(services, id)
		}
	}
	for id, c := range a.checks {
		if !c.inSync {
			checks = append(checks, id)
		}
	}
	slices.Sort(services)
	slices.Sort(checks)
	for _, id := range services {
		s := a.services[id]
		a.cat.putServiceLocked(n, s.svc)
		s.inSync = true
	}
	for _, id := range checks {
		c := a.checks[id]
		w := a.wireCheckLocked(c)
		a.cat.putCheckLocked(n, &w)
		c.inSync = true
	}
}

func (a *Agent) notifyLocked() {
	close(a.changed)
	a.changed = make(chan struct{})
}

func cloneService(s api.AgentService) api.AgentService {
	s.Tags = slices.Clone(s.Tags)
	s.Meta = maps.Clone(s.Meta)
	s.TaggedAddresses = maps.Clone(s.TaggedAddresses)
	return s
}

func nonNilTags(tags []string) []string {
	if tags == nil {
		return []string{}
	}
	return slices.Clone(tags)
}

func validStatus(s string) bool {
	return s == api.HealthPassing || s == api.HealthWarning || s == api.HealthCritical
}
