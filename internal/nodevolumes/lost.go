package nodevolumes

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// serverMount is what the servers hold of a claim's mount on this node:
// enough to undo it when the agent has no record of it.
type serverMount struct {
	pluginID, volumeID, externalID, workloadID string
	usage                                      usage
	hostPath, stagingPath                      string
	cluster                                    bool
	claimIndex                                 uint64
}

// serverRecord returns a record-lost record of the mount s, with the
// servers' paths once they are checked to lie in the mount's directories
// under the plugin's mount root (InvalidArgument naming the field
// otherwise). The record is not saved.
func (m *Manager) serverRecord(s serverMount) (*record, error) {
	rts := m.rootsOf(s.pluginID)
	if err := rts.checkServerPath("host_path", rts.targetDir(s.workloadID, s.volumeID), s.hostPath); err != nil {
		return nil, err
	}
	if s.stagingPath != "" {
		if err := rts.checkServerPath("staging_path", rts.stagingDir(s.volumeID), s.stagingPath); err != nil {
			return nil, err
		}
	}
	now := time.Now().UTC()
	r := &record{
		Version:     recordVersion,
		PluginID:    s.pluginID,
		VolumeID:    s.volumeID,
		ExternalID:  s.externalID,
		WorkloadID:  s.workloadID,
		Usage:       s.usage,
		UsageKey:    s.usage.key(),
		Roots:       rts,
		HostPath:    s.hostPath,
		StagingPath: s.stagingPath,
		State:       StateRecordLost,
		ServerPaths: true,
		Cluster:     s.cluster,
		ClaimIndex:  s.claimIndex,
		CreatedAt:   now,
		UpdatedAt:   now,
	}
	var err error
	if r.PluginPath, err = rts.pluginPath(r.HostPath); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "host_path: %v", err)
	}
	if r.PluginStagingPath, err = rts.pluginPath(r.StagingPath); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "staging_path: %v", err)
	}
	return r, nil
}

// requestRecord returns the record of the mount an UnmountVolume request
// describes with the servers' paths, in state record-lost, for when the
// agent has none; nil when the request carries no paths. usage is the
// request's usage, normalised.
func (m *Manager) requestRecord(req *csisupdv1.UnmountVolumeRequest, u usage) (*record, error) {
	if req.GetHostPath() == "" && req.GetStagingPath() == "" {
		return nil, nil
	}
	switch {
	case req.GetHostPath() == "":
		return nil, status.Error(codes.InvalidArgument, "host_path is required with staging_path")
	case req.GetUsage() == nil:
		return nil, status.Error(codes.InvalidArgument, "usage is required with host_path")
	case req.GetExternalId() == "":
		return nil, status.Error(codes.InvalidArgument, "external_id is required with host_path")
	}
	return m.serverRecord(serverMount{
		pluginID: req.GetPluginId(), volumeID: req.GetVolumeId(), externalID: req.GetExternalId(), workloadID: req.GetWorkloadId(),
		usage: u, hostPath: req.GetHostPath(), stagingPath: req.GetStagingPath(), cluster: req.GetCluster(), claimIndex: req.GetClaimIndex(),
	})
}

