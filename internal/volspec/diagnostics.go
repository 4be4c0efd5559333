package volspec

import (
	"fmt"
	"strings"

	"github.com/agext/levenshtein"
	"github.com/hashicorp/hcl/v2"
)

// fileError is one problem at a position of the file; the problems are
// reported in file order.
type fileError struct {
	at  hcl.Range
	err error
}

// suggest returns `; did you mean "x"?` for the known name closest to
// name, or "" when none is within two edits.
func suggest(name string, known []string) string {
	best, bestDist := "", 3
	for _, k := range known {
		dist := levenshtein.Distance(name, k, nil)
		if dist < bestDist || (dist == bestDist && k < best) {
			best, bestDist = k, dist
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf("; did you mean %q?", best)
}

// notHCL1Form returns HCL 2's error diagnostics that are not on a line
// in a form HCL 1 takes (see hcl1Line).
func notHCL1Form(src []byte, diags hcl.Diagnostics) hcl.Diagnostics {
	lines := strings.Split(string(src), "\n")
	var out hcl.Diagnostics
	for _, d := range diags {
		if d.Severity != hcl.DiagError {
			continue
		}
		if d.Subject != nil && d.Subject.Start.Line >= 1 && d.Subject.Start.Line <= len(lines) && hcl1Line(lines[d.Subject.Start.Line-1]) {
			continue
		}
		out = append(out, d)
	}
	return out
}

// hcl1Line reports whether a line is in a form HCL 1 takes and HCL 2 does
// not: a quoted key ("rack" = "R1"), an argument ended by a comma, or a
// line that opens a block and holds several arguments, a nested block or
// a quoted key, as Nomad's examples write
// topology { segments { rack = "R1", zone = "a" } }.
func hcl1Line(l string) bool {
	t := strings.TrimSpace(l)
	if strings.HasPrefix(t, "\"") || (strings.Contains(t, "=") && strings.HasSuffix(t, ",")) {
		return true
	}
	open := strings.Index(l, "{")
	if open < 0 || strings.Contains(l[:open], "=") {
		return false
	}
	rest := l[open+1:]
	return strings.Count(rest, "=") > 1 || strings.Contains(rest, "{") || strings.Contains(rest, "\"=") || strings.Contains(rest, "\" =")
}
