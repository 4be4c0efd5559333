package consultest

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
)

// handler serves one route with the agent's lock held.
type handler func(w http.ResponseWriter, r *http.Request, z authz)

// invalidCheckMessage is Consul's answer to a check without a type.
const invalidCheckMessage = "Must provide TTL or Script/DockerContainerID/HTTP/TCP/UDP/GRPC/H2PING/AliasService and Interval"

// wrap counts the request, applies injected faults, resolves the token and
// runs h under the lock; afterwards it notifies waiters.
func (a *Agent) wrap(h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		route := r.Pattern
		if route == "/" {
			route = RouteOther
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		defer a.notifyLocked()
		a.counts[route]++
		token := requestToken(r)
		a.tokens[token]++
		if f := a.faults[route]; f != nil && f.remaining > 0 {
			f.remaining--
			http.Error(w, "injected failure", f.code)
			return
		}
		z, ok := a.authorizerLocked(token)
		if !ok {
			a.deny(w, "ACL not found")
			return
		}
		a.expireLocked()
		h(w, r, z)
	})
}

// requestToken reads the ACL token the way Consul does: X-Consul-Token,
// then "Authorization: Bearer", then the token query parameter.
func requestToken(r *http.Request) string {
	if t := r.Header.Get("X-Consul-Token"); t != "" {
		return t
	}
	if t, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return strings.TrimSpace(t)
	}
	return r.URL.Query().Get("token")
}

// authz answers permission questions for one request.
type authz struct {
	all bool
	p   Policy
}

func (a *Agent) authorizerLocked(token string) (authz, bool) {
	if a.acl == nil {
		return authz{all: true}, true
	}
	if token == "" {
		return authz{p: a.acl.Anonymous}, true
	}
	p, ok := a.acl.Tokens[token]
	return authz{p: p}, ok
}

func matchPrefix(prefixes []string, name string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

func (z authz) serviceWrite(name string) bool {
	return z.all || matchPrefix(z.p.ServiceWrite, name)
}

func (z authz) serviceRead(name string) bool {
	return z.serviceWrite(name) || matchPrefix(z.p.ServiceRead, name)
}

func (z authz) nodeWrite() bool { return z.all || z.p.NodeWrite }
func (z authz) nodeRead() bool  { return z.nodeWrite() || z.p.NodeRead }
func (z authz) agentRead() bool { return z.all || z.p.AgentRead }

func (a *Agent) deny(w http.ResponseWriter, msg string) {
	a.denied++
	http.Error(w, msg, http.StatusForbidden)
}

func (a *Agent) denyPermission(w http.ResponseWriter, perm, resource string) {
	a.deny(w, fmt.Sprintf("Permission denied: token lacks permission '%s' on %q", perm, resource))
}

func (a *Agent) writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Consul-Index", strconv.FormatUint(max(a.index, 1), 10))
	w.Header().Set("X-Consul-KnownLeader", "true")
	w.Header().Set("X-Consul-LastContact", "0")
	if err := json.NewEncoder(w).Encode(v); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

func badRequest(w http.ResponseWriter, format string, args ...any) {
	http.Error(w, fmt.Sprintf(format, args...), http.StatusBadRequest)
}

func decode(r *http.Request, v any) error {
	if r.Body == nil {
		return fmt.Errorf("missing request body")
	}
	return json.NewDecoder(r.Body).Decode(v)
}

func (a *Agent) handleOther(w http.ResponseWriter, r *http.Request, _ authz) {
	http.Error(w, fmt.Sprintf("consultest: unsupported endpoint %s %s", r.Method, r.URL.Path), http.StatusNotFound)
}

func (a *Agent) handleSelf(w http.ResponseWriter, _ *http.Request, z authz) {
	if !z.agentRead() {
		a.denyPermission(w, "agent:read", a.node)
		return
	}
	a.writeJSON(w, map[string]map[string]any{
		"Config": {"NodeName": a.node, "Datacenter": a.dc},
		"Member": {"Name": a.node, "Addr": a.addr},
		"Meta":   {},
	})
}

func (a *Agent) handleServices(w http.ResponseWriter, r *http.Request, z authz) {
	if r.URL.Query().Get("filter") != "" {
		badRequest(w, "consultest: the filter parameter is not supported")
		return
	}
	out := make(map[string]*api.AgentService, len(a.services))
	filtered := false
	for id, s := range a.services {
		if !z.serviceRead(s.svc.Service) {
			filtered = true
			continue
		}
		c := cloneService(s.svc)
		c.Tags = nonNilTags(c.Tags)
		out[id] = &c
	}
	if filtered {
		w.Header().Set("X-Consul-Results-Filtered-By-ACLs", "true")
	}
	a.writeJSON(w, out)
}

func (a *Agent) handleChecks(w http.ResponseWriter, r *http.Request, z authz) {
	if r.URL.Query().Get("filter") != "" {
		badRequest(w, "consultest: the filter parameter is not supported")
		return
	}
	out := make(map[string]*api.AgentCheck, len(a.checks))
	filtered := false
	for id, c := range a.checks {
		if !a.checkReadable(c, z) {
			filtered = true
			continue
		}
		chk := c.chk
		out[id] = &chk
	}
	if filtered {
		w.Header().Set("X-Consul-Results-Filtered-By-ACLs", "true")
	}
	a.writeJSON(w, out)
}

func (a *Agent) checkReadable(c *localCheck, z authz) bool {
	if c.chk.ServiceID == "" {
		return z.nodeRead()
	}
	return z.serviceRead(c.chk.ServiceName)
}

// checkDef is a parsed check definition.
type checkDef struct {
	id, name, notes, status string
	typ                     string
	ttl                     time.Duration
	def                     api.HealthCheckDefinition
}

var metaKeyRE = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)

