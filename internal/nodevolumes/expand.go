package nodevolumes

import (
	"context"
	"slices"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
)

// Expand calls NodeExpandVolume on a published mount of the volume: the
// workload's, or any when the request names none.
func (m *Manager) Expand(ctx context.Context, req *csisupdv1.ExpandVolumeRequest) (*csisupdv1.ExpandVolumeResponse, error) {
	r, unlock, err := m.publishedMount(ctx, methodExpand, plugin.CapExpandVolume, req.GetPluginId(), req.GetVolumeId(), req.GetWorkloadId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	ereq := &csi.NodeExpandVolumeRequest{
		VolumeId:          r.ExternalID,
		VolumePath:        r.PluginPath,
		StagingTargetPath: r.PluginStagingPath,
		VolumeCapability:  r.Usage.capability(),
		Secrets:           req.GetSecrets(),
	}
	if req.GetRequiredBytes() != 0 || req.GetLimitBytes() != 0 {
		ereq.CapacityRange = &csi.CapacityRange{RequiredBytes: req.GetRequiredBytes(), LimitBytes: req.GetLimitBytes()}
	}
	resp, err := call(ctx, m, r.PluginID, methodExpand, "NodeExpandVolume", ereq, csi.NodeClient.NodeExpandVolume)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.ExpandVolumeResponse{CapacityBytes: resp.GetCapacityBytes()}, nil
}

// Stats calls NodeGetVolumeStats on a published mount of the volume: the
// workload's, or any when the request names none.
func (m *Manager) Stats(ctx context.Context, req *csisupdv1.VolumeStatsRequest) (*csisupdv1.VolumeStatsResponse, error) {
	r, unlock, err := m.publishedMount(ctx, methodStats, plugin.CapGetVolumeStats, req.GetPluginId(), req.GetVolumeId(), req.GetWorkloadId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	sreq := &csi.NodeGetVolumeStatsRequest{VolumeId: r.ExternalID, VolumePath: r.PluginPath, StagingTargetPath: r.PluginStagingPath}
	resp, err := call(ctx, m, r.PluginID, methodStats, "NodeGetVolumeStats", sreq, csi.NodeClient.NodeGetVolumeStats)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.VolumeStatsResponse{Response: resp, VolumePath: r.HostPath}, nil
}

// VolumeHealth calls NodeGetVolumeHealth on a published mount of the
// volume, the workload's or any when the request names none, with the
// mount's publish and staging paths as Stats does.
func (m *Manager) VolumeHealth(ctx context.Context, req *csisupdv1.VolumeHealthRequest) (*csisupdv1.VolumeHealthResponse, error) {
	r, unlock, err := m.publishedMount(ctx, methodVolumeHealth, plugin.CapGetVolumeHealth, req.GetPluginId(), req.GetVolumeId(), req.GetWorkloadId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	hreq := &csi.NodeGetVolumeHealthRequest{VolumeId: r.ExternalID, VolumePublishPath: r.PluginPath, StagingTargetPath: r.PluginStagingPath}
	resp, err := call(ctx, m, r.PluginID, methodVolumeHealth, "NodeGetVolumeHealth", hreq, csi.NodeClient.NodeGetVolumeHealth)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.VolumeHealthResponse{Response: resp, VolumePath: r.HostPath}, nil
}

// StorageHealth calls NodeGetStorageHealth on a plugin: the health of the
// storage it reaches from this node. It needs no mount and takes no
// volume lock.
func (m *Manager) StorageHealth(ctx context.Context, req *csisupdv1.StorageHealthRequest) (*csisupdv1.StorageHealthResponse, error) {
	if err := checkID("plugin_id", req.GetPluginId()); err != nil {
		return nil, err
	}
	if _, err := m.resolve(req.GetPluginId(), methodStorageHealth, plugin.CapGetStorageHealth); err != nil {
		return nil, err
	}
	sreq := &csi.NodeGetStorageHealthRequest{Secrets: req.GetSecrets()}
	resp, err := call(ctx, m, req.GetPluginId(), methodStorageHealth, "NodeGetStorageHealth", sreq, csi.NodeClient.NodeGetStorageHealth)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.StorageHealthResponse{Response: resp}, nil
}

// publishedMount checks the request, the plugin and its capability, takes
// the volume's lock and returns the first published mount of the volume
// (of the workload, when set) with the function that releases the lock.
func (m *Manager) publishedMount(ctx context.Context, method, capability, pluginID, volumeID, workloadID string) (*record, func(), error) {
	if err := checkID("plugin_id", pluginID); err != nil {
		return nil, nil, err
	}
	if err := checkID("volume_id", volumeID); err != nil {
		return nil, nil, err
	}
	if workloadID != "" {
		if err := checkID("workload_id", workloadID); err != nil {
			return nil, nil, err
		}
	}
	if _, err := m.resolve(pluginID, method, capability); err != nil {
		return nil, nil, err
	}
	unlock, err := m.lockVolume(ctx, pluginID, volumeID)
	if err != nil {
		return nil, nil, err
	}
	var found []*record
	m.mu.Lock()
	for _, r := range m.records {
		if r.PluginID == pluginID && r.VolumeID == volumeID && r.State == StatePublished &&
			(workloadID == "" || r.WorkloadID == workloadID) {
			found = append(found, r.clone())
		}
	}
	m.mu.Unlock()
	if len(found) == 0 {
		unlock()
		if workloadID != "" {
			return nil, nil, status.Errorf(codes.NotFound, "volume %q of plugin %q is not mounted for workload %q", volumeID, pluginID, workloadID)
		}
		return nil, nil, status.Errorf(codes.NotFound, "volume %q of plugin %q is not mounted", volumeID, pluginID)
	}
	slices.SortFunc(found, compareRecords)
	return found[0], unlock, nil
}
