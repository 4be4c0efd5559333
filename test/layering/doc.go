// Package layering holds the test that keeps the package graph of
// DESIGN.md and the README: a table of the imports each package may have,
// compared with what `go list` reports.
package layering