// validateMeta applies Consul's limits on service meta.
func validateMeta(meta map[string]string) error {
	if len(meta) > 64 {
		return fmt.Errorf("Node metadata cannot contain more than 64 key/value pairs")
	}
	for k, v := range meta {
		switch {
		case k == "":
			return fmt.Errorf("Key cannot be blank")
		case !metaKeyRE.MatchString(k):
			return fmt.Errorf("Key contains invalid characters")
		case len(k) > 128:
			return fmt.Errorf("Key is too long (limit: 128 characters)")
		case strings.HasPrefix(k, "consul-"):
			return fmt.Errorf("Key prefix 'consul-' is reserved for internal use")
		case len(v) > 512:
			return fmt.Errorf("Value is too long (limit: 512 characters)")
		}
	}
	return nil
}

func parseDuration(field, s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("Request decode failed: %s: %v", field, err)
	}
	return d, nil
}

// parseCheck validates a check definition as Consul does and works out its
// type.
func parseCheck(c api.AgentServiceCheck) (checkDef, error) {
	d := checkDef{id: c.CheckID, name: c.Name, notes: c.Notes, status: c.Status}
	if d.status == "" {
		d.status = api.HealthCritical
	} else if !validStatus(d.status) {
		return d, fmt.Errorf("Status for checks must 'passing', 'warning', 'critical'")
	}
	var err error
	if d.ttl, err = parseDuration("TTL", c.TTL); err != nil {
		return d, err
	}
	interval, err := parseDuration("Interval", c.Interval)
	if err != nil {
		return d, err
	}
	timeout, err := parseDuration("Timeout", c.Timeout)
	if err != nil {
		return d, err
	}
	switch {
	case d.ttl > 0:
		d.typ = "ttl"
	case c.GRPC != "" && interval > 0:
		d.typ = "grpc"
	case c.HTTP != "" && interval > 0:
		d.typ = "http"
	case c.TCP != "" && interval > 0:
		d.typ = "tcp"
	case c.UDP != "" && interval > 0:
		d.typ = "udp"
	case c.H2PING != "" && interval > 0:
		d.typ = "h2ping"
	case len(c.Args) > 0 && interval > 0:
		d.typ = "script"
	case c.AliasService != "" || c.AliasNode != "":
		d.typ = "alias"
	default:
		return d, fmt.Errorf("%s", invalidCheckMessage)
	}
	d.def = api.HealthCheckDefinition{
		HTTP:             c.HTTP,
		Header:           c.Header,
		Method:           c.Method,
		Body:             c.Body,
		TLSServerName:    c.TLSServerName,
		TLSSkipVerify:    c.TLSSkipVerify,
		TCP:              c.TCP,
		TCPUseTLS:        c.TCPUseTLS,
		UDP:              c.UDP,
		GRPC:             c.GRPC,
		GRPCUseTLS:       c.GRPCUseTLS,
		IntervalDuration: interval,
		TimeoutDuration:  timeout,
		Interval:         api.ReadableDuration(interval),
		Timeout:          api.ReadableDuration(timeout),
	}
	return d, nil
}

