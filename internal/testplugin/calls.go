package testplugin

import (
	"maps"
	"slices"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
)

// Stats counts calls by method name (for example "ControllerPublishVolume").
// Only calls to registered services are counted.
type Stats struct {
	// Calls is the number of calls received, including failed ones.
	Calls map[string]int64
	// InFlight is the number of calls running now.
	InFlight map[string]int64
	// MaxInFlight is the highest number of calls that ran at the same time.
	MaxInFlight map[string]int64
}

// maxNodeLog bounds the node call log; older calls are dropped.
const maxNodeLog = 10000

// NodeCall is one successful node call that changes a volume on the
// node: NodeStageVolume, NodeUnstageVolume, NodePublishVolume,
// NodeUnpublishVolume or NodeExpandVolume, as the plugin received it.
type NodeCall struct {
	Method   string
	VolumeID string
	// Path is the staging target path of stage and unstage calls, the
	// target path of publish and unpublish calls and the volume_path of
	// expand calls.
	Path string
	// StagingPath is the staging target path of a publish or expand call.
	StagingPath string
	// MountGroup is the volume_mount_group of a stage or publish call.
	MountGroup string
	// RequiredBytes and LimitBytes are the capacity range of an expand
	// call.
	RequiredBytes, LimitBytes int64
}

// NodeLog returns the successful node calls in the order they ended, the
// oldest first (at most the last 10000).
func (p *Plugin) NodeLog() []NodeCall {
	p.statsMu.Lock()
	defer p.statsMu.Unlock()
	return slices.Clone(p.nodeLog)
}

// NodeVolume is the node record of one volume: where it is staged and
// published on this node.
type NodeVolume struct {
	StagingPath string
	// Targets are the target paths it is published at, sorted.
	Targets []string
	// MountGroup is the volume_mount_group it was staged with.
	MountGroup string
	// TargetMountGroups are the volume_mount_groups of the targets
	// published with one, by target path; nil when none was.
	TargetMountGroups map[string]string
	// CapacityBytes is the volume's size as this node sees it: its size
	// when staged, grown by NodeExpandVolume, and without
	// Config.NodeExpansionRequired by ControllerExpandVolume at once.
	CapacityBytes int64
}

// NodeVolumes returns the node records of the volumes staged or published
// on this node, by volume id. Volumes neither staged nor published are
// left out.
func (p *Plugin) NodeVolumes() map[string]NodeVolume {
	p.st.mu.Lock()
	defer p.st.mu.Unlock()
	out := make(map[string]NodeVolume)
	for id, n := range p.st.node {
		if n.StagingPath == "" && len(n.Targets) == 0 {
			continue
		}
		nv := NodeVolume{StagingPath: n.StagingPath, Targets: slices.Sorted(maps.Keys(n.Targets)),
			MountGroup: n.StageGroup, CapacityBytes: p.nodeCapacity(n)}
		for path, t := range n.Targets {
			if t.MountGroup != "" {
				if nv.TargetMountGroups == nil {
					nv.TargetMountGroups = make(map[string]string)
				}
				nv.TargetMountGroups[path] = t.MountGroup
			}
		}
		out[id] = nv
	}
	return out
}

// logNodeCall records a successful node call in the node log.
func (p *Plugin) logNodeCall(req any) {
	var c NodeCall
	switch r := req.(type) {
	case *csi.NodeStageVolumeRequest:
		c = NodeCall{Method: "NodeStageVolume", VolumeID: r.GetVolumeId(), Path: r.GetStagingTargetPath(),
			MountGroup: r.GetVolumeCapability().GetMount().GetVolumeMountGroup()}
	case *csi.NodeUnstageVolumeRequest:
		c = NodeCall{Method: "NodeUnstageVolume", VolumeID: r.GetVolumeId(), Path: r.GetStagingTargetPath()}
	case *csi.NodePublishVolumeRequest:
		c = NodeCall{Method: "NodePublishVolume", VolumeID: r.GetVolumeId(), Path: r.GetTargetPath(), StagingPath: r.GetStagingTargetPath(),
			MountGroup: r.GetVolumeCapability().GetMount().GetVolumeMountGroup()}
	case *csi.NodeUnpublishVolumeRequest:
		c = NodeCall{Method: "NodeUnpublishVolume", VolumeID: r.GetVolumeId(), Path: r.GetTargetPath()}
	case *csi.NodeExpandVolumeRequest:
		c = NodeCall{Method: "NodeExpandVolume", VolumeID: r.GetVolumeId(), Path: r.GetVolumePath(), StagingPath: r.GetStagingTargetPath(),
			RequiredBytes: r.GetCapacityRange().GetRequiredBytes(), LimitBytes: r.GetCapacityRange().GetLimitBytes()}
	default:
		return
	}
	p.statsMu.Lock()
	defer p.statsMu.Unlock()
	if len(p.nodeLog) == maxNodeLog {
		p.nodeLog = slices.Delete(p.nodeLog, 0, 1)
	}
	p.nodeLog = append(p.nodeLog, c)
}

// Stats returns a copy of the call counters.
func (p *Plugin) Stats() Stats {
	p.statsMu.Lock()
	defer p.statsMu.Unlock()
	return Stats{
		Calls:       maps.Clone(p.stats.Calls),
		InFlight:    maps.Clone(p.stats.InFlight),
		MaxInFlight: maps.Clone(p.stats.MaxInFlight),
	}
}

// ResetStats zeroes the call counters; MaxInFlight restarts from the calls
// running now.
// Secrets returns the secrets of every call of method received so far
// (nil entries for calls without any), in order, so that tests can check
// what reached the plugin.
func (p *Plugin) Secrets(method string) []map[string]string {
	p.statsMu.Lock()
	defer p.statsMu.Unlock()
	var out []map[string]string
	for _, m := range p.secrets[method] {
		out = append(out, maps.Clone(m))
	}
	return out
}

// recordSecrets keeps the secrets of a request that has them.
func (p *Plugin) recordSecrets(method string, req any) {
	r, ok := req.(interface{ GetSecrets() map[string]string })
	if !ok {
		return
	}
	p.statsMu.Lock()
	defer p.statsMu.Unlock()
	if p.secrets == nil {
		p.secrets = map[string][]map[string]string{}
	}
	p.secrets[method] = append(p.secrets[method], maps.Clone(r.GetSecrets()))
}

func (p *Plugin) ResetStats() {
	p.statsMu.Lock()
	defer p.statsMu.Unlock()
	inFlight := p.stats.InFlight
	p.stats = newStats()
	for m, n := range inFlight {
		if n > 0 {
			p.stats.InFlight[m] = n
			p.stats.MaxInFlight[m] = n
		}
	}
}

func newStats() Stats {
	return Stats{
		Calls:       make(map[string]int64),
		InFlight:    make(map[string]int64),
		MaxInFlight: make(map[string]int64),
	}
}

func (p *Plugin) callStarted(method string) {
	p.statsMu.Lock()
	defer p.statsMu.Unlock()
	p.stats.Calls[method]++
	p.stats.InFlight[method]++
	if n := p.stats.InFlight[method]; n > p.stats.MaxInFlight[method] {
		p.stats.MaxInFlight[method] = n
	}
}

func (p *Plugin) callEnded(method string) {
	p.statsMu.Lock()
	defer p.statsMu.Unlock()
	p.stats.InFlight[method]--
}
