// Package layering holds the tests that keep the package graph of
// DESIGN.md and the README: a table of the imports each package may have,
// compared with what `go list` reports; and the shape of the server role
// that imports cannot show: the volume operations reach the agents only
// through interfaces, Server keeps few methods, and no file under
// internal/server grows into a hub.
package layering
