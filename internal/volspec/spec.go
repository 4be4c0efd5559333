package volspec

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/hashicorp/hcl/v2"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/hcldiag"
)

// Spec is one volume specification. Parse fills it from a file; the CLI
// may then change its fields (a flag overrides the key it stands for)
// before calling CreateRequest or Volume.
type Spec struct {
	// File is the name of the file the spec was read from, or "" for a
	// spec built from flags alone; errors name it.
	File string
	// ID is the volume's id in the cluster (the file's id, or its name
	// when it sets no id).
	ID string
	// Name is the name the plugin's CreateVolume gets when it differs
	// from ID (Nomad's name, set apart from its id); "" means ID.
	Name     string
	PluginID string
	// ExternalID is the volume's id in the storage provider, for
	// register only.
	ExternalID string
	// CapacityMin and CapacityMax are bytes; 0 is unset. On register they
	// are the volume's capacity and the limit it may grow to.
	CapacityMin int64
	CapacityMax int64
	// Capabilities are the ways the volume may be used; none means
	// DefaultCapability.
	Capabilities []Capability
	// MountOptions apply to every file-system capability.
	MountOptions *MountOptions
	// Required and Preferred are the topology_request's segments, each a
	// map of topology keys to values. On register, Required is where the
	// volume is accessible from.
	Required  []map[string]string
	Preferred []map[string]string
	// Parameters go to the plugin's CreateVolume and are recorded.
	Parameters map[string]string
	// MutableParameters go to CreateVolume and are recorded; Control's
	// ModifyVolume changes them later.
	MutableParameters map[string]string
	// Context is the volume context of a registered volume.
	Context map[string]string
	// Secrets go to the plugin; they are never stored, printed or logged.
	Secrets Secrets
	// SnapshotID and CloneID name the recorded snapshot or volume a new
	// volume starts from; at most one is set.
	SnapshotID string
	CloneID    string

	// at records where each key was set, for errors found after Parse.
	at map[string]hcl.Range
}

// Capability is one capability block, in csisupd's names.
type Capability struct {
	// AccessMode is a CSI access mode name, such as SINGLE_NODE_WRITER
	// (Nomad's single-node-writer).
	AccessMode string
	// AccessType is mount (Nomad's file-system) or block (block-device).
	AccessType string
}

// DefaultCapability is the capability of a spec without capability
// blocks, the same as `volume create` without capability flags.
var DefaultCapability = Capability{AccessMode: "SINGLE_NODE_WRITER", AccessType: "mount"}

// MountOptions is the mount_options block.
type MountOptions struct {
	// FSType is the file system to mount, such as ext4.
	FSType string
	// MountFlags are mount options, one each, such as noatime.
	MountFlags []string
}

// Secrets holds CSI secrets. Formatting it with fmt shows the keys only,
// so that a spec printed in a message or a log never carries a value.
type Secrets map[string]string

// String lists the keys with their values redacted.
func (s Secrets) String() string {
	keys := slices.Sorted(maps.Keys(s))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + ":[redacted]"
	}
	return "map[" + strings.Join(parts, " ") + "]"
}

// GoString is String, so that %#v redacts too.
func (s Secrets) GoString() string { return s.String() }

// AccessModes maps Nomad's access_mode names to CSI's. The last two are
// CSI 1.5's modes, which csisupd takes beside Nomad's five.
var AccessModes = map[string]string{
	"single-node-reader-only":   "SINGLE_NODE_READER_ONLY",
	"single-node-writer":        "SINGLE_NODE_WRITER",
	"multi-node-reader-only":    "MULTI_NODE_READER_ONLY",
	"multi-node-single-writer":  "MULTI_NODE_SINGLE_WRITER",
	"multi-node-multi-writer":   "MULTI_NODE_MULTI_WRITER",
	"single-node-single-writer": "SINGLE_NODE_SINGLE_WRITER",
	"single-node-multi-writer":  "SINGLE_NODE_MULTI_WRITER",
}

// AttachmentModes maps Nomad's attachment_mode names to csisupd's access
// types.
var AttachmentModes = map[string]string{
	"file-system":  "mount",
	"block-device": "block",
}

// where returns "file:line: " for a key set in the file, or "file: " (or
// nothing) for one that was not, such as a missing one.
func (s *Spec) where(key string) string {
	if rng, ok := s.at[key]; ok {
		return hcldiag.Pos(rng) + ": "
	}
	if s.File != "" {
		return s.File + ": "
	}
	return ""
}

// refuse returns an error for each key of keys that is set (set reports
// it), saying that op does not take it and why.
func (s *Spec) refuse(op string, keys []string, set func(string) bool, why map[string]string) []error {
	var errs []error
	for _, k := range keys {
		if set(k) {
			errs = append(errs, fmt.Errorf("%s%s: volume %s does not take it: %s", s.where(k), k, op, why[k]))
		}
	}
	return errs
}

// isSet reports whether the spec's field for key has a value.
func (s *Spec) isSet(key string) bool {
	switch key {
	case "external_id":
		return s.ExternalID != ""
	case "context":
		return len(s.Context) > 0
	case "snapshot_id":
		return s.SnapshotID != ""
	case "clone_id":
		return s.CloneID != ""
	case "secrets":
		return len(s.Secrets) > 0
	case "topology_request.preferred":
		return len(s.Preferred) > 0
	}
	return false
}

