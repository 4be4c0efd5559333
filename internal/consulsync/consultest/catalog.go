package consultest

import (
	"crypto/sha256"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sort"
	"sync"

	"github.com/hashicorp/consul/api"
)

// Catalog is the catalog of a Consul datacenter, as its servers hold it:
// every Agent created with the same Catalog pushes its node, services and
// checks to it, and the catalog endpoints of every one of those agents
// answer from it. The Catalog owns the one lock and the one index that all
// its agents use.
//
// The zero value is not usable; create one with NewCatalog.
type Catalog struct {
	mu     sync.Mutex
	index  uint64
	nodes  map[string]*catalogNode
	agents map[string]*Agent // open agents by node name
	// serviceIndex is the index of the last change to an instance of each
	// service that has instances (Consul's "service.<name>" index entry),
	// its node or its checks.
	serviceIndex map[string]uint64
	// extinction is the index at which a service last lost its last
	// instance (Consul's "service_last_extinction" index), 0 before.
	extinction uint64
	// nodesIndex and checksIndex are the indexes of the last change to a
	// node or service and to a check (Consul's table indexes).
	nodesIndex, checksIndex uint64
}

// NewCatalog returns an empty catalog to share between agents through
// Config.Catalog.
func NewCatalog() *Catalog {
	return &Catalog{
		nodes:        make(map[string]*catalogNode),
		agents:       make(map[string]*Agent),
		serviceIndex: make(map[string]uint64),
	}
}

// serfHealthID is the node check Consul's servers maintain for every agent
// from its gossip membership.
const (
	serfHealthID     = "serfHealth"
	serfHealthName   = "Serf Health Status"
	serfAliveOutput  = "Agent alive and reachable"
	serfFailedOutput = "Agent not live or unreachable"
)

// consulVersion is the Consul version whose behaviour the double follows,
// as agents report it in their node meta.
const consulVersion = "1.21.4"

type catalogNode struct {
	node     wireNode
	services map[string]*catalogService
	checks   map[string]*wireCheck
}

type catalogService struct {
	svc         api.AgentService // without indexes
	createIndex uint64
	modifyIndex uint64
}

// wireNode is structs.Node as Consul encodes it.
type wireNode struct {
	ID              string
	Node            string
	Address         string
	Datacenter      string
	TaggedAddresses map[string]string
	Meta            map[string]string
	CreateIndex     uint64
	ModifyIndex     uint64
}

// wireCheck is structs.HealthCheck as Consul encodes it, in
// /v1/agent/checks, /v1/health/... and the catalog.
type wireCheck struct {
	Node        string
	CheckID     string
	Name        string
	Status      string
	Notes       string
	Output      string
	ServiceID   string
	ServiceName string
	ServiceTags []string
	Type        string
	Interval    string
	Timeout     string
	ExposedPort int
	Definition  wireDefinition
	CreateIndex uint64
	ModifyIndex uint64
}

// wireDefinition is structs.HealthCheckDefinition as Consul encodes it:
// every field is omitted when empty, so the definition of a check an agent
// registered, which the agent never fills in, is {}.
type wireDefinition struct {
	HTTP                           string              `json:",omitempty"`
	TLSServerName                  string              `json:",omitempty"`
	TLSSkipVerify                  bool                `json:",omitempty"`
	Header                         map[string][]string `json:",omitempty"`
	Method                         string              `json:",omitempty"`
	Body                           string              `json:",omitempty"`
	TCP                            string              `json:",omitempty"`
	TCPUseTLS                      bool                `json:",omitempty"`
	UDP                            string              `json:",omitempty"`
	OSService                      string              `json:",omitempty"`
	GRPC                           string              `json:",omitempty"`
	GRPCUseTLS                     bool                `json:",omitempty"`
	Interval                       string              `json:",omitempty"`
	Timeout                        string              `json:",omitempty"`
	DeregisterCriticalServiceAfter string              `json:",omitempty"`
}

// wireAgentService is api.AgentService as /v1/agent/services encodes it.
type wireAgentService struct {
	ID                string
	Service           string
	Tags              []string
	Meta              map[string]string
	Port              int
	Address           string
	TaggedAddresses   map[string]api.ServiceAddress `json:",omitempty"`
	Weights           api.AgentWeights
	EnableTagOverride bool
	Datacenter        string `json:",omitempty"`
}