// putCheckLocked stores a check; a check that exists keeps its status and
// output, as Consul keeps them across re-registrations.
func (a *Agent) putCheckLocked(d checkDef, serviceID, serviceName string) {
	c := &localCheck{
		chk: api.AgentCheck{
			Node:        a.node,
			CheckID:     d.id,
			Name:        d.name,
			Status:      d.status,
			Notes:       d.notes,
			ServiceID:   serviceID,
			ServiceName: serviceName,
			Type:        d.typ,
			Definition:  d.def,
		},
		ttl: d.ttl,
	}
	if prev, ok := a.checks[d.id]; ok {
		c.chk.Status, c.chk.Output = prev.chk.Status, prev.chk.Output
	}
	if d.ttl > 0 {
		c.expires = a.now().Add(d.ttl)
	}
	a.checks[d.id] = c
}

func (a *Agent) removeCheckLocked(id string) {
	delete(a.checks, id)
	if n, ok := a.catalog[a.node]; ok {
		delete(n.checks, id)
	}
}

func (a *Agent) handleServiceRegister(w http.ResponseWriter, r *http.Request, z authz) {
	var reg api.AgentServiceRegistration
	if err := decode(r, &reg); err != nil {
		badRequest(w, "Request decode failed: %v", err)
		return
	}
	if reg.Name == "" {
		badRequest(w, "Missing service name")
		return
	}
	if ip := net.ParseIP(reg.Address); ip != nil && ip.IsUnspecified() {
		badRequest(w, "Invalid service address")
		return
	}
	if err := validateMeta(reg.Meta); err != nil {
		badRequest(w, "Invalid Service Meta: %v", err)
		return
	}
	id := reg.ID
	if id == "" {
		id = reg.Name
	}
	var raw []api.AgentServiceCheck
	if reg.Check != nil {
		raw = append(raw, *reg.Check)
	}
	for _, c := range reg.Checks {
		if c != nil {
			raw = append(raw, *c)
		}
	}
	defs := make([]checkDef, 0, len(raw))
	for i, c := range raw {
		d, err := parseCheck(c)
		if err != nil {
			badRequest(w, "%v", err)
			return
		}
		if d.id == "" {
			d.id = "service:" + id
			if len(raw) > 1 {
				d.id += ":" + strconv.Itoa(i+1)
			}
		}
		if d.name == "" {
			d.name = fmt.Sprintf("Service '%s' check", reg.Name)
		}
		defs = append(defs, d)
	}
	if !z.serviceWrite(reg.Name) {
		a.denyPermission(w, "service:write", reg.Name)
		return
	}
	prev, exists := a.services[id]
	if exists && prev.svc.Service != reg.Name && !z.serviceWrite(prev.svc.Service) {
		a.denyPermission(w, "service:write", prev.svc.Service)
		return
	}

	a.index++
	svc := api.AgentService{
		ID:                id,
		Service:           reg.Name,
		Tags:              nonNilTags(reg.Tags),
		Meta:              map[string]string{},
		Port:              reg.Port,
		Address:           reg.Address,
		TaggedAddresses:   map[string]api.ServiceAddress{},
		Weights:           api.AgentWeights{Passing: 1, Warning: 1},
		EnableTagOverride: reg.EnableTagOverride,
		CreateIndex:       a.index,
		ModifyIndex:       a.index,
		Datacenter:        a.dc,
	}
	for k, v := range reg.Meta {
		svc.Meta[k] = v
	}
	for k, v := range reg.TaggedAddresses {
		svc.TaggedAddresses[k] = v
	}
	if reg.Weights != nil {
		if reg.Weights.Passing > 0 {
			svc.Weights.Passing = reg.Weights.Passing
		}
		svc.Weights.Warning = reg.Weights.Warning
	}
	// Default tagged addresses, as Consul fills them for an IP address.
	if ip := net.ParseIP(reg.Address); ip != nil {
		lan, wan := "lan_ipv6", "wan_ipv6"
		if ip.To4() != nil {
			lan, wan = "lan_ipv4", "wan_ipv4"
		}
		for _, k := range []string{lan, wan} {
			if _, ok := svc.TaggedAddresses[k]; !ok {
				svc.TaggedAddresses[k] = api.ServiceAddress{Address: reg.Address, Port: reg.Port}
			}
		}
	}
	if len(svc.TaggedAddresses) == 0 {
		svc.TaggedAddresses = nil
	}
	if exists {
		svc.CreateIndex = prev.svc.CreateIndex
	}
	a.services[id] = &localService{svc: svc}

	keep := make(map[string]bool, len(defs))
	for _, d := range defs {
		a.putCheckLocked(d, id, reg.Name)
		keep[d.id] = true
	}
	if b, _ := strconv.ParseBool(r.URL.Query().Get("replace-existing-checks")); b {
		for cid, c := range a.checks {
			if c.chk.ServiceID == id && !keep[cid] {
				a.removeCheckLocked(cid)
			}
		}
	}
	// Checks of the service follow a new service name.
	for _, c := range a.checks {
		if c.chk.ServiceID == id && c.chk.ServiceName != reg.Name {
			c.chk.ServiceName, c.inSync = reg.Name, false
		}
	}
	a.syncChangesLocked()
}

