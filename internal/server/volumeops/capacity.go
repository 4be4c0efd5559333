package volumeops

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
)

// PluginCapacity asks GetCapacity once per accessible topology segment of
// the plugin's healthy controllers, through the controllers of that
// segment in candidate order until one answers. Controllers without a
// topology are asked once, without a segment: they speak for storage
// that every node reaches.
func (o *Ops) PluginCapacity(ctx context.Context, pluginID string) (*csisupdv1.PluginCapacityResponse, error) {
	cands, err := o.capableControllers(pluginID, plugin.CapGetCapacity)
	if err != nil {
		return nil, err
	}
	// Segments in the candidates' order; each with its controllers.
	bySegment := map[string][]candidate{}
	var keys []string
	for _, c := range cands {
		key := segmentString(c.plugin.GetAccessibleTopology())
		if _, seen := bySegment[key]; !seen {
			keys = append(keys, key)
		}
		bySegment[key] = append(bySegment[key], c)
	}
	resp := &csisupdv1.PluginCapacityResponse{}
	for _, key := range keys {
		segment := bySegment[key][0].plugin.GetAccessibleTopology()
		out := &csisupdv1.PluginCapacity{Segment: &csisupdv1.TopologySegment{Segments: maps.Clone(segment)}}
		req := &csi.GetCapacityRequest{}
		if len(segment) > 0 {
			req.AccessibleTopology = &csi.Topology{Segments: maps.Clone(segment)}
		}
		var errs []string
		for _, c := range bySegment[key] {
			out.ControllerNodeId = c.nodeID
			cctx, cancel := context.WithTimeout(ctx, o.cfg.RPCTimeout)
			got, err := o.cfg.Controllers.GetCapacity(cctx, c.addr, pluginID, req)
			cancel()
			if err != nil {
				errs = append(errs, c.nodeID+": "+status.Convert(err).Message())
				if ctx.Err() != nil {
					break
				}
				continue
			}
			out.AvailableBytes = got.GetAvailableCapacity()
			out.MaximumVolumeBytes = got.GetMaximumVolumeSize().GetValue()
			out.MinimumVolumeBytes = got.GetMinimumVolumeSize().GetValue()
			errs = nil
			break
		}
		out.Error = strings.Join(errs, "; ")
		resp.Capacities = append(resp.Capacities, out)
	}
	slices.SortFunc(resp.Capacities, func(a, b *csisupdv1.PluginCapacity) int {
		return cmp.Compare(segmentString(a.GetSegment().GetSegments()), segmentString(b.GetSegment().GetSegments()))
	})
	return resp, nil
}
