package testplugin

import (
	"fmt"
	"maps"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// supportedModes are the access modes of the plugin's volumes.
var supportedModes = map[csi.VolumeCapability_AccessMode_Mode]bool{
	csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER:       true,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY:  true,
	csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY:   true,
	csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER: true,
	csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER:  true,
}

// singleNode reports whether mode allows only one node at a time.
func singleNode(mode int32) bool {
	m := csi.VolumeCapability_AccessMode_Mode(mode)
	return m == csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER ||
		m == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY
}

// capabilityProblem says why the plugin cannot serve c, or "" when it can.
// Volumes are directories: mount access with any file system type, no block
// access.
func capabilityProblem(c *csi.VolumeCapability) string {
	if c == nil {
		return "volume capability is empty"
	}
	mode := c.GetAccessMode().GetMode()
	if mode == csi.VolumeCapability_AccessMode_UNKNOWN {
		return "volume capability has no access mode"
	}
	if !supportedModes[mode] {
		return fmt.Sprintf("access mode %s is not supported", mode)
	}
	switch c.GetAccessType().(type) {
	case *csi.VolumeCapability_Mount:
		return ""
	case *csi.VolumeCapability_Block:
		return "block access is not supported: volumes are directories"
	default:
		return "volume capability has no access type"
	}
}

// checkCapabilities returns InvalidArgument unless caps is a non-empty list
// of capabilities the plugin can serve.
func checkCapabilities(caps []*csi.VolumeCapability) error {
	if len(caps) == 0 {
		return status.Error(codes.InvalidArgument, "volume_capabilities is required")
	}
	for _, c := range caps {
		if problem := capabilityProblem(c); problem != "" {
			return status.Error(codes.InvalidArgument, problem)
		}
	}
	return nil
}

// checkCapability returns InvalidArgument unless c is set and servable.
func checkCapability(c *csi.VolumeCapability) error {
	if c == nil {
		return status.Error(codes.InvalidArgument, "volume_capability is required")
	}
	if problem := capabilityProblem(c); problem != "" {
		return status.Error(codes.InvalidArgument, problem)
	}
	return nil
}

// requestedSize turns a capacity range into a size: the required bytes, else
// the limit, else def. It returns InvalidArgument for a malformed range.
func requestedSize(r *csi.CapacityRange, def int64) (int64, error) {
	req, limit := r.GetRequiredBytes(), r.GetLimitBytes()
	switch {
	case req < 0 || limit < 0:
		return 0, status.Errorf(codes.InvalidArgument, "capacity range %d..%d is negative", req, limit)
	case limit > 0 && req > limit:
		return 0, status.Errorf(codes.InvalidArgument, "capacity range: required_bytes %d exceeds limit_bytes %d", req, limit)
	case req > 0:
		return req, nil
	case limit > 0:
		return min(def, limit), nil
	}
	return def, nil
}

// fits reports whether size satisfies the capacity range r.
func fits(size int64, r *csi.CapacityRange) bool {
	return size >= r.GetRequiredBytes() && (r.GetLimitBytes() == 0 || size <= r.GetLimitBytes())
}

// topologyMatches reports whether segment t names the plugin's topology:
// every key of t has the plugin's value.
func (p *Plugin) topologyMatches(t *csi.Topology) bool {
	for k, v := range t.GetSegments() {
		if p.topology[k] != v {
			return false
		}
	}
	return true
}

// accessible returns the plugin's topology as a CSI list, or nil.
func (p *Plugin) accessible() []*csi.Topology {
	if len(p.topology) == 0 {
		return nil
	}
	return []*csi.Topology{{Segments: maps.Clone(p.topology)}}
}
