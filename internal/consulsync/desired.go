package consulsync

import (
	"encoding/json"
	"hash/fnv"
	"maps"
	"net"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/consul/api"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/plugin"
)

// Service and check IDs. Every ID csisupd registers starts with
// ServiceIDPrefix; services and checks with other IDs are never touched.
const (
	// ServiceIDPrefix starts every service and check ID csisupd registers.
	ServiceIDPrefix = "_csisupd-"
	// AgentServiceID is the ID of the agent's own service.
	AgentServiceID = ServiceIDPrefix + "agent"
	// GRPCCheckID is the ID of the agent service's gRPC health check.
	GRPCCheckID = AgentServiceID + ":grpc"
	// ServerServiceID is the ID of the server role's service, which other
	// servers and agents find the cluster by.
	ServerServiceID = ServiceIDPrefix + "server"

	pluginServiceIDPrefix = ServiceIDPrefix + "plugin-"
	healthCheckSuffix     = ":health"
	aliasCheckSuffix      = ":agent-alive"
)

// Meta keys and values.
const (
	metaExternalSource = "external-source"
	externalSource     = "csisupd"
	metaNode           = "node"
	metaPluginID       = "plugin-id"
	metaPluginType     = "plugin-type"
	metaVendorName     = "vendor-name"
	metaVendorVersion  = "vendor-version"

	maxMetaValue = 512      // Consul rejects longer meta values
	maxOutput    = 4 * 1024 // Consul truncates longer check output
)

// PluginServiceID returns the Consul service ID of a plugin.
func PluginServiceID(pluginID string) string { return pluginServiceIDPrefix + pluginID }

// PluginCheckID returns the ID of the TTL health check of a plugin service.
func PluginCheckID(pluginID string) string { return PluginServiceID(pluginID) + healthCheckSuffix }

// AliasCheckID returns the ID of the alias check that ties a service to the
// agent service: it turns critical as soon as the agent's gRPC check does.
func AliasCheckID(serviceID string) string { return serviceID + aliasCheckSuffix }

func isOwn(id string) bool { return strings.HasPrefix(id, ServiceIDPrefix) }

// wantService is one service csisupd wants registered.
type wantService struct {
	id  string
	reg *api.AgentServiceRegistration
	// identity changes exactly when the service has a lifecycle change:
	// a new plugin instance, a different fingerprint identity or a
	// configuration change. Health is not part of it.
	identity string
	checks   []wantCheck
}

// wantCheck is one check of a wanted service.
type wantCheck struct {
	id, name, notes, serviceID string
	// ttl > 0 marks a TTL check, whose status and output csisupd sets.
	ttl            time.Duration
	status, output string
	// grpc checks are run by Consul.
	grpc              string
	grpcTLS           bool
	tlsServerName     string
	interval, timeout time.Duration
	// alias checks follow the health of another service of the agent.
	alias string
}

// typ is the check type Consul reports for c.
func (c wantCheck) typ() string {
	switch {
	case c.ttl > 0:
		return "ttl"
	case c.alias != "":
		return "alias"
	default:
		return "grpc"
	}
}

func (c wantCheck) serviceCheck() *api.AgentServiceCheck {
	sc := &api.AgentServiceCheck{CheckID: c.id, Name: c.name, Notes: c.notes}
	switch c.typ() {
	case "ttl":
		sc.TTL = c.ttl.String()
		sc.Status = c.status
	case "alias":
		sc.AliasService = c.alias
	default:
		sc.GRPC, sc.GRPCUseTLS, sc.TLSServerName = c.grpc, c.grpcTLS, c.tlsServerName
		sc.Interval, sc.Timeout = c.interval.String(), c.timeout.String()
	}
	return sc
}

func (c wantCheck) registration() *api.AgentCheckRegistration {
	return &api.AgentCheckRegistration{
		ID:                c.id,
		Name:              c.name,
		Notes:             c.notes,
		ServiceID:         c.serviceID,
		AgentServiceCheck: *c.serviceCheck(),
	}
}

// desired returns the services csisupd wants: the agent's first, then the
// server role's when it is on, then plugins by ID.
func desired(c Config, plugins []*csisupdv1.Plugin) []*wantService {
	out := make([]*wantService, 0, len(plugins)+2)
	out = append(out, agentService(c))
	if c.ServerService {
		out = append(out, serverService(c))
	}
	for _, p := range plugins {
		out = append(out, pluginService(c, p))
	}
	return out
}

