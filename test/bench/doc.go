// Package bench holds the end-to-end benchmarks of the node agent and of
// a cluster: discovery and death detection latency through the real
// registry, the agent's CPU and memory with 1,000 plugins served by a
// separate process, a three-server cluster holding 10,000 nodes, and the
// leader's cost of renewing 10,000 claim leases on 1,000 nodes. Each
// agent result is reported beside the direct Probe round trip measured in
// the same run.
//
// Run them with `make bench` (or `go test -run '^$' -bench . -benchtime 1x
// ./test/bench/`). They measure; they assert no timings.
//
// # BenchmarkCluster10000
//
// Three real servers (raft on loopback with on-disk stores, gRPC with the
// options of an agent's gRPC server that act on every call: its metrics,
// authorizer, stream workers and flow-control windows) run in the
// benchmark's process; 10,000 simulated agents run in a child process
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
// of 1 minute instead of 5. Raft multiplier 5, as testcluster sets it.
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
//     leader_cpu_us/heartbeat, leader_heartbeats/s: the leader's own cost,
//     and the heartbeats it took meanwhile. The servers share one
//     process, so the process's CPU cannot be split by server; instead
//     every agent is moved to the leader (each moves at its next
//     heartbeat) and the process is measured for 30 s more. The followers
//     then only take raft heartbeats, which the idle floor already holds,
//     so the CPU over the idle floor is the leader's cost for 10,000
//     nodes; leader_steady_cpu_%core (the whole process) is an upper bound.
//     The agents' own CPU (agents_steady_cpu_%core) is their process's,
//     never counted in the servers'. With CSISUPD_BENCH_LEADER_PROFILE
//     set to a file name, a CPU profile of this window is written there
//     (docs/performance.md shows what it holds).
//   - floor_cpu_us/heartbeat, floor_heartbeats/s: the floor under
//     leader_cpu_us/heartbeat, measured first, before any server starts.
//     The same 10,000 agents, in a process of their own, register and
//     heartbeat to a bare gRPC server in the benchmark's process: the
//     agent's transport options (rpc.TransportOptions: stream workers,
//     windows, limits) and a Cluster service that answers with a TTL drawn
//     as the leader draws it, and does nothing else (no metrics, no
//     authorizer, no state, no timer). Its CPU over the process's idle
//     floor, per heartbeat, after every agent heartbeated about once, over
//     30 s. leader_cpu_x_floor is the leader's figure over it, and
//     floor_cpu_%core_at_leader_rate what the floor costs at the leader's
//     heartbeat rate: the part of leader_steady_cpu_over_idle_%core that
//     any gRPC server taking these calls spends.
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
//
// # BenchmarkLeaseRenewals1000
//
// Three real servers in the benchmark's process, tuned as for
// BenchmarkCluster10000, and 1,000 simulated agents in a child process,
// each with five plugins, heartbeating as above, every one of them moved
// to the leader (see leader_steady_cpu_%core above: the process's CPU
// over its idle floor is then the leader's).
//
// Each node holds 10 leased claims (workloads w0 to w9), 10,000 in all,
// without mounts: the simulated agents have no node volume service, so
// the benchmark registers the volumes (RegisterVolume calls no plugin)
// and writes each claim through raft on the leader as ClaimVolume
// records one: claim_take, then the claim_step of its mount, built by
// package rules (Admit, Take, Mounted). The volume watcher finds them
// taken, mounted and finished, and leaves them alone. Their lease_ttl is
// 5 minutes, longer than the windows without renewals, so that none
// expires there; a renewal's cost does not depend on the TTL it
// restarts, so the renewal interval is set apart: in renewal mode every
// agent calls Cluster.NodeRenewClaims (with its node secret, as the node
// client's Hold does) for its 10 workloads once per interval, each agent
// at its own phase.
//
// Four windows of 30 s: heartbeats only; renewals every 10 s (a 30 s
// TTL's TTL/3: 100 calls/s, 1,000 claims/s); renewals every 3.33 s (a
// 10 s TTL's: 300 calls/s); heartbeats only again. The renewals start
// before their window, and the window waits until every agent renewed
// once. That first renewal also puts the node's leases into the leader's
// table (ClaimVolume would have put them there; a renewal adds a leased
// claim the table misses, reading the state once), so the windows
// measure renewals of leases the table holds.
//
// Figures (b.ReportMetric):
//
//   - servers_idle_cpu_%core: the three servers before any node exists.
//   - seed_10000_claims_s: registering the 10,000 volumes and writing
//     their claims (30,000 raft writes, 128 at a time).
//   - leader_heartbeats_cpu_%core, _over_idle_%core, heartbeats/s: the
//     windows of heartbeats only, the mean of the first and the last, so
//     that what drifts during the run weighs on both sides alike.
//   - lease_renewal_cpu_%core, renewals/s, claims_renewed/s,
//     leader_cpu_us/renewal: the renewal window of a 30 s TTL, over the
//     heartbeats-only figure: what renewing costs the leader (the target
//     is at most 5 % of a core). The same with the suffix _ttl10s for a
//     10 s TTL.
//   - steady_raft_applies/s: the leader's applied index across the four
//     windows; renewals, like heartbeats, are held in the leader's memory,
//     so it must be 0 (the run fails otherwise, naming what was written).
//
// The run also fails when a renewal call fails, answers a workload lost
// or leaves one unanswered (neither renewed nor lost), and when a claim
// is not taken and mounted after the last window: no lease may expire.
package bench
