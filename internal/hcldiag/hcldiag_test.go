package hcldiag

import (
	"testing"

	"github.com/hashicorp/hcl/v2"
)

func TestError(t *testing.T) {
	at := &hcl.Range{Filename: "agent.hcl", Start: hcl.Pos{Line: 3}}
	tests := []struct {
		name  string
		file  string // ErrorIn's filename; "" is Error
		key   string
		diags hcl.Diagnostics
		want  string // "" is no error
	}{
		{"none", "", "", nil, ""},
		{"warnings only", "", "", hcl.Diagnostics{{Severity: hcl.DiagWarning, Summary: "w", Subject: at}}, ""},
		{"with key and detail", "", "client.servers", hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Bad value", Detail: "Want a list.", Subject: at}},
			"agent.hcl:3: client.servers: Bad value: Want a list"},
		{"without subject", "", "", hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Bad"}}, "Bad"},
		{"without subject, in a file", "policy.hcl", "", hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Bad"}}, "policy.hcl: Bad"},
		{"subject before file", "policy.hcl", "k", hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Bad", Subject: at}}, "agent.hcl:3: k: Bad"},
		{"two", "", "", hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "A", Subject: at}, {Severity: hcl.DiagError, Summary: "B", Subject: at}},
			"agent.hcl:3: A\nagent.hcl:3: B"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Error(tt.key, tt.diags)
			if tt.file != "" {
				err = ErrorIn(tt.file, tt.key, tt.diags)
			}
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Errorf("Error = %q, want %q", got, tt.want)
			}
		})
	}
}
