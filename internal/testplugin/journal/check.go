package journal

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csisupd/csisupd/internal/testplugin"
)

// Names of the checks, in Violation.Check.
const (
	CheckSingleWriter = "SingleWriter"
	CheckSingleNode   = "SingleNode"
	CheckLeftovers    = "Leftovers"
)

// Violation is one broken invariant and the records that show it.
type Violation struct {
	// Check is CheckSingleWriter, CheckSingleNode or CheckLeftovers.
	Check    string
	VolumeID string
	// Nodes are the nodes involved, sorted.
	Nodes []string
	// Message says what is wrong.
	Message string
	// Records are the records of the calls that opened and closed the
	// intervals involved, in time order.
	Records []Record
}

// String is the message followed by the file and line of each record.
func (v Violation) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: volume %s: %s", v.Check, v.VolumeID, v.Message)
	for _, r := range v.Records {
		fmt.Fprintf(&b, "\n\t%s:%d: %s %s %s node=%s code=%s", r.File, r.Line, r.Time.Format(time.RFC3339Nano), r.Phase, r.Method, r.Node, r.Code)
	}
	return b.String()
}

// Access modes by CSI name.
var (
	singleWriterModes = modeSet(
		csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER,
		csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER,
	)
	singleNodeModes = modeSet(
		csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER,
	)
	readerModes = modeSet(
		csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
		csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY,
	)
)

func modeSet(modes ...csi.VolumeCapability_AccessMode_Mode) map[string]bool {
	m := make(map[string]bool)
	for _, mode := range modes {
		m[mode.String()] = true
	}
	return m
}

// call is one call: its begin record and, when it ended, its end record.
type call struct {
	begin Record
	end   *Record
}

// outcome of a call.
const (
	outcomeOK = iota
	outcomeFailed
	outcomeUnknown // no end record
)

func (c call) outcome() int {
	switch {
	case c.end == nil:
		return outcomeUnknown
	case c.end.Code == "OK":
		return outcomeOK
	default:
		return outcomeFailed
	}
}

func (c call) records() []Record {
	if c.end == nil {
		return []Record{c.begin}
	}
	return []Record{c.begin, *c.end}
}

// calls pairs the begin and end records by instance and call. An end
// record without its begin (a hand-made journal) stands for both.
func calls(records []Record) []call {
	type key struct {
		instance string
		call     uint64
	}
	idx := make(map[key]int)
	var out []call
	for _, r := range records {
		k := key{r.Instance, r.Call}
		switch r.Phase {
		case testplugin.JournalBegin:
			idx[k] = len(out)
			out = append(out, call{begin: r})
		case testplugin.JournalEnd:
			if i, ok := idx[k]; ok && out[i].end == nil {
				e := r
				out[i].end = &e
				continue
			}
			e := r
			out = append(out, call{begin: r, end: &e})
		}
	}
	return out
}

// interval is the time a volume was (possibly) staged or published at one
// path on one node.
type interval struct {
	kind     string // "published" or "staged"
	node     string
	volume   string
	path     string
	mode     string
	readonly bool
	start    time.Time
	end      time.Time // zero while open
	unknown  bool      // opened by a call of unknown outcome
	records  []Record
	// effectBy is when the opening call's effect had certainly happened:
	// its end (zero while it has none). opener is the plugin instance
	// that made it.
	effectBy time.Time
	opener   string
}

// closedBy reports whether call c, a close that succeeded (or that the
// plugin answered NotFound), certainly came after iv's opening effect: it
// began once the opening call had ended, or, for an opening call that
// never ended, in another instance of the plugin (the one that made it
// had died).
func (iv *interval) closedBy(c call) bool {
	if iv.effectBy.IsZero() {
		return c.begin.Instance != iv.opener
	}
	return !c.begin.Time.Before(iv.effectBy)
}

func (iv *interval) open() bool { return iv.end.IsZero() }

// overlaps reports whether the half-open intervals share an instant.
func (iv *interval) overlaps(o *interval) bool {
	return (o.open() || iv.start.Before(o.end)) && (iv.open() || o.start.Before(iv.end))
}

