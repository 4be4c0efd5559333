package journal

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testplugin"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// t0 is the start of every hand-built journal.
var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// ms is a time in milliseconds after t0.
func ms(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }

// noEnd as a step's end leaves the call without end record: its plugin
// died during the call.
const noEnd = -1

// step is one call of a hand-built journal.
type step struct {
	node, method, vol, path, mode string
	ro                            bool
	begin, end                    int    // ms after t0; end noEnd: no end record
	code                          string // "" is OK
	// restarted makes the call one of the node's plugin after a restart:
	// another instance.
	restarted bool
}

// afterRestart makes s a call of the node's restarted plugin.
func afterRestart(s step) step {
	s.restarted = true
	return s
}

const (
	snw  = "SINGLE_NODE_WRITER"
	snro = "SINGLE_NODE_READER_ONLY"
	snsw = "SINGLE_NODE_SINGLE_WRITER"
	snmw = "SINGLE_NODE_MULTI_WRITER"
	mnsw = "MULTI_NODE_SINGLE_WRITER"
	mnmw = "MULTI_NODE_MULTI_WRITER"
	mnro = "MULTI_NODE_READER_ONLY"
)

func pub(node, vol, mode string, ro bool, begin, end int) step {
	return step{node: node, method: "NodePublishVolume", vol: vol, path: "/t/" + node + "/" + vol, mode: mode, ro: ro, begin: begin, end: end}
}

func unpub(node, vol string, begin, end int) step {
	return step{node: node, method: "NodeUnpublishVolume", vol: vol, path: "/t/" + node + "/" + vol, begin: begin, end: end}
}

func stage(node, vol, mode string, begin, end int) step {
	return step{node: node, method: "NodeStageVolume", vol: vol, path: "/s/" + node + "/" + vol, mode: mode, begin: begin, end: end}
}

func unstage(node, vol string, begin, end int) step {
	return step{node: node, method: "NodeUnstageVolume", vol: vol, path: "/s/" + node + "/" + vol, begin: begin, end: end}
}

func failed(s step, code string) step {
	s.code = code
	return s
}

// build makes the records of steps, one plugin instance per node, ordered
// by time as Merge orders them.
func build(steps ...step) []Record {
	seq := make(map[string]uint64)
	var recs []Record
	add := func(r Record) {
		seq[r.Node]++
		r.Seq = seq[r.Node]
		if r.Phase == testplugin.JournalBegin {
			r.Call = r.Seq
		}
		r.Plugin, r.File, r.Line = "p", r.Node+".jsonl", int(r.Seq)
		if r.Instance == "" {
			r.Instance = "i-" + r.Node
		}
		recs = append(recs, r)
	}
	for _, s := range steps {
		r := Record{Node: s.node, Method: s.method, VolumeID: s.vol, AccessMode: s.mode, Readonly: s.ro}
		if s.restarted {
			r.Instance = "i2-" + s.node
		}
		if s.method == "NodeStageVolume" || s.method == "NodeUnstageVolume" {
			r.StagingPath = s.path
		} else {
			r.TargetPath = s.path
		}
		begin := r
		begin.Phase, begin.Time = testplugin.JournalBegin, ms(s.begin)
		add(begin)
		if s.end == noEnd {
			continue
		}
		end := r
		end.Phase, end.Time, end.Call, end.Code = testplugin.JournalEnd, ms(s.end), recs[len(recs)-1].Seq, "OK"
		if s.code != "" {
			end.Code = s.code
		}
		add(end)
	}
	slices.SortStableFunc(recs, func(a, b Record) int { return a.Time.Compare(b.Time) })
	return recs
}

// summary is what the tests compare of a violation.
type summary struct {
	check, volume string
	nodes         []string
}

func summarise(vs []Violation) []summary {
	var out []summary
	for _, v := range vs {
		out = append(out, summary{v.Check, v.VolumeID, v.Nodes})
	}
	return out
}

func equalSummaries(a, b []summary) bool {
	return slices.EqualFunc(a, b, func(x, y summary) bool {
		return x.check == y.check && x.volume == y.volume && slices.Equal(x.nodes, y.nodes)
	})
}

// lines encodes records as journal lines.
func lines(t *testing.T, recs ...Record) string {
	t.Helper()
	var s string
	for _, r := range recs {
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		s += string(b) + "\n"
	}
	return s
}

func (s summary) String() string { return fmt.Sprintf("%s %s %v", s.check, s.volume, s.nodes) }