func agentService(c Config) *wantService {
	meta := map[string]string{metaExternalSource: externalSource}
	if c.NodeName != "" {
		meta[metaNode] = clip(c.NodeName, maxMetaValue)
	}
	chk := wantCheck{
		id:            GRPCCheckID,
		name:          "csisupd gRPC health",
		notes:         "Consul dials the agent's gRPC health service.",
		serviceID:     AgentServiceID,
		grpc:          c.GRPCCheck,
		grpcTLS:       c.GRPCCheckTLS,
		tlsServerName: c.GRPCCheckTLSServerName,
		interval:      c.GRPCCheckInterval,
		timeout:       c.GRPCCheckTimeout,
	}
	return newWant(c, AgentServiceID, c.ServiceName, tags(c.Tags), meta, "", chk)
}

// serverService is the server role's service: the agent's gRPC port, under
// the name servers and agents look each other up by.
func serverService(c Config) *wantService {
	meta := map[string]string{metaExternalSource: externalSource}
	if c.NodeName != "" {
		meta[metaNode] = clip(c.NodeName, maxMetaValue)
	}
	return newWant(c, ServerServiceID, c.ServerServiceName, tags(c.Tags), meta, "", aliasCheck(ServerServiceID))
}

// aliasCheck ties a service's health to the agent service's: when the agent
// dies, its gRPC check fails and every aliased service turns critical with
// it, without a write from csisupd.
func aliasCheck(serviceID string) wantCheck {
	return wantCheck{
		id:        AliasCheckID(serviceID),
		name:      "csisupd agent alive",
		notes:     "Follows the csisupd agent's own service: critical when the agent is gone.",
		serviceID: serviceID,
		alias:     AgentServiceID,
	}
}

func pluginService(c Config, p *csisupdv1.Plugin) *wantService {
	typ := string(plugin.Type(p.GetType()).OrUnknown())
	meta := map[string]string{
		metaExternalSource: externalSource,
		metaPluginID:       p.GetId(),
		metaPluginType:     typ,
	}
	if v := p.GetVendorName(); v != "" {
		meta[metaVendorName] = clip(v, maxMetaValue)
	}
	if v := p.GetVendorVersion(); v != "" {
		meta[metaVendorVersion] = clip(v, maxMetaValue)
	}
	if c.NodeName != "" {
		meta[metaNode] = clip(c.NodeName, maxMetaValue)
	}
	id := PluginServiceID(p.GetId())
	status, output := checkState(p)
	chk := wantCheck{
		id:        PluginCheckID(p.GetId()),
		name:      "CSI plugin " + p.GetId() + " health",
		notes:     "Follows csisupd's probes of the plugin.",
		serviceID: id,
		ttl:       c.CheckTTL,
		status:    status,
		output:    output,
	}
	t := tags(append([]string{typ, p.GetVendorVersion()}, c.Tags...))
	return newWant(c, id, c.pluginServiceName(p.GetId()), t, meta, instance(p), chk, aliasCheck(id))
}

// instance names the plugin instance a service was registered for: a new
// instance (the socket was replaced) registers at a new time, so its
// service is a lifecycle change even when nothing else differs.
func instance(p *csisupdv1.Plugin) string {
	return p.GetSocket() + "@" + p.GetRegisteredAt().AsTime().UTC().Format(time.RFC3339Nano)
}

func newWant(c Config, id, name string, tags []string, meta map[string]string, instance string, checks ...wantCheck) *wantService {
	scs := make(api.AgentServiceChecks, 0, len(checks))
	for _, chk := range checks {
		scs = append(scs, chk.serviceCheck())
	}
	reg := &api.AgentServiceRegistration{
		ID:                id,
		Name:              name,
		Tags:              tags,
		Port:              c.ServicePort,
		Address:           c.ServiceAddress,
		EnableTagOverride: c.EnableTagOverride,
		Meta:              meta,
		Checks:            scs,
	}
	return &wantService{id: id, reg: reg, identity: identity(reg, instance), checks: checks}
}