// leftRecord returns, for an UnmountVolume request of the servers that
// carries no paths (their claim never recorded the node's step: the
// agent, or the leader, stopped before it answered), the record-lost
// record of what of the mount is on disk at the paths this agent derives
// for it: the plugin may have staged or published there before the agent
// lost its record. The publish target is undone when it is there; the
// staging target when it is there and no other workload's publish target
// of the volume and usage is (the staging may be theirs). nil when neither
// is to be undone (the usual release of a claim that failed before its
// node step: nothing was mounted), or the request lacks the usage or the
// external id to undo it with.
func (m *Manager) leftRecord(req *csisupdv1.UnmountVolumeRequest, u usage) (*record, error) {
	if req.GetUsage() == nil || req.GetExternalId() == "" {
		return nil, nil
	}
	rts := m.rootsOf(req.GetPluginId())
	volume, key := req.GetVolumeId(), u.key()
	host, staging := rts.targetPath(req.GetWorkloadId(), volume, key), rts.stagingPath(volume, key)
	hostLeft := mayHoldMount(host)
	stagingLeft := mayHoldMount(staging) && !m.publishedForOthers(rts, req.GetWorkloadId(), volume, key)
	if !hostLeft && !stagingLeft {
		return nil, nil
	}
	if !stagingLeft {
		staging = ""
	}
	return m.serverRecord(serverMount{
		pluginID: req.GetPluginId(), volumeID: volume, externalID: req.GetExternalId(), workloadID: req.GetWorkloadId(),
		usage: u, hostPath: host, stagingPath: staging, cluster: req.GetCluster(), claimIndex: req.GetClaimIndex(),
	})
}

// publishedForOthers reports whether a publish target of volume with the
// usage key is on disk for a workload other than workload, or whether
// that cannot be told.
func (m *Manager) publishedForOthers(rts roots, workload, volume, key string) bool {
	workloads := filepath.Dir(filepath.Dir(rts.targetDir(workload, volume)))
	entries, err := os.ReadDir(workloads)
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist)
	}
	for _, e := range entries {
		if e.Name() != workload && mayHoldMount(rts.targetPath(e.Name(), volume, key)) {
			return true
		}
	}
	return false
}

// mayHoldMount reports whether path is there (an error other than its
// absence counts as there: it may hold a mount).
func mayHoldMount(path string) bool {
	_, err := os.Lstat(path)
	return !errors.Is(err, fs.ErrNotExist)
}

// warnPathsDiffer logs at warn when the servers' paths in req differ from
// those of the record of the same usage among recs. The record is this
// agent's own: its paths are the ones the plugin was given, and the ones
// unmounted.
func (m *Manager) warnPathsDiffer(req *csisupdv1.UnmountVolumeRequest, usageKey string, recs []*record) {
	if req.GetHostPath() == "" && req.GetStagingPath() == "" {
		return
	}
	for _, r := range recs {
		if r.UsageKey == usageKey && (r.HostPath != req.GetHostPath() || r.StagingPath != req.GetStagingPath()) {
			m.log.Warn("the servers' paths of a mount differ from its record; unmounting the record's",
				"plugin", r.PluginID, "volume", r.VolumeID, "workload", r.WorkloadID, "usage", r.UsageKey,
				"host_path", r.HostPath, "servers_host_path", req.GetHostPath(),
				"staging_path", r.StagingPath, "servers_staging_path", req.GetStagingPath())
		}
	}
}

// resolveFor checks that r's plugin is there for method, and fills r's
// staging from it (see fillServerStaging).
func (m *Manager) resolveFor(r *record, method string) error {
	p, err := m.resolve(r.PluginID, method, "")
	if err != nil {
		return err
	}
	return fillServerStaging(r, p)
}

// fillServerStaging sets the staging target this agent derives on a
// record with the servers' paths but no staging path when the plugin p
// stages: servers that predate recording staging paths hold none, and
// the plugin staged there.
func fillServerStaging(r *record, p *csisupdv1.Plugin) error {
	if !r.ServerPaths || r.StagingPath != "" || !slices.Contains(p.GetNodeCapabilities(), plugin.CapStageUnstageVolume) {
		return nil
	}
	r.StagingPath = r.Roots.stagingPath(r.VolumeID, r.UsageKey)
	var err error
	if r.PluginStagingPath, err = r.Roots.pluginPath(r.StagingPath); err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	return nil
}

// removal notes that the record named name was removed, for noteLost.
// The caller holds m.mu.
func (m *Manager) removal(name string) {
	if m.claims == nil {
		return // no reconcile reads them
	}
	m.removals++
	m.removedAt[name] = m.removals
}

