package server

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// placement says which controller instances may make a volume operation,
// and which are tried first. A node-local plugin answers only for the
// volumes and snapshots on its own node, and may create a volume on its
// own node whatever it is asked; so an operation that names a topology or
// a source must reach a controller by topology, never by a stable order.
type placement struct {
	// requisite are the segments of which the controller's node must
	// satisfy one; empty means any node.
	requisite []*statepb.TopologySegment
	// preferred are tried first, in order.
	preferred []*statepb.TopologySegment
	// source is the accessible topology of the volume or snapshot the
	// operation reads: the controller's node must reach it too.
	source []*statepb.TopologySegment
	// sourceNode is the node whose controller made the source; it is
	// tried before any other that qualifies.
	sourceNode string
}

// placementOf returns the placement of a new volume's creation request,
// before any source is added.
func placementOf(r *csisupdv1.TopologyRequirement) placement {
	return placement{
		requisite: convertSegments(r.GetRequisite()),
		preferred: convertSegments(r.GetPreferred()),
	}
}

// placementAt returns the placement of an operation on an existing volume
// or snapshot: a controller that reaches topology, the one on node first.
func placementAt(topology []*statepb.TopologySegment, node string) placement {
	return placement{source: topology, sourceNode: node}
}

func convertSegments(in []*csisupdv1.TopologySegment) []*statepb.TopologySegment {
	var out []*statepb.TopologySegment
	for _, s := range in {
		out = append(out, statepb.TopologySegmentFromAPI(s))
	}
	return out
}

// allows reports whether a controller on a node with topology have may
// make the operation.
func (p placement) allows(have map[string]string) bool {
	return (len(p.requisite) == 0 || rules.TopologyFits(p.requisite, have)) && rules.TopologyFits(p.source, have)
}

// rank orders the candidates that allow the operation: the source's node
// first, then by the first preferred segment each satisfies, then as
// given (confirmed nodes first, by node id). It returns nil when none
// qualifies.
func (p placement) rank(cands []candidate) []candidate {
	type ranked struct {
		c    candidate
		rank int
	}
	var rs []ranked
	for _, c := range cands {
		have := c.plugin.GetAccessibleTopology()
		if !p.allows(have) {
			continue
		}
		r := len(p.preferred) + 1
		for i, seg := range p.preferred {
			if rules.TopologyFits([]*statepb.TopologySegment{seg}, have) {
				r = i + 1
				break
			}
		}
		if p.sourceNode != "" && c.nodeID == p.sourceNode {
			r = 0
		}
		rs = append(rs, ranked{c, r})
	}
	slices.SortStableFunc(rs, func(a, b ranked) int { return cmp.Compare(a.rank, b.rank) })
	out := make([]candidate, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.c)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// constrained reports whether the placement restricts the controllers at
// all.
func (p placement) constrained() bool {
	return len(p.requisite) > 0 || len(p.source) > 0
}

// describe returns the segments the placement requires, each as
// "k=v,k=v" with keys in order: the requisite and the source's.
func (p placement) describe() []string {
	var out []string
	for _, segs := range [][]*statepb.TopologySegment{p.requisite, p.source} {
		for _, s := range segs {
			out = append(out, segmentString(s.GetSegments()))
		}
	}
	return out
}

// segmentString formats a segment as "k=v,k=v" with keys in order.
func segmentString(seg map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(seg)) {
		parts = append(parts, k+"="+seg[k])
	}
	return strings.Join(parts, ",")
}

// unsatisfiable is the refusal of an operation no candidate may make.
func (p placement) unsatisfiable(pluginID string, cands []candidate) error {
	var have []string
	for _, c := range cands {
		have = append(have, fmt.Sprintf("%s {%s}", c.nodeID, segmentString(c.plugin.GetAccessibleTopology())))
	}
	reason := "no healthy controller instance's node satisfies it"
	if len(have) > 0 {
		reason += "; controllers: " + strings.Join(have, "; ")
	}
	return csisupdv1.NewTopologyUnsatisfiableError(pluginID, p.describe(), reason)
}

// csiRequirement returns the CSI accessibility requirements of a create
// call: the requisite segments (the caller's, else the source's) and the
// preferred ones that CSI allows beside them (all, without requisite
// segments; else those that are requisite segments too).
func (p placement) csiRequirement() *csi.TopologyRequirement {
	requisite := p.requisite
	if len(requisite) == 0 {
		requisite = p.source
	}
	if len(requisite) == 0 && len(p.preferred) == 0 {
		return nil
	}
	r := &csi.TopologyRequirement{}
	for _, s := range requisite {
		r.Requisite = append(r.Requisite, &csi.Topology{Segments: maps.Clone(s.GetSegments())})
	}
	for _, s := range p.preferred {
		// CSI: with requisite segments, each preferred one must be one of
		// them; the others only ordered the controllers.
		if len(requisite) > 0 && !slices.ContainsFunc(requisite, func(q *statepb.TopologySegment) bool {
			return maps.Equal(q.GetSegments(), s.GetSegments())
		}) {
			continue
		}
		r.Preferred = append(r.Preferred, &csi.Topology{Segments: maps.Clone(s.GetSegments())})
	}
	return r
}

// createdWithin reports whether a volume the plugin reports as accessible
// from got satisfies the placement's requisite segments: one of its
// segments holds every key and value of a requisite segment. A volume
// accessible from everywhere (no segments) satisfies any.
func (p placement) createdWithin(got []*statepb.TopologySegment) bool {
	if len(p.requisite) == 0 || len(got) == 0 {
		return true
	}
	for _, g := range got {
		if rules.TopologyFits(p.requisite, g.GetSegments()) {
			return true
		}
	}
	return false
}
