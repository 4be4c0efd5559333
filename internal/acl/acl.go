package acl

import (
	"fmt"
	"maps"
	"strconv"
)

// Resource is what a rule of a policy is about.
type Resource string

// The resources a policy has rules for.
const (
	// ResourcePlugin covers the plugins of the cluster and of an agent.
	ResourcePlugin Resource = "plugin"
	// ResourceVolume covers volumes and the controller RPCs on them.
	ResourceVolume Resource = "volume"
	// ResourceNode covers nodes and the cluster's event stream; node:write
	// lets an agent register its node.
	ResourceNode Resource = "node"
	// ResourceOperator covers raft peers and snapshots.
	ResourceOperator Resource = "operator"
	// ResourceAgent covers an agent's own status, logs, metrics and
	// configuration (read), and its runtime profiles (write).
	ResourceAgent Resource = "agent"
)

// Resources returns every resource, in a fixed order: plugin, volume,
// node, operator, agent.
func Resources() []Resource {
	return []Resource{ResourcePlugin, ResourceVolume, ResourceNode, ResourceOperator, ResourceAgent}
}

// valid reports whether r is one of Resources.
func (r Resource) valid() bool {
	switch r {
	case ResourcePlugin, ResourceVolume, ResourceNode, ResourceOperator, ResourceAgent:
		return true
	}
	return false
}

// Level is what a rule allows on its resource. Levels are ordered: a
// higher level includes the lower ones, except LevelDeny, which is an
// explicit refusal that wins over every other rule when compiled.
type Level uint8

// The levels of a rule.
const (
	// LevelNone is the absence of a rule: nothing is allowed.
	LevelNone Level = iota
	// LevelDeny refuses the resource even when another policy allows it.
	LevelDeny
	// LevelRead allows reading the resource.
	LevelRead
	// LevelWrite allows reading and changing the resource.
	LevelWrite
)

// ParseLevel parses the level of a policy rule: "deny", "read" or "write".
func ParseLevel(s string) (Level, error) {
	switch s {
	case "deny":
		return LevelDeny, nil
	case "read":
		return LevelRead, nil
	case "write":
		return LevelWrite, nil
	}
	return LevelNone, fmt.Errorf("unknown level %q: want deny, read or write", s)
}

// String returns the level as a policy writes it; LevelNone is "none".
func (l Level) String() string {
	switch l {
	case LevelNone:
		return "none"
	case LevelDeny:
		return "deny"
	case LevelRead:
		return "read"
	case LevelWrite:
		return "write"
	}
	return "Level(" + strconv.Itoa(int(l)) + ")"
}

// Capability is what a method needs: Level is LevelRead or LevelWrite on
// Resource.
type Capability struct {
	Resource Resource
	Level    Level
}

// String returns the capability as "resource:level", "volume:write" for
// example.
func (c Capability) String() string {
	return string(c.Resource) + ":" + c.Level.String()
}

// IsZero reports whether c is the zero Capability (no requirement).
func (c Capability) IsZero() bool { return c == Capability{} }

// valid reports whether c names a known resource and read or write.
func (c Capability) valid() bool {
	return c.Resource.valid() && (c.Level == LevelRead || c.Level == LevelWrite)
}

// ACL is the compiled set of rules of one token. The zero value and a nil
// *ACL deny everything. An ACL is never modified once built.
type ACL struct {
	management bool
	levels     map[Resource]Level
	// nodeIdentity is the node a token made with a node identity acts as.
	nodeIdentity string
}

// Compile merges the rules of policies into one ACL. Per resource, an
// explicit deny in any policy wins; otherwise the highest level of any
// policy applies. Nil policies are skipped; no policies deny everything.
func Compile(policies ...*Policy) *ACL {
	levels := make(map[Resource]Level, len(Resources()))
	for _, p := range policies {
		if p == nil {
			continue
		}
		for r, l := range p.Rules {
			cur := levels[r]
			switch {
			case cur == LevelDeny:
			case l == LevelDeny:
				levels[r] = LevelDeny
			case l > cur:
				levels[r] = l
			}
		}
	}
	return &ACL{levels: levels}
}

// WithNodeIdentity returns a copy of a for a token with the node identity
// name (acl token create --node-identity), as Consul's node identities
// are: it allows node:write (what an agent needs for its Cluster calls)
// besides a's rules, and binds the token to node name (NodeIdentity). An
// explicit node deny of a's policies still wins. An empty name returns a
// unchanged; a nil a is DenyAll.
func (a *ACL) WithNodeIdentity(name string) *ACL {
	if a == nil {
		a = DenyAll()
	}
	if name == "" {
		return a
	}
	levels := maps.Clone(a.levels)
	if levels == nil {
		levels = map[Resource]Level{}
	}
	if levels[ResourceNode] != LevelDeny {
		levels[ResourceNode] = LevelWrite
	}
	return &ACL{management: a.management, levels: levels, nodeIdentity: name}
}

// NodeIdentity returns the node the token is bound to, "" for a token
// without a node identity: the servers let such a token act as that node
// only (CallerNode).
func (a *ACL) NodeIdentity() string {
	if a == nil {
		return ""
	}
	return a.nodeIdentity
}

// Management returns the ACL of a management token: it allows everything.
func Management() *ACL { return &ACL{management: true} }

// DenyAll returns an ACL that allows nothing.
func DenyAll() *ACL { return &ACL{} }

// Allows reports whether the ACL grants c. Write implies read; an explicit
// deny refuses both. A management ACL allows every valid capability. A
// capability that is not read or write on a known resource (the zero
// Capability among them) is never allowed, so a malformed requirement
// fails closed.
func (a *ACL) Allows(c Capability) bool {
	if a == nil || !c.valid() {
		return false
	}
	if a.management {
		return true
	}
	l := a.levels[c.Resource]
	return l != LevelDeny && l >= c.Level
}

// IsManagement reports whether a is the ACL of a management token.
func (a *ACL) IsManagement() bool { return a != nil && a.management }

// Level returns the compiled level of resource r: LevelWrite for every
// resource of a management ACL, LevelNone when no policy has a rule for it.
func (a *ACL) Level(r Resource) Level {
	if a == nil || !r.valid() {
		return LevelNone
	}
	if a.management {
		return LevelWrite
	}
	return a.levels[r]
}
