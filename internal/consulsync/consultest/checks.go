package consultest

import (
	"context"
	"crypto/tls"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// localCheck is a check of the agent's local state.
type localCheck struct {
	id, name, notes        string
	status, output         string
	serviceID, serviceName string
	typ                    string
	interval, timeout, ttl time.Duration
	// def is the definition as registered.
	def api.AgentServiceCheck

	// TTL state: expiry, whether it was applied, the last output an update
	// set and the timer that expires the check on the real clock.
	expires    time.Time
	expired    bool
	lastOutput string
	timer      *time.Timer

	// run is the running gRPC probe loop, if any.
	run *checkRunner

	inSync bool
}

// checkSpec is a validated check registration.
type checkSpec struct {
	def                    api.AgentServiceCheck
	id, name, notes        string
	status                 string
	typ                    string
	interval, timeout, ttl time.Duration
}

// scriptsDisabled is Consul's answer to a script check registered through
// the API of an agent without enable_script_checks.
const scriptsDisabled = "Scripts are disabled on this agent from remote calls; to enable, configure 'enable_script_checks' to true"

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

// parseCheck parses the durations of a check definition, validates it as
// Consul's CheckType.Validate does (the error is the reason to prefix
// with "Invalid check: ") and works out its type as CheckType.Type does.
func parseCheck(c api.AgentServiceCheck) (s checkSpec, decodeErr, invalid error) {
	s = checkSpec{def: cloneServiceCheck(c), id: c.CheckID, name: c.Name, notes: c.Notes, status: c.Status}
	var err error
	if s.ttl, err = parseDuration("TTL", c.TTL); err != nil {
		return s, err, nil
	}
	if s.interval, err = parseDuration("Interval", c.Interval); err != nil {
		return s, err, nil
	}
	if s.timeout, err = parseDuration("Timeout", c.Timeout); err != nil {
		return s, err, nil
	}
	script := len(c.Args) > 0
	intervalCheck := script || c.HTTP != "" || c.TCP != "" || c.UDP != "" || c.GRPC != "" || c.H2PING != ""
	alias := c.AliasNode != "" || c.AliasService != ""
	switch {
	case s.interval > 0 && s.ttl > 0:
		return s, nil, fmt.Errorf("Interval and TTL cannot both be specified")
	case intervalCheck && s.interval <= 0:
		return s, nil, fmt.Errorf("Interval must be > 0 for Script, HTTP, H2PING, TCP, UDP or OSService checks")
	case intervalCheck && alias:
		return s, nil, fmt.Errorf("Interval cannot be set for Alias checks")
	case alias && s.ttl > 0:
		return s, nil, fmt.Errorf("TTL must be not be set for Alias checks")
	case !intervalCheck && !alias && s.ttl <= 0:
		return s, nil, fmt.Errorf("TTL must be > 0 for TTL checks")
	case c.FailuresBeforeWarning > c.FailuresBeforeCritical:
		return s, nil, fmt.Errorf("FailuresBeforeWarning can't be higher than FailuresBeforeCritical")
	}
	switch {
	case c.GRPC != "":
		s.typ = "grpc"
	case c.HTTP != "":
		s.typ = "http"
	case s.ttl > 0:
		s.typ = "ttl"
	case c.TCP != "":
		s.typ = "tcp"
	case c.UDP != "":
		s.typ = "udp"
	case alias:
		s.typ = "alias"
	case script && c.DockerContainerID != "":
		s.typ = "docker"
	case script:
		s.typ = "script"
	case c.H2PING != "":
		s.typ = "h2ping"
	}
	return s, nil, nil
}

// putCheckLocked stores a check and starts what runs it. A check that
// exists keeps its status and output, as Consul keeps them across
// re-registrations, and its runner and TTL timer are replaced.
func (a *Agent) putCheckLocked(s checkSpec, serviceID, serviceName string) {
	if s.status == "" {
		s.status = api.HealthCritical
	}
	def := s.def
	def.CheckID, def.Name, def.Notes = s.id, s.name, s.notes
	c := &localCheck{
		id: s.id, name: s.name, notes: s.notes,
		status:    s.status,
		serviceID: serviceID, serviceName: serviceName,
		typ:      s.typ,
		interval: s.interval, timeout: s.timeout, ttl: s.ttl,
		def: def,
	}
	if prev, ok := a.checks[s.id]; ok {
		c.status, c.output = prev.status, prev.output
		a.stopCheckLocked(prev)
	}
	a.checks[s.id] = c
	a.cat.index++
	if c.ttl > 0 {
		c.expires = a.now().Add(c.ttl)
		a.armTTLLocked(c)
	}
	if c.typ == "grpc" {
		a.startGRPCLocked(c)
	}
}

// removeCheckLocked deregisters a check from the agent and the catalog.
func (a *Agent) removeCheckLocked(id string) {
	c, ok := a.checks[id]
	if !ok {
		return
	}
	a.stopCheckLocked(c)
	delete(a.checks, id)
	a.checksRemoved = true
	a.cat.index++
	if n, ok := a.cat.nodes[a.node]; ok {
		a.cat.removeCheckLocked(n, id)
	}
}

// stopCheckLocked stops the runner and the TTL timer of a check. A runner
// stops on its own once cancelled; Close waits for it.
func (a *Agent) stopCheckLocked(c *localCheck) {
	if c.run != nil {
		c.run.cancel()
		c.run = nil
	}
	if c.timer != nil {
		if c.timer.Stop() {
			a.wg.Done()
		}
		c.timer = nil
	}
}

// wireCheckLocked encodes a local check as a Consul agent serves and
// pushes it: Interval and Timeout as strings ("" when unset), an empty
// Definition, no indexes.
func (a *Agent) wireCheckLocked(c *localCheck) wireCheck {
	w := wireCheck{
		Node:        a.node,
		CheckID:     c.id,
		Name:        c.name,
		Status:      c.status,
		Notes:       c.notes,
		Output:      c.output,
		ServiceID:   c.serviceID,
		ServiceName: c.serviceName,
		ServiceTags: []string{},
		Type:        c.typ,
		Interval:    durationString(c.interval),
		Timeout:     durationString(c.timeout),
	}
	if s, ok := a.services[c.serviceID]; ok && c.serviceID != "" {
		w.ServiceTags = nonNilTags(s.svc.Tags)
	}
	return w
}

// agentCheckLocked is a local check as consul/api decodes it from
// /v1/agent/checks.
func (a *Agent) agentCheckLocked(c *localCheck) api.AgentCheck {
	w := a.wireCheckLocked(c)
	return api.AgentCheck{
		Node: w.Node, CheckID: w.CheckID, Name: w.Name, Status: w.Status, Notes: w.Notes,
		Output: w.Output, ServiceID: w.ServiceID, ServiceName: w.ServiceName, Type: w.Type,
	}
}

func durationString(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return d.String()
}

// truncateOutput caps check output as Consul does.
func truncateOutput(s string) string {
	if total := len(s); total > checkBufSize {
		return fmt.Sprintf("%s ... (captured %d of %d bytes)", s[:checkBufSize], checkBufSize, total)
	}
	return s
}

// updateTTLLocked applies a TTL update: status, output, and a new TTL.
func (a *Agent) updateTTLLocked(c *localCheck, status, output string) {
	a.cat.index++
	c.status, c.output, c.inSync = status, output, false
	c.lastOutput, c.expired = output, false
	c.expires = a.now().Add(c.ttl)
	a.armTTLLocked(c)
}

// armTTLLocked (re)starts the timer that expires a TTL check on the real
// clock, so that expiry is pushed and notified without a request. With a
// test clock (Config.Now) expiry is also applied at each observation.
func (a *Agent) armTTLLocked(c *localCheck) {
	if c.timer != nil && c.timer.Stop() {
		a.wg.Done()
	}
	c.timer = nil
	if a.closed {
		return
	}
	a.wg.Add(1)
	c.timer = time.AfterFunc(c.ttl, func() {
		defer a.wg.Done()
		a.cat.mu.Lock()
		defer a.cat.mu.Unlock()
		if !a.closed {
			a.cat.refreshLocked()
		}
	})
}

// expireLocked turns TTL checks whose TTL ran out critical, as the TTL
// timer of a Consul agent does, with Consul's output. It reports whether
// a check expired.
func (a *Agent) expireLocked() bool {
	now := a.now()
	changed := false
	for _, c := range a.checks {
		if c.ttl > 0 && !c.expired && !now.Before(c.expires) {
			c.expired = true
			c.status, c.inSync = api.HealthCritical, false
			c.output = "TTL expired"
			if c.lastOutput != "" {
				c.output = "TTL expired (last output before timeout follows): " + c.lastOutput
			}
			changed = true
		}
	}
	if changed {
		a.cat.index++
	}
	return changed
}

// evalAliasesLocked evaluates the alias checks of the agent: those of a
// local service (remote false) from the local state, those with an
// AliasNode (remote true) from the catalog. A local alias is evaluated
// again only when its service or a node check changed since the last
// evaluation (an unsynced record), or a check was removed, so an agent with
// many aliases stays linear per change.
func (a *Agent) evalAliasesLocked(remote bool) {
	var touched map[string]bool
	all := false
	if !remote {
		touched = a.touchedServicesLocked()
		all = a.checksRemoved || touched[""]
		if len(touched) == 0 && !all {
			return
		}
		a.checksRemoved = false
	}
	var byService map[string][]*wireCheck
	results := map[string][2]string{} // local alias target -> status, output
	for _, c := range a.checks {
		if c.typ != "alias" || (c.def.AliasNode != "") != remote {
			continue
		}
		var status, output string
		if remote {
			status, output = a.cat.aliasNodeLocked(c.def.AliasNode, c.def.AliasService)
		} else {
			if !all && !touched[c.def.AliasService] {
				continue
			}
			r, ok := results[c.def.AliasService]
			if !ok {
				if byService == nil {
					byService = a.checksByServiceLocked(all, touched)
				}
				r[0], r[1] = a.aliasLocalLocked(c.def.AliasService, byService)
				results[c.def.AliasService] = r
			}
			status, output = r[0], r[1]
		}
		if status != c.status || output != c.output {
			c.status, c.output, c.inSync = status, output, false
		}
	}
}

// touchedServicesLocked returns the IDs of the services whose local aliases
// need evaluating: those with an unsynced registration or an unsynced
// non-alias check ("" for node checks), and the targets of unsynced (new or
// re-registered) local alias checks.
func (a *Agent) touchedServicesLocked() map[string]bool {
	touched := map[string]bool{}
	for id, s := range a.services {
		if !s.inSync {
			touched[id] = true
		}
	}
	for _, c := range a.checks {
		switch {
		case c.inSync:
		case c.typ != "alias":
			touched[c.serviceID] = true
		case c.def.AliasNode == "":
			touched[c.def.AliasService] = true
		}
	}
	return touched
}

// checksByServiceLocked groups the agent's checks of the touched services
// (of every service when all is set) and its node checks (under "") by
// service ID.
func (a *Agent) checksByServiceLocked(all bool, touched map[string]bool) map[string][]*wireCheck {
	by := make(map[string][]*wireCheck)
	for _, c := range a.checks {
		if !all && c.serviceID != "" && !touched[c.serviceID] {
			continue
		}
		w := &wireCheck{CheckID: c.id, Name: c.name, Status: c.status, Output: c.output, ServiceID: c.serviceID, Type: c.typ}
		by[c.serviceID] = append(by[c.serviceID], w)
	}
	return by
}

// aliasLocalLocked evaluates an alias of a service of this agent from the
// checks of the service and the node checks of the agent.
func (a *Agent) aliasLocalLocked(serviceID string, byService map[string][]*wireCheck) (string, string) {
	checks := slices.Concat(byService[""], byService[serviceID])
	status, output, found := aliasResult(checks, serviceID)
	if !found {
		if _, ok := a.services[serviceID]; !ok {
			return api.HealthCritical, fmt.Sprintf("Service %s could not be found on node %s", serviceID, a.node)
		}
	}
	return status, output
}

// checkRunner is the probe loop of a gRPC check.
type checkRunner struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when the loop returned
}