func (a *Agent) handleServiceDeregister(w http.ResponseWriter, r *http.Request, z authz) {
	id := r.PathValue("id")
	s, ok := a.services[id]
	if !ok {
		http.Error(w, fmt.Sprintf("Unknown service ID %q. Ensure that the service ID is passed, not the service name.", id), http.StatusNotFound)
		return
	}
	if !z.serviceWrite(s.svc.Service) {
		a.denyPermission(w, "service:write", s.svc.Service)
		return
	}
	a.index++
	delete(a.services, id)
	if n, ok := a.catalog[a.node]; ok {
		delete(n.services, id)
	}
	for cid, c := range a.checks {
		if c.chk.ServiceID == id {
			a.removeCheckLocked(cid)
		}
	}
}

// checkWritable reports the permission a write to a check needs, and
// whether z has it.
func (a *Agent) checkWritable(serviceID string, z authz) (perm, resource string, ok bool) {
	if serviceID == "" {
		return "node:write", a.node, z.nodeWrite()
	}
	name := serviceID
	if s, found := a.services[serviceID]; found {
		name = s.svc.Service
	}
	return "service:write", name, z.serviceWrite(name)
}

func (a *Agent) handleCheckRegister(w http.ResponseWriter, r *http.Request, z authz) {
	var reg api.AgentCheckRegistration
	if err := decode(r, &reg); err != nil {
		badRequest(w, "Request decode failed: %v", err)
		return
	}
	if reg.Name == "" {
		badRequest(w, "Missing check name")
		return
	}
	if reg.Status != "" && !validStatus(reg.Status) {
		badRequest(w, "Bad check status")
		return
	}
	d, err := parseCheck(reg.AgentServiceCheck)
	if err != nil {
		badRequest(w, "%v", err)
		return
	}
	d.name, d.notes = reg.Name, reg.Notes
	d.id = reg.ID
	if d.id == "" {
		d.id = reg.CheckID
	}
	if d.id == "" {
		d.id = reg.Name
	}
	serviceName := ""
	if reg.ServiceID != "" {
		s, ok := a.services[reg.ServiceID]
		if !ok {
			http.Error(w, fmt.Sprintf("ServiceID %q does not exist", reg.ServiceID), http.StatusInternalServerError)
			return
		}
		serviceName = s.svc.Service
	}
	if perm, res, ok := a.checkWritable(reg.ServiceID, z); !ok {
		a.denyPermission(w, perm, res)
		return
	}
	a.index++
	a.putCheckLocked(d, reg.ServiceID, serviceName)
	a.syncChangesLocked()
}

