package consultest

import (
	"fmt"
	"maps"
	"net/http"
	"strings"
)

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

// SetToken adds or replaces an ACL token. It enables ACLs (with a deny-all
// anonymous policy) if they were off.
func (a *Agent) SetToken(secret string, p Policy) {
	a.cat.mu.Lock()
	defer a.cat.mu.Unlock()
	if a.acl == nil {
		a.acl = &ACL{Tokens: make(map[string]Policy)}
	}
	a.acl.Tokens[secret] = p
}

// DeleteToken removes an ACL token; requests that carry it get "ACL not
// found".
func (a *Agent) DeleteToken(secret string) {
	a.cat.mu.Lock()
	defer a.cat.mu.Unlock()
	if a.acl != nil {
		delete(a.acl.Tokens, secret)
	}
}

func cloneACL(in *ACL) *ACL {
	if in == nil {
		return nil
	}
	out := &ACL{Tokens: make(map[string]Policy, len(in.Tokens)), Anonymous: in.Anonymous}
	maps.Copy(out.Tokens, in.Tokens)
	return out
}

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

func (z authz) nodeRead() bool { return z.nodeWrite() || z.p.NodeRead }

func (z authz) agentRead() bool { return z.all || z.p.AgentRead }

func (a *Agent) deny(w http.ResponseWriter, msg string) {
	a.denied++
	http.Error(w, msg, http.StatusForbidden)
}

func (a *Agent) denyPermission(w http.ResponseWriter, perm, resource string) {
	a.deny(w, fmt.Sprintf("Permission denied: token lacks permission '%s' on %q", perm, resource))
}
