// Package soak holds csisupd's soak and stall tests: the real agent binary
// supervising well-behaved plugins (csi-testplugin) next to plugins that
// stall or attack the supervision connection (cmd/csi-hostile), asserting
// that no plugin can stall supervision of the others, bloat the agent or
// keep it from stopping.
//
// stall_test.go runs in the default suite (a few seconds; with -race the
// agent under test is built with the race detector too). hostile_test.go
// runs 80 hostile plugins for 30 s and is behind the build tag "fault"
// (`make test-fault`). Every measured figure is logged with t.Logf.
package soak