func (a *Agent) handleCheckDeregister(w http.ResponseWriter, r *http.Request, z authz) {
	id := r.PathValue("id")
	c, ok := a.checks[id]
	if !ok {
		http.Error(w, fmt.Sprintf("Unknown check ID %q. Ensure that the check ID is passed, not the check name.", id), http.StatusNotFound)
		return
	}
	if perm, res, ok := a.checkWritable(c.chk.ServiceID, z); !ok {
		a.denyPermission(w, perm, res)
		return
	}
	a.index++
	a.removeCheckLocked(id)
}

func (a *Agent) handleCheckUpdate(w http.ResponseWriter, r *http.Request, z authz) {
	var upd struct{ Status, Output string }
	if err := decode(r, &upd); err != nil {
		badRequest(w, "Request decode failed: %v", err)
		return
	}
	if !validStatus(upd.Status) {
		badRequest(w, "Invalid check status: '%s'", upd.Status)
		return
	}
	if total := len(upd.Output); total > checkBufSize {
		upd.Output = fmt.Sprintf("%s ... (captured %d of %d bytes)", upd.Output[:checkBufSize], checkBufSize, total)
	}
	id := r.PathValue("id")
	c, ok := a.checks[id]
	if !ok {
		http.Error(w, fmt.Sprintf("Unknown check ID %q. Ensure that the check ID is passed, not the check name.", id), http.StatusNotFound)
		return
	}
	if perm, res, ok := a.checkWritable(c.chk.ServiceID, z); !ok {
		a.denyPermission(w, perm, res)
		return
	}
	if c.ttl == 0 {
		http.Error(w, fmt.Sprintf("CheckID %q does not have associated TTL", id), http.StatusInternalServerError)
		return
	}
	a.index++
	c.chk.Status, c.chk.Output, c.inSync = upd.Status, upd.Output, false
	c.expires = a.now().Add(c.ttl)
	a.syncChangesLocked()
}

func (a *Agent) handleCatalogRegister(w http.ResponseWriter, r *http.Request, z authz) {
	var reg api.CatalogRegistration
	if err := decode(r, &reg); err != nil {
		badRequest(w, "Request decode failed: %v", err)
		return
	}
	if reg.Node == "" {
		badRequest(w, "Must provide node")
		return
	}
	if reg.Address == "" && !reg.SkipNodeUpdate {
		badRequest(w, "Must provide address if SkipNodeUpdate is not set")
		return
	}
	if reg.Service != nil && reg.Service.Service == "" {
		badRequest(w, "Must provide service name with ID")
		return
	}
	if !reg.SkipNodeUpdate && !z.nodeWrite() {
		a.denyPermission(w, "node:write", reg.Node)
		return
	}
	if reg.Service != nil && !z.serviceWrite(reg.Service.Service) {
		a.denyPermission(w, "service:write", reg.Service.Service)
		return
	}
	a.index++
	n := a.catalogNodeLocked(reg.Node)
	if !reg.SkipNodeUpdate {
		n.node.Address = reg.Address
		n.node.TaggedAddresses = reg.TaggedAddresses
		n.node.Meta = reg.NodeMeta
	}
	serviceName := ""
	if reg.Service != nil {
		s := cloneService(*reg.Service)
		if s.ID == "" {
			s.ID = s.Service
		}
		if s.Weights.Passing == 0 {
			s.Weights = api.AgentWeights{Passing: 1, Warning: 1}
		}
		s.ModifyIndex = a.index
		n.services[s.ID] = &s
		serviceName = s.Service
	}
	checks := slices.Clone(reg.Checks)
	if reg.Check != nil {
		checks = append(checks, &api.HealthCheck{
			CheckID: reg.Check.CheckID, Name: reg.Check.Name, Status: reg.Check.Status,
			Notes: reg.Check.Notes, Output: reg.Check.Output, ServiceID: reg.Check.ServiceID,
			Type: reg.Check.Type, Definition: reg.Check.Definition,
		})
	}
	for _, c := range checks {
		if c == nil {
			continue
		}
		h := *c
		h.Node = reg.Node
		if h.Status == "" {
			h.Status = api.HealthCritical
		}
		if h.ServiceID != "" && h.ServiceName == "" {
			if s, ok := n.services[h.ServiceID]; ok {
				h.ServiceName = s.Service
			} else {
				h.ServiceName = serviceName
			}
		}
		h.ModifyIndex = a.index
		n.checks[h.CheckID] = &h
	}
	a.writeJSON(w, true)
}

