package registry

import (
	"maps"
	"math"
	"slices"
	"strings"

	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
)

// Source returns the registry as a plugin.Source: the read model of its
// records, its ignored entries and its change subscriptions.
func (r *Registry) Source() plugin.Source { return source{r} }

// source adapts a Registry to plugin.Source.
type source struct{ r *Registry }

// List returns the records' read models and, for every required plugin
// without a record, its placeholder (health state HealthMissing), sorted
// by id.
func (s source) List() []*csisupdv1.Plugin {
	s.r.mu.Lock()
	out := make([]*csisupdv1.Plugin, 0, len(s.r.plugins))
	for _, p := range s.r.plugins {
		out = append(out, p.Proto())
	}
	out = append(out, s.r.missingLocked()...)
	s.r.mu.Unlock()
	slices.SortFunc(out, func(a, b *csisupdv1.Plugin) int { return strings.Compare(a.GetId(), b.GetId()) })
	return out
}

// Get returns the read model of plugin id: its record's, or the
// placeholder of a required plugin without one.
func (s source) Get(id string) (*csisupdv1.Plugin, bool) {
	s.r.mu.Lock()
	defer s.r.mu.Unlock()
	if p, ok := s.r.plugins[id]; ok {
		return p.Proto(), true
	}
	if _, ok := s.r.episodes[id]; ok {
		return s.r.placeholderLocked(id), true
	}
	return nil, false
}

func (s source) Ignored() []plugin.Ignored { return s.r.Ignored() }

func (s source) Subscribe() plugin.Subscription { return s.r.Subscribe() }

// Proto returns the record's read model, the one shape every consumer of
// plugin state reads (the Agent API, the node client, the Consul sync, the
// CLI). It is the only converter from a record. The message shares no
// map or slice with the record, so its reader may keep or change it.
func (p Plugin) Proto() *csisupdv1.Plugin {
	fp := p.Fingerprint
	// Names, paths and descriptions come from the file system and from
	// errors; maps and capabilities come from the plugin's own gRPC
	// answers, which are valid UTF-8 already.
	m := &csisupdv1.Plugin{
		Id:                     plugin.WireString(p.ID),
		Type:                   plugin.WireString(string(fp.Type.OrUnknown())),
		Healthy:                p.Healthy(),
		HealthState:            plugin.WireString(string(p.Health.State)),
		HealthDescription:      plugin.WireString(p.Health.Description),
		Socket:                 plugin.WireString(p.Instance.Path),
		VendorName:             plugin.WireString(fp.VendorName),
		VendorVersion:          plugin.WireString(fp.VendorVersion),
		Manifest:               maps.Clone(fp.Manifest),
		NodeId:                 plugin.WireString(fp.NodeID),
		MaxVolumes:             maxVolumes(fp.MaxVolumes),
		AccessibleTopology:     maps.Clone(fp.AccessibleTopology),
		PluginCapabilities:     slices.Clone(fp.PluginCapabilities),
		ControllerCapabilities: slices.Clone(fp.ControllerCapabilities),
		NodeCapabilities:       slices.Clone(fp.NodeCapabilities),
		RegisteredAt:           timestamppb.New(p.RegisteredAt),
		HealthSince:            timestamppb.New(p.Health.Since),
	}
	if !p.Health.LastProbe.IsZero() {
		m.LastProbe = timestamppb.New(p.Health.LastProbe)
	}
	return m
}

// maxVolumes is CSI's int64 max_volumes_per_node in the API's int32, which
// keeps it a JSON number in protojson (64-bit integers are strings there);
// no node holds 2^31 volumes, so the clamp never loses a real value.
func maxVolumes(n int64) int32 { return int32(min(max(n, math.MinInt32), math.MaxInt32)) }
