package volreq

import (
	"errors"
	"fmt"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// MaxTopologySegments caps the accessible topology of a registered volume:
// a segment is one zone or rack a volume is reachable from.
const MaxTopologySegments = 512

// CreateVolume checks a Control.CreateVolume request.
func CreateVolume(req *csisupdv1.VolumeCreateRequest) error {
	return first(
		func() error { return Text("id", req.GetId()) },
		func() error { return Text("plugin_id", req.GetPluginId()) },
		func() error { return Name("name", req.GetName()) },
		func() error {
			return Capacity("capacity_min_bytes", req.GetCapacityMinBytes(), "capacity_max_bytes", req.GetCapacityMaxBytes())
		},
		func() error { return Capabilities("capabilities", req.GetCapabilities()) },
		func() error { return textMap("parameters", req.GetParameters()) },
		func() error { return secrets("secrets", req.GetSecrets()) },
		func() error { return textMap("mutable_parameters", req.GetMutableParameters()) },
		func() error {
			return topology("accessibility_requirements.requisite", req.GetAccessibilityRequirements().GetRequisite())
		},
		func() error {
			return topology("accessibility_requirements.preferred", req.GetAccessibilityRequirements().GetPreferred())
		},
		func() error { return contentSource("content_source", req.GetContentSource()) },
	)
}

// contentSource checks the snapshot or volume id a volume starts from.
func contentSource(field string, src *csisupdv1.VolumeContentSource) error {
	if err := Text(field+".snapshot_id", src.GetSnapshotId()); err != nil {
		return err
	}
	return Text(field+".volume_id", src.GetVolumeId())
}

// ExpandClusterVolume checks a Control.ExpandVolume request.
func ExpandClusterVolume(req *csisupdv1.VolumeExpandRequest) error {
	return first(
		func() error { return Text("id", req.GetId()) },
		func() error {
			return Capacity("capacity_min_bytes", req.GetCapacityMinBytes(), "capacity_max_bytes", req.GetCapacityMaxBytes())
		},
		func() error { return secrets("secrets", req.GetSecrets()) },
	)
}

// ModifyVolume checks a Control.ModifyVolume request.
func ModifyVolume(req *csisupdv1.VolumeModifyRequest) error {
	return first(
		func() error { return Text("id", req.GetId()) },
		func() error { return textMap("mutable_parameters", req.GetMutableParameters()) },
		func() error { return secrets("secrets", req.GetSecrets()) },
	)
}

// CreateSnapshot checks a Control.CreateVolumeSnapshot request.
func CreateSnapshot(req *csisupdv1.VolumeSnapshotCreateRequest) error {
	return first(
		func() error { return Text("volume_id", req.GetVolumeId()) },
		func() error { return Text("id", req.GetId()) },
		func() error { return textMap("parameters", req.GetParameters()) },
		func() error { return secrets("secrets", req.GetSecrets()) },
	)
}

// DeleteSnapshot checks a Control.DeleteVolumeSnapshot request.
func DeleteSnapshot(req *csisupdv1.VolumeSnapshotDeleteRequest) error {
	return first(
		func() error { return Text("id", req.GetId()) },
		func() error { return secrets("secrets", req.GetSecrets()) },
	)
}

// RegisterVolume checks a Control.RegisterVolume request.
func RegisterVolume(req *csisupdv1.VolumeRegisterRequest) error {
	v := req.GetVolume()
	return first(
		func() error { return Text("volume.id", v.GetId()) },
		func() error { return Text("volume.plugin_id", v.GetPluginId()) },
		func() error { return Text("volume.external_id", v.GetExternalId()) },
		func() error { return Text("volume.controller_node_id", v.GetControllerNodeId()) },
		func() error { return NonNegative("volume.capacity_bytes", v.GetCapacityBytes()) },
		func() error { return Capabilities("volume.capabilities", v.GetCapabilities()) },
		func() error { return textMap("volume.parameters", v.GetParameters()) },
		func() error { return textMap("volume.mutable_parameters", v.GetMutableParameters()) },
		func() error { return textMap("volume.context", v.GetContext()) },
		func() error { return topology("volume.accessible_topology", v.GetAccessibleTopology()) },
		func() error { return contentSource("volume.content_source", v.GetContentSource()) },
	)
}

func topology(field string, segs []*csisupdv1.TopologySegment) error {
	if len(segs) > MaxTopologySegments {
		return fmt.Errorf("%s has %d segments, more than the %d allowed", field, len(segs), MaxTopologySegments)
	}
	for i, s := range segs {
		f := fmt.Sprintf("%s[%d].segments", field, i)
		if err := Map(f, s.GetSegments()); err != nil {
			return err
		}
		if err := segment(f, s.GetSegments()); err != nil {
			return err
		}
	}
	return nil
}

// claimant checks the volume, node and workload a claim or release names.
// The node is an id or a name, either of which a caller may mistype.
func claimant(volumeID, nodeID, workloadID string) error {
	return first(
		func() error { return Text("id", volumeID) },
		func() error { return Text("node_id", nodeID) },
		func() error { return Text("workload_id", workloadID) },
	)
}

// ClaimVolume checks a Control.ClaimVolume request at the servers: the
// privileged mount flags pass, for the node's agent to judge. The volume
// it creates (create) is checked as CreateVolume checks its request.
func ClaimVolume(req *csisupdv1.VolumeClaimRequest) error {
	return first(
		func() error { return claimant(req.GetId(), req.GetNodeId(), req.GetWorkloadId()) },
		func() error { return Text("owner", req.GetOwner()) },
		func() error { return Usage("usage", req.GetUsage(), privileged) },
		func() error { return secrets("secrets", req.GetSecrets()) },
		func() error {
			if req.GetCreate() == nil {
				return nil
			}
			if err := CreateVolume(req.GetCreate()); err != nil {
				return fmt.Errorf("create: %w", err)
			}
			return nil
		},
	)
}

// CheckClaim checks a Control.CheckClaim request: its volume, the nodes it
// names (ids or names) and its usage, as ClaimVolume checks a claim's.
func CheckClaim(req *csisupdv1.CheckClaimRequest) error {
	if err := Text("volume_id", req.GetVolumeId()); err != nil {
		return err
	}
	for i, n := range req.GetNodeIds() {
		if err := Text(fmt.Sprintf("node_ids[%d]", i), n); err != nil {
			return err
		}
	}
	return Usage("usage", req.GetUsage(), privileged)
}

// ReleaseVolume checks a Control.ReleaseVolume request.
func ReleaseVolume(req *csisupdv1.VolumeReleaseRequest) error {
	if f := req.GetForce(); f > 2 {
		return fmt.Errorf("force: %d is not 0, 1 (a node that is down or gone) or 2 (also a node that answers)", f)
	}
	if err := claimant(req.GetId(), req.GetNodeId(), req.GetWorkloadId()); err != nil {
		return err
	}
	return secrets("secrets", req.GetSecrets())
}

// DeleteVolume checks a Control.DeleteVolume request.
func DeleteVolume(req *csisupdv1.VolumeDeleteRequest) error {
	if req.GetForce() && !req.GetDeregisterOnly() {
		return errors.New("force: only a deregistration (deregister_only) forgets a volume with claims; a delete must release them first")
	}
	if err := Text("id", req.GetId()); err != nil {
		return err
	}
	return secrets("secrets", req.GetSecrets())
}

// MountVolume checks a NodeVolumes.MountVolume request on the node:
// allowed are the privileged mount flags its operator allows
// (client.allow_mount_flags).
func MountVolume(req *csisupdv1.MountVolumeRequest, allowed []string) error {
	return first(
		func() error { return Usage("usage", req.GetUsage(), allowed) },
		func() error { return Map("volume_context", req.GetVolumeContext()) },
		func() error { return Map("publish_context", req.GetPublishContext()) },
		func() error { return Secrets("secrets", req.GetSecrets()) },
	)
}

// ExpandVolume checks a NodeVolumes.ExpandVolume request.
func ExpandVolume(req *csisupdv1.ExpandVolumeRequest) error {
	return first(
		func() error {
			return Capacity("required_bytes", req.GetRequiredBytes(), "limit_bytes", req.GetLimitBytes())
		},
		func() error { return Secrets("secrets", req.GetSecrets()) },
	)
}

// StorageHealth checks a NodeVolumes.StorageHealth request.
func StorageHealth(req *csisupdv1.StorageHealthRequest) error {
	return Secrets("secrets", req.GetSecrets())
}

// first runs checks in order and returns the first error.
func first(checks ...func() error) error {
	for _, check := range checks {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}
