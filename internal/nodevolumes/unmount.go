package nodevolumes

import (
	"context"
	"fmt"
	"slices"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
)

// This file holds the way back of a mount: unpublish, and unstage after
// the volume's last workload on the node.

// Unmount unpublishes the volume for the workload (every usage, or the
// request's usage only), unstages it when no other mount uses its staging,
// and forgets the mounts. When there is no record of the mount and the
// request carries the servers' paths of the claim (host_path, with usage
// and external_id), those are unpublished and unstaged: the record may
// have been lost, and the node must not confirm a release it did not do.
// A mount that has a record is undone from the record's paths, whatever
// the request's. A mount that does not exist succeeds.
func (m *Manager) Unmount(ctx context.Context, req *csisupdv1.UnmountVolumeRequest) (*csisupdv1.UnmountVolumeResponse, error) {
	if err := checkIDs(req.GetPluginId(), req.GetVolumeId(), req.GetWorkloadId()); err != nil {
		return nil, err
	}
	usageKey := ""
	var u usage
	if req.GetUsage() != nil {
		var err error
		if u, err = normaliseUsage(req.GetUsage()); err != nil {
			return nil, err
		}
		usageKey = u.key()
	}
	unlock, err := m.lockVolume(ctx, req.GetPluginId(), req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer unlock()

	var recs []*record
	var settling *record
	m.mu.Lock()
	for _, r := range m.records {
		if r.PluginID != req.GetPluginId() || r.VolumeID != req.GetVolumeId() || r.WorkloadID != req.GetWorkloadId() ||
			usageKey != "" && r.UsageKey != usageKey {
			continue
		}
		if r.State == StateSettling {
			settling = r.clone()
			continue
		}
		recs = append(recs, r.clone())
	}
	m.mu.Unlock()
	if settling != nil {
		// The plugin may still do the failed step late, and the undo is
		// repeated at SettleAt: confirming the release before then would
		// let the servers give the volume to another node while this one
		// may have it published.
		return nil, csisupdv1.MarkRetryable(status.Errorf(codes.Aborted,
			"the mount of volume %q for workload %q (usage %s) failed with an unknown outcome and was undone; the plugin may still do its step late, so the undo is repeated at %s before the release is confirmed",
			settling.VolumeID, settling.WorkloadID, settling.UsageKey, settling.SettleAt.Format(time.RFC3339)), "the undo is repeated by itself")
	}
	resp := &csisupdv1.UnmountVolumeResponse{}
	if len(recs) == 0 {
		if defectForgetRecord {
			return resp, nil
		}
		fromServers, err := m.requestRecord(req, u)
		if err != nil {
			return nil, err
		}
		what := "no record of the mount being released; unmounting it from the servers' paths"
		if fromServers == nil {
			if fromServers, err = m.leftRecord(req, u); err != nil {
				return nil, err
			}
			what = "no record of the mount being released and no paths from the servers, but its directories are on disk; unmounting it from them"
		}
		if fromServers == nil {
			return resp, nil
		}
		m.log.Warn(what,
			"plugin", fromServers.PluginID, "volume", fromServers.VolumeID, "workload", fromServers.WorkloadID, "usage", fromServers.UsageKey,
			"host_path", fromServers.HostPath, "staging_path", fromServers.StagingPath, "claim_index", fromServers.ClaimIndex)
		recs = []*record{fromServers}
	} else {
		m.warnPathsDiffer(req, usageKey, recs)
	}
	slices.SortFunc(recs, compareRecords)
	for _, r := range recs {
		if err := m.resolveFor(r, methodUnmount); err != nil {
			return nil, err
		}
		if defectBusyRelease && m.stagingInUse(r) {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is in use on this node", r.VolumeID)
		}
		before := r.proto()
		unstaged, err := m.teardown(ctx, r, false)
		if err != nil {
			m.log.Warn("unmount failed; finishing it in the background",
				"plugin", r.PluginID, "volume", r.VolumeID, "workload", r.WorkloadID, "usage", r.UsageKey, "state", r.State, "error", statusMessage(err))
			m.schedule(r.name())
			return nil, err
		}
		resp.Unmounted = append(resp.Unmounted, before)
		resp.Unstaged = resp.Unstaged || unstaged
		m.log.Info("volume unmounted", "plugin", r.PluginID, "volume", r.VolumeID, "workload", r.WorkloadID, "usage", r.UsageKey, "unstaged", unstaged)
	}
	return resp, nil
}

// teardown finishes or undoes the mount r, whatever its state: it
// unpublishes it when it may be published, unstages it when it may be
// staged and no other mount uses that staging, removes the directories
// and forgets the record. Each step is recorded before it starts, or is
// covered by the record as it is: a restart that finds it undoes the
// record's state through the unstage.
// skipCurrent tells that the plugin refused r's current step (staging or
// publishing), so that step needs no undo. The caller holds r's volume
// lock. unstaged reports whether NodeUnstageVolume was called and
// succeeded.
func (m *Manager) teardown(ctx context.Context, r *record, skipCurrent bool) (unstaged bool, err error) {
	switch r.State {
	case StateStaging, StatePublishing, StatePublished, StateUnpublishing, StateRecordLost:
		// A staging record may have been published: Mount records the
		// publishing step in memory only.
		if skipCurrent && (r.State == StateStaging || r.State == StatePublishing) {
			break
		}
		r.State = StateUnpublishing
		if err := m.save(r); err != nil {
			return false, status.Error(codes.Internal, err.Error())
		}
		if !defectSkipUnpublish {
			ureq := &csi.NodeUnpublishVolumeRequest{VolumeId: r.ExternalID, TargetPath: r.PluginPath}
			if _, err := call(ctx, m, r.PluginID, methodUnmount, "NodeUnpublishVolume", ureq, csi.NodeClient.NodeUnpublishVolume); err != nil {
				if !absent(err) {
					return false, m.stepFailed(r, err)
				}
			}
		}
		m.emit(plugin.EventVolumeUnpublished, r, fmt.Sprintf("volume %s unpublished for workload %s from %s", r.VolumeID, r.WorkloadID, r.HostPath))
	}
	m.removeTargetDirs(r)

	if r.StagingPath != "" && !m.stagingInUse(r) {
		if !(skipCurrent && r.State == StateStaging) {
			// Only in memory: every state the record can have on disk
			// here (staging, publishing, unpublishing, unstaging) is
			// undone by a restart through the unstage.
			r.State = StateUnstaging
			m.note(r)
			ureq := &csi.NodeUnstageVolumeRequest{VolumeId: r.ExternalID, StagingTargetPath: r.PluginStagingPath}
			if _, err := call(ctx, m, r.PluginID, methodUnmount, "NodeUnstageVolume", ureq, csi.NodeClient.NodeUnstageVolume); err != nil {
				if !absent(err) {
					return false, m.stepFailed(r, err)
				}
			}
			unstaged = true
			m.emit(plugin.EventVolumeUnstaged, r, fmt.Sprintf("volume %s unstaged from %s (usage %s)", r.VolumeID, r.StagingPath, r.UsageKey))
		}
		m.removeStagingDirs(r)
	}
	if r.Uncertain {
		r.Uncertain, r.State, r.SettleAt = false, StateSettling, time.Now().UTC().Add(m.timeout)
		if err := m.save(r); err != nil {
			return unstaged, status.Error(codes.Internal, err.Error())
		}
		m.schedule(r.name())
		return unstaged, nil
	}
	if err := m.store.remove(r.name()); err != nil {
		return unstaged, status.Error(codes.Internal, err.Error())
	}
	m.forget(r)
	return unstaged, nil
}

// stepFailed records the failure of r's current step and returns err.
func (m *Manager) stepFailed(r *record, err error) error {
	r.Error = fmt.Sprintf("%s failed: %s", r.State, statusMessage(err))
	if serr := m.save(r); serr != nil {
		m.log.Warn("cannot record a failed step", "volume", r.VolumeID, "error", serr)
	}
	return err
}
