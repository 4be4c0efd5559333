package raftnode

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/hashicorp/raft"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// bootstrapAction is what one bootstrap attempt concluded.
type bootstrapAction int

const (
	// bootstrapWait: not yet; a later attempt may bootstrap or join.
	bootstrapWait bootstrapAction = iota
	// bootstrapRefuse: the servers are set up in a way that cannot form a
	// cluster by bootstrap_expect; the operator must act.
	bootstrapRefuse
	// bootstrapNow: bootstrap with bootstrapDecision.Servers.
	bootstrapNow
)

// bootstrapDecision is the outcome of decideBootstrap: the action, the
// reason as a log message with its key-value pairs, and the configuration
// to bootstrap when the action is bootstrapNow.
type bootstrapDecision struct {
	Action  bootstrapAction
	Reason  string
	Args    []any
	Servers []raft.Server
}

// decideBootstrap is the bootstrap rule, free of I/O so that the server and
// the simulation test run the same code. self is this server's own report,
// with its known set K in KnownServerIds and its BootstrapExpect; peers are
// the reports of the servers reached in this attempt (duplicates and this
// server's own answer allowed). It returns the decision and the new K.
//
// K is this server's id, the ids of the servers it reached and every id in
// the known sets they reported; it never shrinks. A server bootstraps only
// when |K| equals bootstrap_expect, it reached every member of K in this
// attempt, and every member reports the same bootstrap_expect, no raft state
// and a known set equal to K; the configuration is K sorted by id. Two
// servers that bootstrap V and W with a common member C saw C report V and W
// as its known set; since C's set only grows and |V| = |W|, V = W. Any two
// sets of bootstrap_expect servers out of fewer than twice as many intersect,
// so such servers cannot split.
func decideBootstrap(self *csisupdv1.PeerInfoResponse, peers []*csisupdv1.PeerInfoResponse) (bootstrapDecision, []string) {
	expect := int(self.GetBootstrapExpect())
	known := map[string]struct{}{self.GetServerId(): {}}
	for _, id := range self.GetKnownServerIds() {
		known[id] = struct{}{}
	}
	for _, p := range peers {
		if p.GetServerId() == "" {
			continue // no server's answer
		}
		known[p.GetServerId()] = struct{}{}
		for _, k := range p.GetKnownServerIds() {
			if k != "" {
				known[k] = struct{}{}
			}
		}
	}
	ids := sortedIDs(known)
	// The reports of this attempt by server id; this server's own answer
	// (retry_join may list it) is replaced by self.
	reached := map[string][]*csisupdv1.PeerInfoResponse{self.GetServerId(): {self}}
	for _, p := range peers {
		id := p.GetServerId()
		if id == "" {
			continue
		}
		if prev := reached[id]; len(prev) > 0 && prev[0].GetRaftAddress() != p.GetRaftAddress() {
			return bootstrapDecision{Action: bootstrapRefuse,
				Reason: "two servers share one id; not bootstrapping",
				Args:   []any{"id", id, "raft_addresses", []string{prev[0].GetRaftAddress(), p.GetRaftAddress()}},
			}, ids
		}
		if id != self.GetServerId() {
			reached[id] = append(reached[id], p)
		}
	}

	// In id order, so that the same reports always give the same reason.
	reachedIDs := sortedIDs(reached)
	for _, id := range reachedIDs {
		for _, p := range reached[id] {
			if p.GetBootstrapExpect() != self.GetBootstrapExpect() {
				return bootstrapDecision{Action: bootstrapRefuse,
					Reason: "bootstrap_expect mismatch; not bootstrapping: every server must use the same bootstrap_expect",
					Args: []any{"bootstrap_expect", self.GetBootstrapExpect(),
						"peer", p.GetServerId(), "peer_rpc_address", p.GetRpcAddress(),
						"peer_bootstrap_expect", p.GetBootstrapExpect()},
				}, ids
			}
		}
	}
	for _, id := range reachedIDs {
		for _, p := range reached[id] {
			if p.GetHasRaftState() {
				return bootstrapDecision{Action: bootstrapWait,
					Reason: "a peer already has raft state; waiting to join its cluster",
					Args:   []any{"peer", id},
				}, ids
			}
		}
	}
	if len(ids) > expect {
		return bootstrapDecision{Action: bootstrapRefuse,
			Reason: "more servers known than bootstrap_expect; not bootstrapping, since they could form two clusters: " +
				"stop the surplus servers, restart the others (a server forgets the servers it knew only by restarting), " +
				"and start the surplus ones again once a leader exists, to join it",
			Args: []any{"bootstrap_expect", expect, "known_servers", strings.Join(ids, ",")},
		}, ids
	}
	if len(ids) < expect {
		return bootstrapDecision{Action: bootstrapWait,
			Reason: "waiting for servers before bootstrapping",
			Args:   []any{"known", len(ids), "bootstrap_expect", expect, "known_servers", strings.Join(ids, ",")},
		}, ids
	}
	var missing, behind []string
	for _, id := range ids {
		reports, ok := reached[id]
		if !ok {
			missing = append(missing, id)
			continue
		}
		for _, p := range reports {
			if id != self.GetServerId() && !sameIDs(p.GetKnownServerIds(), ids) {
				behind = append(behind, id)
				break
			}
		}
	}
	if len(missing) > 0 {
		return bootstrapDecision{Action: bootstrapWait,
			Reason: "waiting to reach every known server before bootstrapping",
			Args:   []any{"unreached", strings.Join(missing, ","), "known_servers", strings.Join(ids, ",")},
		}, ids
	}
	if len(behind) > 0 {
		return bootstrapDecision{Action: bootstrapWait,
			Reason: "waiting for every known server to know the same servers before bootstrapping",
			Args:   []any{"behind", strings.Join(behind, ","), "known_servers", strings.Join(ids, ",")},
		}, ids
	}
	d := bootstrapDecision{Action: bootstrapNow, Reason: "bootstrapping cluster", Args: []any{"servers", strings.Join(ids, ",")}}
	for _, id := range ids {
		d.Servers = append(d.Servers, raft.Server{
			Suffrage: raft.Voter,
			ID:       raft.ServerID(id),
			Address:  raft.ServerAddress(reached[id][0].GetRaftAddress()),
		})
	}
	return d, ids
}

