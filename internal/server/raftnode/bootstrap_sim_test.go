package raftnode

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/raft"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// A simulation of bootstrap by bootstrap_expect: servers that start at
// different times query each other over links that come and go, one way at
// a time, and apply a bootstrap rule to what they heard. No network, no
// clock: a seed fixes the schedule and the interleaving.

// simRule is a bootstrap rule as the simulation runs it: self's report
// (with its known set) and the reports of this attempt in, the
// configuration to bootstrap (nil: none) and the new known set out.
type simRule func(self *csisupdv1.PeerInfoResponse, peers []*csisupdv1.PeerInfoResponse) ([]raft.Server, []string)

// newRule is the rule the server runs.
func newRule(self *csisupdv1.PeerInfoResponse, peers []*csisupdv1.PeerInfoResponse) ([]raft.Server, []string) {
	d, known := decideBootstrap(self, peers)
	if d.Action != bootstrapNow {
		return nil, known
	}
	return d.Servers, known
}

// oldRule is the rule before known sets: bootstrap with every server
// reached once there are bootstrap_expect of them, all agreeing on the
// number and none with raft state.
func oldRule(self *csisupdv1.PeerInfoResponse, peers []*csisupdv1.PeerInfoResponse) ([]raft.Server, []string) {
	servers := map[string]*csisupdv1.PeerInfoResponse{self.GetServerId(): self}
	for _, p := range peers {
		servers[p.GetServerId()] = p
	}
	for _, p := range servers {
		if p.GetBootstrapExpect() != self.GetBootstrapExpect() || p.GetHasRaftState() {
			return nil, nil
		}
	}
	if len(servers) < int(self.GetBootstrapExpect()) {
		return nil, nil
	}
	var conf []raft.Server
	for _, id := range sortedIDs(servers) {
		conf = append(conf, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(id), Address: raft.ServerAddress(servers[id].GetRaftAddress())})
	}
	return conf, nil
}

type simServer struct {
	id, raftAddr string
	start        int // the round it starts in; before, it neither asks nor answers
	known        []string
	// conf is the raft configuration it holds, nil without raft state;
	// bootstrapped says it came from its own bootstrap rather than from a
	// bootstrapped peer (raft replication, or a join).
	conf         []raft.Server
	bootstrapped bool
	// The attempt in progress.
	reports []*csisupdv1.PeerInfoResponse
	adopt   []raft.Server
}

func (s *simServer) info(expect int) *csisupdv1.PeerInfoResponse {
	return &csisupdv1.PeerInfoResponse{
		ServerId: s.id, RaftAddress: s.raftAddr,
		BootstrapExpect: uint32(expect), HasRaftState: s.conf != nil,
		// Known sets are replaced, never changed in place: no copy.
		KnownServerIds: s.known,
	}
}

// simResult is one run: the configurations that servers bootstrapped, by
// server index, and whether every server ended with raft state holding
// the same configuration.
type simResult struct {
	boots  map[int][]raft.Server
	rounds int // rounds run
	formed bool
}

// simSchedule says which links work in a round: up(round, from, to).
type simSchedule func(round, from, to int) bool

// simulate runs n servers with bootstrap_expect expect for at most rounds
// rounds. Every round each started server without raft state makes one
// attempt: it queries the started servers that the schedule lets it
// reach, then decides. The queries and decisions of all servers are
// interleaved at random, so a report may be older than others of the same
// attempt, as over a real network.
func simulate(rng *rand.Rand, rule simRule, n, expect, rounds int, starts []int, up simSchedule, stopWhenStuck bool) simResult {
	servers := make([]*simServer, n)
	for i := range servers {
		id := fmt.Sprintf("s%d", i)
		servers[i] = &simServer{id: id, raftAddr: "raft-" + id, start: starts[i]}
		servers[i].known = []string{servers[i].id}
	}
	res := simResult{boots: map[int][]raft.Server{}}
	type event struct {
		server int
		query  int // -1: decide
	}
	for round := range rounds {
		res.rounds = round + 1
		var queues [][]event
		for i, s := range servers {
			if s.start > round || s.conf != nil {
				continue
			}
			var q []event
			for _, j := range rng.Perm(n) {
				if j != i && servers[j].start <= round && up(round, i, j) {
					q = append(q, event{i, j})
				}
			}
			queues = append(queues, append(q, event{i, -1}))
		}
		for len(queues) > 0 {
			k := rng.IntN(len(queues))
			ev := queues[k][0]
			if queues[k] = queues[k][1:]; len(queues[k]) == 0 {
				queues = slices.Delete(queues, k, k+1)
			}
			s := servers[ev.server]
			if ev.query >= 0 {
				peer := servers[ev.query]
				s.reports = append(s.reports, peer.info(expect))
				if peer.conf != nil && slices.ContainsFunc(peer.conf, func(c raft.Server) bool { return string(c.ID) == s.id }) {
					s.adopt = peer.conf
				}
				continue
			}
			if s.adopt != nil {
				s.conf = s.adopt
			} else {
				conf, known := rule(s.info(expect), s.reports)
				if known != nil {
					s.known = known
				}
				if conf != nil {
					s.conf, s.bootstrapped = conf, true
					res.boots[ev.server] = conf
				}
			}
			s.reports, s.adopt = nil, nil
		}
		if done, stuck := simDone(servers, expect); done || (stopWhenStuck && stuck) {
			break
		}
	}
	res.formed = true
	for _, s := range servers {
		if s.conf == nil || !slices.Equal(s.conf, servers[0].conf) {
			res.formed = false
		}
	}
	return res
}