// grpcProbe queries the standard gRPC health service, as Consul's
// GrpcHealthProbe does.
type grpcProbe struct {
	target  string // host:port or host:port/service
	timeout time.Duration
	tls     *tls.Config // nil: insecure credentials
}

// startGRPCLocked starts the probe loop of a gRPC check unless checks are
// manual or the agent is closed.
func (a *Agent) startGRPCLocked(c *localCheck) {
	if a.manual || a.closed {
		return
	}
	p := grpcProbe{target: c.def.GRPC, timeout: c.timeout}
	if p.timeout <= 0 {
		p.timeout = defaultCheckTimeout
	}
	if c.def.GRPCUseTLS {
		p.tls = a.checkTLSConfig(c.def.TLSServerName, c.def.TLSSkipVerify)
	}
	h := newStatusHandler(c.def.SuccessBeforePassing, c.def.FailuresBeforeWarning, c.def.FailuresBeforeCritical)
	ctx, cancel := context.WithCancel(context.Background())
	r := &checkRunner{cancel: cancel, done: make(chan struct{})}
	c.run = r
	a.wg.Add(1)
	go a.runGRPC(ctx, c.id, r, p, c.interval, h)
}

// checkTLSConfig builds the TLS configuration of a check as Consul's
// OutgoingTLSConfigForCheck does.
func (a *Agent) checkTLSConfig(serverName string, skipVerify bool) *tls.Config {
	cfg := &tls.Config{}
	if a.checkTLS != nil {
		cfg = a.checkTLS.Clone()
	}
	cfg.InsecureSkipVerify = skipVerify
	if serverName != "" {
		cfg.ServerName = serverName
	}
	return cfg
}

