package consultest

import (
	"maps"
	"net/http"
	"slices"
	"strconv"

	"github.com/hashicorp/consul/api"
)

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
