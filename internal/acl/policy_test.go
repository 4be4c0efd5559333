package acl

import (
	"errors"
	"maps"
	"regexp"
	"strings"
	"testing"
)

func TestParsePolicyGood(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want map[Resource]Level
	}{
		{"empty denies everything", "", map[Resource]Level{}},
		{"only comments", "# nothing\n// allowed\n", map[Resource]Level{}},
		{"one rule", `volume { policy = "write" }`, map[Resource]Level{ResourceVolume: LevelWrite}},
		{
			name: "every resource",
			src: `
plugin {
  policy = "read"
}
volume {
  policy = "write"
}
node     { policy = "read" }
operator { policy = "deny" }
agent    { policy = "read" }
`,
			want: map[Resource]Level{ResourcePlugin: LevelRead, ResourceVolume: LevelWrite, ResourceNode: LevelRead,
				ResourceOperator: LevelDeny, ResourceAgent: LevelRead},
		},
		{"heredoc-free template string", `node { policy = "${"read"}" }`, map[Resource]Level{ResourceNode: LevelRead}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := ParsePolicy("ops", "ops.hcl", []byte(tt.src))
			if err != nil {
				t.Fatal(err)
			}
			if p.Name != "ops" {
				t.Errorf("name %q", p.Name)
			}
			if !maps.Equal(p.Rules, tt.want) {
				t.Fatalf("rules %v, want %v", p.Rules, tt.want)
			}
		})
	}
}

func TestParsePolicyBad(t *testing.T) {
	tests := []struct {
		name string
		src  string
		// want are the problems, in order, each a substring of one error
		// line.
		want []string
	}{
		{"unknown resource", "volume { policy = \"read\" }\nsecret { policy = \"read\" }\n",
			[]string{`p.hcl:2: unsupported block "secret": the resources are plugin, volume, node, operator, agent`}},
		{"unknown key", "volume {\n  policy = \"read\"\n  capabilities = [\"x\"]\n}\n",
			[]string{`p.hcl:3: unsupported argument "capabilities" in block volume`}},
		{"top-level argument", "policy = \"write\"\n", []string{`p.hcl:1: unsupported argument "policy": a policy has only rule blocks`}},
		{"label", "volume \"v1\" { policy = \"read\" }\n", []string{`p.hcl:1: block volume takes no labels`}},
		{"duplicate block", "node { policy = \"read\" }\n\nnode { policy = \"write\" }\n",
			[]string{`p.hcl:3: duplicate block node (first at line 1)`}},
		{"bad level", "agent {\n  policy = \"admin\"\n}\n", []string{`p.hcl:2: agent.policy: unknown level "admin": want deny, read or write`}},
		{"missing policy", "\noperator {}\n", []string{`p.hcl:2: block operator: missing argument policy`}},
		{"nested block", "volume {\n  policy = \"read\"\n  rule { }\n}\n", []string{`p.hcl:3: unsupported block "rule" in block volume`}},
		{"variable", "volume { policy = write }\n", []string{`p.hcl:1: volume.policy: Variables not allowed`}},
		{"number", "volume { policy = 2 }\n", []string{`p.hcl:1: volume.policy: unknown level "2"`}},
		{"list", "volume { policy = [\"read\"] }\n", []string{`p.hcl:1: volume.policy: Unsuitable value type`}},
		{"syntax error", "volume {\n  policy = \"read\"\n", []string{`p.hcl:1: Unclosed configuration block`}},
		{"several problems in file order", "bogus {}\nvolume { policy = \"x\" }\nnode \"n\" {}\n",
			[]string{`p.hcl:1: unsupported block "bogus"`, `p.hcl:2: volume.policy: unknown level "x"`, `p.hcl:3: block node takes no labels`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := ParsePolicy("p", "p.hcl", []byte(tt.src))
			if err == nil {
				t.Fatalf("parsed: %v", p.Rules)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tt.want) {
				t.Fatalf("%d problems, want %d:\n%v", len(lines), len(tt.want), err)
			}
			for i, w := range tt.want {
				if !strings.Contains(lines[i], w) {
					t.Errorf("problem %d: %q, want it to contain %q", i, lines[i], w)
				}
			}
		})
	}
}