func sortedIDs[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for id := range m {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

// sameIDs compares a reported known set with a sorted one; a report may
// come unsorted or with duplicates from a server of another version.
func sameIDs(reported, sorted []string) bool {
	r := slices.Clone(reported)
	slices.Sort(r)
	return slices.Equal(slices.Compact(r), sorted)
}

// bootstrapState is what a server remembers between bootstrap attempts:
// its known set and the last refusal it logged, so that a refusal is
// logged once per change rather than at every attempt. The zero value
// is ready.
type bootstrapState struct {
	mu          sync.Mutex
	known       []string // sorted, without duplicates
	lastRefusal string
}

// knownIDs returns the known set, sorted, with self in it.
func (b *bootstrapState) knownIDs(self string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := slices.BinarySearch(b.known, self); !ok {
		b.known = append(b.known, self)
		slices.Sort(b.known)
	}
	return slices.Clone(b.known)
}

// setKnown records the known set after an attempt. It keeps every id it
// had: the set must never shrink for the rule to be safe.
func (b *bootstrapState) setKnown(ids []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	merged := append(slices.Clone(b.known), ids...)
	slices.Sort(merged)
	b.known = slices.Compact(merged)
}

// refusalChanged reports whether d differs from the last refusal logged,
// and remembers it.
func (b *bootstrapState) refusalChanged(d bootstrapDecision) bool {
	key := d.Reason + fmt.Sprint(d.Args...)
	b.mu.Lock()
	defer b.mu.Unlock()
	if key == b.lastRefusal {
		return false
	}
	b.lastRefusal = key
	return true
}
