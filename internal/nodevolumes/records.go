package nodevolumes

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// Mount states, as records and Mount.state name them.
const (
	StateStaging      = "staging"
	StatePublishing   = "publishing"
	StatePublished    = "published"
	StateUnpublishing = "unpublishing"
	StateUnstaging    = "unstaging"
	// StateRecordLost is a mount the servers hold a claim for while this
	// agent had no record of it (its record was lost): it is listed
	// with the servers' paths and undone from them on release.
	StateRecordLost = "record-lost"
	// StateSettling is a mount whose stage or publish failed with an
	// unknown outcome and was undone: the plugin may still do the step
	// late, after its caller gave up, so the undo is made again at
	// SettleAt (the RPC timeout later) before the record is forgotten.
	// It is no mount (other workloads' releases and the servers' claims
	// pass it by), but a release of its own workload waits for it: the
	// servers must not free the claim while a late step may hold the
	// volume here.
	StateSettling = "settling"
)

// recordVersion is the version of the record format this package writes
// and reads.
const recordVersion = 1

// Modes of the files and directories the manager creates.
const (
	fileMode = 0o600
	dirMode  = 0o700
)

// record is the on-disk record of one mount: one volume used by one
// workload with one usage. It holds what finishing or undoing the mount
// needs, and never a secret (requests' secrets and contexts are not kept).
type record struct {
	Version    int    `json:"version"`
	PluginID   string `json:"plugin_id"`
	VolumeID   string `json:"volume_id"`
	ExternalID string `json:"external_id"`
	WorkloadID string `json:"workload_id"`
	Usage      usage  `json:"usage"`
	UsageKey   string `json:"usage_key"`
	// Roots is the plugin's mount root on the host and as the plugin sees
	// it, when the mount was made: the paths below were derived from it.
	Roots roots `json:"roots"`
	// HostPath and StagingPath are the targets on the host; StagingPath is
	// empty when the plugin does not stage. PluginPath and
	// PluginStagingPath are the same paths as sent to the plugin.
	HostPath          string `json:"host_path"`
	StagingPath       string `json:"staging_path,omitempty"`
	PluginPath        string `json:"plugin_path"`
	PluginStagingPath string `json:"plugin_staging_path,omitempty"`
	State             string `json:"state"`
	// ServerPaths tells that the paths are the servers' (the mount's own
	// record was lost) rather than derived from the roots: they are
	// checked to lie under the mount's directories, not to equal them.
	ServerPaths bool   `json:"server_paths,omitempty"`
	Cluster     bool   `json:"cluster,omitempty"`
	ClaimIndex  uint64 `json:"claim_index,omitempty"`
	// Error is the (redacted) message of the last failed step.
	Error string `json:"error,omitempty"`
	// Uncertain tells that a step failed with an unknown outcome: once
	// undone, the record settles (StateSettling) until SettleAt.
	Uncertain bool      `json:"uncertain,omitempty"`
	SettleAt  time.Time `json:"settle_at,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// name returns the record's file name, which its identity (plugin, volume,
// workload, usage key) determines. The ids may not contain a separator
// that would keep a joined name unambiguous, so the name is a hash of them.
func (r *record) name() string { return recordName(r.PluginID, r.VolumeID, r.WorkloadID, r.UsageKey) }

func recordName(plugin, volume, workload, usageKey string) string {
	h := sha256.Sum256([]byte(strings.Join([]string{plugin, volume, workload, usageKey}, "\x00")))
	return hex.EncodeToString(h[:16]) + ".json"
}

// sharesStaging reports whether o uses the same staging as r.
func (r *record) sharesStaging(o *record) bool {
	return r.StagingPath != "" && o.StagingPath == r.StagingPath &&
		o.PluginID == r.PluginID && o.VolumeID == r.VolumeID && o.UsageKey == r.UsageKey
}

// clone returns a copy of r that shares nothing with it.
func (r *record) clone() *record {
	c := *r
	c.Usage.MountFlags = slices.Clone(r.Usage.MountFlags)
	return &c
}

// proto returns the record as its API message.
func (r *record) proto() *csisupdv1.Mount {
	return &csisupdv1.Mount{
		PluginId:    r.PluginID,
		VolumeId:    r.VolumeID,
		ExternalId:  r.ExternalID,
		WorkloadId:  r.WorkloadID,
		Usage:       r.Usage.proto(),
		UsageKey:    r.UsageKey,
		HostPath:    r.HostPath,
		StagingPath: r.StagingPath,
		State:       r.State,
		Cluster:     r.Cluster,
		ClaimIndex:  r.ClaimIndex,
		CreatedAt:   timestamppb.New(r.CreatedAt),
		UpdatedAt:   timestamppb.New(r.UpdatedAt),
		Error:       r.Error,
	}
}

// check reports the first field of a record read from disk that is not
// valid.
func (r *record) check() error {
	if r.Version != recordVersion {
		return fmt.Errorf("version %d is not %d", r.Version, recordVersion)
	}
	for _, f := range []struct{ name, id string }{
		{"plugin_id", r.PluginID}, {"volume_id", r.VolumeID}, {"workload_id", r.WorkloadID},
	} {
		if err := checkID(f.name, f.id); err != nil {
			return errors.New(statusMessage(err))
		}
	}
	if r.ExternalID == "" {
		return errors.New("external_id is empty")
	}
	u, err := normaliseUsage(r.Usage.proto())
	if err != nil {
		return errors.New(statusMessage(err))
	}
	if u.key() != r.UsageKey {
		return fmt.Errorf("usage_key %q does not match the usage (%q)", r.UsageKey, u.key())
	}
	if !filepath.IsAbs(r.Roots.Host) || (r.Roots.Plugin != "" && !filepath.IsAbs(r.Roots.Plugin)) {
		return fmt.Errorf("mount roots %q and %q are not absolute", r.Roots.Host, r.Roots.Plugin)
	}
	if err := r.checkPaths(); err != nil {
		return err
	}
	if p, err := r.Roots.pluginPath(r.HostPath); err != nil || p != r.PluginPath {
		return fmt.Errorf("plugin_path %q does not match host_path %q", r.PluginPath, r.HostPath)
	}
	if p, err := r.Roots.pluginPath(r.StagingPath); err != nil || p != r.PluginStagingPath {
		return fmt.Errorf("plugin_staging_path %q does not match staging_path %q", r.PluginStagingPath, r.StagingPath)
	}
	switch r.State {
	case StateStaging:
		if r.StagingPath == "" {
			return errors.New("state staging without a staging_path")
		}
	case StateUnstaging:
		if r.StagingPath == "" {
			return errors.New("state unstaging without a staging_path")
		}
	case StateRecordLost:
		if !r.ServerPaths {
			return errors.New("state record-lost without server_paths")
		}
	case StateSettling:
		if r.SettleAt.IsZero() {
			return errors.New("state settling without settle_at")
		}
	case StatePublishing, StatePublished, StateUnpublishing:
	default:
		return fmt.Errorf("state %q is not a mount state", r.State)
	}
	return nil
}

// checkPaths reports a host or staging path that is not the mount's: the
// paths derived from the roots, or for the servers' paths ones under the
// mount's directories.
func (r *record) checkPaths() error {
	if r.ServerPaths {
		if !under(r.Roots.targetDir(r.WorkloadID, r.VolumeID), r.HostPath) {
			return fmt.Errorf("host_path %q is not under the publish directory of the mount", r.HostPath)
		}
		if r.StagingPath != "" && !under(r.Roots.stagingDir(r.VolumeID), r.StagingPath) {
			return fmt.Errorf("staging_path %q is not under the staging directory of the mount", r.StagingPath)
		}
		return nil
	}
	if r.HostPath != r.Roots.targetPath(r.WorkloadID, r.VolumeID, r.UsageKey) {
		return fmt.Errorf("host_path %q is not the publish target of the mount", r.HostPath)
	}
	if r.StagingPath != "" && r.StagingPath != r.Roots.stagingPath(r.VolumeID, r.UsageKey) {
		return fmt.Errorf("staging_path %q is not the staging target of the mount", r.StagingPath)
	}
	return nil
}
