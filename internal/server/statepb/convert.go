package statepb

import (
	"maps"
	"slices"

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

// LogEntryFromAPI converts a public log entry to its storage form. A
// command this package does not know is dropped; the round-trip test keeps
// the two lists of commands equal.
func LogEntryFromAPI(in *csisupdv1.LogEntry) *LogEntry {
	if in == nil {
		return nil
	}
	out := &LogEntry{Time: cloneTime(in.Time)}
	switch c := in.Command.(type) {
	case *csisupdv1.LogEntry_NodeUpsert:
		out.Command = &LogEntry_NodeUpsert{NodeUpsert: ClusterNodeFromAPI(c.NodeUpsert)}
	case *csisupdv1.LogEntry_NodePlugins:
		out.Command = &LogEntry_NodePlugins{NodePlugins: NodePluginsCommandFromAPI(c.NodePlugins)}
	case *csisupdv1.LogEntry_NodeStatus:
		out.Command = &LogEntry_NodeStatus{NodeStatus: NodeStatusCommandFromAPI(c.NodeStatus)}
	case *csisupdv1.LogEntry_VolumeUpsert:
		out.Command = &LogEntry_VolumeUpsert{VolumeUpsert: VolumeFromAPI(c.VolumeUpsert)}
	case *csisupdv1.LogEntry_VolumeDelete:
		out.Command = &LogEntry_VolumeDelete{VolumeDelete: c.VolumeDelete}
	case *csisupdv1.LogEntry_ServerUpsert:
		out.Command = &LogEntry_ServerUpsert{ServerUpsert: ServerRecordFromAPI(c.ServerUpsert)}
	case *csisupdv1.LogEntry_Batch:
		out.Command = &LogEntry_Batch{Batch: LogBatchFromAPI(c.Batch)}
	case *csisupdv1.LogEntry_Noop:
		out.Command = &LogEntry_Noop{Noop: slices.Clone(c.Noop)}
	case *csisupdv1.LogEntry_AclPolicyUpsert:
		out.Command = &LogEntry_AclPolicyUpsert{AclPolicyUpsert: ACLPolicyFromAPI(c.AclPolicyUpsert)}
	case *csisupdv1.LogEntry_AclPolicyDelete:
		out.Command = &LogEntry_AclPolicyDelete{AclPolicyDelete: c.AclPolicyDelete}
	case *csisupdv1.LogEntry_AclTokenUpsert:
		out.Command = &LogEntry_AclTokenUpsert{AclTokenUpsert: ACLTokenRecordFromAPI(c.AclTokenUpsert)}
	case *csisupdv1.LogEntry_AclTokenDelete:
		out.Command = &LogEntry_AclTokenDelete{AclTokenDelete: c.AclTokenDelete}
	case *csisupdv1.LogEntry_AclBootstrap:
		out.Command = &LogEntry_AclBootstrap{AclBootstrap: ACLBootstrapCommandFromAPI(c.AclBootstrap)}
	}
	return out
}

// LogEntryToAPI converts a stored log entry to its public form.
func LogEntryToAPI(in *LogEntry) *csisupdv1.LogEntry {
	if in == nil {
		return nil
	}
	out := &csisupdv1.LogEntry{Time: in.Time}
	switch c := in.Command.(type) {
	case *LogEntry_NodeUpsert:
		out.Command = &csisupdv1.LogEntry_NodeUpsert{NodeUpsert: ClusterNodeToAPI(c.NodeUpsert)}
	case *LogEntry_NodePlugins:
		out.Command = &csisupdv1.LogEntry_NodePlugins{NodePlugins: NodePluginsCommandToAPI(c.NodePlugins)}
	case *LogEntry_NodeStatus:
		out.Command = &csisupdv1.LogEntry_NodeStatus{NodeStatus: NodeStatusCommandToAPI(c.NodeStatus)}
	case *LogEntry_VolumeUpsert:
		out.Command = &csisupdv1.LogEntry_VolumeUpsert{VolumeUpsert: VolumeToAPI(c.VolumeUpsert)}
	case *LogEntry_VolumeDelete:
		out.Command = &csisupdv1.LogEntry_VolumeDelete{VolumeDelete: c.VolumeDelete}
	case *LogEntry_ServerUpsert:
		out.Command = &csisupdv1.LogEntry_ServerUpsert{ServerUpsert: ServerRecordToAPI(c.ServerUpsert)}
	case *LogEntry_Batch:
		out.Command = &csisupdv1.LogEntry_Batch{Batch: LogBatchToAPI(c.Batch)}
	case *LogEntry_Noop:
		out.Command = &csisupdv1.LogEntry_Noop{Noop: c.Noop}
	case *LogEntry_AclPolicyUpsert:
		out.Command = &csisupdv1.LogEntry_AclPolicyUpsert{AclPolicyUpsert: ACLPolicyToAPI(c.AclPolicyUpsert)}
	case *LogEntry_AclPolicyDelete:
		out.Command = &csisupdv1.LogEntry_AclPolicyDelete{AclPolicyDelete: c.AclPolicyDelete}
	case *LogEntry_AclTokenUpsert:
		out.Command = &csisupdv1.LogEntry_AclTokenUpsert{AclTokenUpsert: ACLTokenRecordToAPI(c.AclTokenUpsert)}
	case *LogEntry_AclTokenDelete:
		out.Command = &csisupdv1.LogEntry_AclTokenDelete{AclTokenDelete: c.AclTokenDelete}
	case *LogEntry_AclBootstrap:
		out.Command = &csisupdv1.LogEntry_AclBootstrap{AclBootstrap: ACLBootstrapCommandToAPI(c.AclBootstrap)}
	}
	return out
}

// LogBatchFromAPI converts a public batch to its storage form.
func LogBatchFromAPI(in *csisupdv1.LogBatch) *LogBatch {
	if in == nil {
		return nil
	}
	return &LogBatch{Entries: convertAll(in.Entries, LogEntryFromAPI)}
}

// LogBatchToAPI converts a stored batch to its public form.
func LogBatchToAPI(in *LogBatch) *csisupdv1.LogBatch {
	if in == nil {
		return nil
	}
	return &csisupdv1.LogBatch{Entries: convertAll(in.Entries, LogEntryToAPI)}
}

// NodePluginsCommandFromAPI converts a public node plugins command to its
// storage form.
func NodePluginsCommandFromAPI(in *csisupdv1.NodePluginsCommand) *NodePluginsCommand {
	if in == nil {
		return nil
	}
	return &NodePluginsCommand{NodeId: in.NodeId, Plugins: PluginsFromAPI(in.Plugins)}
}

// NodePluginsCommandToAPI converts a stored node plugins command to its
// public form.
func NodePluginsCommandToAPI(in *NodePluginsCommand) *csisupdv1.NodePluginsCommand {
	if in == nil {
		return nil
	}
	return &csisupdv1.NodePluginsCommand{NodeId: in.NodeId, Plugins: PluginsToAPI(in.Plugins)}
}

// NodeStatusCommandFromAPI converts a public node status command to its
// storage form.
func NodeStatusCommandFromAPI(in *csisupdv1.NodeStatusCommand) *NodeStatusCommand {
	if in == nil {
		return nil
	}
	return &NodeStatusCommand{NodeId: in.NodeId, Status: in.Status, Description: in.Description}
}

// NodeStatusCommandToAPI converts a stored node status command to its
// public form.
func NodeStatusCommandToAPI(in *NodeStatusCommand) *csisupdv1.NodeStatusCommand {
	if in == nil {
		return nil
	}
	return &csisupdv1.NodeStatusCommand{NodeId: in.NodeId, Status: in.Status, Description: in.Description}
}

// StateSnapshotFromAPI converts a public state snapshot to its storage
// form.
func StateSnapshotFromAPI(in *csisupdv1.StateSnapshot) *StateSnapshot {
	if in == nil {
		return nil
	}
	return &StateSnapshot{
		Version:           in.Version,
		Nodes:             convertAll(in.Nodes, ClusterNodeFromAPI),
		Volumes:           convertAll(in.Volumes, VolumeFromAPI),
		Servers:           convertAll(in.Servers, ServerRecordFromAPI),
		Index:             in.Index,
		AclPolicies:       convertAll(in.AclPolicies, ACLPolicyFromAPI),
		AclTokens:         convertAll(in.AclTokens, ACLTokenRecordFromAPI),
		AclBootstrapIndex: in.AclBootstrapIndex,
	}
}

// StateSnapshotToAPI converts a stored state snapshot to its public form.
func StateSnapshotToAPI(in *StateSnapshot) *csisupdv1.StateSnapshot {
	if in == nil {
		return nil
	}
	return &csisupdv1.StateSnapshot{
		Version:           in.Version,
		Nodes:             convertAll(in.Nodes, ClusterNodeToAPI),
		Volumes:           convertAll(in.Volumes, VolumeToAPI),
		Servers:           convertAll(in.Servers, ServerRecordToAPI),
		Index:             in.Index,
		AclPolicies:       convertAll(in.AclPolicies, ACLPolicyToAPI),
		AclTokens:         convertAll(in.AclTokens, ACLTokenRecordToAPI),
		AclBootstrapIndex: in.AclBootstrapIndex,
	}
}

// ServerRecordFromAPI converts a public server record to its storage form.
func ServerRecordFromAPI(in *csisupdv1.ServerRecord) *ServerRecord {
	if in == nil {
		return nil
	}
	return &ServerRecord{Id: in.Id, RaftAddress: in.RaftAddress, RpcAddress: in.RpcAddress}
}

// ServerRecordToAPI converts a stored server record to its public form.
func ServerRecordToAPI(in *ServerRecord) *csisupdv1.ServerRecord {
	if in == nil {
		return nil
	}
	return &csisupdv1.ServerRecord{Id: in.Id, RaftAddress: in.RaftAddress, RpcAddress: in.RpcAddress}
}

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

// ACLTokenRecordFromAPI converts a public token record to its storage row.
func ACLTokenRecordFromAPI(in *csisupdv1.ACLTokenRecord) *ACLTokenRecord {
	if in == nil {
		return nil
	}
	return &ACLTokenRecord{
		AccessorId:   in.AccessorId,
		SecretHash:   slices.Clone(in.SecretHash),
		Name:         in.Name,
		Type:         in.Type,
		Policies:     slices.Clone(in.Policies),
		CreateTime:   cloneTime(in.CreateTime),
		NodeIdentity: in.NodeIdentity,
	}
}

// ACLTokenRecordToAPI converts a stored token record to its public form.
func ACLTokenRecordToAPI(in *ACLTokenRecord) *csisupdv1.ACLTokenRecord {
	if in == nil {
		return nil
	}
	return &csisupdv1.ACLTokenRecord{
		AccessorId:   in.AccessorId,
		SecretHash:   in.SecretHash,
		Name:         in.Name,
		Type:         in.Type,
		Policies:     in.Policies,
		CreateTime:   in.CreateTime,
		NodeIdentity: in.NodeIdentity,
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

// ACLBootstrapCommandFromAPI converts a public ACL bootstrap command to
// its storage form.
func ACLBootstrapCommandFromAPI(in *csisupdv1.ACLBootstrapCommand) *ACLBootstrapCommand {
	if in == nil {
		return nil
	}
	return &ACLBootstrapCommand{Token: ACLTokenRecordFromAPI(in.Token), ResetIndex: in.ResetIndex}
}

// ACLBootstrapCommandToAPI converts a stored ACL bootstrap command to its
// public form.
func ACLBootstrapCommandToAPI(in *ACLBootstrapCommand) *csisupdv1.ACLBootstrapCommand {
	if in == nil {
		return nil
	}
	return &csisupdv1.ACLBootstrapCommand{Token: ACLTokenRecordToAPI(in.Token), ResetIndex: in.ResetIndex}
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
func cloneTime(t *timestamppb.Timestamp) *timestamppb.Timestamp {
	if t == nil {
		return nil
	}
	return &timestamppb.Timestamp{Seconds: t.Seconds, Nanos: t.Nanos}
}