// simDone reports whether every server has raft state, and whether no
// server can bootstrap any more under the known-set rule: each one has
// raft state or knows more than expect servers, and a known set never
// shrinks.
func simDone(servers []*simServer, expect int) (done, stuck bool) {
	done, stuck = true, true
	for _, s := range servers {
		if s.conf == nil {
			done = false
			if len(s.known) <= expect {
				stuck = false
			}
		}
	}
	return done, stuck
}

// split returns two different configurations that servers bootstrapped.
func (r simResult) split() (a, b []raft.Server, ok bool) {
	for _, i := range sortedKeys(r.boots) {
		if a == nil {
			a = r.boots[i]
		} else if !slices.Equal(a, r.boots[i]) {
			return a, r.boots[i], true
		}
	}
	return nil, nil, false
}

func sortedKeys(m map[int][]raft.Server) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func confIDs(conf []raft.Server) string {
	ids := make([]string, len(conf))
	for i, c := range conf {
		ids[i] = string(c.ID)
	}
	return "{" + strings.Join(ids, ",") + "}"
}

// simCase is the cluster of one seed: n servers, bootstrap_expect expect,
// and a schedule of start rounds and links drawn from the seed.
type simCase struct {
	n, expect int
	starts    []int
	up        simSchedule
}

const simRounds = 24

// randomCase draws bootstrap_expect from 1, 2, 3 and 5 and n from
// bootstrap_expect to 2*bootstrap_expect-1 (each pair alike), and a schedule: servers
// start late at random, and links are up at random, one way at a time,
// with a density drawn per seed, or only inside groups that are redrawn
// every few rounds (partitions that move).
func randomCase(seed uint64) simCase {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	var sizes [][2]int // bootstrap_expect, n
	for _, e := range []int{1, 2, 3, 5} {
		for n := e; n < 2*e; n++ {
			sizes = append(sizes, [2]int{e, n})
		}
	}
	size := sizes[rng.IntN(len(sizes))]
	expect, n := size[0], size[1]
	c := simCase{n: n, expect: expect, starts: make([]int, n)}
	for i := range c.starts {
		if rng.IntN(2) == 0 {
			c.starts[i] = rng.IntN(simRounds / 2)
		}
	}
	density := []float64{0.1, 0.3, 0.6, 0.9, 1}[rng.IntN(5)]
	links := make([][][]bool, simRounds) // links[round][from][to]
	groups := make([]int, n)
	period := 1 + rng.IntN(6)
	partitioned := rng.IntN(2) == 0
	for r := range links {
		if r%period == 0 {
			for i := range groups {
				groups[i] = rng.IntN(2)
			}
		}
		links[r] = make([][]bool, n)
		for i := range links[r] {
			links[r][i] = make([]bool, n)
			for j := range links[r][i] {
				links[r][i][j] = rng.Float64() < density && (!partitioned || groups[i] == groups[j])
			}
		}
	}
	c.up = func(round, from, to int) bool { return links[round][from][to] }
	return c
}

const simSeeds = 10_000