func TestParsePolicyNameAndSize(t *testing.T) {
	if _, err := ParsePolicy("bad name", "p.hcl", nil); err == nil || !strings.Contains(err.Error(), `policy name "bad name"`) {
		t.Fatalf("invalid name: %v", err)
	}
	big := strings.Repeat("# filler\n", MaxPolicyBytes/9+1)
	if _, err := ParsePolicy("p", "p.hcl", []byte(big)); err == nil || !strings.Contains(err.Error(), "p.hcl: policy p is") {
		t.Fatalf("oversized policy: %v", err)
	}
}

func TestValidatePolicyName(t *testing.T) {
	good := []string{"a", "anonymous", "Ops_team-2", "0", strings.Repeat("x", 128)}
	bad := []string{"", "-a", "_a", "a b", "a.b", "a/b", "ü", strings.Repeat("x", 129), "a\n"}
	for _, n := range good {
		if err := ValidatePolicyName(n); err != nil {
			t.Errorf("ValidatePolicyName(%q): %v", n, err)
		}
	}
	for _, n := range bad {
		if err := ValidatePolicyName(n); err == nil {
			t.Errorf("ValidatePolicyName(%q) accepted it", n)
		}
	}
}

func TestFormatRulesRoundTrip(t *testing.T) {
	in := map[Resource]Level{ResourceVolume: LevelWrite, ResourceOperator: LevelDeny, ResourceAgent: LevelRead, ResourceNode: LevelNone}
	src := FormatRules(in)
	want := "volume {\n  policy = \"write\"\n}\noperator {\n  policy = \"deny\"\n}\nagent {\n  policy = \"read\"\n}\n"
	if src != want {
		t.Fatalf("FormatRules:\n%s\nwant:\n%s", src, want)
	}
	p, err := ParsePolicy("p", "p.hcl", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	delete(in, ResourceNode)
	if !maps.Equal(p.Rules, in) {
		t.Fatalf("round trip %v, want %v", p.Rules, in)
	}
}

// FuzzParsePolicy feeds arbitrary bytes as the rules of a policy.
// ParsePolicy must never panic; every problem it reports must name the
// file (and the line when it has one); a policy it accepts must hold only
// known resources and levels, and parse to the same rules again from
// FormatRules of its rules.
func FuzzParsePolicy(f *testing.F) {
	f.Add([]byte(`volume { policy = "write" }`))
	f.Add([]byte("plugin {\n  policy = \"read\"\n}\noperator { policy = \"deny\" }\n"))
	f.Add([]byte("node \"x\" { policy = read }\nnode {}\nbogus = 1\n"))
	f.Add([]byte("agent { policy = \"${\"re\"}ad\" }\n"))
	f.Add([]byte(""))
	f.Add([]byte("volume {\n"))
	at := regexp.MustCompile(`^fuzz\.hcl(:\d+)?: `)
	f.Fuzz(func(t *testing.T, src []byte) {
		if len(src) > MaxPolicyBytes {
			t.Skip("larger than a policy may be")
		}
		p, err := ParsePolicy("fuzz", "fuzz.hcl", src)
		if err != nil {
			for _, e := range unjoin(err) {
				if !at.MatchString(e.Error()) {
					t.Errorf("problem does not name fuzz.hcl:LINE: %q", e.Error())
				}
			}
			return
		}
		for r, l := range p.Rules {
			if !r.valid() || l < LevelDeny || l > LevelWrite {
				t.Fatalf("accepted rule %q = %v", r, l)
			}
		}
		again, err := ParsePolicy("fuzz", "again.hcl", []byte(FormatRules(p.Rules)))
		if err != nil {
			t.Fatalf("FormatRules of accepted rules does not parse: %v", err)
		}
		if !maps.Equal(again.Rules, p.Rules) {
			t.Fatalf("round trip changed the rules: %v -> %v", p.Rules, again.Rules)
		}
	})
}

func TestUnjoin(t *testing.T) {
	a, b := errors.New("a"), errors.New("b")
	if got := unjoin(errors.Join(a, b)); len(got) != 2 || got[0] != a || got[1] != b {
		t.Fatalf("unjoin: %v", got)
	}
	if got := unjoin(a); len(got) != 1 || got[0] != a {
		t.Fatalf("unjoin single: %v", got)
	}
}
