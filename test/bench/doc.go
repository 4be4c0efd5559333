// Package bench holds the node agent's end-to-end benchmarks: discovery and
// death detection latency through the real registry, and the agent's CPU
// and memory with 1,000 plugins served by a separate process. Each result
// is reported beside the direct Probe round trip measured in the same run.
//
// Run them with `make bench` (or `go test -run '^$' -bench . -benchtime 1x
// ./test/bench/`). They measure; they assert no timings.
package bench