func (iv *interval) describe() string {
	until := "still open at the end of the journal"
	if !iv.open() {
		until = "until " + iv.end.Format(time.RFC3339Nano)
	}
	s := fmt.Sprintf("%s at %q on node %s (%s, readonly=%t) from %s %s", iv.kind, iv.path, iv.node, iv.mode, iv.readonly,
		iv.start.Format(time.RFC3339Nano), until)
	if iv.unknown {
		s += " (opened by a call of unknown outcome)"
	}
	return s
}

// intervals turns the calls of openMethod and closeMethod into intervals
// per node, volume and path (see the package documentation).
func intervals(cs []call, kind, openMethod, closeMethod string, pathOf func(Record) string) []*interval {
	type key struct{ node, volume, path string }
	groups := make(map[key][]call)
	for _, c := range cs {
		if m := c.begin.Method; m == openMethod || m == closeMethod {
			k := key{c.begin.Node, c.begin.VolumeID, pathOf(c.begin)}
			groups[k] = append(groups[k], c)
		}
	}
	var out []*interval
	for _, k := range slices.SortedFunc(maps.Keys(groups), func(a, b key) int {
		return cmp.Or(cmp.Compare(a.volume, b.volume), cmp.Compare(a.node, b.node), cmp.Compare(a.path, b.path))
	}) {
		g := groups[k]
		slices.SortStableFunc(g, func(a, b call) int { return a.begin.Time.Compare(b.begin.Time) })
		var cur *interval
		for _, c := range g {
			o := c.outcome()
			switch {
			case c.begin.Method == openMethod && o != outcomeFailed && cur == nil:
				cur = &interval{kind: kind, node: k.node, volume: k.volume, path: k.path, mode: c.begin.AccessMode,
					readonly: c.begin.Readonly, start: c.begin.Time, unknown: o == outcomeUnknown, records: c.records(), opener: c.begin.Instance}
				if c.end != nil {
					cur.effectBy = c.end.Time
				}
				out = append(out, cur)
			case c.begin.Method == closeMethod && (o == outcomeOK || o == outcomeFailed && c.end.Code == "NotFound") && cur != nil && cur.closedBy(c):
				cur.end = c.end.Time
				cur.records = append(cur.records, c.records()...)
				cur = nil
			}
		}
	}
	return out
}

func published(cs []call) []*interval {
	return intervals(cs, "published", "NodePublishVolume", "NodeUnpublishVolume", func(r Record) string { return r.TargetPath })
}

func staged(cs []call) []*interval {
	return intervals(cs, "staged", "NodeStageVolume", "NodeUnstageVolume", func(r Record) string { return r.StagingPath })
}

// pairs returns a violation for every two intervals of one volume on
// different nodes that overlap, among those keep selects, when match says
// the pair breaks the check.
func pairs(check string, ivs []*interval, keep func(*interval) bool, match func(a, b *interval) bool, what string) []Violation {
	byVolume := make(map[string][]*interval)
	for _, iv := range ivs {
		if keep(iv) {
			byVolume[iv.volume] = append(byVolume[iv.volume], iv)
		}
	}
	var out []Violation
	for _, vol := range slices.Sorted(maps.Keys(byVolume)) {
		g := byVolume[vol]
		for i, a := range g {
			for _, b := range g[i+1:] {
				if a.node == b.node || !match(a, b) || !a.overlaps(b) {
					continue
				}
				recs := append(slices.Clone(a.records), b.records...)
				slices.SortStableFunc(recs, func(x, y Record) int { return x.Time.Compare(y.Time) })
				out = append(out, Violation{
					Check: check, VolumeID: vol, Nodes: sortedNodes(a.node, b.node), Records: recs,
					Message: fmt.Sprintf("%s on nodes %s and %s at once: %s; %s", what, a.node, b.node, a.describe(), b.describe()),
				})
			}
		}
	}
	return out
}

func sortedNodes(nodes ...string) []string {
	slices.Sort(nodes)
	return slices.Compact(nodes)
}