// identity fingerprints a registration without the checks' initial status,
// plus the plugin instance.
func identity(reg *api.AgentServiceRegistration, instance string) string {
	r := *reg
	r.Checks = make(api.AgentServiceChecks, len(reg.Checks))
	for i, c := range reg.Checks {
		cc := *c
		cc.Status = ""
		r.Checks[i] = &cc
	}
	// Strings, numbers and maps of strings always encode: no error.
	b, _ := json.Marshal(&r)
	return instance + "|" + string(b)
}

// checkState maps a plugin's health to a TTL check status and output. A
// plugin that has not been probed yet is critical: it is not known to be
// healthy.
func checkState(p *csisupdv1.Plugin) (status, output string) {
	status = api.HealthCritical
	if p.GetHealthy() {
		status = api.HealthPassing
	}
	output = p.GetHealthDescription()
	if output == "" {
		state := p.GetHealthState()
		output = "plugin is " + state
		if state == "" || state == string(heartbeat.Unknown) {
			output = "plugin not probed yet"
		}
	}
	return status, clip(output, maxOutput)
}

// tags drops blanks and duplicates, keeping the first occurrence.
func tags(in []string) []string {
	out := make([]string, 0, len(in))
	for _, t := range in {
		if t != "" && !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

// clip shortens s to at most n bytes without splitting a character.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// serviceMatches reports whether the service Consul holds is what reg
// registers, allowing for what Consul fills in: default weights, default
// tagged addresses, and empty lists and maps for missing ones.
func serviceMatches(cur *api.AgentService, reg *api.AgentServiceRegistration) bool {
	if cur.Service != reg.Name || cur.Port != reg.Port || cur.Address != reg.Address ||
		cur.EnableTagOverride != reg.EnableTagOverride || cur.Kind != reg.Kind {
		return false
	}
	if !slices.Equal(cur.Tags, reg.Tags) || !maps.Equal(cur.Meta, reg.Meta) {
		return false
	}
	want := api.AgentWeights{Passing: 1, Warning: 1}
	if reg.Weights != nil {
		want = *reg.Weights
	}
	if cur.Weights != want {
		return false
	}
	return taggedAddressesMatch(cur.TaggedAddresses, reg)
}

// taggedAddressesMatch allows the defaults Consul adds for an IP address,
// and nothing else beyond what reg registers.
func taggedAddressesMatch(cur map[string]api.ServiceAddress, reg *api.AgentServiceRegistration) bool {
	defaults := map[string]bool{}
	if ip := net.ParseIP(reg.Address); ip != nil {
		if ip.To4() != nil {
			defaults["lan_ipv4"], defaults["wan_ipv4"] = true, true
		} else {
			defaults["lan_ipv6"], defaults["wan_ipv6"] = true, true
		}
	}
	for k, v := range cur {
		if want, ok := reg.TaggedAddresses[k]; ok {
			if v != want {
				return false
			}
			continue
		}
		if !defaults[k] || v != (api.ServiceAddress{Address: reg.Address, Port: reg.Port}) {
			return false
		}
	}
	for k := range reg.TaggedAddresses {
		if _, ok := cur[k]; !ok {
			return false
		}
	}
	return true
}

// checkMatches reports whether the check Consul holds is c, judged only by
// what a Consul agent reports for it: its type, name, notes and service.
// A Consul agent never returns a check's definition (address, TLS,
// interval, TTL, alias target) from /v1/agent/checks, so a changed
// definition cannot be seen there. It does not need to be: a definition
// follows from csisupd's configuration, every configuration change is a
// lifecycle change of the service (its identity), and the service is then
// registered again with all its checks (replace-existing-checks).
func checkMatches(cur *api.AgentCheck, c wantCheck) bool {
	return cur.ServiceID == c.serviceID && cur.Name == c.name && cur.Notes == c.notes && cur.Type == c.typ()
}

// refreshAfter is how long after its last write a TTL check is refreshed:
// between a quarter and a half of the TTL, spread by check ID so checks
// registered together are not all refreshed in the same pass.
func refreshAfter(ttl time.Duration, checkID string) time.Duration {
	h := fnv.New32a()
	h.Write([]byte(checkID))
	spread := ttl / 4
	if spread <= 0 {
		return ttl / 2
	}
	return ttl/2 - time.Duration(uint64(h.Sum32())%uint64(spread))
}
