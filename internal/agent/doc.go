// Package agent wires csisupd's roles into one daemon and owns its
// lifecycle: listeners opened before anything starts (a bad address never
// leaves half a daemon), start, reload on SIGHUP, and a graceful stop that
// persists the registry and deregisters from Consul.
package agent
