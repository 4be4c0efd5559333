package fingerprint

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csisupd/csisupd/internal/plugin"
)

// Fingerprint is what a plugin reports about itself.
type Fingerprint struct {
	VendorName             string            `json:"vendor_name"`
	VendorVersion          string            `json:"vendor_version"`
	Manifest               map[string]string `json:"manifest,omitempty"`
	Type                   plugin.Type       `json:"type"`
	PluginCapabilities     []string          `json:"plugin_capabilities"`
	ControllerCapabilities []string          `json:"controller_capabilities"`
	NodeCapabilities       []string          `json:"node_capabilities"`
	NodeID                 string            `json:"node_id"`
	MaxVolumes             int64             `json:"max_volumes"`
	AccessibleTopology     map[string]string `json:"accessible_topology"`
}

// Clients are the CSI services Take talks to.
type Clients struct {
	Identity   csi.IdentityClient
	Controller csi.ControllerClient
	Node       csi.NodeClient
}

// Equal reports whether two fingerprints describe the same plugin identity
// and abilities.
func (f Fingerprint) Equal(o Fingerprint) bool {
	return f.VendorName == o.VendorName &&
		f.VendorVersion == o.VendorVersion &&
		maps.Equal(f.Manifest, o.Manifest) &&
		f.Type == o.Type &&
		slices.Equal(f.PluginCapabilities, o.PluginCapabilities) &&
		slices.Equal(f.ControllerCapabilities, o.ControllerCapabilities) &&
		slices.Equal(f.NodeCapabilities, o.NodeCapabilities) &&
		f.NodeID == o.NodeID &&
		f.MaxVolumes == o.MaxVolumes &&
		maps.Equal(f.AccessibleTopology, o.AccessibleTopology)
}

// Diff names the fields that differ between f and o, for event descriptions.
func (f Fingerprint) Diff(o Fingerprint) []string {
	var d []string
	add := func(name string, differs bool) {
		if differs {
			d = append(d, name)
		}
	}
	add("vendor_name", f.VendorName != o.VendorName)
	add("vendor_version", f.VendorVersion != o.VendorVersion)
	add("manifest", !maps.Equal(f.Manifest, o.Manifest))
	add("type", f.Type != o.Type)
	add("plugin_capabilities", !slices.Equal(f.PluginCapabilities, o.PluginCapabilities))
	add("controller_capabilities", !slices.Equal(f.ControllerCapabilities, o.ControllerCapabilities))
	add("node_capabilities", !slices.Equal(f.NodeCapabilities, o.NodeCapabilities))
	add("node_id", f.NodeID != o.NodeID)
	add("max_volumes", f.MaxVolumes != o.MaxVolumes)
	add("accessible_topology", !maps.Equal(f.AccessibleTopology, o.AccessibleTopology))
	return d
}

// HasControllerCapability reports whether the plugin advertised the named
// controller capability (for example "PUBLISH_UNPUBLISH_VOLUME").
func (f Fingerprint) HasControllerCapability(name string) bool {
	return slices.Contains(f.ControllerCapabilities, name)
}

// Take fingerprints a plugin. Each call carries ctx's deadline. An error
// names the CSI call that failed and wraps its gRPC status; a plugin that
// is not a CSI server fails at GetPluginInfo. An empty plugin name or an
// empty node ID from a node plugin is an error: both are required by CSI.
func Take(ctx context.Context, c Clients) (Fingerprint, error) {
	fp := Fingerprint{Type: plugin.TypeUnknown}

	info, err := c.Identity.GetPluginInfo(ctx, &csi.GetPluginInfoRequest{})
	if err != nil {
		if status.Code(err) == codes.Unimplemented {
			return fp, fmt.Errorf("GetPluginInfo: socket does not serve the CSI Identity service: %w", err)
		}
		return fp, fmt.Errorf("GetPluginInfo: %w", err)
	}
	if info.GetName() == "" {
		return fp, errors.New("GetPluginInfo: plugin returned an empty name")
	}
	fp.VendorName = info.GetName()
	fp.VendorVersion = info.GetVendorVersion()
	if len(info.GetManifest()) > 0 {
		fp.Manifest = maps.Clone(info.GetManifest())
	}

	pcaps, err := c.Identity.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	if err != nil {
		return fp, fmt.Errorf("GetPluginCapabilities: %w", err)
	}
	hasController := false
	for _, pc := range pcaps.GetCapabilities() {
		if svc := pc.GetService(); svc != nil {
			if svc.GetType() == csi.PluginCapability_Service_CONTROLLER_SERVICE {
				hasController = true
			}
			fp.PluginCapabilities = append(fp.PluginCapabilities, svc.GetType().String())
		}
		if exp := pc.GetVolumeExpansion(); exp != nil {
			fp.PluginCapabilities = append(fp.PluginCapabilities, "VOLUME_EXPANSION_"+exp.GetType().String())
		}
	}
	fp.PluginCapabilities = sortedUnique(fp.PluginCapabilities)

	if hasController {
		ccaps, err := c.Controller.ControllerGetCapabilities(ctx, &csi.ControllerGetCapabilitiesRequest{})
		if err != nil {
			return fp, fmt.Errorf("ControllerGetCapabilities: %w", err)
		}
		for _, cc := range ccaps.GetCapabilities() {
			if rpc := cc.GetRpc(); rpc != nil {
				fp.ControllerCapabilities = append(fp.ControllerCapabilities, rpc.GetType().String())
			}
		}
		fp.ControllerCapabilities = sortedUnique(fp.ControllerCapabilities)
	}

	isNode := false
	ninfo, err := c.Node.NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})
	switch {
	case err == nil:
		if ninfo.GetNodeId() == "" {
			// The node ID is required by the CSI spec; without it no volume
			// can ever be published to this node.
			return fp, errors.New("NodeGetInfo: plugin returned an empty node_id")
		}
		isNode = true
		fp.NodeID = ninfo.GetNodeId()
		fp.MaxVolumes = ninfo.GetMaxVolumesPerNode()
		if t := ninfo.GetAccessibleTopology(); t != nil && len(t.GetSegments()) > 0 {
			fp.AccessibleTopology = maps.Clone(t.GetSegments())
		}
	case status.Code(err) == codes.Unimplemented:
		// Not a node plugin.
	default:
		return fp, fmt.Errorf("NodeGetInfo: %w", err)
	}

	if isNode {
		ncaps, err := c.Node.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
		if err != nil {
			return fp, fmt.Errorf("NodeGetCapabilities: %w", err)
		}
		for _, nc := range ncaps.GetCapabilities() {
			if rpc := nc.GetRpc(); rpc != nil {
				fp.NodeCapabilities = append(fp.NodeCapabilities, rpc.GetType().String())
			}
		}
		fp.NodeCapabilities = sortedUnique(fp.NodeCapabilities)
	}

	fp.Type = plugin.TypeOf(hasController, isNode)
	return fp, nil
}

func sortedUnique(s []string) []string {
	s = slices.DeleteFunc(s, func(v string) bool { return v == "" || strings.HasSuffix(v, "UNKNOWN") })
	slices.Sort(s)
	return slices.Compact(s)
}