// runGRPC waits a random stagger in [0, interval), then probes every
// interval until ctx is cancelled.
func (a *Agent) runGRPC(ctx context.Context, id string, r *checkRunner, p grpcProbe, interval time.Duration, h *statusHandler) {
	defer a.wg.Done()
	defer close(r.done)
	defer r.cancel()
	var stagger time.Duration
	if interval > 0 {
		stagger = rand.N(interval)
	}
	t := time.NewTimer(stagger)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		status, output := p.check(ctx)
		if ctx.Err() != nil {
			return
		}
		if status, output, ok := h.update(status, output); ok {
			a.reportCheck(id, r, status, output)
		}
		t.Reset(interval)
	}
}

// reportCheck records a check result, pushes it to the catalog and wakes
// waiters when it changed something. Results of a stopped runner are
// dropped.
func (a *Agent) reportCheck(id string, r *checkRunner, status, output string) {
	cat := a.cat
	cat.mu.Lock()
	defer cat.mu.Unlock()
	c, ok := a.checks[id]
	if a.closed || !ok || c.run != r {
		return
	}
	output = truncateOutput(output)
	if c.status == status && c.output == output {
		return
	}
	idx0 := cat.index
	cat.index++
	c.status, c.output, c.inSync = status, output, false
	cat.finishLocked(idx0)
}

