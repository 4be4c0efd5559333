package statepb

import (
	"maps"
	"slices"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// Every converter converts field by field, so that a field added to one
// side and not to the converter shows in the package's round-trip test.
// The FromAPI converters copy: a stored row shares nothing with the
// message it was made from, which its caller may still change. The ToAPI
// converters share the row's maps, lists and timestamps: the state store
// never changes a row once stored, its read methods already hand rows out
// shared, and the public messages made from them answer a call and are
// only encoded, so copying them would only cost the read paths (a page of
// 100 nodes with 5 plugins each is about 5,000 allocations more).

// ClusterNodeFromAPI converts a public node to its storage row.
func ClusterNodeFromAPI(in *csisupdv1.ClusterNode) *ClusterNode {
	if in == nil {
		return nil
	}
	return &ClusterNode{
		Id:                in.Id,
		Name:              in.Name,
		Address:           in.Address,
		Status:            in.Status,
		StatusDescription: in.StatusDescription,
		StatusUpdatedAt:   cloneTime(in.StatusUpdatedAt),
		RegisteredAt:      cloneTime(in.RegisteredAt),
		Plugins:           PluginsFromAPI(in.Plugins),
		CreateIndex:       in.CreateIndex,
		ModifyIndex:       in.ModifyIndex,
		DrainingPlugins:   slices.Clone(in.DrainingPlugins),
		Rekeyed:           in.Rekeyed,
		ReplacedBy:        in.ReplacedBy,
	}
}

// ClusterNodeToAPI converts a stored node to its public form.
func ClusterNodeToAPI(in *ClusterNode) *csisupdv1.ClusterNode {
	if in == nil {
		return nil
	}
	return &csisupdv1.ClusterNode{
		Id:                in.Id,
		Name:              in.Name,
		Address:           in.Address,
		Status:            in.Status,
		StatusDescription: in.StatusDescription,
		StatusUpdatedAt:   in.StatusUpdatedAt,
		RegisteredAt:      in.RegisteredAt,
		Plugins:           PluginsToAPI(in.Plugins),
		CreateIndex:       in.CreateIndex,
		ModifyIndex:       in.ModifyIndex,
		DrainingPlugins:   in.DrainingPlugins,
		// The secret's hash never leaves the servers.
		Rekeyed:    in.Rekeyed,
		ReplacedBy: in.ReplacedBy,
	}
}

// PluginsFromAPI converts a list of public plugins to their storage form.
func PluginsFromAPI(in []*csisupdv1.Plugin) []*Plugin { return convertAll(in, PluginFromAPI) }

// PluginsToAPI converts a list of stored plugins to their public form.
func PluginsToAPI(in []*Plugin) []*csisupdv1.Plugin { return convertAll(in, PluginToAPI) }

// ClusterNodesToAPI converts a list of stored nodes to their public form.
func ClusterNodesToAPI(in []*ClusterNode) []*csisupdv1.ClusterNode {
	return convertAll(in, ClusterNodeToAPI)
}

// VolumesToAPI converts a list of stored volumes to their public form.
func VolumesToAPI(in []*Volume) []*csisupdv1.Volume { return convertAll(in, VolumeToAPI) }

// VolumeCapabilitiesFromAPI converts a list of public volume capabilities
// to their storage form.
func VolumeCapabilitiesFromAPI(in []*csisupdv1.VolumeCapability) []*VolumeCapability {
	return convertAll(in, VolumeCapabilityFromAPI)
}

// ACLPoliciesToAPI converts a list of stored ACL policies to their public
// form.
func ACLPoliciesToAPI(in []*ACLPolicy) []*csisupdv1.ACLPolicy { return convertAll(in, ACLPolicyToAPI) }

// PluginFromAPI converts a public plugin instance to its storage form.
func PluginFromAPI(in *csisupdv1.Plugin) *Plugin {
	if in == nil {
		return nil
	}
	return &Plugin{
		Id:                     in.Id,
		Type:                   in.Type,
		Healthy:                in.Healthy,
		HealthState:            in.HealthState,
		HealthDescription:      in.HealthDescription,
		Socket:                 in.Socket,
		VendorName:             in.VendorName,
		VendorVersion:          in.VendorVersion,
		Manifest:               maps.Clone(in.Manifest),
		NodeId:                 in.NodeId,
		MaxVolumes:             in.MaxVolumes,
		AccessibleTopology:     maps.Clone(in.AccessibleTopology),
		PluginCapabilities:     slices.Clone(in.PluginCapabilities),
		ControllerCapabilities: slices.Clone(in.ControllerCapabilities),
		NodeCapabilities:       slices.Clone(in.NodeCapabilities),
		LastProbe:              cloneTime(in.LastProbe),
		RegisteredAt:           cloneTime(in.RegisteredAt),
		HealthSince:            cloneTime(in.HealthSince),
	}
}

// PluginToAPI converts a stored plugin instance to its public form.
func PluginToAPI(in *Plugin) *csisupdv1.Plugin {
	if in == nil {
		return nil
	}
	return &csisupdv1.Plugin{
		Id:                     in.Id,
		Type:                   in.Type,
		Healthy:                in.Healthy,
		HealthState:            in.HealthState,
		HealthDescription:      in.HealthDescription,
		Socket:                 in.Socket,
		VendorName:             in.VendorName,
		VendorVersion:          in.VendorVersion,
		Manifest:               in.Manifest,
		NodeId:                 in.NodeId,
		MaxVolumes:             in.MaxVolumes,
		AccessibleTopology:     in.AccessibleTopology,
		PluginCapabilities:     in.PluginCapabilities,
		ControllerCapabilities: in.ControllerCapabilities,
		NodeCapabilities:       in.NodeCapabilities,
		LastProbe:              in.LastProbe,
		RegisteredAt:           in.RegisteredAt,
		HealthSince:            in.HealthSince,
	}
}

// ACLPolicyFromAPI converts a public ACL policy to its storage row.
func ACLPolicyFromAPI(in *csisupdv1.ACLPolicy) *ACLPolicy {
	if in == nil {
		return nil
	}
	return &ACLPolicy{
		Name:        in.Name,
		Description: in.Description,
		Rules:       in.Rules,
		CreateTime:  cloneTime(in.CreateTime),
		ModifyTime:  cloneTime(in.ModifyTime),
	}
}

// ACLPolicyToAPI converts a stored ACL policy to its public form.
func ACLPolicyToAPI(in *ACLPolicy) *csisupdv1.ACLPolicy {
	if in == nil {
		return nil
	}
	return &csisupdv1.ACLPolicy{
		Name:        in.Name,
		Description: in.Description,
		Rules:       in.Rules,
		CreateTime:  in.CreateTime,
		ModifyTime:  in.ModifyTime,
	}
}

// ACLTokenView returns a stored token as the API shows it: without its
// secret, whose hash is all the state holds.
func ACLTokenView(in *ACLTokenRecord) *csisupdv1.ACLToken {
	if in == nil {
		return nil
	}
	return &csisupdv1.ACLToken{
		AccessorId:   in.AccessorId,
		Name:         in.Name,
		Type:         in.Type,
		Policies:     slices.Clone(in.Policies),
		CreateTime:   cloneTime(in.CreateTime),
		NodeIdentity: in.NodeIdentity,
	}
}

// convertAll converts every element of in with f; nil stays nil.
func convertAll[A, B any](in []A, f func(A) B) []B {
	if in == nil {
		return nil
	}
	out := make([]B, len(in))
	for i, v := range in {
		out[i] = f(v)
	}
	return out
}

// cloneTime copies a timestamp; nil stays nil.
func cloneDuration(d *durationpb.Duration) *durationpb.Duration {
	if d == nil {
		return nil
	}
	return &durationpb.Duration{Seconds: d.Seconds, Nanos: d.Nanos}
}

func cloneTime(t *timestamppb.Timestamp) *timestamppb.Timestamp {
	if t == nil {
		return nil
	}
	return &timestamppb.Timestamp{Seconds: t.Seconds, Nanos: t.Nanos}
}
