package nodevolumes

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/ids"
)

// Access types of a usage, as VolumeUsage.access_type names them.
const (
	AccessTypeMount = "mount"
	AccessTypeBlock = "block"
)

// DefaultAccessMode is the access mode of a usage that names none.
const DefaultAccessMode = "SINGLE_NODE_WRITER"

// maxPathLen caps a path the servers send (PATH_MAX on Linux).
const maxPathLen = 4096

// Directories under a plugin's mount root.
const (
	stagingDir     = "staging"
	perWorkloadDir = "per-workload"
)

// checkID returns InvalidArgument naming field unless id is a valid plugin,
// volume or workload id: it must be usable as one path element.
func checkID(field, id string) error {
	switch {
	case id == "":
		return status.Errorf(codes.InvalidArgument, "%s is required", field)
	case id == "." || id == "..":
		return status.Errorf(codes.InvalidArgument, "%s %q is not a valid id", field, id)
	case !ids.ValidPluginID(id):
		return status.Errorf(codes.InvalidArgument, "%s %q is not a valid id: it must match %s", field, id, ids.PluginIDPattern)
	}
	return nil
}

// usage is a normalised VolumeUsage: defaults applied, names checked.
type usage struct {
	AccessMode string   `json:"access_mode"`
	AccessType string   `json:"access_type"`
	ReadOnly   bool     `json:"read_only,omitempty"`
	FSType     string   `json:"fs_type,omitempty"`
	MountFlags []string `json:"mount_flags,omitempty"`
	// MountGroup is CSI's volume_mount_group; records written before it
	// existed load with none.
	MountGroup string `json:"volume_mount_group,omitempty"`
}

// normaliseUsage checks u and applies its defaults. A nil u is the default
// usage: a writable file system for a single node.
func normaliseUsage(u *csisupdv1.VolumeUsage) (usage, error) {
	n := usage{
		AccessMode: u.GetAccessMode(),
		AccessType: u.GetAccessType(),
		ReadOnly:   u.GetReadOnly(),
		FSType:     u.GetFsType(),
		MountFlags: append([]string(nil), u.GetMountFlags()...),
		MountGroup: u.GetVolumeMountGroup(),
	}
	if n.AccessMode == "" {
		n.AccessMode = DefaultAccessMode
	}
	if v, ok := csi.VolumeCapability_AccessMode_Mode_value[n.AccessMode]; !ok || v == int32(csi.VolumeCapability_AccessMode_UNKNOWN) {
		return usage{}, status.Errorf(codes.InvalidArgument, "usage.access_mode %q is not a CSI access mode name (for example %s)", n.AccessMode, DefaultAccessMode)
	}
	if n.AccessType == "" {
		n.AccessType = AccessTypeMount
	}
	switch n.AccessType {
	case AccessTypeMount:
	case AccessTypeBlock:
		if n.FSType != "" || len(n.MountFlags) > 0 || n.MountGroup != "" {
			return usage{}, status.Error(codes.InvalidArgument, "usage: fs_type, mount_flags and volume_mount_group apply to access_type mount only, not block")
		}
	default:
		return usage{}, status.Errorf(codes.InvalidArgument, "usage.access_type %q is neither %q nor %q", n.AccessType, AccessTypeMount, AccessTypeBlock)
	}
	for i, f := range n.MountFlags {
		if f == "" {
			return usage{}, status.Errorf(codes.InvalidArgument, "usage.mount_flags[%d] is empty", i)
		}
	}
	return n, nil
}

// key returns the usage key: <rw|ro>-<file-system|block>-<access mode>,
// followed by 8 hex digits of a hash of the mount options (mount group
// included) when there are any, so that two usages with other options
// never share a staging. A usage without a mount group hashes as before
// the group existed, so the keys, and paths, of older records stay.
func (u usage) key() string {
	var b strings.Builder
	if u.ReadOnly {
		b.WriteString("ro-")
	} else {
		b.WriteString("rw-")
	}
	if u.AccessType == AccessTypeBlock {
		b.WriteString("block-")
	} else {
		b.WriteString("file-system-")
	}
	b.WriteString(strings.ToLower(strings.ReplaceAll(u.AccessMode, "_", "-")))
	if u.FSType != "" || len(u.MountFlags) > 0 || u.MountGroup != "" {
		h := sha256.New()
		h.Write([]byte(u.FSType))
		for _, f := range u.MountFlags {
			h.Write([]byte{0})
			h.Write([]byte(f))
		}
		if u.MountGroup != "" {
			// 1 never occurs in a mount flag: a group cannot pass for one.
			h.Write([]byte{1})
			h.Write([]byte(u.MountGroup))
		}
		b.WriteString("-")
		b.WriteString(hex.EncodeToString(h.Sum(nil)[:4]))
	}
	return b.String()
}

