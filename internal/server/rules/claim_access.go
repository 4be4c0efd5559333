package rules

import (
	"fmt"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

// Usage returns the usage of a claim request with its defaults: the
// volume's first capability when the request has none; otherwise the
// access type mount and the access mode of the volume's first capability
// where the request leaves them empty.
func Usage(v *statepb.Volume, req *csisupdv1.VolumeClaimRequest) (*statepb.VolumeUsage, error) {
	first := DefaultCapabilities(v.GetCapabilities())[0]
	var u *statepb.VolumeUsage
	if req.GetUsage() == nil {
		u = &statepb.VolumeUsage{
			AccessMode: first.GetAccessMode(), AccessType: first.GetAccessType(),
			FsType: first.GetFsType(), MountFlags: first.GetMountFlags(),
		}
	} else {
		u = statepb.VolumeUsageFromAPI(req.GetUsage())
	}
	if u.AccessType == "" {
		u.AccessType = "mount"
	}
	if u.AccessMode == "" {
		u.AccessMode = first.GetAccessMode()
	}
	if u.AccessMode == "" {
		u.AccessMode = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER.String()
	}
	if _, err := CSICapability(UsageCapability(u)); err != nil {
		return nil, err
	}
	if _, ok := accessModes[u.AccessMode]; !ok {
		return nil, status.Errorf(codes.InvalidArgument, "claim usage: access_mode %q cannot be claimed", u.AccessMode)
	}
	if u.AccessType == "block" && (u.FsType != "" || len(u.MountFlags) > 0 || u.VolumeMountGroup != "") {
		return nil, status.Error(codes.InvalidArgument, "claim usage: fs_type, mount_flags and volume_mount_group are for access_type mount only")
	}
	return u, nil
}

// UsageCapability is the capability a usage asks of the volume.
func UsageCapability(u *statepb.VolumeUsage) *statepb.VolumeCapability {
	return &statepb.VolumeCapability{
		AccessType: u.GetAccessType(), AccessMode: u.GetAccessMode(), FsType: u.GetFsType(), MountFlags: u.GetMountFlags(),
	}
}

// accessRule is what one access mode allows of the claims of a volume.
type accessRule struct {
	// oneNode: every claim is on the same node.
	oneNode bool
	// oneWriter: at most one claim is not read-only.
	oneWriter bool
	// readersOnly: every claim is read-only.
	readersOnly bool
}

// accessModes are the CSI access modes a claim may use.
var accessModes = map[string]accessRule{
	csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER.String():        {oneNode: true, oneWriter: true},
	csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER.String(): {oneNode: true, oneWriter: true},
	csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER.String():  {oneNode: true},
	csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY.String():   {oneNode: true, readersOnly: true},
	csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY.String():    {readersOnly: true},
	csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER.String():  {oneWriter: true},
	csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER.String():   {},
}

// ruleOf returns the rule of a claim's access mode; a mode that is not
// known gets the strictest rule.
func ruleOf(c *statepb.VolumeClaim) (string, accessRule) {
	mode := c.GetUsage().GetAccessMode()
	if r, ok := accessModes[mode]; ok {
		return mode, r
	}
	return mode, accessRule{oneNode: true, oneWriter: true, readersOnly: true}
}

// RW names a claim's read-only flag: read-only or read-write.
func RW(readOnly bool) string {
	if readOnly {
		return "read-only"
	}
	return "read-write"
}

// accessConflict returns why claim c cannot be added next to the existing
// claim old, or "". Both claims' access modes are respected: the stricter
// wins.
func accessConflict(c, old *statepb.VolumeClaim) string {
	for _, cl := range []*statepb.VolumeClaim{c, old} {
		mode, r := ruleOf(cl)
		if defectSingleWriter && c.GetNodeId() != old.GetNodeId() {
			continue
		}
		var why string
		switch {
		case r.oneNode && c.GetNodeId() != old.GetNodeId():
			why = "keeps the volume on one node"
		case r.readersOnly && (!c.GetReadOnly() || !old.GetReadOnly()):
			why = "allows read-only claims only"
		case r.oneWriter && !c.GetReadOnly() && !old.GetReadOnly():
			why = "allows one writer"
		}
		if why != "" {
			oldMode, _ := ruleOf(old)
			return fmt.Sprintf("access mode %s %s, and workload %q holds a claim on node %q (%s, %s, state %s)",
				mode, why, old.GetWorkloadId(), old.GetNodeId(), oldMode, RW(old.GetReadOnly()), old.GetState())
		}
	}
	return ""
}

// CSICapability converts our capability form to CSI's.
func CSICapability(c *statepb.VolumeCapability) (*csi.VolumeCapability, error) {
	mode := csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER
	if c.GetAccessMode() != "" {
		v, ok := csi.VolumeCapability_AccessMode_Mode_value[c.GetAccessMode()]
		if !ok {
			return nil, status.Errorf(codes.InvalidArgument, "capability access_mode %q is not a CSI access mode", c.GetAccessMode())
		}
		mode = csi.VolumeCapability_AccessMode_Mode(v)
	}
	out := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode}}
	switch c.GetAccessType() {
	case "", "mount":
		out.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{
			FsType: c.GetFsType(), MountFlags: c.GetMountFlags(),
		}}
	case "block":
		out.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	default:
		return nil, status.Errorf(codes.InvalidArgument, "capability access_type %q must be mount or block", c.GetAccessType())
	}
	return out, nil
}

// DefaultCapabilities returns caps, or the default of a volume that names
// none: mount, single-node-writer.
func DefaultCapabilities(caps []*statepb.VolumeCapability) []*statepb.VolumeCapability {
	if len(caps) > 0 {
		return caps
	}
	return []*statepb.VolumeCapability{{AccessType: "mount", AccessMode: "SINGLE_NODE_WRITER"}}
}

// nodePlugin returns the plugin instance a node reports for a plugin id,
// or nil.
func nodePlugin(node *statepb.ClusterNode, pluginID string) *statepb.Plugin {
	for _, p := range node.GetPlugins() {
		if p.GetId() == pluginID {
			return p
		}
	}
	return nil
}

// TopologyFits reports whether a node with the topology have can reach a
// volume reachable from segs: have holds every key and value of one
// segment. No segments means everywhere.
func TopologyFits(segs []*statepb.TopologySegment, have map[string]string) bool {
	if len(segs) == 0 {
		return true
	}
	for _, seg := range segs {
		fits := true
		for k, val := range seg.GetSegments() {
			if got, ok := have[k]; !ok || got != val {
				fits = false
				break
			}
		}
		if fits {
			return true
		}
	}
	return false
}