// TestBootstrapSimulationNoSplit runs the server's rule on random
// schedules: no two servers may bootstrap different configurations. The
// same schedules under the old rule must split, or the simulation would
// prove nothing.
func TestBootstrapSimulationNoSplit(t *testing.T) {
	seeds := uint64(simSeeds)
	if testing.Short() {
		seeds /= 10
	}
	var runs, withBoot, withSurplusBoot, oldSplits int
	var firstSplit string
	// Per bootstrap_expect/n: runs, runs that bootstrapped, old-rule splits.
	type tally struct{ runs, boots, oldSplits int }
	byCase := map[string]*tally{}
	for seed := range seeds {
		c := randomCase(seed)
		key := fmt.Sprintf("%d/%d", c.expect, c.n)
		if byCase[key] == nil {
			byCase[key] = &tally{}
		}
		byCase[key].runs++
		res := simulate(rand.New(rand.NewPCG(seed, 1)), newRule, c.n, c.expect, simRounds, c.starts, c.up, true)
		runs++
		if a, b, ok := res.split(); ok {
			t.Fatalf("seed %d: n=%d bootstrap_expect=%d: split into %s and %s", seed, c.n, c.expect, confIDs(a), confIDs(b))
		}
		for _, conf := range res.boots {
			if len(conf) != c.expect {
				t.Fatalf("seed %d: bootstrapped %s with bootstrap_expect=%d", seed, confIDs(conf), c.expect)
			}
		}
		if len(res.boots) > 0 {
			withBoot++
			byCase[key].boots++
			if c.n > c.expect {
				withSurplusBoot++
			}
		}

		old := simulate(rand.New(rand.NewPCG(seed, 1)), oldRule, c.n, c.expect, simRounds, c.starts, c.up, false)
		if a, b, ok := old.split(); ok {
			oldSplits++
			byCase[key].oldSplits++
			if firstSplit == "" {
				firstSplit = fmt.Sprintf("seed %d: n=%d bootstrap_expect=%d: %s and %s", seed, c.n, c.expect, confIDs(a), confIDs(b))
			}
		}
	}
	t.Logf("known-set rule: %d runs, %d bootstrapped (%d with surplus servers), no split", runs, withBoot, withSurplusBoot)
	t.Logf("old rule: %d of %d runs split; first: %s", oldSplits, runs, firstSplit)
	keys := make([]string, 0, len(byCase))
	for k := range byCase {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		c := byCase[k]
		t.Logf("bootstrap_expect/n %s: %d runs, %d bootstrapped, old rule split %d", k, c.runs, c.boots, c.oldSplits)
	}
	// The schedules must reach bootstraps, also with surplus servers that
	// stayed unheard of, or the absence of splits says little.
	if withBoot < runs/10 || withSurplusBoot < runs/50 {
		t.Fatalf("only %d runs bootstrapped (%d with surplus servers): the schedules do not exercise the rule", withBoot, withSurplusBoot)
	}
	if oldSplits == 0 {
		t.Fatal("the old rule never split: the schedules cannot tell a safe rule from an unsafe one")
	}
}

// TestBootstrapSimulationLiveness: with exactly bootstrap_expect servers
// that all reach each other, every server holds the same configuration of
// all of them within a few rounds, and with more servers than that none
// bootstraps.
func TestBootstrapSimulationLiveness(t *testing.T) {
	full := func(_, _, _ int) bool { return true }
	for _, expect := range []int{1, 2, 3, 5} {
		for seed := range uint64(200) {
			starts := make([]int, expect)
			res := simulate(rand.New(rand.NewPCG(seed, 2)), newRule, expect, expect, 3, starts, full, false)
			if !res.formed || len(res.boots) == 0 {
				t.Fatalf("bootstrap_expect=%d seed %d: not formed after %d rounds (bootstraps %v)", expect, seed, res.rounds, res.boots)
			}
			for i, conf := range res.boots {
				if len(conf) != expect {
					t.Fatalf("bootstrap_expect=%d seed %d: s%d bootstrapped %s", expect, seed, i, confIDs(conf))
				}
			}
			if expect > 1 {
				starts = make([]int, expect+1)
				res = simulate(rand.New(rand.NewPCG(seed, 3)), newRule, expect+1, expect, 6, starts, full, false)
				if len(res.boots) != 0 {
					t.Fatalf("bootstrap_expect=%d seed %d: %d servers that all know each other bootstrapped %v", expect, seed, expect+1, res.boots)
				}
			}
		}
	}
}

