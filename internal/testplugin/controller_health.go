package testplugin

import (
	"context"
	"maps"
	"slices"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ControllerGetVolumeHealth reports the conditions set with
// Plugin.SetVolumeHealth for an existing volume; none when it is healthy.
func (s *controllerServer) ControllerGetVolumeHealth(_ context.Context, req *csi.ControllerGetVolumeHealthRequest) (*csi.ControllerGetVolumeHealthResponse, error) {
	// CSI: LIST_VOLUME_HEALTH also obliges the plugin to this call.
	if s.require(csi.ControllerServiceCapability_RPC_GET_VOLUME_HEALTH) != nil {
		if err := s.require(csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH); err != nil {
			return nil, err
		}
	}
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	st := s.p.st
	st.mu.Lock()
	_, ok := st.volumes[req.GetVolumeId()]
	st.mu.Unlock()
	if !ok {
		return nil, status.Errorf(codes.NotFound, "volume %q does not exist", req.GetVolumeId())
	}
	return &csi.ControllerGetVolumeHealthResponse{VolumeHealth: s.p.volumeHealth(req.GetVolumeId(), s.p.fileConditions())}, nil
}

// ControllerListVolumeHealth lists, in pages ordered by volume id, the
// existing volumes that have adverse conditions; CSI says healthy volumes
// should be left out.
func (s *controllerServer) ControllerListVolumeHealth(_ context.Context, req *csi.ControllerListVolumeHealthRequest) (*csi.ControllerListVolumeHealthResponse, error) {
	if err := s.require(csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH); err != nil {
		return nil, err
	}
	after, err := parseToken(req.GetStartingToken(), req.GetMaxEntries())
	if err != nil {
		return nil, err
	}
	st := s.p.st
	st.mu.Lock()
	ids := slices.Collect(maps.Keys(st.volumes))
	st.mu.Unlock()
	conditions := s.p.fileConditions()
	var sick []string
	for _, id := range ids {
		if len(s.p.volumeHealth(id, conditions).GetHealthStatuses()) > 0 {
			sick = append(sick, id)
		}
	}
	sick, next := page(sick, after, req.GetMaxEntries())
	resp := &csi.ControllerListVolumeHealthResponse{NextToken: next}
	for _, id := range sick {
		resp.Entries = append(resp.Entries, s.p.volumeHealth(id, conditions))
	}
	return resp, nil
}
