package volumeops

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
)

// Bounds of the external listings: what one plugin may make the leader
// hold, and how many entries are asked for per page.
const (
	maxExternalEntries = 100_000
	externalPageSize   = 1000
)

// External states, as ExternalVolume.state and ExternalSnapshot.state name
// them.
const (
	externalKnown   = "known"
	externalUnknown = "unknown"
	externalMissing = "missing"
)

// externalListing is what every controller of a plugin listed: entries by
// external id, the controllers that listed each, the controllers whose
// listing was whole, and the controllers that could not be listed.
type externalListing[E any] struct {
	entries   map[string]E
	nodes     map[string][]string
	answered  map[string]bool // by node id
	errs      []string
	truncated bool
}

// listControllers lists every page of each candidate with page (a
// ListVolumes or ListSnapshots call from a starting token), keyed by id,
// up to maxExternalEntries in all. A controller whose listing fails, or
// repeats a page token, is named in errs.
func listControllers[E any](ctx context.Context, timeout time.Duration, cands []candidate,
	page func(ctx context.Context, c candidate, token string) ([]E, string, error), id func(E) string,
) externalListing[E] {
	out := externalListing[E]{entries: map[string]E{}, nodes: map[string][]string{}, answered: map[string]bool{}}
	for _, c := range cands {
		seen := map[string]bool{}
		token := ""
		for {
			pctx, cancel := context.WithTimeout(ctx, timeout)
			entries, next, err := page(pctx, c, token)
			cancel()
			if err != nil {
				out.errs = append(out.errs, fmt.Sprintf("controller on node %s: %s", c.nodeID, status.Convert(err).Message()))
				break
			}
			for _, e := range entries {
				k := id(e)
				if _, dup := out.entries[k]; !dup {
					if len(out.entries) >= maxExternalEntries {
						out.truncated = true
						continue
					}
					out.entries[k] = e
				}
				if !slices.Contains(out.nodes[k], c.nodeID) {
					out.nodes[k] = append(out.nodes[k], c.nodeID)
				}
			}
			if next == "" && !out.truncated {
				out.answered[c.nodeID] = true
			}
			if next == "" || out.truncated {
				break
			}
			if seen[next] {
				out.errs = append(out.errs, fmt.Sprintf("controller on node %s: the plugin answered next_token %q twice", c.nodeID, next))
				break
			}
			seen[next] = true
			token = next
		}
	}
	return out
}

// ExternalVolumes runs ListExternalVolumes on the leader.
func (o *Ops) ExternalVolumes(ctx context.Context, pluginID string) (*csisupdv1.ExternalVolumesResponse, error) {
	cands, err := o.capableControllers(pluginID, plugin.CapListVolumes)
	if err != nil {
		return nil, err
	}
	l := listControllers(ctx, o.cfg.RPCTimeout, cands, func(ctx context.Context, c candidate, token string) ([]*csi.ListVolumesResponse_Entry, string, error) {
		resp, err := o.cfg.Controllers.ListVolumes(ctx, c.addr, pluginID, &csi.ListVolumesRequest{MaxEntries: externalPageSize, StartingToken: token})
		return resp.GetEntries(), resp.GetNextToken(), err
	}, func(e *csi.ListVolumesResponse_Entry) string { return e.GetVolume().GetVolumeId() })

	resp := &csisupdv1.ExternalVolumesResponse{Complete: len(l.errs) == 0 && !l.truncated, Errors: l.errs, Truncated: l.truncated}
	known := map[string]string{} // external id -> cluster id
	for _, v := range o.cfg.State().Volumes(pluginID) {
		known[v.GetExternalId()] = v.GetId()
		if _, listed := l.entries[v.GetExternalId()]; !listed && resp.Complete {
			resp.Volumes = append(resp.Volumes, &csisupdv1.ExternalVolume{ExternalId: v.GetExternalId(), ClusterId: v.GetId(), State: externalMissing})
		}
	}
	for id, e := range l.entries {
		ev := &csisupdv1.ExternalVolume{
			ExternalId: id, ClusterId: known[id], State: externalState(known[id]),
			CapacityBytes: e.GetVolume().GetCapacityBytes(), ControllerNodeIds: l.nodes[id],
		}
		for _, t := range e.GetVolume().GetAccessibleTopology() {
			ev.AccessibleTopology = append(ev.AccessibleTopology, &csisupdv1.TopologySegment{Segments: maps.Clone(t.GetSegments())})
		}
		resp.Volumes = append(resp.Volumes, ev)
	}
	sortExternal(resp.Volumes)
	return resp, nil
}

// ExternalSnapshots runs ListExternalSnapshots on the leader.
func (o *Ops) ExternalSnapshots(ctx context.Context, pluginID string) (*csisupdv1.ExternalSnapshotsResponse, error) {
	cands, err := o.capableControllers(pluginID, plugin.CapListSnapshots)
	if err != nil {
		return nil, err
	}
	l := listControllers(ctx, o.cfg.RPCTimeout, cands, func(ctx context.Context, c candidate, token string) ([]*csi.ListSnapshotsResponse_Entry, string, error) {
		resp, err := o.cfg.Controllers.ListSnapshots(ctx, c.addr, pluginID, &csi.ListSnapshotsRequest{MaxEntries: externalPageSize, StartingToken: token})
		return resp.GetEntries(), resp.GetNextToken(), err
	}, func(e *csi.ListSnapshotsResponse_Entry) string { return e.GetSnapshot().GetSnapshotId() })

	resp := &csisupdv1.ExternalSnapshotsResponse{Complete: len(l.errs) == 0 && !l.truncated, Errors: l.errs, Truncated: l.truncated}
	known := map[string]string{}
	for _, snap := range o.cfg.State().VolumeSnapshots() {
		if snap.GetPluginId() != pluginID || snap.GetExternalId() == "" {
			continue // another plugin's, or not made yet
		}
		known[snap.GetExternalId()] = snap.GetId()
		if _, listed := l.entries[snap.GetExternalId()]; !listed && resp.Complete {
			resp.Snapshots = append(resp.Snapshots, &csisupdv1.ExternalSnapshot{ExternalId: snap.GetExternalId(), ClusterId: snap.GetId(), State: externalMissing})
		}
	}
	for id, e := range l.entries {
		es := &csisupdv1.ExternalSnapshot{
			ExternalId: id, ClusterId: known[id], State: externalState(known[id]), SourceExternalId: e.GetSnapshot().GetSourceVolumeId(),
			SizeBytes: e.GetSnapshot().GetSizeBytes(), ReadyToUse: e.GetSnapshot().GetReadyToUse(), ControllerNodeIds: l.nodes[id],
		}
		resp.Snapshots = append(resp.Snapshots, es)
	}
	sortExternal(resp.Snapshots)
	return resp, nil
}

// externalState is the state of a listed entry: known when the cluster
// has it under clusterID, else unknown.
func externalState(clusterID string) string {
	if clusterID != "" {
		return externalKnown
	}
	return externalUnknown
}

// sortExternal sorts listed volumes or snapshots by state (known, unknown,
// missing), then by external id.
func sortExternal[E interface {
	GetState() string
	GetExternalId() string
}](entries []E) {
	order := func(state string) int {
		return slices.Index([]string{externalKnown, externalUnknown, externalMissing}, state)
	}
	slices.SortFunc(entries, func(a, b E) int {
		return cmp.Or(cmp.Compare(order(a.GetState()), order(b.GetState())), cmp.Compare(a.GetExternalId(), b.GetExternalId()))
	})
}
