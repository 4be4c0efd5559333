package acl

import (
	"testing"
)

func TestParseLevel(t *testing.T) {
	for _, l := range []Level{LevelDeny, LevelRead, LevelWrite} {
		got, err := ParseLevel(l.String())
		if err != nil || got != l {
			t.Errorf("ParseLevel(%q) = %v, %v; want %v", l.String(), got, err, l)
		}
	}
	for _, s := range []string{"", "none", "Write", "list", " read"} {
		if l, err := ParseLevel(s); err == nil {
			t.Errorf("ParseLevel(%q) = %v, want an error", s, l)
		}
	}
	if got := Level(9).String(); got != "Level(9)" {
		t.Errorf("Level(9).String() = %q", got)
	}
}

func TestCapability(t *testing.T) {
	c := Capability{Resource: ResourceVolume, Level: LevelWrite}
	if c.String() != "volume:write" || c.IsZero() {
		t.Fatalf("%v: String %q, IsZero %v", c, c.String(), c.IsZero())
	}
	if !(Capability{}).IsZero() {
		t.Fatal("the zero capability is not IsZero")
	}
}

func TestResources(t *testing.T) {
	want := []Resource{"plugin", "volume", "node", "operator", "agent"}
	got := Resources()
	if len(got) != len(want) {
		t.Fatalf("Resources() = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("Resources() = %v, want %v", got, want)
		}
	}
}

func rules(kv ...any) *Policy {
	p := &Policy{Name: "p", Rules: map[Resource]Level{}}
	for i := 0; i < len(kv); i += 2 {
		p.Rules[kv[i].(Resource)] = kv[i+1].(Level)
	}
	return p
}

func TestCompileAllows(t *testing.T) {
	read := func(r Resource) Capability { return Capability{r, LevelRead} }
	write := func(r Resource) Capability { return Capability{r, LevelWrite} }
	tests := []struct {
		name  string
		acl   *ACL
		allow []Capability
		deny  []Capability
	}{
		{
			name: "no policies deny everything",
			acl:  Compile(),
			deny: []Capability{read(ResourceVolume), write(ResourceVolume), read(ResourceAgent)},
		},
		{
			name:  "write implies read",
			acl:   Compile(rules(ResourceVolume, LevelWrite)),
			allow: []Capability{read(ResourceVolume), write(ResourceVolume)},
			deny:  []Capability{read(ResourcePlugin), write(ResourceNode)},
		},
		{
			name:  "read does not imply write",
			acl:   Compile(rules(ResourcePlugin, LevelRead)),
			allow: []Capability{read(ResourcePlugin)},
			deny:  []Capability{write(ResourcePlugin)},
		},
		{
			name:  "highest level of several policies",
			acl:   Compile(rules(ResourceNode, LevelRead), rules(ResourceNode, LevelWrite), rules(ResourceNode, LevelRead)),
			allow: []Capability{read(ResourceNode), write(ResourceNode)},
		},
		{
			name: "deny in a later policy wins over write",
			acl:  Compile(rules(ResourceOperator, LevelWrite), rules(ResourceOperator, LevelDeny)),
			deny: []Capability{read(ResourceOperator), write(ResourceOperator)},
		},
		{
			name:  "deny in an earlier policy wins over write",
			acl:   Compile(rules(ResourceOperator, LevelDeny, ResourceVolume, LevelRead), rules(ResourceOperator, LevelWrite)),
			allow: []Capability{read(ResourceVolume)},
			deny:  []Capability{read(ResourceOperator), write(ResourceOperator), write(ResourceVolume)},
		},
		{
			name:  "nil policies are skipped",
			acl:   Compile(nil, rules(ResourceAgent, LevelRead), nil),
			allow: []Capability{read(ResourceAgent)},
		},
		{
			name:  "management allows everything",
			acl:   Management(),
			allow: []Capability{read(ResourceVolume), write(ResourceOperator), write(ResourceAgent), read(ResourceNode)},
		},
		{
			name: "deny all",
			acl:  DenyAll(),
			deny: []Capability{read(ResourcePlugin), write(ResourcePlugin)},
		},
		{
			name: "nil ACL denies",
			acl:  nil,
			deny: []Capability{read(ResourcePlugin)},
		},
		{
			name: "malformed capabilities fail closed, even for management",
			acl:  Management(),
			deny: []Capability{{}, {ResourceVolume, LevelDeny}, {ResourceVolume, LevelNone}, {"secrets", LevelRead}, {ResourceVolume, Level(7)}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, c := range tt.allow {
				if !tt.acl.Allows(c) {
					t.Errorf("Allows(%s) = false, want true", c)
				}
			}
			for _, c := range tt.deny {
				if tt.acl.Allows(c) {
					t.Errorf("Allows(%s) = true, want false", c)
				}
			}
		})
	}
}

func TestIsManagementAndLevel(t *testing.T) {
	if !Management().IsManagement() || Compile(rules(ResourceVolume, LevelWrite)).IsManagement() ||
		DenyAll().IsManagement() || (*ACL)(nil).IsManagement() {
		t.Fatal("IsManagement is true only for Management()")
	}
	a := Compile(rules(ResourceVolume, LevelWrite, ResourceNode, LevelDeny))
	for r, want := range map[Resource]Level{ResourceVolume: LevelWrite, ResourceNode: LevelDeny, ResourcePlugin: LevelNone} {
		if got := a.Level(r); got != want {
			t.Errorf("Level(%s) = %s, want %s", r, got, want)
		}
	}
	if got := Management().Level(ResourceAgent); got != LevelWrite {
		t.Errorf("management Level(agent) = %s", got)
	}
}

// TestCompileDoesNotAlias checks that an ACL does not change when a
// policy it was compiled from changes.
func TestCompileDoesNotAlias(t *testing.T) {
	p := rules(ResourceVolume, LevelWrite)
	a := Compile(p)
	p.Rules[ResourceVolume] = LevelDeny
	if !a.Allows(Capability{ResourceVolume, LevelWrite}) {
		t.Fatal("changing the policy changed the compiled ACL")
	}
}