// wireProxy is an empty structs.ConnectProxyConfig as Consul encodes it.
type wireProxy struct {
	Mode             string
	MeshGateway      struct{}
	Expose           struct{}
	TransparentProxy struct{}
	AccessLogs       struct{}
}

// wireNodeService is structs.NodeService as /v1/health/service encodes
// it.
type wireNodeService struct {
	ID                string
	Service           string
	Tags              []string
	Address           string
	TaggedAddresses   map[string]api.ServiceAddress `json:",omitempty"`
	Meta              map[string]string
	Port              int
	Weights           api.AgentWeights
	EnableTagOverride bool
	Proxy             wireProxy
	Connect           struct{}
	CreateIndex       uint64
	ModifyIndex       uint64
}

// wireServiceNode is structs.ServiceNode as /v1/catalog/service encodes
// it.
type wireServiceNode struct {
	ID                       string
	Node                     string
	Address                  string
	Datacenter               string
	TaggedAddresses          map[string]string
	NodeMeta                 map[string]string
	ServiceKind              string
	ServiceID                string
	ServiceName              string
	ServiceTags              []string
	ServiceAddress           string
	ServiceTaggedAddresses   map[string]api.ServiceAddress `json:",omitempty"`
	ServiceWeights           api.AgentWeights
	ServiceMeta              map[string]string
	ServicePort              int
	ServiceEnableTagOverride bool
	ServiceProxy             wireProxy
	ServiceConnect           struct{}
	CreateIndex              uint64
	ModifyIndex              uint64
}

// wireServiceEntry is structs.CheckServiceNode as Consul encodes it.
type wireServiceEntry struct {
	Node    wireNode
	Service wireNodeService
	Checks  []wireCheck
}

