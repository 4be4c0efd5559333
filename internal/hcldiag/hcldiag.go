// Package hcldiag turns the HCL parser's diagnostics into the errors the
// config loader and the volume specification parser report: one error per
// diagnostic, prefixed with file:line, so that both kinds of file speak
// the same way about their mistakes.
package hcldiag

import (
	"errors"
	"fmt"
	"strings"

	"github.com/hashicorp/hcl/v2"
)

// Error turns HCL's error diagnostics into one error each, prefixed with
// file:line and, when not empty, key; nil when diags holds no error.
func Error(key string, diags hcl.Diagnostics) error {
	var errs []error
	for _, d := range diags {
		if d.Severity != hcl.DiagError {
			continue
		}
		var parts []string
		if d.Subject != nil {
			parts = append(parts, Pos(*d.Subject))
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
