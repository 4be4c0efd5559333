package testplugin

import (
	"context"
	"slices"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// identityServer is the CSI Identity service.
type identityServer struct {
	csi.UnimplementedIdentityServer
	p *Plugin
}

// GetPluginInfo reports the configured name and vendor version.
func (s *identityServer) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{
		Name:          s.p.cfg.Name,
		VendorVersion: s.p.cfg.VendorVersion,
	}, nil
}

// GetPluginCapabilities reports CONTROLLER_SERVICE for controller and
// monolith plugins, VOLUME_ACCESSIBILITY_CONSTRAINTS when a topology is set
// (Config.Topology or Config.NodeLocal), and the volume expansion of
// Config.Expansion: ONLINE when the plugin can expand volumes, OFFLINE, or
// none.
func (s *identityServer) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	var caps []*csi.PluginCapability
	service := func(t csi.PluginCapability_Service_Type) {
		caps = append(caps, &csi.PluginCapability{Type: &csi.PluginCapability_Service_{
			Service: &csi.PluginCapability_Service{Type: t},
		}})
	}
	if s.p.hasCtrl {
		service(csi.PluginCapability_Service_CONTROLLER_SERVICE)
	}
	if len(s.p.topology) > 0 {
		service(csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS)
	}
	expansion := func(t csi.PluginCapability_VolumeExpansion_Type) {
		caps = append(caps, &csi.PluginCapability{Type: &csi.PluginCapability_VolumeExpansion_{
			VolumeExpansion: &csi.PluginCapability_VolumeExpansion{Type: t},
		}})
	}
	switch s.p.cfg.Expansion {
	case ExpansionOffline:
		expansion(csi.PluginCapability_VolumeExpansion_OFFLINE)
	case ExpansionOnline:
		// ONLINE needs the controller or the node EXPAND_VOLUME capability.
		if s.p.hasNode || slices.Contains(s.p.caps, csi.ControllerServiceCapability_RPC_EXPAND_VOLUME) {
			expansion(csi.PluginCapability_VolumeExpansion_ONLINE)
		}
	}
	return &csi.GetPluginCapabilitiesResponse{Capabilities: caps}, nil
}

// Probe answers according to the probe faults: hang until the call ends,
// delay, fail with a code, or report not ready.
func (s *identityServer) Probe(ctx context.Context, _ *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	f := s.p.currentFaults()
	if f.ProbeHang {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if err := sleep(ctx, f.ProbeDelay); err != nil {
		return nil, err
	}
	if f.ProbeError != codes.OK {
		return nil, status.Errorf(f.ProbeError, "testplugin: injected probe error %s", f.ProbeError)
	}
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(!f.ProbeNotReady)}, nil
}