// proto returns the usage as its API message.
func (u usage) proto() *csisupdv1.VolumeUsage {
	return &csisupdv1.VolumeUsage{
		AccessMode:       u.AccessMode,
		AccessType:       u.AccessType,
		ReadOnly:         u.ReadOnly,
		FsType:           u.FSType,
		MountFlags:       append([]string(nil), u.MountFlags...),
		VolumeMountGroup: u.MountGroup,
	}
}

// capability returns the CSI volume capability of the usage.
func (u usage) capability() *csi.VolumeCapability {
	c := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{
		Mode: csi.VolumeCapability_AccessMode_Mode(csi.VolumeCapability_AccessMode_Mode_value[u.AccessMode]),
	}}
	if u.AccessType == AccessTypeBlock {
		c.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
	} else {
		c.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{
			FsType:           u.FSType,
			MountFlags:       append([]string(nil), u.MountFlags...),
			VolumeMountGroup: u.MountGroup,
		}}
	}
	return c
}

// roots are a plugin's mount root on the host and the same root as the
// plugin sees it.
type roots struct {
	// Host is the mount root on the host (PluginDirs.MountDir or the
	// default under the data directory).
	Host string `json:"host"`
	// Plugin is the path the plugin sees for Host; empty when it sees the
	// host path.
	Plugin string `json:"plugin,omitempty"`
}

// stagingPath returns the host staging target of volume with usage key.
func (r roots) stagingPath(volume, usageKey string) string {
	return filepath.Join(r.stagingDir(volume), usageKey)
}

// stagingDir returns the host directory of volume's staging targets.
func (r roots) stagingDir(volume string) string {
	return filepath.Join(r.Host, stagingDir, volume)
}

// targetPath returns the host publish target of volume for workload with
// usage key.
func (r roots) targetPath(workload, volume, usageKey string) string {
	return filepath.Join(r.targetDir(workload, volume), usageKey)
}

// targetDir returns the host directory of volume's publish targets for
// workload.
func (r roots) targetDir(workload, volume string) string {
	return filepath.Join(r.Host, perWorkloadDir, workload, volume)
}

// under reports whether p is a clean absolute path strictly below dir:
// no "..", no doubled or trailing separator, not dir itself.
func under(dir, p string) bool {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return false
	}
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// checkServerPath returns InvalidArgument naming field unless p, a host
// path the servers sent, lies below dir (see under) and no directory
// between the mount root and p is a symbolic link: the plugin is never
// asked to unpublish or unstage anything outside the mount's directory.
// p itself may be a link (a plugin may publish one); parts that do not
// exist yet are fine.
func (r roots) checkServerPath(field, dir, p string) error {
	if len(p) > maxPathLen {
		return status.Errorf(codes.InvalidArgument, "%s is %d bytes long; at most %d are allowed", field, len(p), maxPathLen)
	}
	if !under(dir, p) {
		return status.Errorf(codes.InvalidArgument, "%s %q is not a clean path under %q", field, p, dir)
	}
	rel, err := filepath.Rel(r.Host, filepath.Dir(p))
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "%s %q is not under the mount root %q", field, p, r.Host)
	}
	walked := r.Host
	for _, part := range strings.Split(rel, string(filepath.Separator)) {
		walked = filepath.Join(walked, part)
		fi, err := os.Lstat(walked)
		switch {
		case errors.Is(err, os.ErrNotExist):
			return nil
		case err != nil:
			return status.Errorf(codes.Internal, "check %s %q: %v", field, p, err)
		case fi.Mode()&os.ModeSymlink != 0:
			return status.Errorf(codes.InvalidArgument, "%s %q passes through the symbolic link %q", field, p, walked)
		}
	}
	return nil
}

// pluginPath returns hostPath, a path under the host root, as the plugin
// sees it. An empty hostPath stays empty.
func (r roots) pluginPath(hostPath string) (string, error) {
	if hostPath == "" || r.Plugin == "" {
		return hostPath, nil
	}
	rel, err := filepath.Rel(r.Host, hostPath)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", fmt.Errorf("volumes: path %q is not under the mount root %q", hostPath, r.Host)
	}
	return filepath.Join(r.Plugin, rel), nil
}
