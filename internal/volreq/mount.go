package volreq

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// The privileged mount flags: a node's agent passes them to a plugin only
// when its operator lists them in client.allow_mount_flags. suid lets a
// set-user-id file on the volume gain root on the host; dev lets a device
// node on the volume open a host device.
const (
	FlagSuid = "suid"
	FlagDev  = "dev"
)

// privileged lists the privileged flags. The servers let all of them
// through: they cannot know a node's list, and the node's agent refuses
// the ones its operator does not allow.
var privileged = []string{FlagSuid, FlagDev}

// Caps of the mount flags of one usage or capability. Real mount options
// are short (uid=1000, context="system_u:object_r:..."), and the kernel
// takes at most one page of them in all.
const (
	MaxMountFlags     = 64
	MaxMountFlagBytes = 256
)

// refusedFlags are mount options no request may bring, by why: they change
// what is mounted or where, not how a file system is mounted. Compared by
// the option's name (before "="), in lower case.
var refusedFlags = map[string]string{
	"remount":     "it changes an existing mount",
	"bind":        "it mounts a host path instead of the volume",
	"rbind":       "it mounts a host path instead of the volume",
	"move":        "it moves an existing mount",
	"loop":        "it mounts a file through a loop device instead of the volume",
	"shared":      "it changes the mount propagation of the host",
	"rshared":     "it changes the mount propagation of the host",
	"slave":       "it changes the mount propagation of the host",
	"rslave":      "it changes the mount propagation of the host",
	"private":     "it changes the mount propagation of the host",
	"rprivate":    "it changes the mount propagation of the host",
	"unbindable":  "it changes the mount propagation of the host",
	"runbindable": "it changes the mount propagation of the host",
}

// xMountPrefix starts util-linux's X-mount.* options (mkdir, owner, mode,
// subdir, idmap), which make mount(8) act on host paths.
const xMountPrefix = "x-mount."

// MountFlags checks the mount flags of one usage or capability; field names
// them in errors (for example "usage.mount_flags"). allowed lists the
// privileged flags (FlagSuid, FlagDev) that may pass.
func MountFlags(field string, flags, allowed []string) error {
	if len(flags) > MaxMountFlags {
		return fmt.Errorf("%s has %d flags, more than the %d allowed", field, len(flags), MaxMountFlags)
	}
	for i, f := range flags {
		if err := mountFlag(fmt.Sprintf("%s[%d]", field, i), f, allowed); err != nil {
			return err
		}
	}
	return nil
}

func mountFlag(field, f string, allowed []string) error {
	switch {
	case f == "":
		return fmt.Errorf("%s is empty", field)
	case len(f) > MaxMountFlagBytes:
		return fmt.Errorf("%s is %d bytes long, more than the %d allowed", field, len(f), MaxMountFlagBytes)
	case !utf8.ValidString(f):
		return fmt.Errorf("%s %q is not valid UTF-8", field, f)
	case strings.Contains(f, ","):
		return fmt.Errorf("%s %q holds a comma: give each mount option as a flag of its own", field, f)
	case strings.IndexFunc(f, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		return fmt.Errorf("%s %q holds whitespace or a control character", field, f)
	}
	name, _, _ := strings.Cut(strings.ToLower(f), "=")
	if why, ok := refusedFlags[name]; ok {
		return fmt.Errorf("%s %q is not allowed: %s", field, f, why)
	}
	if strings.HasPrefix(name, xMountPrefix) {
		return fmt.Errorf("%s %q is not allowed: X-mount options make mount(8) act on host paths", field, f)
	}
	if slices.Contains(privileged, name) && !slices.Contains(allowed, name) {
		return fmt.Errorf("%s %q is not allowed on this node: its agent's client.allow_mount_flags does not list %q", field, f, name)
	}
	return nil
}

// fsTypePattern is what a file system type name may be: ext4, xfs, nfs4,
// fuse.sshfs, ntfs-3g. No "/", so it never names a path.
var fsTypePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._+-]{0,31}$`)

// FSType checks a file system type; empty means the plugin's default.
func FSType(field, fsType string) error {
	if fsType == "" {
		return nil
	}
	if !fsTypePattern.MatchString(fsType) || strings.Contains(fsType, "..") {
		return fmt.Errorf("%s %q is not a file system type name: at most 32 lower-case letters, digits and . _ + -, starting with a letter or digit, without \"..\"",
			field, fsType)
	}
	return nil
}

// MaxGroupID is the largest group id a volume mount group may name: the
// kernel's gid_t is 32 bits, and its all-ones value means "no group".
const MaxGroupID = 1<<32 - 2

// VolumeMountGroup checks a volume mount group (CSI's
// VolumeCapability.MountVolume.volume_mount_group); empty means none. It
// must be a group id in canonical decimal form (no sign, no leading zero)
// of at most MaxGroupID: the plugin hands it to mount options such as
// gid=, and one spelling per group keeps the usages of a volume
// comparable.
func VolumeMountGroup(field, group string) error {
	if group == "" {
		return nil
	}
	if len(group) > len(strconv.Itoa(MaxGroupID)) || strings.IndexFunc(group, func(r rune) bool { return r < '0' || r > '9' }) >= 0 ||
		(len(group) > 1 && group[0] == '0') {
		return fmt.Errorf("%s %q is not a group id: give a decimal number from 0 to %d without leading zeros", field, group, MaxGroupID)
	}
	if n, err := strconv.ParseUint(group, 10, 64); err != nil || n > MaxGroupID {
		return fmt.Errorf("%s %q is out of range: group ids go from 0 to %d", field, group, MaxGroupID)
	}
	return nil
}

// Usage checks the mount options of a usage: its fs type, mount flags
// (allowed are the privileged flags that may pass) and volume mount group.
// A nil usage passes.
func Usage(field string, u *csisupdv1.VolumeUsage, allowed []string) error {
	if err := mountOptions(field, u.GetFsType(), u.GetMountFlags(), allowed); err != nil {
		return err
	}
	if err := VolumeMountGroup(field+".volume_mount_group", u.GetVolumeMountGroup()); err != nil {
		return err
	}
	if u.GetVolumeMountGroup() != "" && u.GetAccessType() == "block" {
		return fmt.Errorf("%s.volume_mount_group applies to access_type mount only, not block", field)
	}
	return nil
}

// Capabilities checks the mount options of a volume's capabilities as the
// servers see them: every privileged flag passes, for the node to judge.
func Capabilities(field string, caps []*csisupdv1.VolumeCapability) error {
	if len(caps) > MaxCapabilities {
		return fmt.Errorf("%s has %d capabilities, more than the %d allowed", field, len(caps), MaxCapabilities)
	}
	for i, c := range caps {
		if err := mountOptions(fmt.Sprintf("%s[%d]", field, i), c.GetFsType(), c.GetMountFlags(), privileged); err != nil {
			return err
		}
	}
	return nil
}

// MaxCapabilities caps the capabilities of one volume: CSI knows 2 access
// types and 7 access modes, so more than 64 is never a real list.
const MaxCapabilities = 64

func mountOptions(field, fsType string, flags, allowed []string) error {
	if err := FSType(field+".fs_type", fsType); err != nil {
		return err
	}
	return MountFlags(field+".mount_flags", flags, allowed)
}
