package consultest

import (
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

// Config configures an Agent. The zero value is a ready-to-use agent
// without ACLs.
type Config struct {
	// Addr is the TCP address to listen on (default "127.0.0.1:0").
	Addr string
	// NodeName is the agent's node (default "consultest").
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
}

// ACL is the ACL system of an Agent.
type ACL struct {
	// Tokens maps secret IDs to what they may do.
	Tokens map[string]Policy
	// Anonymous applies to requests without a token.
	Anonymous Policy
}

// Policy is what a token may do. The zero Policy allows nothing. Prefix
// lists work like Consul's service_prefix rules: "" matches every name.
type Policy struct {
	// ServiceWrite lists service name prefixes the token may register,
	// deregister and update checks of. Write implies read.
	ServiceWrite []string
	// ServiceRead lists service name prefixes the token may read.
	ServiceRead []string
	// NodeWrite allows catalog registrations and node checks.
	NodeWrite bool
	// NodeRead allows reading node checks.
	NodeRead bool
	// AgentRead allows /v1/agent/self.
	AgentRead bool
}

// AllowAll returns a policy that allows everything the Agent serves.
func AllowAll() Policy {
	return Policy{ServiceWrite: []string{""}, NodeWrite: true, NodeRead: true, AgentRead: true}
}

// Agent is a fake Consul agent served over HTTP. It is safe for concurrent
// use.
type Agent struct {
	srv  *httptest.Server
	now  func() time.Time
	node string
	addr string
	dc   string

	mu       sync.Mutex
	acl      *ACL
	index    uint64
	services map[string]*localService
	checks   map[string]*localCheck
	catalog  map[string]*catalogNode
	counts   map[string]int
	denied   int
	tokens   map[string]int
	faults   map[string]*fault
	changed  chan struct{}
}

type localService struct {
	svc    api.AgentService
	inSync bool
}

type localCheck struct {
	chk     api.AgentCheck
	ttl     time.Duration
	expires time.Time
	inSync  bool
}

type catalogNode struct {
	node     api.Node
	services map[string]*api.AgentService
	checks   map[string]*api.HealthCheck
}

type fault struct {
	remaining int
	code      int
}

// New starts an Agent. Close it when done.
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
	l, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("consultest: listen on %s: %w", cfg.Addr, err)
	}
	a := &Agent{
		now:      cfg.Now,
		node:     cfg.NodeName,
		addr:     cfg.NodeAddress,
		dc:       cfg.Datacenter,
		acl:      cloneACL(cfg.ACL),
		services: make(map[string]*localService),
		checks:   make(map[string]*localCheck),
		catalog:  make(map[string]*catalogNode),
		counts:   make(map[string]int),
		tokens:   make(map[string]int),
		faults:   make(map[string]*fault),
		changed:  make(chan struct{}),
	}
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

// Close stops the server and closes its connections.
func (a *Agent) Close() { a.srv.Close() }

// Addr returns the host:port the Agent listens on, as consul/api's
// Config.Address takes it.
func (a *Agent) Addr() string { return a.srv.Listener.Addr().String() }

// URL returns the base URL of the Agent.
func (a *Agent) URL() string { return a.srv.URL }

// NodeName returns the agent's node name.
func (a *Agent) NodeName() string { return a.node }

// Changed returns a channel that is closed at the next request or state
// change. Wait on it instead of sleeping.
func (a *Agent) Changed() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.changed
}

// Count returns how many requests hit route (one of the Route constants)
// since the start or the last ResetCounts, including failed ones.
func (a *Agent) Count(route string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.counts[route]
}

// Counts returns the request counters by route.
func (a *Agent) Counts() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.counts)
}

// Reads returns how many GET requests were made.
func (a *Agent) Reads() int {
	a.mu.Lock()
	defer a.mu.Unlock()
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
	a.mu.Lock()
	defer a.mu.Unlock()
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
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.denied
}

// TokensSeen returns how many requests carried each token; requests
// without a token count under "".
func (a *Agent) TokensSeen() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.tokens)
}

// ResetCounts zeroes the request, denial and token counters.
func (a *Agent) ResetCounts() {
	a.mu.Lock()
	defer a.mu.Unlock()
	clear(a.counts)
	clear(a.tokens)
	a.denied = 0
}

// FailNext makes the next n requests to route fail with the HTTP status
// code, before any other processing. A later call replaces an earlier one.
func (a *Agent) FailNext(route string, n, code int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.faults[route] = &fault{remaining: n, code: code}
}

// SetToken adds or replaces an ACL token. It enables ACLs (with a deny-all
// anonymous policy) if they were off.
func (a *Agent) SetToken(secret string, p Policy) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.acl == nil {
		a.acl = &ACL{Tokens: make(map[string]Policy)}
	}
	a.acl.Tokens[secret] = p
}

// DeleteToken removes an ACL token; requests that carry it get "ACL not
// found".
func (a *Agent) DeleteToken(secret string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.acl != nil {
		delete(a.acl.Tokens, secret)
	}
}

// Service returns a copy of a local service as /v1/agent/services shows it.
func (a *Agent) Service(id string) (api.AgentService, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.services[id]
	if !ok {
		return api.AgentService{}, false
	}
	return cloneService(s.svc), true
}

