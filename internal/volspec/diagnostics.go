package volspec

import (
	"errors"
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

// diagsError turns HCL's error diagnostics into one error each, prefixed
// with file:line and, when not empty, key.
func diagsError(key string, diags hcl.Diagnostics) error {
	var errs []error
	for _, d := range diags {
		if d.Severity != hcl.DiagError {
			continue
		}
		var parts []string
		if d.Subject != nil {
			parts = append(parts, pos(*d.Subject))
		}
		if key != "" {
			parts = append(parts, key)
		}
		msg := d.Summary
		if d.Detail != "" {
			msg += ": " + strings.TrimSuffix(d.Detail, ".")
		}
		parts = append(parts, msg)
		errs = append(errs, errors.New(strings.Join(parts, ": ")))
	}
	return errors.Join(errs...)
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

// pos formats the start of rng as "file:line".
func pos(rng hcl.Range) string {
	return fmt.Sprintf("%s:%d", rng.Filename, rng.Start.Line)
}