// SingleWriter returns a violation for every two read-write publications
// of one volume (NodePublishVolume with readonly unset and an access mode
// that is not *_READER_ONLY) on different nodes whose intervals overlap,
// when either has a single-writer access mode: SINGLE_NODE_WRITER,
// SINGLE_NODE_SINGLE_WRITER, SINGLE_NODE_MULTI_WRITER or
// MULTI_NODE_SINGLE_WRITER.
func SingleWriter(records []Record) []Violation {
	writer := func(iv *interval) bool { return !iv.readonly && !readerModes[iv.mode] }
	either := func(a, b *interval) bool { return singleWriterModes[a.mode] || singleWriterModes[b.mode] }
	return pairs(CheckSingleWriter, published(calls(records)), writer, either, "published read-write")
}

// SingleNode returns a violation for every two intervals of one volume
// staged or published (read-only or not) on different nodes that overlap,
// when either has a single-node access mode (SINGLE_NODE_*).
func SingleNode(records []Record) []Violation {
	cs := calls(records)
	all := append(staged(cs), published(cs)...)
	either := func(a, b *interval) bool { return singleNodeModes[a.mode] || singleNodeModes[b.mode] }
	return pairs(CheckSingleNode, all, func(*interval) bool { return true }, either, "staged or published")
}

// Leftovers compares the end of the journal with the claims held, as held
// tells (whether a claim on the volume holds it on the node):
//
//   - a volume still staged or published on a node (an interval open at
//     the end, opened by a call that succeeded or of unknown outcome)
//     while held is false for that volume and node;
//   - a volume held on a node where it is not published: held is asked
//     for every volume and node the journal names (volume ids of any
//     record, created ones included; the writers' nodes and the node ids
//     of controller publish calls), so a claim on a volume or node the
//     journal never names is not seen.
//
// A publication of unknown outcome counts as published, both ways.
func Leftovers(records []Record, held func(volumeID, nodeID string) bool) []Violation {
	cs := calls(records)
	pubs := published(cs)
	open := make(map[[2]string][]*interval) // by volume, node
	for _, iv := range append(staged(cs), pubs...) {
		if iv.open() {
			k := [2]string{iv.volume, iv.node}
			open[k] = append(open[k], iv)
		}
	}
	var out []Violation
	for _, k := range slices.SortedFunc(maps.Keys(open), compareKey) {
		if held(k[0], k[1]) {
			continue
		}
		var desc []string
		var recs []Record
		for _, iv := range open[k] {
			desc = append(desc, iv.describe())
			recs = append(recs, iv.records...)
		}
		slices.SortStableFunc(recs, func(x, y Record) int { return x.Time.Compare(y.Time) })
		out = append(out, Violation{Check: CheckLeftovers, VolumeID: k[0], Nodes: []string{k[1]}, Records: recs,
			Message: fmt.Sprintf("left on node %s with no claim holding it: %s", k[1], strings.Join(desc, "; "))})
	}
	isPublished := make(map[[2]string]bool)
	last := make(map[[2]string]*interval) // the last publication, to show
	for _, iv := range pubs {
		k := [2]string{iv.volume, iv.node}
		if iv.open() {
			isPublished[k] = true
		}
		if l := last[k]; l == nil || l.start.Before(iv.start) {
			last[k] = iv
		}
	}
	volumes, nodes := make(map[string]bool), make(map[string]bool)
	for _, r := range records {
		if r.VolumeID != "" {
			volumes[r.VolumeID] = true
		}
		if r.Node != "" {
			nodes[r.Node] = true
		}
		if r.NodeID != "" {
			nodes[r.NodeID] = true
		}
	}
	for _, v := range slices.Sorted(maps.Keys(volumes)) {
		for _, n := range slices.Sorted(maps.Keys(nodes)) {
			k := [2]string{v, n}
			if !held(v, n) || isPublished[k] {
				continue
			}
			viol := Violation{Check: CheckLeftovers, VolumeID: v, Nodes: []string{n},
				Message: fmt.Sprintf("held on node %s but not published there at the end of the journal", n)}
			if l := last[k]; l != nil {
				viol.Message += "; last " + l.describe()
				viol.Records = slices.Clone(l.records)
			}
			out = append(out, viol)
		}
	}
	return out
}

func compareKey(a, b [2]string) int {
	return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1]))
}
