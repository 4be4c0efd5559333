package nemesis

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// The claim history the schedulers record, and the model it is checked
// against: csisupd's promise that every claim a client saw acknowledged
// is there until the client saw its release acknowledged, and that an
// acknowledged release leaves nothing. It lives outside the nemesis build
// tag so that its own tests run with every `go test`: a model that
// accepted everything would turn the soak blind.

// Operation kinds in History.
const (
	opClaim   = "claim"
	opRelease = "release"
	opGet     = "get"
)

// Outcomes of a claim or release.
const (
	outOK      = "ok"      // acknowledged
	outRefused = "refused" // refused by a rule: nothing changed
	outUnknown = "unknown" // failed or timed out: it may have happened, partly, or later
)

// Op is one client call in the history.
type Op struct {
	Client   int
	Kind     string // opClaim, opRelease or opGet
	Volume   string
	Node     string // claim and release
	Workload string // claim and release
	Outcome  string // claim and release
	// Held is what a get saw: "node/workload" of each claim on the volume.
	Held         []string
	Call, Return time.Time
	Err          string // the error, for the report
}

// key is the claim an op is about.
func (o Op) key() string { return o.Node + "/" + o.Workload }

func (o Op) String() string {
	s := fmt.Sprintf("client %d %s %s %s", o.Client, o.Kind, o.Volume, o.key())
	if o.Kind == opGet {
		s = fmt.Sprintf("client %d get %s -> %v", o.Client, o.Volume, o.Held)
	} else {
		s += " -> " + o.Outcome
	}
	s += fmt.Sprintf(" [%s .. %s]", o.Call.Format("15:04:05.000"), o.Return.Format("15:04:05.000"))
	if o.Err != "" {
		s += ": " + o.Err
	}
	return s
}

// claimInput is one operation on one claim (volume, node, workload): the
// unit porcupine checks, each claim independent of the others.
type claimInput struct {
	claim string // volume|node/workload
	kind  string
	// outcome of a claim or release; for a get, whether the claim was seen.
	outcome string
	seen    bool
	op      int // index in the history, for the report
}

// Claim states in the model.
const (
	stAbsent  = "absent"
	stPresent = "present"
	stUnknown = "unknown" // after a failed claim or release: either, until acknowledged again
)

// claimModel is one claim's presence.
var claimModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		for _, op := range history {
			k := op.Input.(claimInput).claim
			by[k] = append(by[k], op)
		}
		var out [][]porcupine.Operation
		for _, k := range slices.Sorted(maps.Keys(by)) {
			out = append(out, by[k])
		}
		return out
	},
	Init: func() any { return stAbsent },
	Step: func(state, input, _ any) (bool, any) {
		in, st := input.(claimInput), state.(string)
		switch in.kind {
		case opClaim:
			switch in.outcome {
			case outOK:
				return true, stPresent
			case outRefused:
				return true, st
			}
			return true, stUnknown
		case opRelease:
			switch in.outcome {
			case outOK:
				return true, stAbsent
			case outRefused:
				return true, st
			}
			return true, stUnknown
		case opGet:
			switch st {
			case stPresent:
				return in.seen, st
			case stAbsent:
				return !in.seen, st
			}
			return true, st
		}
		return false, st
	},
	Equal: func(a, b any) bool { return a == b },
	DescribeOperation: func(input, _ any) string {
		in := input.(claimInput)
		if in.kind == opGet {
			return fmt.Sprintf("get %s seen=%v", in.claim, in.seen)
		}
		return fmt.Sprintf("%s %s -> %s", in.kind, in.claim, in.outcome)
	},
	DescribeState: func(state any) string { return state.(string) },
}

// porcupineOps turns the history into one operation per claim: a get of a
// volume becomes a get of every claim of that volume the history names,
// seen or not.
func porcupineOps(history []Op) []porcupine.Operation {
	claimsOf := map[string]map[string]bool{} // volume -> claim keys
	for _, o := range history {
		if o.Kind != opGet {
			if claimsOf[o.Volume] == nil {
				claimsOf[o.Volume] = map[string]bool{}
			}
			claimsOf[o.Volume][o.key()] = true
		}
	}
	base := time.Time{}
	for _, o := range history {
		if base.IsZero() || o.Call.Before(base) {
			base = o.Call
		}
	}
	var out []porcupine.Operation
	add := func(o Op, in claimInput) {
		out = append(out, porcupine.Operation{ClientId: o.Client, Input: in,
			Call: o.Call.Sub(base).Nanoseconds(), Return: o.Return.Sub(base).Nanoseconds()})
	}
	for i, o := range history {
		if o.Kind != opGet {
			add(o, claimInput{claim: o.Volume + "|" + o.key(), kind: o.Kind, outcome: o.Outcome, op: i})
			continue
		}
		for _, k := range slices.Sorted(maps.Keys(claimsOf[o.Volume])) {
			add(o, claimInput{claim: o.Volume + "|" + k, kind: opGet, seen: slices.Contains(o.Held, k), op: i})
		}
	}
	return out
}

// CheckHistory checks the history against claimModel. It returns "" when
// it is linearizable, else a report naming the claim and its operations.
func CheckHistory(history []Op, timeout time.Duration) string {
	ops := porcupineOps(history)
	res := porcupine.CheckOperationsTimeout(claimModel, ops, timeout)
	switch res {
	case porcupine.Ok:
		return ""
	case porcupine.Unknown:
		return fmt.Sprintf("the claim history (%d operations) could not be checked within %s", len(history), timeout)
	}
	// Show the operations of each claim that fails on its own.
	var b strings.Builder
	by := map[string][]porcupine.Operation{}
	for _, op := range ops {
		k := op.Input.(claimInput).claim
		by[k] = append(by[k], op)
	}
	for _, k := range slices.Sorted(maps.Keys(by)) {
		part := by[k]
		if porcupine.CheckOperations(claimModel, part) {
			continue
		}
		fmt.Fprintf(&b, "claim %s is not linearizable; its operations:\n", k)
		slices.SortFunc(part, func(x, y porcupine.Operation) int { return cmp.Compare(x.Call, y.Call) })
		for _, op := range part {
			fmt.Fprintf(&b, "\t%s\n", history[op.Input.(claimInput).op])
		}
	}
	if b.Len() == 0 {
		return "the claim history is not linearizable"
	}
	return b.String()
}
