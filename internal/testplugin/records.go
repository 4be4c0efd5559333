package testplugin

import (
	"errors"
	"io"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
)

// Volume is a copy of the controller record of one volume, for tests to
// check what the plugin was asked to do.
type Volume struct {
	ID            string
	Name          string
	CapacityBytes int64
	Parameters    map[string]string
	// MutableParameters are the current mutable parameters: those of
	// CreateVolume, changed key by key by ControllerModifyVolume.
	MutableParameters map[string]string
	// SourceSnapshotID and SourceVolumeID name the content source of a
	// restored or cloned volume.
	SourceSnapshotID string
	SourceVolumeID   string
	// Topology is the volume's accessible topology segment; nil when the
	// plugin has no topology.
	Topology map[string]string
	// PublishedNodeIDs are the nodes the volume is controller-published
	// to, sorted.
	PublishedNodeIDs []string
	CreatedAt        time.Time
}

// Snapshot is a copy of the record of one snapshot.
type Snapshot struct {
	ID             string
	Name           string
	SourceVolumeID string
	SizeBytes      int64
	// ReadyToUse is what the next answer including the snapshot reports.
	ReadyToUse bool
	CreatedAt  time.Time
}

// Volumes returns copies of the controller records of this plugin's
// volumes, sorted by id.
func (p *Plugin) Volumes() []Volume {
	p.st.mu.Lock()
	defer p.st.mu.Unlock()
	out := make([]Volume, 0, len(p.st.volumes))
	for _, v := range p.st.volumes {
		out = append(out, publicVolume(v))
	}
	slices.SortFunc(out, func(a, b Volume) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Volume returns a copy of the controller record of volume id, and
// whether this plugin has it.
func (p *Plugin) Volume(id string) (Volume, bool) {
	p.st.mu.Lock()
	defer p.st.mu.Unlock()
	v, ok := p.st.volumes[id]
	if !ok {
		return Volume{}, false
	}
	return publicVolume(v), true
}

// Snapshots returns copies of the records of this plugin's snapshots,
// sorted by id.
func (p *Plugin) Snapshots() []Snapshot {
	p.st.mu.Lock()
	defer p.st.mu.Unlock()
	out := make([]Snapshot, 0, len(p.st.snapshots))
	for _, s := range p.st.snapshots {
		out = append(out, Snapshot{
			ID: s.ID, Name: s.Name, SourceVolumeID: s.SourceVolumeID, SizeBytes: s.SizeBytes,
			ReadyToUse: s.NotReadyReports == 0, CreatedAt: s.CreatedAt,
		})
	}
	slices.SortFunc(out, func(a, b Snapshot) int { return strings.Compare(a.ID, b.ID) })
	return out
}

func publicVolume(v *volume) Volume {
	return Volume{
		ID:                v.ID,
		Name:              v.Name,
		CapacityBytes:     v.CapacityBytes,
		Parameters:        maps.Clone(v.Parameters),
		MutableParameters: maps.Clone(v.MutableParameters),
		SourceSnapshotID:  v.SourceSnapshotID,
		SourceVolumeID:    v.SourceVolumeID,
		Topology:          maps.Clone(v.Topology),
		PublishedNodeIDs:  slices.Sorted(maps.Keys(v.Published)),
		CreatedAt:         v.CreatedAt,
	}
}

// VolumeHealthStatus is one adverse health condition of a volume, as the
// CSI health RPCs report it.
type VolumeHealthStatus struct {
	Status csi.VolumeHealthErrorType
	// Reason is a short CamelCase word for the condition; CSI requires
	// it, and one (Status, Reason) pair at most once per volume.
	Reason  string
	Message string
}

// StorageHealthStatus is one adverse condition of the storage backend, as
// NodeGetStorageHealth reports it.
type StorageHealthStatus struct {
	Status  csi.StorageHealthErrorType
	Reason  string
	Message string
}

// maxHealthStatuses bounds the conditions kept per volume and for the
// storage; a test needs a few.
const maxHealthStatuses = 16

// SetVolumeHealth sets the adverse health conditions of volume id, which
// ControllerGetVolumeHealth, ControllerListVolumeHealth and
// NodeGetVolumeHealth report while the volume exists; no conditions make
// it healthy again. Repeated (Status, Reason) pairs are kept once, and at
// most the first 16 conditions. The conditions live in memory, as faults
// do, and go with the volume when it is deleted.
func (p *Plugin) SetVolumeHealth(id string, statuses ...VolumeHealthStatus) {
	var kept []VolumeHealthStatus
	for _, s := range statuses {
		dup := slices.ContainsFunc(kept, func(k VolumeHealthStatus) bool { return k.Status == s.Status && k.Reason == s.Reason })
		if !dup && len(kept) < maxHealthStatuses {
			kept = append(kept, s)
		}
	}
	p.healthMu.Lock()
	defer p.healthMu.Unlock()
	if p.health == nil {
		p.health = make(map[string][]VolumeHealthStatus)
	}
	if len(kept) == 0 {
		delete(p.health, id)
		return
	}
	p.health[id] = kept
}

// ReasonAbnormal is the reason of the condition SetVolumeCondition sets.
const ReasonAbnormal = "Abnormal"

// SetVolumeCondition is the short form of SetVolumeHealth: abnormal makes
// volume id DEGRADED with reason ReasonAbnormal and message; not abnormal
// clears its conditions.
func (p *Plugin) SetVolumeCondition(id string, abnormal bool, message string) {
	if !abnormal {
		p.SetVolumeHealth(id)
		return
	}
	p.SetVolumeHealth(id, VolumeHealthStatus{Status: csi.VolumeHealthErrorType_DEGRADED, Reason: ReasonAbnormal, Message: message})
}

// SetStorageHealth sets the adverse conditions NodeGetStorageHealth
// reports (at most 16); none means the storage is healthy.
func (p *Plugin) SetStorageHealth(statuses ...StorageHealthStatus) {
	if len(statuses) > maxHealthStatuses {
		statuses = statuses[:maxHealthStatuses]
	}
	p.healthMu.Lock()
	defer p.healthMu.Unlock()
	p.storage = slices.Clone(statuses)
}

// volumeHealth returns volume id's conditions for the wire: those set
// with SetVolumeHealth, then the line of Config.VolumeConditionsFile in
// fileConditions (from p.fileConditions), if any.
func (p *Plugin) volumeHealth(id string, fileConditions map[string]string) *csi.VolumeHealth {
	p.healthMu.Lock()
	defer p.healthMu.Unlock()
	h := &csi.VolumeHealth{VolumeId: id}
	for _, s := range p.health[id] {
		h.HealthStatuses = append(h.HealthStatuses, &csi.VolumeHealth_VolumeHealthEntry{Status: s.Status, Reason: s.Reason, Message: s.Message})
	}
	if msg, ok := fileConditions[id]; ok && len(h.HealthStatuses) < maxHealthStatuses {
		h.HealthStatuses = append(h.HealthStatuses, &csi.VolumeHealth_VolumeHealthEntry{
			Status: csi.VolumeHealthErrorType_DEGRADED, Reason: ReasonAbnormal, Message: msg})
	}
	return h
}

// maxConditionsFileBytes bounds what is read of Config.VolumeConditionsFile.
const maxConditionsFileBytes = 64 << 10

// fileConditions reads Config.VolumeConditionsFile: volume id to message.
// A missing or unreadable file lists none (the plugin logs why).
func (p *Plugin) fileConditions() map[string]string {
	path := p.cfg.VolumeConditionsFile
	if path == "" {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			p.logger.Warn("volume conditions file not read", "file", path, "error", err)
		}
		return nil
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxConditionsFileBytes))
	if err != nil {
		p.logger.Warn("volume conditions file not read", "file", path, "error", err)
		return nil
	}
	out := map[string]string{}
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		id, msg, _ := strings.Cut(line, " ")
		out[id] = strings.TrimSpace(msg)
	}
	return out
}

// forgetHealth drops the conditions of a deleted volume.
func (p *Plugin) forgetHealth(id string) {
	p.healthMu.Lock()
	defer p.healthMu.Unlock()
	delete(p.health, id)
}