// capabilities returns the API's capabilities, with the mount options on
// each mount capability.
func (s *Spec) capabilities() ([]*csisupdv1.VolumeCapability, error) {
	caps := s.Capabilities
	if len(caps) == 0 {
		caps = []Capability{DefaultCapability}
	}
	out := make([]*csisupdv1.VolumeCapability, 0, len(caps))
	mounted := false
	for _, c := range caps {
		vc := &csisupdv1.VolumeCapability{AccessMode: c.AccessMode, AccessType: c.AccessType}
		if c.AccessType == "mount" {
			mounted = true
			if s.MountOptions != nil {
				vc.FsType = s.MountOptions.FSType
				vc.MountFlags = slices.Clone(s.MountOptions.MountFlags)
			}
		}
		out = append(out, vc)
	}
	if s.MountOptions != nil && !mounted && (s.MountOptions.FSType != "" || len(s.MountOptions.MountFlags) > 0) {
		return nil, fmt.Errorf("%smount_options: every capability is block-device; mount options apply to file-system capabilities only", s.where("mount_options"))
	}
	return out, nil
}

// segments returns topology segments as the API's messages.
func segments(in []map[string]string) []*csisupdv1.TopologySegment {
	if len(in) == 0 {
		return nil
	}
	out := make([]*csisupdv1.TopologySegment, len(in))
	for i, m := range in {
		out[i] = &csisupdv1.TopologySegment{Segments: maps.Clone(m)}
	}
	return out
}

// check returns the problems every operation shares: unset id and plugin,
// capacities out of order, both content sources, control characters in
// ids and keys.
func (s *Spec) check() []error {
	var errs []error
	if s.ID == "" {
		errs = append(errs, fmt.Errorf("%sid is not set: the volume needs an id", s.where("")))
	}
	if s.PluginID == "" {
		errs = append(errs, fmt.Errorf("%splugin_id is not set: the volume needs a plugin", s.where("")))
	}
	if s.CapacityMin < 0 || s.CapacityMax < 0 {
		errs = append(errs, fmt.Errorf("%scapacity: sizes cannot be negative", s.where("")))
	} else if s.CapacityMax > 0 && s.CapacityMin > s.CapacityMax {
		errs = append(errs, fmt.Errorf("%scapacity_max: %d bytes is less than capacity_min's %d", s.where("capacity_max"), s.CapacityMax, s.CapacityMin))
	}
	if s.SnapshotID != "" && s.CloneID != "" {
		errs = append(errs, fmt.Errorf("%s%s", s.where("clone_id"), errExclusive))
	}
	return append(errs, s.checkText()...)
}

// errExclusive is the problem of a spec with both content sources.
var errExclusive = errors.New("snapshot_id and clone_id are exclusive: a volume starts from a snapshot or from another volume, not both")

// CreateRequest returns the Control.CreateVolume request of the spec. It
// refuses the keys only register takes.
func (s *Spec) CreateRequest() (*csisupdv1.VolumeCreateRequest, error) {
	errs := s.check()
	errs = append(errs, s.refuse("create", []string{"external_id", "context"}, s.isSet, map[string]string{
		"external_id": "the plugin names a new volume; use volume register for a volume that exists",
		"context":     "the plugin returns a new volume's context; use volume register for a volume that exists",
	})...)
	caps, err := s.capabilities()
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	req := &csisupdv1.VolumeCreateRequest{
		Id:                s.ID,
		Name:              s.createName(),
		PluginId:          s.PluginID,
		CapacityMinBytes:  s.CapacityMin,
		CapacityMaxBytes:  s.CapacityMax,
		Capabilities:      caps,
		Parameters:        maps.Clone(s.Parameters),
		Secrets:           maps.Clone(map[string]string(s.Secrets)),
		MutableParameters: maps.Clone(s.MutableParameters),
	}
	if len(s.Required) > 0 || len(s.Preferred) > 0 {
		req.AccessibilityRequirements = &csisupdv1.TopologyRequirement{
			Requisite: segments(s.Required), Preferred: segments(s.Preferred),
		}
	}
	switch {
	case s.SnapshotID != "":
		req.ContentSource = &csisupdv1.VolumeContentSource{Source: &csisupdv1.VolumeContentSource_SnapshotId{SnapshotId: s.SnapshotID}}
	case s.CloneID != "":
		req.ContentSource = &csisupdv1.VolumeContentSource{Source: &csisupdv1.VolumeContentSource_VolumeId{VolumeId: s.CloneID}}
	}
	return req, nil
}

// createName returns the request's name: Name, unless it is the id.
func (s *Spec) createName() string {
	if s.Name == s.ID {
		return ""
	}
	return s.Name
}

// Volume returns the volume Control.RegisterVolume records for the spec:
// capacity_min is its capacity, capacity_max the limit it may grow to,
// and topology_request's required segments are where it is accessible
// from. It refuses the keys only create takes.
func (s *Spec) Volume() (*csisupdv1.Volume, error) {
	errs := s.check()
	if s.ExternalID == "" {
		errs = append(errs, fmt.Errorf("%sexternal_id is not set: register records a volume by its id in the storage provider", s.where("")))
	}
	errs = append(errs, s.refuse("register", []string{"snapshot_id", "clone_id", "secrets", "topology_request.preferred"}, s.isSet, map[string]string{
		"snapshot_id":                "only a new volume starts from a snapshot; use volume create",
		"clone_id":                   "only a new volume starts from another; use volume create",
		"secrets":                    "register records the volume without calling the plugin, and secrets are never stored",
		"topology_request.preferred": "preferences choose where a new volume is made; say where this one is accessible with required",
	})...)
	caps, err := s.capabilities()
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return &csisupdv1.Volume{
		Id:                 s.ID,
		PluginId:           s.PluginID,
		ExternalId:         s.ExternalID,
		CapacityBytes:      s.CapacityMin,
		CapacityLimitBytes: s.CapacityMax,
		Capabilities:       caps,
		Parameters:         maps.Clone(s.Parameters),
		MutableParameters:  maps.Clone(s.MutableParameters),
		Context:            maps.Clone(s.Context),
		AccessibleTopology: segments(s.Required),
	}, nil
}
