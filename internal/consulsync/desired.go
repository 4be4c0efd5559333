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

	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/registry"
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

	pluginServiceIDPrefix = ServiceIDPrefix + "plugin-"
	healthCheckSuffix     = ":health"
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
	interval, timeout time.Duration
}

func (c wantCheck) serviceCheck() *api.AgentServiceCheck {
	sc := &api.AgentServiceCheck{CheckID: c.id, Name: c.name, Notes: c.notes}
	if c.ttl > 0 {
		sc.TTL = c.ttl.String()
		sc.Status = c.status
		return sc
	}
	sc.GRPC, sc.GRPCUseTLS = c.grpc, c.grpcTLS
	sc.Interval, sc.Timeout = c.interval.String(), c.timeout.String()
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

// desired returns the services csisupd wants for the plugins, the agent's
// first, then plugins by ID.
func desired(c Config, plugins []registry.Plugin) []*wantService {
	out := make([]*wantService, 0, len(plugins)+1)
	out = append(out, agentService(c))
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
		id:        GRPCCheckID,
		name:      "csisupd gRPC health",
		notes:     "Consul dials the agent's gRPC health service.",
		serviceID: AgentServiceID,
		grpc:      c.GRPCCheck,
		grpcTLS:   c.GRPCCheckTLS,
		interval:  c.GRPCCheckInterval,
		timeout:   min(DefaultGRPCCheckTimeout, c.GRPCCheckInterval),
	}
	return newWant(c, AgentServiceID, c.ServiceName, tags(c.Tags), meta, chk, "")
}

func pluginService(c Config, p registry.Plugin) *wantService {
	fp := p.Fingerprint
	typ := string(fp.Type)
	if typ == "" {
		typ = "unknown"
	}
	meta := map[string]string{
		metaExternalSource: externalSource,
		metaPluginID:       p.ID,
		metaPluginType:     typ,
	}
	if fp.VendorName != "" {
		meta[metaVendorName] = clip(fp.VendorName, maxMetaValue)
	}
	if fp.VendorVersion != "" {
		meta[metaVendorVersion] = clip(fp.VendorVersion, maxMetaValue)
	}
	if c.NodeName != "" {
		meta[metaNode] = clip(c.NodeName, maxMetaValue)
	}
	id := PluginServiceID(p.ID)
	status, output := checkState(p)
	chk := wantCheck{
		id:        PluginCheckID(p.ID),
		name:      "CSI plugin " + p.ID + " health",
		notes:     "Follows csisupd's probes of the plugin.",
		serviceID: id,
		ttl:       c.CheckTTL,
		status:    status,
		output:    output,
	}
	t := tags(append([]string{typ, fp.VendorVersion}, c.Tags...))
	return newWant(c, id, c.pluginServiceName(p.ID), t, meta, chk, p.Instance.String())
}

func newWant(c Config, id, name string, tags []string, meta map[string]string, chk wantCheck, instance string) *wantService {
	reg := &api.AgentServiceRegistration{
		ID:                id,
		Name:              name,
		Tags:              tags,
		Port:              c.ServicePort,
		Address:           c.ServiceAddress,
		EnableTagOverride: c.EnableTagOverride,
		Meta:              meta,
		Checks:            api.AgentServiceChecks{chk.serviceCheck()},
	}
	return &wantService{id: id, reg: reg, identity: identity(reg, instance), checks: []wantCheck{chk}}
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
func checkState(p registry.Plugin) (status, output string) {
	status = api.HealthCritical
	if p.Health.State == heartbeat.Healthy {
		status = api.HealthPassing
	}
	output = p.Health.Description
	if output == "" {
		output = "plugin is " + string(p.Health.State)
		if p.Health.State == "" || p.Health.State == heartbeat.Unknown {
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

// checkMatches reports whether the check Consul holds has c's definition.
// Consul does not report a TTL; a TTL change is a configuration change and
// re-registers the service.
func checkMatches(cur *api.AgentCheck, c wantCheck) bool {
	if cur.ServiceID != c.serviceID || cur.Name != c.name || cur.Notes != c.notes {
		return false
	}
	if c.ttl > 0 {
		return cur.Type == "ttl"
	}
	d := cur.Definition
	return cur.Type == "grpc" && d.GRPC == c.grpc && d.GRPCUseTLS == c.grpcTLS &&
		(d.IntervalDuration == 0 || d.IntervalDuration == c.interval) &&
		(d.TimeoutDuration == 0 || d.TimeoutDuration == c.timeout)
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
