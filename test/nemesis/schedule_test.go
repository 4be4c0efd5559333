package nemesis

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Fault kinds of the schedule. A fault is applied at its time and undone
// (restart, continue, heal, fast again) after its duration.
const (
	faultKillServer  = "kill-server"      // SIGKILL a server, restart it
	faultKillAgent   = "kill-agent"       // SIGKILL an agent, restart it
	faultStopServer  = "stop-server"      // SIGSTOP a server, SIGCONT it
	faultStopAgent   = "stop-agent"       // SIGSTOP an agent, SIGCONT it
	faultStopLeader  = "stop-leader"      // SIGSTOP whichever server leads then
	faultServerCut   = "partition-server" // cut one server from the other servers
	faultLeaderCut   = "partition-leader" // cut the leader from the majority
	faultAgentCut    = "partition-agent"  // cut an agent from every server
	faultOneWay      = "one-way"          // drop what one host sends another
	faultSlowPlugin  = "slow-plugin"      // a plugin answers slowDelay late, acting after its caller gave up
	faultCrashPlugin = "crash-plugin"     // a plugin exits in its next mutating call, after the work
	faultClockJump   = "clock-jump"       // an agent restarted with its monotonic clock jumped
	faultLostRecord  = "lost-record"      // an agent stopped, its mount records removed, restarted
	faultLeaderBurst = "leader-burst"     // concurrent claims of one volume, the leader killed or stopped meanwhile
)

// faultKinds are every kind, in the order the schedule draws from.
var faultKinds = []string{faultKillServer, faultKillAgent, faultStopServer, faultStopAgent, faultStopLeader,
	faultServerCut, faultLeaderCut, faultAgentCut, faultOneWay, faultSlowPlugin, faultCrashPlugin,
	faultClockJump, faultLostRecord, faultLeaderBurst}

// clockOffsets are the monotonic clock offsets a clock jump picks from:
// a restart into another one jumps the agent's clocks forward or back.
var clockOffsets = []time.Duration{0, time.Hour, 24 * time.Hour, 30 * 24 * time.Hour}

// ClusterSize draws a seed's cluster: 3 or 5 servers and 3 to 5 agents.
func ClusterSize(seed int64) (servers, agents int) {
	rng := rand.New(rand.NewPCG(uint64(seed), 5))
	return 3 + 2*rng.IntN(2), 3 + rng.IntN(3)
}

// Fault is one entry of the schedule.
type Fault struct {
	At   time.Duration // after the start of the run
	Kind string
	// Target is a process or host name; "leader" is resolved when the
	// fault is applied. A one-way cut's is "from->to".
	Target string
	For    time.Duration // until it is undone
	Clock  time.Duration // a clock jump's new offset
	Kill   bool          // a leader burst kills (else stops) the leader
}

func (f Fault) String() string {
	s := fmt.Sprintf("+%6.2fs %-16s %-10s for %5.2fs", f.At.Seconds(), f.Kind, f.Target, f.For.Seconds())
	switch f.Kind {
	case faultClockJump:
		s += fmt.Sprintf(" clock %+v", f.Clock)
	case faultLeaderBurst:
		s += fmt.Sprintf(" kill=%v", f.Kill)
	}
	return s
}

// Schedule draws the faults of a run of length d from seed, over servers
// and agents, from kinds (nil: every kind). The same arguments give the
// same schedule: that is what replaying a seed replays. Faults on one
// target never overlap; faults on different targets do. Each lasts at
// most maxFault, so that no node is down for claim_gc_grace.
func Schedule(seed int64, d time.Duration, servers, agents, kinds []string) []Fault {
	if len(kinds) == 0 {
		kinds = faultKinds
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 28))
	busy := map[string]time.Duration{} // target -> busy until
	pick := func(hosts []string) string { return hosts[rng.IntN(len(hosts))] }
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo)+1)) }
	var out []Fault
	for at := 3 * time.Second; at < d; at += between(time.Second, 6*time.Second) {
		f := Fault{At: at, Kind: kinds[rng.IntN(len(kinds))], For: between(time.Second, maxFault)}
		switch f.Kind {
		case faultKillServer, faultStopServer, faultServerCut:
			f.Target = pick(servers)
		case faultKillAgent, faultStopAgent, faultAgentCut, faultClockJump, faultLostRecord:
			f.Target = pick(agents)
		case faultStopLeader, faultLeaderCut, faultLeaderBurst:
			f.Target = "leader"
			f.Kill = rng.IntN(2) == 0
		case faultOneWay:
			// Between two servers, or a server and an agent either
			// way: agents do not talk to each other.
			from := pick(servers)
			to := pick(append(slices.Clone(servers), agents...))
			for to == from {
				to = pick(append(slices.Clone(servers), agents...))
			}
			if rng.IntN(2) == 0 {
				from, to = to, from
			}
			f.Target = from + "->" + to
		case faultSlowPlugin, faultCrashPlugin:
			f.Target = PluginName(pick(agents), plugins[rng.IntN(len(plugins))])
		}
		if f.Kind == faultClockJump {
			f.Clock = clockOffsets[rng.IntN(len(clockOffsets))]
		}
		if f.Kind == faultKillServer || f.Kind == faultKillAgent || f.Kind == faultLostRecord || f.Kind == faultClockJump {
			f.For = between(0, 5*time.Second) // down until restarted
		}
		// One fault per target at a time; the leader is any server, so
		// leader faults wait for every server, and server faults for
		// the leader's.
		keys := targetsOf(f, servers)
		free := true
		for _, k := range keys {
			if busy[k] > at {
				free = false
			}
		}
		if !free {
			continue
		}
		for _, k := range keys {
			busy[k] = at + f.For + time.Second
		}
		out = append(out, f)
	}
	return out
}

// targetsOf are the names a fault occupies.
func targetsOf(f Fault, servers []string) []string {
	switch {
	case f.Target == "leader":
		return append(slices.Clone(servers), "leader")
	case strings.Contains(f.Target, "->"):
		from, to, _ := strings.Cut(f.Target, "->")
		return []string{from, to}
	case slices.Contains(servers, f.Target):
		return []string{f.Target, "leader"}
	}
	return []string{f.Target}
}

// maxFault bounds a fault's duration: well under the servers'
// claim_gc_grace (gcGrace), so a node is never down long enough for the
// servers to free its claims, which the history check would take for
// lost claims.
const maxFault = 12 * time.Second