// removalsNow returns the count of records removed so far.
func (m *Manager) removalsNow() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.removals
}

// pruneRemovals forgets the removals up to since: no later round can
// mistake them for newer than its answer.
func (m *Manager) pruneRemovals(since uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, n := range m.removedAt {
		if n <= since {
			delete(m.removedAt, name)
		}
	}
}

// noteLost keeps every claim the servers hold as mounted on this node and
// that has no record here as a record in state record-lost, logged at
// warn once (the record then exists), so that it is listed and its
// release undoes it from the servers' paths. since is the removal count
// before claims were read: a mount removed after it (an unmount that
// ended meanwhile) is not lost.
func (m *Manager) noteLost(ctx context.Context, loop *watchdog.Loop, claims []*csisupdv1.NodeClaimRef, since uint64) {
	if defectForgetRecord {
		return
	}
	for _, c := range claims {
		if !c.GetMounted() || c.GetHostPath() == "" || ctx.Err() != nil {
			continue
		}
		loop.Busy(time.Now().Add(m.timeout)) // a Mount or Unmount of the volume may hold its lock
		lost, err := m.keepLost(ctx, c, since)
		if err != nil {
			m.log.Warn("cannot keep a claim the servers hold for this node as a lost mount record; trying again",
				"volume", c.GetVolumeId(), "workload", c.GetWorkloadId(), "plugin", c.GetPluginId(), "error", statusMessage(err))
			continue
		}
		if lost != nil {
			m.log.Warn("volume mount record lost; the servers hold a claim for it",
				"volume", lost.VolumeID, "workload", lost.WorkloadID, "plugin", lost.PluginID, "usage", lost.UsageKey,
				"host_path", lost.HostPath, "claim_index", lost.ClaimIndex)
		}
	}
}

// keepLost saves the claim c as a record-lost record when its mount has
// no record, and returns it; nil when it has one or was removed since.
func (m *Manager) keepLost(ctx context.Context, c *csisupdv1.NodeClaimRef, since uint64) (*record, error) {
	if err := checkIDs(c.GetPluginId(), c.GetVolumeId(), c.GetWorkloadId()); err != nil {
		return nil, err
	}
	u, err := normaliseUsage(c.GetUsage())
	if err != nil {
		return nil, err
	}
	name := recordName(c.GetPluginId(), c.GetVolumeId(), c.GetWorkloadId(), u.key())
	// known reports whether the claim's mount has a record (of its usage,
	// or at its host path should the usage keys disagree) or was removed
	// since.
	known := func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		if _, ok := m.records[name]; ok || m.removedAt[name] > since {
			return true
		}
		for _, r := range m.records {
			if r.PluginID == c.GetPluginId() && r.VolumeID == c.GetVolumeId() && r.WorkloadID == c.GetWorkloadId() && r.HostPath == c.GetHostPath() {
				return true
			}
		}
		return false
	}
	if known() {
		return nil, nil
	}
	unlock, err := m.lockVolume(ctx, c.GetPluginId(), c.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	if known() {
		return nil, nil
	}
	r, err := m.serverRecord(serverMount{
		pluginID: c.GetPluginId(), volumeID: c.GetVolumeId(), externalID: cmp.Or(c.GetExternalId(), c.GetVolumeId()), workloadID: c.GetWorkloadId(),
		usage: u, hostPath: c.GetHostPath(), stagingPath: c.GetStagingPath(), cluster: true, claimIndex: c.GetClaimIndex(),
	})
	if err != nil {
		return nil, err
	}
	if err := m.save(r); err != nil {
		m.forget(r)
		return nil, fmt.Errorf("volumes: keep the lost mount of volume %q: %w", r.VolumeID, err)
	}
	return r, nil
}

// countRecords returns how many records there are, and how many of them
// are in state record-lost.
func (m *Manager) countRecords() (records, lost int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.records {
		if r.State == StateRecordLost {
			lost++
		}
	}
	return len(m.records), lost
}