// check runs one probe and returns the status and output Consul reports.
func (p grpcProbe) check(ctx context.Context) (string, string) {
	if err := p.probe(ctx); err != nil {
		return api.HealthCritical, err.Error()
	}
	return api.HealthPassing, fmt.Sprintf("gRPC check %s: success", p.target)
}

func (p grpcProbe) probe(ctx context.Context) error {
	server, service, _ := strings.Cut(p.target, "/")
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	creds := insecure.NewCredentials()
	if p.tls != nil {
		creds = credentials.NewTLS(p.tls)
	}
	conn, err := grpc.NewClient("passthrough:///"+server, grpc.WithTransportCredentials(creds))
	if err != nil {
		return fmt.Errorf("gRPC check %s: %w", p.target, err)
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return fmt.Errorf("gRPC check %s: %w", p.target, err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("gRPC %s serving status: %s", p.target, resp.GetStatus())
	}
	return nil
}

// statusHandler applies SuccessBeforePassing, FailuresBeforeWarning and
// FailuresBeforeCritical as Consul's StatusHandler does. It belongs to one
// runner goroutine.
type statusHandler struct {
	successBeforePassing, successCounter                          int
	failuresBeforeWarning, failuresBeforeCritical, failureCounter int
}

func newStatusHandler(successBeforePassing, failuresBeforeWarning, failuresBeforeCritical int) *statusHandler {
	if failuresBeforeWarning == 0 {
		failuresBeforeWarning = failuresBeforeCritical
	}
	return &statusHandler{
		successBeforePassing:   successBeforePassing,
		successCounter:         successBeforePassing,
		failuresBeforeWarning:  failuresBeforeWarning,
		failuresBeforeCritical: failuresBeforeCritical,
		failureCounter:         failuresBeforeCritical,
	}
}

// update returns the status to record for a probe result, if any.
func (h *statusHandler) update(status, output string) (string, string, bool) {
	if status == api.HealthPassing || status == api.HealthWarning {
		h.successCounter++
		h.failureCounter = 0
		if h.successCounter >= h.successBeforePassing {
			return status, output, true
		}
		return "", "", false
	}
	h.failureCounter++
	h.successCounter = 0
	if h.failureCounter >= h.failuresBeforeCritical {
		return status, output, true
	}
	if h.failureCounter >= h.failuresBeforeWarning {
		return api.HealthWarning, output, true
	}
	return "", "", false
}

func cloneServiceCheck(c api.AgentServiceCheck) api.AgentServiceCheck {
	c.Args = slices.Clone(c.Args)
	if c.Header != nil {
		h := make(map[string][]string, len(c.Header))
		for k, v := range c.Header {
			h[k] = slices.Clone(v)
		}
		c.Header = h
	}
	return c
}
