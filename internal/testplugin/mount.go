package testplugin

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Values of Config.Mounts: how the node service places a volume.
const (
	// MountsMarker, the default, mounts nothing: NodeStageVolume only
	// records the staging path and NodePublishVolume makes the target a
	// symbolic link to the volume's directory. It needs no privileges.
	MountsMarker = "marker"
	// MountsBind makes real bind mounts, as a driver does: the volume's
	// directory on the staging target, and the staging target on the
	// publish target. It needs root with CAP_SYS_ADMIN; see
	// RealMountsAvailable.
	MountsBind = "bind"
)

// mountInfoFile lists the mounts of this process's mount namespace.
const mountInfoFile = "/proc/self/mountinfo"

// MountPoints returns the mount points of this process's mount namespace,
// as /proc/self/mountinfo lists them: real paths, with no symbolic links.
func MountPoints() (map[string]bool, error) {
	f, err := os.Open(mountInfoFile)
	if err != nil {
		return nil, fmt.Errorf("testplugin: mount table: %w", err)
	}
	defer f.Close()
	points, err := parseMountInfo(f)
	if err != nil {
		return nil, fmt.Errorf("testplugin: mount table %s: %w", mountInfoFile, err)
	}
	return points, nil
}

// IsMountPoint reports whether path is a mount point in this process's
// mount namespace. Symbolic links in path are resolved first, since the
// mount table holds real paths; a path that does not exist is not a mount
// point.
func IsMountPoint(path string) (bool, error) {
	real, err := filepath.EvalSymlinks(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("testplugin: mount point %q: %w", path, err)
	}
	real, err = filepath.Abs(real)
	if err != nil {
		return false, fmt.Errorf("testplugin: mount point %q: %w", path, err)
	}
	points, err := MountPoints()
	if err != nil {
		return false, err
	}
	return points[real], nil
}

// parseMountInfo reads the mount points of a mountinfo file: the fifth
// field of each line, with the kernel's octal escapes undone.
func parseMountInfo(r io.Reader) (map[string]bool, error) {
	points := make(map[string]bool)
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		// Fields are separated by one space; the kernel escapes spaces,
		// tabs, newlines and backslashes in paths, but no other white space.
		fields := strings.Split(sc.Text(), " ")
		if len(fields) < 5 {
			return nil, fmt.Errorf("line %q has %d fields, want at least 5", sc.Text(), len(fields))
		}
		p, err := unescapeMountPath(fields[4])
		if err != nil {
			return nil, err
		}
		points[p] = true
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return points, nil
}