// Services returns copies of all local services by id.
func (a *Agent) Services() map[string]api.AgentService {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]api.AgentService, len(a.services))
	for id, s := range a.services {
		out[id] = cloneService(s.svc)
	}
	return out
}

// Check returns a copy of a local check as /v1/agent/checks shows it.
func (a *Agent) Check(id string) (api.AgentCheck, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.expireLocked()
	c, ok := a.checks[id]
	if !ok {
		return api.AgentCheck{}, false
	}
	return c.chk, true
}

// Checks returns copies of all local checks by id.
func (a *Agent) Checks() map[string]api.AgentCheck {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.expireLocked()
	out := make(map[string]api.AgentCheck, len(a.checks))
	for id, c := range a.checks {
		out[id] = c.chk
	}
	return out
}

// CatalogService returns a copy of a service of the agent's node as the
// catalog holds it.
func (a *Agent) CatalogService(id string) (api.AgentService, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	n, ok := a.catalog[a.node]
	if !ok {
		return api.AgentService{}, false
	}
	s, ok := n.services[id]
	if !ok {
		return api.AgentService{}, false
	}
	return cloneService(*s), true
}

// SetCheckStatus sets the status and output of a local check of any type,
// as if the agent had run it.
func (a *Agent) SetCheckStatus(id, status, output string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.checks[id]
	if !ok {
		return fmt.Errorf("consultest: unknown check %q", id)
	}
	if !validStatus(status) {
		return fmt.Errorf("consultest: invalid check status %q", status)
	}
	c.chk.Status, c.chk.Output, c.inSync = status, output, false
	a.index++
	a.syncChangesLocked()
	a.notifyLocked()
	return nil
}

// AntiEntropy runs one full anti-entropy pass for the agent's node, as a
// Consul agent does periodically: a local service that enables tag
// override takes the tags the catalog holds for it; then the catalog's
// services and checks of the node are replaced by the local ones.
func (a *Agent) AntiEntropy() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.expireLocked()
	n := a.catalogNodeLocked(a.node)
	for id, s := range a.services {
		if rs, ok := n.services[id]; ok && s.svc.EnableTagOverride {
			s.svc.Tags = nonNilTags(rs.Tags)
		}
		c := cloneService(s.svc)
		n.services[id] = &c
		s.inSync = true
	}
	for id := range n.services {
		if _, ok := a.services[id]; !ok {
			delete(n.services, id)
		}
	}
	for id, c := range a.checks {
		n.checks[id] = a.healthCheckLocked(c)
		c.inSync = true
	}
	for id := range n.checks {
		if _, ok := a.checks[id]; !ok {
			delete(n.checks, id)
		}
	}
	a.index++
	a.notifyLocked()
}

// syncChangesLocked pushes local changes to the catalog, as a Consul agent
// does right after each write through its API.
func (a *Agent) syncChangesLocked() {
	n := a.catalogNodeLocked(a.node)
	for id, s := range a.services {
		if !s.inSync {
			c := cloneService(s.svc)
			n.services[id] = &c
			s.inSync = true
		}
	}
	for id, c := range a.checks {
		if !c.inSync {
			n.checks[id] = a.healthCheckLocked(c)
			c.inSync = true
		}
	}
}

func (a *Agent) catalogNodeLocked(name string) *catalogNode {
	n, ok := a.catalog[name]
	if !ok {
		n = &catalogNode{
			services: make(map[string]*api.AgentService),
			checks:   make(map[string]*api.HealthCheck),
		}
		n.node = api.Node{Node: name, Datacenter: a.dc}
		if name == a.node {
			n.node.Address = a.addr
		}
		a.catalog[name] = n
	}
	return n
}

func (a *Agent) healthCheckLocked(c *localCheck) *api.HealthCheck {
	h := &api.HealthCheck{
		Node:        a.node,
		CheckID:     c.chk.CheckID,
		Name:        c.chk.Name,
		Status:      c.chk.Status,
		Notes:       c.chk.Notes,
		Output:      c.chk.Output,
		ServiceID:   c.chk.ServiceID,
		ServiceName: c.chk.ServiceName,
		Type:        c.chk.Type,
		Definition:  c.chk.Definition,
		ModifyIndex: a.index,
	}
	if s, ok := a.services[c.chk.ServiceID]; ok {
		h.ServiceTags = slices.Clone(s.svc.Tags)
	}
	return h
}

// expireLocked turns TTL checks whose TTL ran out critical, as the TTL
// timer of a Consul agent does.
func (a *Agent) expireLocked() {
	now := a.now()
	changed := false
	for _, c := range a.checks {
		if c.ttl > 0 && now.After(c.expires) && !(c.chk.Status == api.HealthCritical && c.chk.Output == "TTL expired") {
			c.chk.Status, c.chk.Output, c.inSync = api.HealthCritical, "TTL expired", false
			changed = true
		}
	}
	if changed {
		a.index++
		a.syncChangesLocked()
	}
}

func (a *Agent) notifyLocked() {
	close(a.changed)
	a.changed = make(chan struct{})
}

func cloneACL(in *ACL) *ACL {
	if in == nil {
		return nil
	}
	out := &ACL{Tokens: make(map[string]Policy, len(in.Tokens)), Anonymous: in.Anonymous}
	maps.Copy(out.Tokens, in.Tokens)
	return out
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
