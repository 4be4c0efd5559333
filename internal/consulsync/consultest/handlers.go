package consultest

import (
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/hashicorp/consul/api"
)

// handler serves one route with the catalog's lock held.
type handler func(w http.ResponseWriter, r *http.Request, z authz)

// wrap counts the request, applies injected faults, resolves the token and
// runs h under the lock, then brings the state to rest (alias checks,
// catalog sync) and notifies waiters.
func (a *Agent) wrap(h handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		route := r.Pattern
		if route == "/" {
			route = RouteOther
		}
		cat := a.cat
		cat.mu.Lock()
		defer cat.mu.Unlock()
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
		idx0 := cat.index
		cat.refreshLocked()
		h(w, r, z)
		cat.finishLocked(idx0)
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
	a.writeJSONIndex(w, v, a.cat.index)
}

// writeJSONIndex answers v with index as X-Consul-Index; Consul never
// answers an index below 1.
func (a *Agent) writeJSONIndex(w http.ResponseWriter, v any, index uint64) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Consul-Index", strconv.FormatUint(max(index, 1), 10))
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
		"Config": {"NodeName": a.node, "Datacenter": a.dc, "NodeID": nodeID(a.node), "Version": consulVersion},
		"Member": {"Name": a.node, "Addr": a.addr},
		"Meta":   {"consul-network-segment": "", "consul-version": consulVersion},
	})
}

