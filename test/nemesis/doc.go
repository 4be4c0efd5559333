//go:build nemesis

// Package nemesis runs csisupd as a cluster of real processes on simulated
// hosts and injects faults into it: processes killed and restarted,
// stopped and continued, hosts partitioned. Its tests carry the build tag
// nemesis (make nemesis) and need root, ip and iptables (package netlab);
// elsewhere they skip with the reason.
//
// # The cluster
//
// StartCluster builds a netlab lab with server hosts s1..sN, agent hosts
// a1..aM and one more host, ctl, for the test's own clients. Each server
// host runs `csisupd agent` with the server role (bootstrap_expect = N,
// retry_join naming every server); each agent host runs `csisupd agent`
// with the client role and a csi-testplugin process serving the plugin
// "tp" in node-local mode, with the host name as its CSI node id and a
// call journal in a directory that outlives the processes (Journals).
// Every process binds its host's lab address and the default ports (each
// host has an address of its own), so all of their traffic crosses the
// lab's router, where the cuts apply. A process restarted keeps its data
// dir, state dir and configuration.
//
// # How the test talks to the cluster
//
// The test process stays in the root network namespace, which has no
// route into the lab. It reads the cluster by running the csisupd CLI
// (`--json`) inside the ctl host with Lab.Command, one bounded command per
// question, against the servers' lab addresses. The ctl host is never cut
// by Cut unless a test names it, but Isolate cuts a host from ctl too (so
// an isolated server cannot be asked anything); HealAll heals it. The CLI's
// JSON is the project's stable external contract, so the test reads what
// an operator would, and needs no client code of its own. A process's
// output is kept in memory and logged when the test fails.
//
// # Faults and the schedule
//
// Kill (SIGKILL), Restart, Stop (SIGSTOP), Cont (SIGCONT), Cut, Isolate,
// Rejoin and HealAll are each bounded and recorded with a timestamp in the
// test log and in Events, the fault schedule of the run. Processes are
// named by their host (s1, a2) and plugins by PluginName (a2/plugin).
//
// # The soak
//
// TestNemesis (Run) runs the workload (Workload: schedulers claiming and
// releasing, a lifecycle client, leader bursts; Leases: a client holding
// leased claims of volumes of its own) and a fault schedule (Schedule,
// drawn from the seed) for -nemesis-time, heals everything, and checks
// the invariants: the plugins' journals (package testplugin/journal:
// single writer, single node, leftovers against the servers' claims once
// the cluster converged and again after every claim is released), the
// clients' claim history (CheckHistory, a porcupine model), the leases
// (CheckLeasesDuringRun, CheckLeasesAfterHeal), unexpected exits, panics
// and races, and the processes' usage.
//
// # Leases
//
// The lease client claims the lease volumes with a lease of 5 to 10 s
// and an owner, renews each node's leases with one RenewClaims on a
// random server every third of a TTL, and after one to four TTLs
// releases a lease or abandons it (no more renewals, no release); every
// lease left when the workload ends is abandoned. It keeps, for each, when
// it was claimed and when its last renewal attempt returned; a reader
// reads the lease volumes' claims every second. Its claims stay out of
// the claim history: an expired lease is a claim that vanishes without a
// release. The invariant is that no leased claim outlives its lease by
// more than its TTL plus releaseBound while its node is up. A leader
// change legitimately extends a lease (a full TTL from the new leader's
// takeover) and a node that is down or cut off delays its release, so it
// is checked where it is exact: during the run, a read that sees an
// abandoned lease still taken later than its last renewal plus its TTL
// and releaseBound is a violation when no fault (a fault's span or any
// event of the schedule) overlaps the window from its last renewal minus
// its TTL to that read; after the final heal, every lease not released
// must be seen gone or releasing by electionBound, its TTL and
// releaseBound after the heal, and none may survive the convergence.
// TestDefects runs it on builds with deliberate defects and fails unless
// the check meant for each catches it; each defect's run ends as soon as
// its check has. Every cluster is on a lab of its own, so seeds and defect
// soaks can run side by side (-nemesis-parallel).
//
// # Seed
//
// The -seed flag (make nemesis SEED=N) is the first seed; 0 picks one from
// the clock. Each run logs its seed and schedule first; the same seed and
// -nemesis-time give the same schedule. The model and the schedule have
// their own tests without the build tag, so they run with every go test.
package nemesis