// TestDecideBootstrap checks the rule's answers one by one.
func TestDecideBootstrap(t *testing.T) {
	peer := func(id string, expect uint32, raftState bool, known ...string) *csisupdv1.PeerInfoResponse {
		return &csisupdv1.PeerInfoResponse{ServerId: id, RaftAddress: "raft-" + id, RpcAddress: "rpc-" + id,
			BootstrapExpect: expect, HasRaftState: raftState, KnownServerIds: known}
	}
	self := peer("b", 3, false, "b")
	cases := []struct {
		name   string
		self   *csisupdv1.PeerInfoResponse
		peers  []*csisupdv1.PeerInfoResponse
		action bootstrapAction
		reason string
		known  []string
	}{
		{"alone", self, nil, bootstrapWait, "waiting for servers", []string{"b"}},
		{"an answer without id", self, []*csisupdv1.PeerInfoResponse{{BootstrapExpect: 2, KnownServerIds: []string{"x"}}},
			bootstrapWait, "waiting for servers", []string{"b"}},
		{"first contact", self, []*csisupdv1.PeerInfoResponse{peer("a", 3, false, "a"), peer("c", 3, false, "c")},
			bootstrapWait, "know the same servers", []string{"a", "b", "c"}},
		{"agreed", peer("b", 3, false, "a", "b", "c"),
			[]*csisupdv1.PeerInfoResponse{peer("c", 3, false, "a", "b", "c"), peer("a", 3, false, "c", "b", "a"), peer("b", 3, false, "b")},
			bootstrapNow, "bootstrapping cluster", []string{"a", "b", "c"}},
		{"a member unreached", peer("b", 3, false, "a", "b", "c"), []*csisupdv1.PeerInfoResponse{peer("a", 3, false, "a", "b", "c")},
			bootstrapWait, "reach every known server", []string{"a", "b", "c"}},
		{"a member knows more", peer("b", 3, false, "a", "b", "c"),
			[]*csisupdv1.PeerInfoResponse{peer("a", 3, false, "a", "b", "c"), peer("c", 3, false, "a", "b", "c", "d")},
			bootstrapRefuse, "more servers known than bootstrap_expect", []string{"a", "b", "c", "d"}},
		{"surplus known before", peer("b", 3, false, "b", "d"), []*csisupdv1.PeerInfoResponse{peer("a", 3, false, "a"), peer("c", 3, false, "c")},
			bootstrapRefuse, "stop the surplus servers", []string{"a", "b", "c", "d"}},
		{"raft state first", self, []*csisupdv1.PeerInfoResponse{peer("a", 3, true, "a"), peer("c", 3, false, "c", "d", "e")},
			bootstrapWait, "already has raft state", []string{"a", "b", "c", "d", "e"}},
		{"mismatch", self, []*csisupdv1.PeerInfoResponse{peer("a", 2, false, "a")},
			bootstrapRefuse, "bootstrap_expect mismatch", []string{"a", "b"}},
		{"shared id", self, []*csisupdv1.PeerInfoResponse{peer("a", 3, false, "a"),
			{ServerId: "a", RaftAddress: "elsewhere", BootstrapExpect: 3}},
			bootstrapRefuse, "share one id", []string{"a", "b"}},
	}
	for _, tc := range cases {
		d, known := decideBootstrap(tc.self, tc.peers)
		if d.Action != tc.action || !strings.Contains(d.Reason, tc.reason) || !slices.Equal(known, tc.known) {
			t.Errorf("%s: action %d %q known %v, want action %d with %q known %v", tc.name, d.Action, d.Reason, known, tc.action, tc.reason, tc.known)
		}
		if d.Action == bootstrapNow {
			want := []raft.Server{
				{Suffrage: raft.Voter, ID: "a", Address: "raft-a"},
				{Suffrage: raft.Voter, ID: "b", Address: "raft-b"},
				{Suffrage: raft.Voter, ID: "c", Address: "raft-c"},
			}
			if !slices.Equal(d.Servers, want) {
				t.Errorf("%s: configuration %+v, want %+v", tc.name, d.Servers, want)
			}
		}
		if d.Action == bootstrapRefuse && strings.Contains(d.Reason, "surplus") && !strings.Contains(fmt.Sprint(d.Args...), strings.Join(tc.known, ",")) {
			t.Errorf("%s: refusal %v does not name the known servers %v", tc.name, d.Args, tc.known)
		}
	}
}