func (a *Agent) handleServices(w http.ResponseWriter, r *http.Request, z authz) {
	if r.URL.Query().Get("filter") != "" {
		badRequest(w, "consultest: the filter parameter is not supported")
		return
	}
	out := make(map[string]wireAgentService, len(a.services))
	filtered := false
	for id, s := range a.services {
		if !z.serviceRead(s.svc.Service) {
			filtered = true
			continue
		}
		c := cloneService(s.svc)
		out[id] = wireAgentService{
			ID:                c.ID,
			Service:           c.Service,
			Tags:              nonNilTags(c.Tags),
			Meta:              c.Meta,
			Port:              c.Port,
			Address:           c.Address,
			TaggedAddresses:   c.TaggedAddresses,
			Weights:           c.Weights,
			EnableTagOverride: c.EnableTagOverride,
			Datacenter:        c.Datacenter,
		}
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
	out := make(map[string]wireCheck, len(a.checks))
	filtered := false
	for id, c := range a.checks {
		if !a.checkReadable(c, z) {
			filtered = true
			continue
		}
		out[id] = a.wireCheckLocked(c)
	}
	if filtered {
		w.Header().Set("X-Consul-Results-Filtered-By-ACLs", "true")
	}
	a.writeJSON(w, out)
}

func (a *Agent) checkReadable(c *localCheck, z authz) bool {
	if c.serviceID == "" {
		return z.nodeRead()
	}
	return z.serviceRead(c.serviceName)
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
	if reg.Check != nil && !isZeroCheck(*reg.Check) {
		raw = append(raw, *reg.Check)
	}
	for _, c := range reg.Checks {
		if c != nil {
			raw = append(raw, *c)
		}
	}
	specs := make([]checkSpec, 0, len(raw))
	for _, c := range raw {
		s, decodeErr, invalid := parseCheck(c)
		if decodeErr != nil {
			badRequest(w, "%v", decodeErr)
			return
		}
		if invalid != nil {
			badRequest(w, "Invalid check: %v", invalid)
			return
		}
		specs = append(specs, s)
	}
	for _, s := range specs {
		if s.status != "" && !validStatus(s.status) {
			badRequest(w, "Status for checks must 'passing', 'warning', 'critical'")
			return
		}
	}
	for i := range specs {
		if specs[i].id == "" {
			specs[i].id = "service:" + id
			if len(specs) > 1 {
				specs[i].id += ":" + strconv.Itoa(i+1)
			}
		}
		if specs[i].name == "" {
			specs[i].name = fmt.Sprintf("Service '%s' check", reg.Name)
		}
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
	for _, s := range specs {
		if s.typ == "script" || s.typ == "docker" {
			http.Error(w, scriptsDisabled, http.StatusInternalServerError)
			return
		}
	}

	a.cat.index++
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
		Datacenter:        a.dc,
	}
	maps.Copy(svc.Meta, reg.Meta)
	maps.Copy(svc.TaggedAddresses, reg.TaggedAddresses)
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
	a.services[id] = &localService{svc: svc}

	keep := make(map[string]bool, len(specs))
	for _, s := range specs {
		a.putCheckLocked(s, id, reg.Name)
		keep[s.id] = true
	}
	if b, _ := strconv.ParseBool(r.URL.Query().Get("replace-existing-checks")); b {
		for _, cid := range slices.Sorted(maps.Keys(a.checks)) {
			if c := a.checks[cid]; c.serviceID == id && !keep[cid] {
				a.removeCheckLocked(cid)
			}
		}
	}
	// Checks of the service follow a new service name and new tags.
	for _, c := range a.checks {
		if c.serviceID == id {
			c.serviceName, c.inSync = reg.Name, false
		}
	}
}

// isZeroCheck reports whether a check is empty, as Consul skips an empty
// Check in a service registration.
func isZeroCheck(c api.AgentServiceCheck) bool {
	return c.CheckID == "" && c.Name == "" && len(c.Args) == 0 && c.DockerContainerID == "" && c.Shell == "" &&
		c.Interval == "" && c.Timeout == "" && c.TTL == "" && c.HTTP == "" && len(c.Header) == 0 && c.Method == "" &&
		c.Body == "" && c.TCP == "" && !c.TCPUseTLS && c.UDP == "" && c.Status == "" && c.Notes == "" &&
		c.TLSServerName == "" && !c.TLSSkipVerify && c.GRPC == "" && !c.GRPCUseTLS && c.H2PING == "" &&
		!c.H2PingUseTLS && c.AliasNode == "" && c.AliasService == "" && c.SuccessBeforePassing == 0 &&
		c.FailuresBeforeWarning == 0 && c.FailuresBeforeCritical == 0 && c.DeregisterCriticalServiceAfter == ""
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
	a.cat.index++
	delete(a.services, id)
	if n, ok := a.cat.nodes[a.node]; ok {
		a.cat.removeServiceLocked(n, id)
	}
	for _, cid := range slices.Sorted(maps.Keys(a.checks)) {
		if a.checks[cid].serviceID == id {
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
	s, decodeErr, invalid := parseCheck(reg.AgentServiceCheck)
	if decodeErr != nil {
		badRequest(w, "%v", decodeErr)
		return
	}
	if invalid != nil {
		badRequest(w, "Invalid check: %v", invalid)
		return
	}
	s.name, s.notes = reg.Name, reg.Notes
	s.id = reg.ID
	if s.id == "" {
		s.id = reg.CheckID
	}
	if s.id == "" {
		s.id = reg.Name
	}
	serviceName := ""
	if reg.ServiceID != "" {
		svc, ok := a.services[reg.ServiceID]
		if !ok {
			http.Error(w, fmt.Sprintf("ServiceID %q does not exist", reg.ServiceID), http.StatusNotFound)
			return
		}
		serviceName = svc.svc.Service
	}
	if perm, res, ok := a.checkWritable(reg.ServiceID, z); !ok {
		a.denyPermission(w, perm, res)
		return
	}
	if s.typ == "script" || s.typ == "docker" {
		http.Error(w, scriptsDisabled, http.StatusInternalServerError)
		return
	}
	a.putCheckLocked(s, reg.ServiceID, serviceName)
}

func (a *Agent) handleCheckDeregister(w http.ResponseWriter, r *http.Request, z authz) {
	id := r.PathValue("id")
	c, ok := a.checks[id]
	if !ok {
		http.Error(w, fmt.Sprintf("Unknown check ID %q. Ensure that the check ID is passed, not the check name.", id), http.StatusNotFound)
		return
	}
	if perm, res, ok := a.checkWritable(c.serviceID, z); !ok {
		a.denyPermission(w, perm, res)
		return
	}
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
	upd.Output = truncateOutput(upd.Output)
	id := r.PathValue("id")
	c, ok := a.checks[id]
	if !ok {
		http.Error(w, fmt.Sprintf("Unknown check ID %q. Ensure that the check ID is passed, not the check name.", id), http.StatusNotFound)
		return
	}
	if perm, res, ok := a.checkWritable(c.serviceID, z); !ok {
		a.denyPermission(w, perm, res)
		return
	}
	if c.ttl == 0 {
		http.Error(w, fmt.Sprintf("CheckID %q does not have associated TTL", id), http.StatusInternalServerError)
		return
	}
	a.updateTTLLocked(c, upd.Status, upd.Output)
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
	cat := a.cat
	cat.index++
	dc := reg.Datacenter
	if dc == "" {
		dc = a.dc
	}
	n := cat.nodeLocked(reg.Node, dc)
	if !reg.SkipNodeUpdate {
		cat.setNodeInfoLocked(n, wireNode{
			ID: reg.ID, Address: reg.Address,
			TaggedAddresses: maps.Clone(reg.TaggedAddresses), Meta: maps.Clone(reg.NodeMeta),
		})
	}
	if reg.Service != nil {
		s := cloneService(*reg.Service)
		if s.ID == "" {
			s.ID = s.Service
		}
		if s.Weights.Passing == 0 {
			s.Weights = api.AgentWeights{Passing: 1, Warning: 1}
		}
		s.Datacenter = ""
		cat.putServiceLocked(n, s)
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
		h := wireCheck{
			CheckID: c.CheckID, Name: c.Name, Status: c.Status, Notes: c.Notes, Output: c.Output,
			ServiceID: c.ServiceID, ServiceName: c.ServiceName, ServiceTags: c.ServiceTags, Type: c.Type,
			Definition: wireDefinitionOf(c.Definition),
		}
		if h.Status == "" {
			h.Status = api.HealthCritical
		}
		cat.putCheckLocked(n, &h)
	}
	a.writeJSON(w, true)
}

// wireDefinitionOf converts a check definition given to
// /v1/catalog/register, which the catalog keeps and serves.
func wireDefinitionOf(d api.HealthCheckDefinition) wireDefinition {
	return wireDefinition{
		HTTP:                           d.HTTP,
		TLSServerName:                  d.TLSServerName,
		TLSSkipVerify:                  d.TLSSkipVerify,
		Header:                         maps.Clone(d.Header),
		Method:                         d.Method,
		Body:                           d.Body,
		TCP:                            d.TCP,
		TCPUseTLS:                      d.TCPUseTLS,
		UDP:                            d.UDP,
		OSService:                      d.OSService,
		GRPC:                           d.GRPC,
		GRPCUseTLS:                     d.GRPCUseTLS,
		Interval:                       durationString(d.IntervalDuration),
		Timeout:                        durationString(d.TimeoutDuration),
		DeregisterCriticalServiceAfter: durationString(d.DeregisterCriticalServiceAfterDuration),
	}
}

// catalogMatches lists the catalog instances of a service that carry all
// the requested tags and that z may read, ordered by node name, then
// service ID.
func (a *Agent) catalogMatches(name string, tags []string, z authz) ([]*catalogNode, []*catalogService, bool) {
	var nodes []*catalogNode
	var svcs []*catalogService
	filtered := false
	for _, nn := range slices.Sorted(maps.Keys(a.cat.nodes)) {
		n := a.cat.nodes[nn]
		for _, id := range slices.Sorted(maps.Keys(n.services)) {
			s := n.services[id]
			if s.svc.Service != name || !hasTags(s.svc.Tags, tags) {
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

// serviceRead runs the blocking part of a catalog or health (checks)
// query of the service named in the path, and returns the service's index
// to answer with; false when the query was answered 400.
func (a *Agent) serviceRead(w http.ResponseWriter, r *http.Request, checks bool) (uint64, bool) {
	b, ok := parseBlocking(w, r)
	if !ok {
		return 0, false
	}
	name := r.PathValue("name")
	index := func() uint64 { return a.cat.serviceIndexLocked(name, checks) }
	a.blockLocked(r, b, index)
	return index(), true
}

func (a *Agent) handleCatalogService(w http.ResponseWriter, r *http.Request, z authz) {
	index, ok := a.serviceRead(w, r, false)
	if !ok {
		return
	}
	nodes, svcs, filtered := a.catalogMatches(r.PathValue("name"), r.URL.Query()["tag"], z)
	out := make([]wireServiceNode, 0, len(svcs))
	for i, s := range svcs {
		n := nodes[i].node
		c := cloneService(s.svc)
		out = append(out, wireServiceNode{
			ID:                       n.ID,
			Node:                     n.Node,
			Address:                  n.Address,
			Datacenter:               n.Datacenter,
			TaggedAddresses:          maps.Clone(n.TaggedAddresses),
			NodeMeta:                 maps.Clone(n.Meta),
			ServiceID:                c.ID,
			ServiceName:              c.Service,
			ServiceTags:              nonNilTags(c.Tags),
			ServiceAddress:           c.Address,
			ServiceTaggedAddresses:   c.TaggedAddresses,
			ServiceWeights:           c.Weights,
			ServiceMeta:              c.Meta,
			ServicePort:              c.Port,
			ServiceEnableTagOverride: c.EnableTagOverride,
			CreateIndex:              s.createIndex,
			ModifyIndex:              s.modifyIndex,
		})
	}
	if filtered {
		w.Header().Set("X-Consul-Results-Filtered-By-ACLs", "true")
	}
	a.writeJSONIndex(w, out, index)
}

func (a *Agent) handleHealthService(w http.ResponseWriter, r *http.Request, z authz) {
	q := r.URL.Query()
	_, passingOnly := q["passing"]
	if v := q.Get("passing"); v != "" {
		var err error
		if passingOnly, err = strconv.ParseBool(v); err != nil {
			badRequest(w, "Invalid value for ?passing")
			return
		}
	}
	index, ok := a.serviceRead(w, r, true)
	if !ok {
		return
	}
	nodes, svcs, filtered := a.catalogMatches(r.PathValue("name"), q["tag"], z)
	out := make([]wireServiceEntry, 0, len(svcs))
	for i, s := range svcs {
		n := nodes[i]
		c := cloneService(s.svc)
		node := n.node
		node.TaggedAddresses, node.Meta = maps.Clone(node.TaggedAddresses), maps.Clone(node.Meta)
		e := wireServiceEntry{
			Node: node,
			Service: wireNodeService{
				ID:                c.ID,
				Service:           c.Service,
				Tags:              nonNilTags(c.Tags),
				Address:           c.Address,
				TaggedAddresses:   c.TaggedAddresses,
				Meta:              c.Meta,
				Port:              c.Port,
				Weights:           c.Weights,
				EnableTagOverride: c.EnableTagOverride,
				CreateIndex:       s.createIndex,
				ModifyIndex:       s.modifyIndex,
			},
			Checks: []wireCheck{},
		}
		passing := true
		for _, id := range slices.Sorted(maps.Keys(n.checks)) {
			h := n.checks[id]
			if h.ServiceID == "" || h.ServiceID == c.ID {
				hc := cloneWireCheck(*h)
				hc.ServiceTags = nonNilTags(hc.ServiceTags)
				e.Checks = append(e.Checks, hc)
				if hc.Status != api.HealthPassing {
					passing = false
				}
			}
		}
		if passingOnly && !passing {
			continue
		}
		out = append(out, e)
	}
	if filtered {
		w.Header().Set("X-Consul-Results-Filtered-By-ACLs", "true")
	}
	a.writeJSONIndex(w, out, index)
}
