package volumeops

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// candidate is one controller instance a volume operation may use.
type candidate struct {
	nodeID string
	addr   string
	plugin *statepb.Plugin
	// confirmed is set when the node has heartbeated to, or answered a
	// call of, this leader since it took over or restored a snapshot.
	confirmed bool
}

// controllerCandidates returns the healthy controller instances of a plugin
// on ready nodes: first those on nodes this leader has heard from since it
// took over or restored a snapshot, then those on nodes it has not heard
// from yet, each group in node id order. A node not heard from is still
// tried, so that volume work goes on at once after a leader change rather
// than after the nodes' next heartbeats; a successful call confirms it
// (callControllers).
func (o *Ops) controllerCandidates(pluginID string) ([]candidate, error) {
	p := o.cfg.State().Plugin(pluginID)
	if p == nil {
		return nil, csisupdv1.NewPluginNotKnownError(pluginID)
	}
	var confirmed, unconfirmed []candidate
	for _, inst := range p.Instances {
		if ctrl, _ := plugin.Type(inst.Plugin.GetType()).Roles(); !ctrl || !inst.Healthy {
			continue
		}
		node := o.cfg.State().Node(inst.NodeID)
		if node == nil || node.GetStatus() != state.NodeStatusReady {
			continue
		}
		c := candidate{nodeID: node.GetId(), addr: node.GetAddress(), plugin: inst.Plugin, confirmed: o.cfg.Nodes.Confirmed(node.GetId())}
		if c.confirmed {
			confirmed = append(confirmed, c)
		} else {
			unconfirmed = append(unconfirmed, c)
		}
	}
	if out := append(confirmed, unconfirmed...); len(out) > 0 {
		return out, nil
	}
	return nil, status.Errorf(codes.FailedPrecondition,
		"plugin %q has no healthy controller instance on a ready node (%d of %d controllers healthy)",
		pluginID, p.ControllersHealthy, p.ControllersExpected)
}

// capableControllers returns the plugin's controller candidates that
// advertise capability, or the error that says there are none.
func (o *Ops) capableControllers(pluginID, capability string) ([]candidate, error) {
	cands, err := o.controllerCandidates(pluginID)
	if err != nil {
		return nil, err
	}
	if cands = withCapability(cands, capability); len(cands) == 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "plugin %q has no healthy controller with %s", pluginID, capability)
	}
	return cands, nil
}

// withCapability keeps the candidates that advertise a controller capability.
func withCapability(cands []candidate, capability string) []candidate {
	var out []candidate
	for _, c := range cands {
		if slices.Contains(c.plugin.GetControllerCapabilities(), capability) {
			out = append(out, c)
		}
	}
	return out
}

// placedControllers returns the controller candidates of a plugin that
// advertise capability and that place allows, in the order place ranks
// them; it refuses with a typed error when none qualifies.
func (o *Ops) placedControllers(pluginID, capability string, place placement) ([]candidate, error) {
	cands, err := o.controllerCandidates(pluginID)
	if err != nil {
		return nil, err
	}
	if cands = withCapability(cands, capability); len(cands) == 0 {
		return nil, csisupdv1.NewCapabilityMissingError(pluginID, "the volume operation", capability)
	}
	ranked := place.rank(cands)
	if ranked == nil {
		return nil, place.unsatisfiable(pluginID, cands)
	}
	return ranked, nil
}

// DefaultIsRetryable reports whether a ClientCSI error means the next
// controller candidate may succeed: errors marked retryable, a plugin that is
// not on the node, or an agent that cannot be reached.
func DefaultIsRetryable(err error) bool {
	if err == nil {
		return false
	}
	if csisupdv1.IsRetryable(err) || csisupdv1.IsPluginNotFound(err) {
		return true
	}
	if errors.Is(err, context.Canceled) {
		return false
	}
	return status.Code(err) == codes.Unavailable
}

// callControllers calls fn on each candidate in order, moving to the next
// one on a retryable error, and, for a node this leader has not heard from
// yet, also when its agent could not be reached in time: such a node may
// be long gone. The first node that answers is confirmed, as a heartbeat
// would; a node whose call failed is not. It returns the candidate that
// answered.
func (o *Ops) callControllers(ctx context.Context, op string, cands []candidate, fn func(ctx context.Context, c candidate) error) (candidate, error) {
	var errs []error
	for _, c := range cands {
		watchdog.Beat(ctx)
		cctx, cancel := context.WithTimeout(ctx, o.cfg.RPCTimeout)
		watchdog.BusyWith(ctx, cctx)
		err := fn(cctx, c)
		cancel()
		if err == nil {
			o.cfg.Nodes.Confirm(c.nodeID)
			return c, nil
		}
		errs = append(errs, fmt.Errorf("node %s (%s): %w", c.nodeID, c.addr, err))
		if ctx.Err() != nil || !tryNext(o.cfg.IsRetryable, c, err) {
			return c, err
		}
		o.logger.Warn("controller call failed; trying the next candidate", "op", op, "node", c.nodeID, "confirmed", c.confirmed, "error", err)
	}
	return candidate{}, status.Errorf(codes.Unavailable, "%s: every controller candidate failed: %v", op, errors.Join(errs...))
}

// tryNext reports whether the failed call to c leaves the next candidate
// worth a try: the error is retryable, or c is on a node this leader has
// not heard from and its agent could not be reached, or not in time.
func tryNext(isRetryable func(error) bool, c candidate, err error) bool {
	if isRetryable(err) {
		return true
	}
	if c.confirmed {
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	return errors.Is(err, context.DeadlineExceeded)
}

// controllerAdvertises reports whether a controller instance of the
// plugin, healthy or not, advertises a controller capability.
func (o *Ops) controllerAdvertises(pluginID, capability string) bool {
	return o.cfg.State().ControllerAdvertises(pluginID, capability)
}

// publishCandidates returns the healthy controllers of v's plugin that can
// publish and unpublish and reach v: a node-local controller answers only
// for its own volumes, so the one that created v comes first, and only
// controllers whose node's topology reaches v's are tried.
func (o *Ops) publishCandidates(v *statepb.Volume) ([]candidate, error) {
	cands, err := o.capableControllers(v.GetPluginId(), plugin.CapPublishUnpublishVolume)
	if err != nil {
		return nil, err
	}
	place := placementAt(v.GetAccessibleTopology(), v.GetControllerNodeId())
	ranked := place.rank(cands)
	if ranked == nil {
		return nil, place.unsatisfiable(v.GetPluginId(), cands)
	}
	return ranked, nil
}

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
