// Package hcldiag turns the HCL parser's diagnostics into the errors the
// config loader, the volume specification parser and the ACL policy parser
// report: one error per diagnostic, prefixed with file:line, so that every
// kind of file speaks the same way about its mistakes.
package hcldiag

import (
	"errors"
	"fmt"
	"strings"

	"github.com/hashicorp/hcl/v2"
)

// Error turns HCL's error diagnostics into one error each, prefixed with
// file:line and, when not empty, key; nil when diags holds no error.
func Error(key string, diags hcl.Diagnostics) error { return ErrorIn("", key, diags) }

// ErrorIn is Error for diagnostics of the file named filename: one
// without a position is prefixed with filename alone (when not empty).
func ErrorIn(filename, key string, diags hcl.Diagnostics) error {
	var errs []error
	for _, d := range diags {
		if d.Severity != hcl.DiagError {
			continue
		}
		var parts []string
		switch {
		case d.Subject != nil:
			parts = append(parts, Pos(*d.Subject))
		case filename != "":
			parts = append(parts, filename)
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

// Pos formats the start of rng as "file:line".
func Pos(rng hcl.Range) string {
	return fmt.Sprintf("%s:%d", rng.Filename, rng.Start.Line)
}