// catalogMatches lists the catalog instances of a service that carry all
// the requested tags and that z may read, in a stable order.
func (a *Agent) catalogMatches(name string, tags []string, z authz) ([]*catalogNode, []*api.AgentService, bool) {
	var nodes []*catalogNode
	var svcs []*api.AgentService
	filtered := false
	names := make([]string, 0, len(a.catalog))
	for n := range a.catalog {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, nn := range names {
		n := a.catalog[nn]
		ids := make([]string, 0, len(n.services))
		for id := range n.services {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		for _, id := range ids {
			s := n.services[id]
			if s.Service != name || !hasTags(s.Tags, tags) {
				continue
			}
			if !z.serviceRead(name) {
				filtered = true
				continue
			}
			nodes = append(nodes, n)
			svcs = append(svcs, s)
		}
	}
	return nodes, svcs, filtered
}

func hasTags(have, want []string) bool {
	for _, t := range want {
		if !slices.Contains(have, t) {
			return false
		}
	}
	return true
}

func (a *Agent) handleCatalogService(w http.ResponseWriter, r *http.Request, z authz) {
	nodes, svcs, filtered := a.catalogMatches(r.PathValue("name"), r.URL.Query()["tag"], z)
	out := make([]*api.CatalogService, 0, len(svcs))
	for i, s := range svcs {
		n := nodes[i]
		c := cloneService(*s)
		out = append(out, &api.CatalogService{
			Node:                     n.node.Node,
			Address:                  n.node.Address,
			Datacenter:               a.dc,
			TaggedAddresses:          n.node.TaggedAddresses,
			NodeMeta:                 n.node.Meta,
			ServiceID:                c.ID,
			ServiceName:              c.Service,
			ServiceAddress:           c.Address,
			ServiceTaggedAddresses:   c.TaggedAddresses,
			ServiceTags:              nonNilTags(c.Tags),
			ServiceMeta:              c.Meta,
			ServicePort:              c.Port,
			ServiceWeights:           api.Weights{Passing: c.Weights.Passing, Warning: c.Weights.Warning},
			ServiceEnableTagOverride: c.EnableTagOverride,
			CreateIndex:              c.CreateIndex,
			ModifyIndex:              c.ModifyIndex,
		})
	}
	if filtered {
		w.Header().Set("X-Consul-Results-Filtered-By-ACLs", "true")
	}
	a.writeJSON(w, out)
}

func (a *Agent) handleHealthService(w http.ResponseWriter, r *http.Request, z authz) {
	q := r.URL.Query()
	_, passingOnly := q["passing"]
	if v := q.Get("passing"); v != "" {
		passingOnly, _ = strconv.ParseBool(v)
	}
	nodes, svcs, filtered := a.catalogMatches(r.PathValue("name"), q["tag"], z)
	out := make([]*api.ServiceEntry, 0, len(svcs))
	for i, s := range svcs {
		n := nodes[i]
		node := n.node
		c := cloneService(*s)
		e := &api.ServiceEntry{Node: &node, Service: &c}
		for _, h := range n.checks {
			if h.ServiceID == "" || h.ServiceID == s.ID {
				hc := *h
				e.Checks = append(e.Checks, &hc)
			}
		}
		sort.Slice(e.Checks, func(i, j int) bool { return e.Checks[i].CheckID < e.Checks[j].CheckID })
		if passingOnly && e.Checks.AggregatedStatus() != api.HealthPassing && len(e.Checks) > 0 {
			continue
		}
		out = append(out, e)
	}
	if filtered {
		w.Header().Set("X-Consul-Results-Filtered-By-ACLs", "true")
	}
	a.writeJSON(w, out)
}
