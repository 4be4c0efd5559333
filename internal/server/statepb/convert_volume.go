package statepb

import (
	"maps"
	"slices"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// The converters of volumes, their claims, capabilities, expansions,
// conditions and snapshots, as convert.go describes.

// VolumeFromAPI converts a public volume to its storage row.
func VolumeFromAPI(in *csisupdv1.Volume) *Volume {
	if in == nil {
		return nil
	}
	return &Volume{
		Id:                 in.Id,
		PluginId:           in.PluginId,
		ExternalId:         in.ExternalId,
		CapacityBytes:      in.CapacityBytes,
		Context:            maps.Clone(in.Context),
		Parameters:         maps.Clone(in.Parameters),
		Capabilities:       convertAll(in.Capabilities, VolumeCapabilityFromAPI),
		Claims:             convertAll(in.Claims, VolumeClaimFromAPI),
		ControllerNodeId:   in.ControllerNodeId,
		CreatedAt:          cloneTime(in.CreatedAt),
		CreateIndex:        in.CreateIndex,
		ModifyIndex:        in.ModifyIndex,
		AccessibleTopology: convertAll(in.AccessibleTopology, TopologySegmentFromAPI),
		CapacityLimitBytes: in.CapacityLimitBytes,
		ContentSource:      VolumeContentSourceFromAPI(in.ContentSource),
		MutableParameters:  maps.Clone(in.MutableParameters),
		Expansion:          VolumeExpansionFromAPI(in.Expansion),
		Availability:       in.Availability,
		Conditions:         convertAll(in.Conditions, VolumeConditionFromAPI),
		Ephemeral:          in.Ephemeral,
	}
}

// VolumeToAPI converts a stored volume to its public form.
func VolumeToAPI(in *Volume) *csisupdv1.Volume {
	if in == nil {
		return nil
	}
	return &csisupdv1.Volume{
		Id:                 in.Id,
		PluginId:           in.PluginId,
		ExternalId:         in.ExternalId,
		CapacityBytes:      in.CapacityBytes,
		Context:            in.Context,
		Parameters:         in.Parameters,
		Capabilities:       convertAll(in.Capabilities, VolumeCapabilityToAPI),
		Claims:             convertAll(in.Claims, VolumeClaimToAPI),
		ControllerNodeId:   in.ControllerNodeId,
		CreatedAt:          in.CreatedAt,
		CreateIndex:        in.CreateIndex,
		ModifyIndex:        in.ModifyIndex,
		AccessibleTopology: convertAll(in.AccessibleTopology, TopologySegmentToAPI),
		CapacityLimitBytes: in.CapacityLimitBytes,
		ContentSource:      VolumeContentSourceToAPI(in.ContentSource),
		MutableParameters:  in.MutableParameters,
		Expansion:          VolumeExpansionToAPI(in.Expansion),
		Availability:       in.Availability,
		Conditions:         convertAll(in.Conditions, VolumeConditionToAPI),
		Ephemeral:          in.Ephemeral,
	}
}

// VolumeContentSourceFromAPI converts a public content source to its
// storage form.
func VolumeContentSourceFromAPI(in *csisupdv1.VolumeContentSource) *VolumeContentSource {
	if in == nil {
		return nil
	}
	out := &VolumeContentSource{}
	switch s := in.Source.(type) {
	case *csisupdv1.VolumeContentSource_SnapshotId:
		out.Source = &VolumeContentSource_SnapshotId{SnapshotId: s.SnapshotId}
	case *csisupdv1.VolumeContentSource_VolumeId:
		out.Source = &VolumeContentSource_VolumeId{VolumeId: s.VolumeId}
	}
	return out
}

// VolumeContentSourceToAPI converts a stored content source to its public
// form.
func VolumeContentSourceToAPI(in *VolumeContentSource) *csisupdv1.VolumeContentSource {
	if in == nil {
		return nil
	}
	out := &csisupdv1.VolumeContentSource{}
	switch s := in.Source.(type) {
	case *VolumeContentSource_SnapshotId:
		out.Source = &csisupdv1.VolumeContentSource_SnapshotId{SnapshotId: s.SnapshotId}
	case *VolumeContentSource_VolumeId:
		out.Source = &csisupdv1.VolumeContentSource_VolumeId{VolumeId: s.VolumeId}
	}
	return out
}

// VolumeExpansionFromAPI converts a public expansion to its storage form.
func VolumeExpansionFromAPI(in *csisupdv1.VolumeExpansion) *VolumeExpansion {
	if in == nil {
		return nil
	}
	return &VolumeExpansion{
		CapacityBytes: in.CapacityBytes,
		LimitBytes:    in.LimitBytes,
		State:         in.State,
		NodesPending:  slices.Clone(in.NodesPending),
		NodesDone:     slices.Clone(in.NodesDone),
		LastError:     in.LastError,
		StartedAt:     cloneTime(in.StartedAt),
	}
}

// VolumeExpansionToAPI converts a stored expansion to its public form.
func VolumeExpansionToAPI(in *VolumeExpansion) *csisupdv1.VolumeExpansion {
	if in == nil {
		return nil
	}
	return &csisupdv1.VolumeExpansion{
		CapacityBytes: in.CapacityBytes,
		LimitBytes:    in.LimitBytes,
		State:         in.State,
		NodesPending:  in.NodesPending,
		NodesDone:     in.NodesDone,
		LastError:     in.LastError,
		StartedAt:     in.StartedAt,
	}
}

// VolumeConditionFromAPI converts a public volume condition to its
// storage form.
func VolumeConditionFromAPI(in *csisupdv1.VolumeCondition) *VolumeCondition {
	if in == nil {
		return nil
	}
	return &VolumeCondition{Source: in.Source, Message: in.Message, Since: cloneTime(in.Since)}
}

// VolumeConditionToAPI converts a stored volume condition to its public
// form.
func VolumeConditionToAPI(in *VolumeCondition) *csisupdv1.VolumeCondition {
	if in == nil {
		return nil
	}
	return &csisupdv1.VolumeCondition{Source: in.Source, Message: in.Message, Since: in.Since}
}

// VolumeSnapshotView returns the public form of a stored volume snapshot.
// Snapshots were never stored in a public form, so there is no conversion
// back.
func VolumeSnapshotView(in *VolumeSnapshot) *csisupdv1.VolumeSnapshot {
	if in == nil {
		return nil
	}
	return &csisupdv1.VolumeSnapshot{
		Id:                 in.Id,
		PluginId:           in.PluginId,
		SourceVolumeId:     in.SourceVolumeId,
		ExternalId:         in.ExternalId,
		SizeBytes:          in.SizeBytes,
		ReadyToUse:         in.ReadyToUse,
		CreatedAt:          in.CreatedAt,
		ControllerNodeId:   in.ControllerNodeId,
		Parameters:         in.Parameters,
		State:              in.State,
		CreateIndex:        in.CreateIndex,
		ModifyIndex:        in.ModifyIndex,
		AccessibleTopology: convertAll(in.AccessibleTopology, TopologySegmentToAPI),
		LastError:          in.LastError,
	}
}

// VolumeCapabilityFromAPI converts a public volume capability to its
// storage form.
func VolumeCapabilityFromAPI(in *csisupdv1.VolumeCapability) *VolumeCapability {
	if in == nil {
		return nil
	}
	return &VolumeCapability{
		AccessType: in.AccessType,
		AccessMode: in.AccessMode,
		FsType:     in.FsType,
		MountFlags: slices.Clone(in.MountFlags),
	}
}

// VolumeCapabilityToAPI converts a stored volume capability to its public
// form.
func VolumeCapabilityToAPI(in *VolumeCapability) *csisupdv1.VolumeCapability {
	if in == nil {
		return nil
	}
	return &csisupdv1.VolumeCapability{
		AccessType: in.AccessType,
		AccessMode: in.AccessMode,
		FsType:     in.FsType,
		MountFlags: in.MountFlags,
	}
}

// VolumeClaimFromAPI converts a public claim to its storage form.
func VolumeClaimFromAPI(in *csisupdv1.VolumeClaim) *VolumeClaim {
	if in == nil {
		return nil
	}
	return &VolumeClaim{
		NodeId:              in.NodeId,
		CsiNodeId:           in.CsiNodeId,
		ReadOnly:            in.ReadOnly,
		PublishContext:      maps.Clone(in.PublishContext),
		ClaimedAt:           cloneTime(in.ClaimedAt),
		WorkloadId:          in.WorkloadId,
		State:               in.State,
		Usage:               VolumeUsageFromAPI(in.Usage),
		HostPath:            in.HostPath,
		ControllerPublished: in.ControllerPublished,
		Mounted:             in.Mounted,
		NodeGone:            in.NodeGone,
		StateUpdatedAt:      cloneTime(in.StateUpdatedAt),
		LastError:           in.LastError,
		ClaimIndex:          in.ClaimIndex,
		StagingPath:         in.StagingPath,
		Forced:              in.Forced,
		SkippedSteps:        slices.Clone(in.SkippedSteps),
		Owner:               in.Owner,
		ReleaseReason:       in.ReleaseReason,
		LeaseTtl:            cloneDuration(in.LeaseTtl),
	}
}

// VolumeClaimToAPI converts a stored claim to its public form.
func VolumeClaimToAPI(in *VolumeClaim) *csisupdv1.VolumeClaim {
	if in == nil {
		return nil
	}
	return &csisupdv1.VolumeClaim{
		NodeId:              in.NodeId,
		CsiNodeId:           in.CsiNodeId,
		ReadOnly:            in.ReadOnly,
		PublishContext:      in.PublishContext,
		ClaimedAt:           in.ClaimedAt,
		WorkloadId:          in.WorkloadId,
		State:               in.State,
		Usage:               VolumeUsageToAPI(in.Usage),
		HostPath:            in.HostPath,
		ControllerPublished: in.ControllerPublished,
		Mounted:             in.Mounted,
		NodeGone:            in.NodeGone,
		StateUpdatedAt:      in.StateUpdatedAt,
		LastError:           in.LastError,
		ClaimIndex:          in.ClaimIndex,
		StagingPath:         in.StagingPath,
		Forced:              in.Forced,
		SkippedSteps:        in.SkippedSteps,
		Owner:               in.Owner,
		ReleaseReason:       in.ReleaseReason,
		LeaseTtl:            in.LeaseTtl,
	}
}

// VolumeClaimsToAPI converts a list of stored claims to their public form.
func VolumeClaimsToAPI(in []*VolumeClaim) []*csisupdv1.VolumeClaim {
	return convertAll(in, VolumeClaimToAPI)
}

// VolumeUsageFromAPI converts a public volume usage to its storage form.
func VolumeUsageFromAPI(in *csisupdv1.VolumeUsage) *VolumeUsage {
	if in == nil {
		return nil
	}
	return &VolumeUsage{
		AccessMode:       in.AccessMode,
		AccessType:       in.AccessType,
		ReadOnly:         in.ReadOnly,
		FsType:           in.FsType,
		MountFlags:       slices.Clone(in.MountFlags),
		VolumeMountGroup: in.VolumeMountGroup,
	}
}

// VolumeUsageToAPI converts a stored volume usage to its public form.
func VolumeUsageToAPI(in *VolumeUsage) *csisupdv1.VolumeUsage {
	if in == nil {
		return nil
	}
	return &csisupdv1.VolumeUsage{
		AccessMode:       in.AccessMode,
		AccessType:       in.AccessType,
		ReadOnly:         in.ReadOnly,
		FsType:           in.FsType,
		MountFlags:       in.MountFlags,
		VolumeMountGroup: in.VolumeMountGroup,
	}
}

// TopologySegmentFromAPI converts a public topology segment to its storage
// form.
func TopologySegmentFromAPI(in *csisupdv1.TopologySegment) *TopologySegment {
	if in == nil {
		return nil
	}
	return &TopologySegment{Segments: maps.Clone(in.Segments)}
}

// TopologySegmentToAPI converts a stored topology segment to its public
// form.
func TopologySegmentToAPI(in *TopologySegment) *csisupdv1.TopologySegment {
	if in == nil {
		return nil
	}
	return &csisupdv1.TopologySegment{Segments: in.Segments}
}
