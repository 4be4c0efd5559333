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
// with file:line and, when not empty, key. A syntax error on a line that
// opens a block holding more than HCL 2 allows there, as Nomad's examples
// write topology { segments { rack = "R1", zone = "z1" } }, gets a hint.
func diagsError(src []byte, key string, diags hcl.Diagnostics) error {
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
		if d.Subject != nil && oneLineBlock(src, d.Subject.Start.Line) {
			msg += " (HCL 2 takes one argument and no block inside a one-line block: write topology { segments = { rack = \"R1\", zone = \"z1\" } })"
		}
		parts = append(parts, msg)
		errs = append(errs, errors.New(strings.Join(parts, ": ")))
	}
	return errors.Join(errs...)
}

// oneLineBlock reports whether line (1-based) of src opens a block and
// holds several arguments, a nested block or a quoted key: the HCL 1
// forms of Nomad's examples, such as topology { segments { rack = "R1" } }.
func oneLineBlock(src []byte, line int) bool {
	if src == nil || line < 1 {
		return false
	}
	lines := strings.Split(string(src), "\n")
	if line > len(lines) {
		return false
	}
	l := lines[line-1]
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
