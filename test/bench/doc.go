// Package bench holds the end-to-end benchmarks of the node agent and of
// a cluster: discovery and death detection latency through the real
// registry, the agent's CPU and memory with 1,000 plugins served by a
// separate process, and a three-server cluster holding 10,000 nodes. Each
// agent result is reported beside the direct Probe round trip measured in
// the same run.
//
// Run them with `make bench` (or `go test -run '^$' -bench . -benchtime 1x
// ./test/bench/`). They measure; they assert no timings.
//
// # BenchmarkCluster10000
//
// Three real servers (raft on loopback with on-disk stores, gRPC) run in
// the benchmark's process; 10,000 simulated agents run in a child process
// (the test binary run again, see TestMain). A simulated agent has no
// plugins to probe: it registers its node with five plugins through the
// Cluster API, as the node client does, then heartbeats at the TTL the
// server returns, and on a failure moves to the next server and backs off.
// The agents share four gRPC connections per server; at most 256
// registrations are in flight. Agent i starts on server i mod 3.
//
// Tuning: production timeouts, but server MaxHeartbeatsPerSecond 1000
// instead of 50, so TTLs at 10,000 nodes are 10-20 s instead of 200-400 s
// (the heartbeat rate is then 20 times production's), and a failover TTL
// of 1 minute instead of 5. Raft multiplier 2, as testcluster sets it.
//
// Figures (b.ReportMetric):
//
//   - registration_s, registrations/s: from the agents' process start to
//     the last node registered; servers_registration_cpu_%core meanwhile.
//   - servers_idle_cpu_%core: the three servers before any node exists,
//     the floor under the CPU figures.
//   - servers_steady_cpu_%core, heartbeats/s, servers_cpu_us/heartbeat:
//     30 s of heartbeats only, agents spread over the servers as in
//     production (followers forward their agents' heartbeats to the
//     leader). The per-heartbeat cost is over the idle floor and includes
//     the forwarding hop.
//   - leader_steady_cpu_%core, leader_steady_cpu_over_idle_%core,
//     leader_cpu_us/heartbeat: the leader's own cost. The servers share one
//     process, so the process's CPU cannot be split by server; instead
//     every agent is moved to the leader (each moves at its next
//     heartbeat) and the process is measured for 30 s more. The followers
//     then only take raft heartbeats, which the idle floor already holds,
//     so the CPU over the idle floor is the leader's cost for 10,000
//     nodes; leader_steady_cpu_%core (the whole process) is an upper bound.
//     The agents' own CPU (agents_steady_cpu_%core) is their process's,
//     never counted in the servers'.
//   - steady_raft_applies/s: the leader's applied index over both steady
//     windows; heartbeats are held in memory, so it must be 0 (the run
//     fails otherwise, naming what was written).
//   - servers_rss_MiB, servers_heap_inuse_MiB: the process of the three
//     servers (each holds the full state), after the first window.
//   - listnodes_page100_p50_ms, _p99_ms: 1000 ListNodes calls of one page
//     of 100 on the leader, walking every page position in turn, while the
//     heartbeats go on.
//   - failover_*: five times, the leader is killed (no graceful stop); the
//     time to a new ready leader, and until every node's first heartbeat
//     started after the kill succeeded (so the new leader took it), are
//     measured from the kill. That second time is bounded below by the
//     longest TTL (about 20 s): agents keep their schedule and find out
//     at their next heartbeat. failover_nodes_marked_down counts nodes not
//     ready, or whose status changed after the kill; it must be 0 (the
//     run fails otherwise). The killed server is restarted and caught up
//     before the next kill.
package bench