// unescapeMountPath undoes the kernel's escapes in a mountinfo path: a
// space, tab, newline or backslash is written as \ and three octal digits.
func unescapeMountPath(s string) (string, error) {
	if !strings.Contains(s, `\`) {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			b.WriteByte(s[i])
			continue
		}
		if i+4 > len(s) {
			return "", fmt.Errorf("path %q: escape at byte %d is cut short", s, i)
		}
		n, err := strconv.ParseUint(s[i+1:i+4], 8, 8)
		if err != nil {
			return "", fmt.Errorf("path %q: bad escape at byte %d", s, i)
		}
		b.WriteByte(byte(n))
		i += 3
	}
	return b.String(), nil
}

// RealMountsAvailable reports whether this process can make the bind
// mounts of MountsBind, and if not, why. Being root is not always enough:
// a container without CAP_SYS_ADMIN refuses mount(2). So the first call
// tries a read-only bind mount of a temporary directory; later calls
// return its result.
func RealMountsAvailable() (bool, string) {
	return mountProbe()
}

var mountProbe = sync.OnceValues(func() (bool, string) {
	if uid := os.Geteuid(); uid != 0 {
		return false, fmt.Sprintf("bind mounts need root; this process runs as uid %d", uid)
	}
	dir, err := os.MkdirTemp("", "testplugin-mount-probe-")
	if err != nil {
		return false, fmt.Sprintf("cannot create a directory for the mount probe: %v", err)
	}
	defer os.RemoveAll(dir)
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	for _, d := range []string{src, dst} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return false, fmt.Sprintf("cannot create a directory for the mount probe: %v", err)
		}
	}
	if err := bindMount(src, dst, true); err != nil {
		return false, fmt.Sprintf("the mount probe failed: %v", err)
	}
	mounted, err := IsMountPoint(dst)
	if uerr := unmount(dst, 0); uerr != nil {
		return false, fmt.Sprintf("the mount probe cannot undo its mount: %v", uerr)
	}
	switch {
	case err != nil:
		return false, fmt.Sprintf("the mount probe cannot read the mount table: %v", err)
	case !mounted:
		return false, fmt.Sprintf("the mount probe's bind mount of %s is not in %s", dst, mountInfoFile)
	}
	return true, "root may bind-mount"
})

// keptFlags are the per-mount flags a read-only remount must repeat: a
// remount sets all of them at once, and in a user namespace the flags
// inherited from the source are locked, so dropping one fails with EPERM.
var keptFlags = []struct{ statfs, mount uintptr }{
	{unix.ST_NOSUID, unix.MS_NOSUID},
	{unix.ST_NODEV, unix.MS_NODEV},
	{unix.ST_NOEXEC, unix.MS_NOEXEC},
	{unix.ST_NOATIME, unix.MS_NOATIME},
	{unix.ST_NODIRATIME, unix.MS_NODIRATIME},
	{unix.ST_RELATIME, unix.MS_RELATIME},
}

// bindMount bind-mounts source on target, then remounts it read-only when
// readonly is set: MS_RDONLY is ignored on the first bind, so a
// read-only bind mount takes two calls.
func bindMount(source, target string, readonly bool) error {
	if err := unix.Mount(source, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind mount %q on %q: %w", source, target, err)
	}
	if !readonly {
		return nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(target, &st); err != nil {
		return errors.Join(fmt.Errorf("read-only bind mount on %q: statfs: %w", target, err), unmount(target, 0))
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY)
	for _, f := range keptFlags {
		if uintptr(st.Flags)&f.statfs != 0 {
			flags |= f.mount
		}
	}
	if err := unix.Mount("", target, "", flags, ""); err != nil {
		return errors.Join(fmt.Errorf("remount %q read-only: %w", target, err), unmount(target, 0))
	}
	return nil
}

// unmount unmounts the mount on path with the unmount flags given
// (MNT_DETACH for a lazy unmount). A path that is not a mount point, or
// does not exist, succeeds. A symbolic link at path is not followed.
func unmount(path string, flags int) error {
	err := unix.Unmount(path, flags|unix.UMOUNT_NOFOLLOW)
	if err == nil || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return fmt.Errorf("unmount %q: %w", path, err)
}

// maxStacked bounds the mounts UnmountAll removes from one path: the
// plugin never stacks mounts, so more means something else is mounting
// there.
const maxStacked = 16

// UnmountAll lazily unmounts (MNT_DETACH) every staging and target path
// the plugin's records hold that is a mount point, so that no mount of a
// test outlives it. The records stay as they are. Stop and Kill leave the
// mounts in place, as a plugin process that exits or crashes does; tests
// with MountsBind register UnmountAll with t.Cleanup, after the temporary
// directories the mounts live in, so that it runs before they are
// removed.
func (p *Plugin) UnmountAll() error {
	p.st.mu.Lock()
	var paths []string
	for _, n := range p.st.node {
		// Targets first: they were mounted from the staging mount.
		for t := range n.Targets {
			paths = append(paths, t)
		}
	}
	for _, n := range p.st.node {
		if n.StagingPath != "" {
			paths = append(paths, n.StagingPath)
		}
	}
	p.st.mu.Unlock()
	var errs []error
	for _, path := range paths {
		if err := unmountAllAt(path); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// unmountAllAt lazily unmounts path until it is no mount point.
func unmountAllAt(path string) error {
	for range maxStacked {
		mounted, err := IsMountPoint(path)
		if err != nil || !mounted {
			return err
		}
		if err := unmount(path, unix.MNT_DETACH); err != nil {
			return fmt.Errorf("testplugin: %w", err)
		}
	}
	return fmt.Errorf("testplugin: %q is still a mount point after %d unmounts", path, maxStacked)
}
