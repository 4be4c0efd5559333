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