// nodeID derives a stable node ID in UUID form from a node name; a real
// agent generates a random one once and keeps it in its data dir.
func nodeID(name string) string {
	h := sha256.Sum256([]byte("consultest-node/" + name))
	return fmt.Sprintf("%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

// agentNodeLocked returns the catalog node of an agent as the agent
// registers it: its ID, address, default tagged addresses and meta.
func agentNode(a *Agent) wireNode {
	return wireNode{
		ID:         nodeID(a.node),
		Node:       a.node,
		Address:    a.addr,
		Datacenter: a.dc,
		TaggedAddresses: map[string]string{
			"lan": a.addr, "lan_ipv4": a.addr, "wan": a.addr, "wan_ipv4": a.addr,
		},
		Meta: map[string]string{"consul-network-segment": "", "consul-version": consulVersion},
	}
}

// registerAgentLocked adds an agent's node with a passing serfHealth check,
// as the servers do when the agent joins.
func (cat *Catalog) registerAgentLocked(a *Agent) {
	cat.agents[a.node] = a
	cat.index++
	n := cat.nodeLocked(a.node, a.dc)
	cat.setNodeInfoLocked(n, agentNode(a))
	cat.putCheckLocked(n, &wireCheck{
		Node: a.node, CheckID: serfHealthID, Name: serfHealthName,
		Status: api.HealthPassing, Output: serfAliveOutput,
	})
}

// nodeLocked returns a catalog node, creating it when missing.
func (cat *Catalog) nodeLocked(name, dc string) *catalogNode {
	n, ok := cat.nodes[name]
	if !ok {
		n = &catalogNode{
			node:     wireNode{Node: name, Datacenter: dc, CreateIndex: cat.index, ModifyIndex: cat.index},
			services: make(map[string]*catalogService),
			checks:   make(map[string]*wireCheck),
		}
		cat.nodes[name] = n
		cat.nodesIndex = cat.index
	}
	return n
}

// setNodeInfoLocked replaces a node's ID, address, tagged addresses and
// meta, keeping its indexes when nothing changed.
func (cat *Catalog) setNodeInfoLocked(n *catalogNode, info wireNode) {
	info.Node, info.Datacenter = n.node.Node, n.node.Datacenter
	info.CreateIndex, info.ModifyIndex = n.node.CreateIndex, n.node.ModifyIndex
	if !reflect.DeepEqual(info, n.node) {
		info.ModifyIndex = cat.index
		n.node = info
		cat.nodesIndex = cat.index
		cat.touchNodeLocked(n)
	}
}

// putServiceLocked stores a service in a node, keeping its indexes when
// nothing changed. The node's checks of the service follow its name and
// tags, as the catalog copies them into each check.
func (cat *Catalog) putServiceLocked(n *catalogNode, svc api.AgentService) {
	svc = cloneService(svc)
	svc.CreateIndex, svc.ModifyIndex = 0, 0
	svc.Tags = nonNilTags(svc.Tags)
	prev, ok := n.services[svc.ID]
	switch {
	case !ok:
		n.services[svc.ID] = &catalogService{svc: svc, createIndex: cat.index, modifyIndex: cat.index}
		cat.serviceIndex[svc.Service], cat.nodesIndex = cat.index, cat.index
	case !reflect.DeepEqual(prev.svc, svc):
		old := prev.svc.Service
		prev.svc, prev.modifyIndex = svc, cat.index
		cat.serviceIndex[svc.Service], cat.nodesIndex = cat.index, cat.index
		if old != svc.Service {
			cat.lostInstanceLocked(old)
		}
	}
	for _, h := range n.checks {
		if h.ServiceID == svc.ID && (h.ServiceName != svc.Service || !slices.Equal(h.ServiceTags, svc.Tags)) {
			h.ServiceName, h.ServiceTags, h.ModifyIndex = svc.Service, slices.Clone(svc.Tags), cat.index
		}
	}
}

// putCheckLocked stores a check in a node, keeping its indexes when
// nothing changed. A service check takes the service's name and tags from
// the catalog.
func (cat *Catalog) putCheckLocked(n *catalogNode, h *wireCheck) {
	c := cloneWireCheck(*h)
	c.Node = n.node.Node
	if c.ServiceID != "" {
		if s, ok := n.services[c.ServiceID]; ok {
			c.ServiceName, c.ServiceTags = s.svc.Service, slices.Clone(s.svc.Tags)
		}
	}
	c.ServiceTags = nonNilTags(c.ServiceTags)
	prev, ok := n.checks[c.CheckID]
	if ok {
		c.CreateIndex, c.ModifyIndex = prev.CreateIndex, prev.ModifyIndex
		if reflect.DeepEqual(*prev, c) {
			return
		}
	} else {
		c.CreateIndex = cat.index
	}
	c.ModifyIndex = cat.index
	n.checks[c.CheckID] = &c
	cat.touchCheckLocked(n, &c)
}

// removeServiceLocked deletes a service instance from a node.
func (cat *Catalog) removeServiceLocked(n *catalogNode, id string) {
	s, ok := n.services[id]
	if !ok {
		return
	}
	delete(n.services, id)
	cat.nodesIndex = cat.index
	cat.lostInstanceLocked(s.svc.Service)
}

// removeCheckLocked deletes a check from a node.
func (cat *Catalog) removeCheckLocked(n *catalogNode, id string) {
	c, ok := n.checks[id]
	if !ok {
		return
	}
	delete(n.checks, id)
	cat.touchCheckLocked(n, c)
}

// touchNodeLocked moves the index of every service of a node, as Consul
// does when the node or one of its node checks changes.
func (cat *Catalog) touchNodeLocked(n *catalogNode) {
	for _, s := range n.services {
		cat.serviceIndex[s.svc.Service] = cat.index
	}
}

// touchCheckLocked moves the index of the service a check belongs to, or
// of every service of its node for a node check.
func (cat *Catalog) touchCheckLocked(n *catalogNode, c *wireCheck) {
	cat.checksIndex = cat.index
	if c.ServiceID == "" {
		cat.touchNodeLocked(n)
		return
	}
	if s, ok := n.services[c.ServiceID]; ok {
		cat.serviceIndex[s.svc.Service] = cat.index
	}
}

// lostInstanceLocked records that an instance of service name went away:
// the service's index moves, or, when it was the last instance, the
// service's index is dropped and the extinction index moves, as in
// Consul's state store.
func (cat *Catalog) lostInstanceLocked(name string) {
	for _, n := range cat.nodes {
		for _, s := range n.services {
			if s.svc.Service == name {
				cat.serviceIndex[name] = cat.index
				return
			}
		}
	}
	delete(cat.serviceIndex, name)
	cat.extinction = cat.index
}

// serviceIndexLocked is the X-Consul-Index of the catalog (checks false)
// and health (checks true) queries of service name, as Consul computes it:
// the index of the service's last change while it has instances; for a
// service without instances, the extinction index, or, when no service
// ever lost its last instance, the index of the last change to any node
// or service (and check, for health).
func (cat *Catalog) serviceIndexLocked(name string, checks bool) uint64 {
	if idx, ok := cat.serviceIndex[name]; ok {
		return idx
	}
	if cat.extinction > 0 {
		return cat.extinction
	}
	if checks {
		return max(cat.nodesIndex, cat.checksIndex)
	}
	return cat.nodesIndex
}

// sortedAgentsLocked lists the open agents by node name.
func (cat *Catalog) sortedAgentsLocked() []*Agent {
	names := slices.Sorted(maps.Keys(cat.agents))
	out := make([]*Agent, len(names))
	for i, n := range names {
		out[i] = cat.agents[n]
	}
	return out
}

// refreshLocked expires the TTL checks of every agent whose TTL ran out,
// then commits and wakes waiters. It is run before every observation of
// the state, so expiry shows even when the test clock is not the real
// one.
func (cat *Catalog) refreshLocked() {
	expired := false
	for _, a := range cat.agents {
		if a.expireLocked() {
			expired = true
		}
	}
	if expired {
		cat.commitLocked()
		cat.notifyAllLocked()
	}
}

// commitLocked brings the state to rest after a change, as the agents'
// check runners and state syncers do: alias checks of local services are
// re-evaluated, local changes are pushed to the catalog, then alias checks
// of other nodes are evaluated from the catalog and pushed as well. Alias
// checks are not inputs of other alias checks, so one round is enough.
func (cat *Catalog) commitLocked() {
	agents := cat.sortedAgentsLocked()
	for _, a := range agents {
		a.evalAliasesLocked(false)
	}
	cat.pushLocked(agents)
	for _, a := range agents {
		a.evalAliasesLocked(true)
	}
	cat.pushLocked(agents)
}

// pushLocked pushes the unsynced local state of the agents to the catalog
// under one new index.
func (cat *Catalog) pushLocked(agents []*Agent) {
	dirty := false
	for _, a := range agents {
		if a.dirtyLocked() {
			dirty = true
			break
		}
	}
	if !dirty {
		return
	}
	cat.index++
	for _, a := range agents {
		a.syncLocked()
	}
}

// notifyAllLocked wakes the waiters of every agent of the catalog.
func (cat *Catalog) notifyAllLocked() {
	for _, a := range cat.agents {
		a.notifyLocked()
	}
}

// finishLocked commits and, when the index moved since idx0, wakes the
// waiters of every agent of the catalog.
func (cat *Catalog) finishLocked(idx0 uint64) {
	cat.commitLocked()
	if cat.index != idx0 {
		cat.notifyAllLocked()
	}
}

// aliasResult aggregates checks as Consul's alias check does: critical if
// any is critical, else warning if any is warning, else passing. Checks of
// other services and alias checks are skipped; node checks (ServiceID "")
// count. found reports whether a check of the service itself was seen.
func aliasResult(checks []*wireCheck, serviceID string) (status, output string, found bool) {
	sort.Slice(checks, func(i, j int) bool { return checks[i].CheckID < checks[j].CheckID })
	status, output = api.HealthPassing, "No checks found."
	for _, c := range checks {
		if c.Type == "alias" {
			continue
		}
		match := c.ServiceID == serviceID
		if c.ServiceID != "" && !match {
			continue
		}
		if match {
			found = true
		}
		switch c.Status {
		case api.HealthCritical:
			if status != api.HealthCritical {
				status, output = api.HealthCritical, fmt.Sprintf("Aliased check %q failing: %s", c.Name, c.Output)
			}
		case api.HealthWarning:
			if status == api.HealthPassing {
				status, output = api.HealthWarning, fmt.Sprintf("Aliased check %q failing: %s", c.Name, c.Output)
			}
		default:
			if status == api.HealthPassing {
				output = "All checks passing."
			}
		}
	}
	return status, output, found
}

// aliasNodeLocked evaluates an alias check of node (and, when serviceID is
// set, of that service on the node) from the catalog.
func (cat *Catalog) aliasNodeLocked(node, serviceID string) (string, string) {
	var checks []*wireCheck
	n := cat.nodes[node]
	if n != nil {
		for _, c := range n.checks {
			checks = append(checks, c)
		}
	}
	status, output, found := aliasResult(checks, serviceID)
	if !found {
		exists := false
		if n != nil && serviceID != "" {
			_, exists = n.services[serviceID]
		}
		if !exists {
			return api.HealthCritical, fmt.Sprintf("Service %s could not be found on node %s", serviceID, node)
		}
	}
	return status, output
}

func cloneWireCheck(c wireCheck) wireCheck {
	c.ServiceTags = slices.Clone(c.ServiceTags)
	c.Definition.Header = maps.Clone(c.Definition.Header)
	return c
}
