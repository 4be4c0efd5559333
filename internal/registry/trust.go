package registry

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// A socket in the plugin directory is trusted with volume secrets: whatever
// answers on it receives the secrets of every CSI call made to its plugin
// id. So the registry dials a socket only when nobody but trusted users
// can have put it there:
//
//   - the plugin directory is writable by neither its group nor others,
//     and owned by root or by the agent's own user (checked at every scan,
//     and by the agent at start through CheckPluginDir);
//   - no parent of the plugin directory is writable by others, unless it
//     has the sticky bit (as /tmp): in such a directory nobody can rename
//     or remove an entry they do not own. The parents' owners and group
//     write bits are not checked, and the parents are checked at start
//     only (CheckPluginDir);
//   - a plugin subdirectory <id>/ is writable by neither its group nor
//     others, and owned by root, the agent's user or one of the plugin
//     owners (a plugin running as its own user creates its own
//     subdirectory);
//   - a socket is owned by root, the agent's user or one of the plugin
//     owners;
//   - symlinks are never followed: a symlink as <id>.sock, as <id>/ or as
//     <id>/csi.sock is never dialled, wherever it points. csisupd's socket
//     layout has no need for them, and a symlink pointing out of the
//     plugin directory would make the checks above meaningless.
//
// The plugin directory itself may be a symlink: it is the operator's
// configuration, and its target is what is checked.
//
// The directory checks (the first three) can be turned off
// (ManagerConfig.AllowInsecurePluginDir); the socket owner and symlink
// rules always apply. The checks rest on the directories being writable
// by trusted users only: a socket is checked when a scan finds it, and
// again (its identity, see checkInstance) when a connection to it is made.

// trustPolicy decides which entries of the plugin directory may be dialled.
type trustPolicy struct {
	// agentUID is the agent's own (effective) user.
	agentUID uint32
	// owners are the other users that may own sockets and plugin
	// subdirectories (client.plugin_owners).
	owners []uint32
	// insecureDirs turns the directory checks off
	// (client.allow_insecure_plugin_dir).
	insecureDirs bool
}

// newTrustPolicy is the policy of an agent running as the current
// effective user.
func newTrustPolicy(owners []uint32, insecureDirs bool) trustPolicy {
	return trustPolicy{agentUID: uint32(os.Geteuid()), owners: slices.Clone(owners), insecureDirs: insecureDirs}
}

// ownerAllowed reports whether uid may own a plugin socket or a plugin
// subdirectory: root, the agent's own user agentUID, or one of owners.
func ownerAllowed(uid, agentUID uint32, owners []uint32) bool {
	return uid == 0 || uid == agentUID || slices.Contains(owners, uid)
}

// dirProblems lists why a directory with file mode mode, owned by uid, is
// not trusted to hold plugin sockets, or returns nil: it is writable by its
// group or by others, or owned by a user other than root, agentUID and
// owners. The problems read after "is" ("is writable by others"). The
// plugin directory itself is checked with no owners; a plugin subdirectory
// with the plugin owners.
func dirProblems(mode fs.FileMode, uid, agentUID uint32, owners []uint32) []string {
	var out []string
	if mode&0o020 != 0 {
		out = append(out, "writable by its group")
	}
	if mode&0o002 != 0 {
		out = append(out, "writable by others")
	}
	if !ownerAllowed(uid, agentUID, owners) {
		out = append(out, "not owned by "+allowedOwners(agentUID, owners))
	}
	return out
}

// parentProblem returns why a parent directory of the plugin directory with
// file mode mode is not trusted, or "": it is writable by others without
// the sticky bit, so anyone could rename the plugin directory away and put
// one of their own in its place.
func parentProblem(mode fs.FileMode) string {
	if mode&0o002 != 0 && mode&fs.ModeSticky == 0 {
		return "writable by others without the sticky bit"
	}
	return ""
}

// allowedOwners names the users allowed by agentUID and owners, for
// messages: "root (uid 0) or the agent's user csisupd (uid 998)".
func allowedOwners(agentUID uint32, owners []uint32) string {
	names := []string{"root (uid 0)"}
	if agentUID != 0 {
		names = append(names, "the agent's user "+describeUID(agentUID))
	}
	for _, uid := range owners {
		if uid != 0 && uid != agentUID {
			names = append(names, describeUID(uid)+" from client.plugin_owners")
		}
	}
	if len(names) == 1 {
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// describeUID names a user for messages: "alice (uid 1000)", or "uid 1000"
// when no user has that uid.
func describeUID(uid uint32) string {
	id := strconv.FormatUint(uint64(uid), 10)
	if u, err := user.LookupId(id); err == nil && u.Username != "" {
		return u.Username + " (uid " + id + ")"
	}
	return "uid " + id
}

// ownerOf returns the owner of the file fi describes.
func ownerOf(fi fs.FileInfo) (uint32, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return st.Uid, true
}

// socketProblem returns why the socket fi describes, at path, is not
// trusted (its owner is not allowed), or "".
func (p trustPolicy) socketProblem(fi fs.FileInfo) string {
	uid, ok := ownerOf(fi)
	if !ok {
		return "owner unknown (no unix stat data)"
	}
	if ownerAllowed(uid, p.agentUID, p.owners) {
		return ""
	}
	return fmt.Sprintf("owned by %s, who may not serve plugins: allowed owners are %s; "+
		"add the user to client.plugin_owners to trust it", describeUID(uid), allowedOwners(p.agentUID, p.owners))
}

// subdirProblem returns why the plugin subdirectory fi describes is not
// trusted, or "" (always "" when the directory checks are off).
func (p trustPolicy) subdirProblem(path string, fi fs.FileInfo) string {
	if p.insecureDirs {
		return ""
	}
	uid, ok := ownerOf(fi)
	if !ok {
		return "owner unknown (no unix stat data)"
	}
	probs := dirProblems(fi.Mode(), uid, p.agentUID, p.owners)
	if len(probs) == 0 {
		return ""
	}
	return fmt.Sprintf("plugin subdirectory %s (mode %s, owner %s) is %s, so no socket in it is dialled; fix: %s",
		path, fi.Mode(), describeUID(uid), strings.Join(probs, " and "), dirFix(path, fi.Mode(), probs, p.agentUID))
}

// topProblem returns why the plugin directory dir is not trusted now, or
// "" (always "" when the directory checks are off). Its parents are
// checked at start only (CheckPluginDir).
func (p trustPolicy) topProblem(dir string) string {
	if p.insecureDirs {
		return ""
	}
	switch err := checkDir(dir, p.agentUID); {
	case errors.Is(err, fs.ErrNotExist):
		// Removed since it was read: the next scan finds no sockets.
		return ""
	case err != nil:
		return err.Error()
	}
	return ""
}

// dirFix is the command that fixes probs of the directory at path, for an
// agent running as agentUID.
func dirFix(path string, mode fs.FileMode, probs []string, agentUID uint32) string {
	var fixes []string
	if mode&0o022 != 0 {
		fixes = append(fixes, "chmod go-w "+path)
	}
	for _, pr := range probs {
		if strings.HasPrefix(pr, "not owned by ") {
			owner := "root"
			if agentUID != 0 {
				owner = strconv.FormatUint(uint64(agentUID), 10)
			}
			fixes = append(fixes, "chown "+owner+" "+path)
		}
	}
	return strings.Join(fixes, " and ")
}

// symlinkReason says why the symlink at path in the plugin directory dir is
// not followed, and where it points.
func symlinkReason(path, dir string) string {
	where := "its target cannot be resolved"
	if target, err := filepath.EvalSymlinks(path); err == nil {
		where = "it resolves to " + target + ", outside the plugin directory"
		if realDir, err := filepath.EvalSymlinks(dir); err == nil && within(target, realDir) {
			where = "it resolves to " + target + ", inside the plugin directory"
		}
	}
	link, _ := os.Readlink(path)
	return fmt.Sprintf("not a unix socket (symlink to %q; %s): symlinks in the plugin directory are never followed; "+
		"create the socket or directory at %s itself", link, where, path)
}

// within reports whether path is dir or lies under it (both clean).
func within(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// UntrustedDirError is why the plugin directory, or one of its parents,
// cannot be trusted with plugin sockets.
type UntrustedDirError struct {
	// Path is the directory with the problem: the plugin directory or one
	// of its parents (Parent).
	Path   string
	Parent bool
	// Mode and UID are what was found.
	Mode fs.FileMode
	UID  uint32
	// Problems say what is wrong ("writable by others").
	Problems []string
	// Fix is a command that fixes it.
	Fix string
}

// Error describes the directory, what was found and how to fix it.
func (e *UntrustedDirError) Error() string {
	what := "plugin directory " + e.Path
	if e.Parent {
		what = "parent directory " + e.Path + " of the plugin directory"
	}
	return fmt.Sprintf("%s (mode %s, owner %s) is %s; fix: %s",
		what, e.Mode, describeUID(e.UID), strings.Join(e.Problems, " and "), e.Fix)
}

// CheckPluginDir checks that the plugin directory dir can be trusted with
// plugin sockets by an agent running as the current effective user: dir
// is writable by neither its group nor others and owned by root or that
// user, and none of its parents (of dir as given and of where it resolves
// to) is writable by others without the sticky bit. It returns an
// *UntrustedDirError for the first problem found, or an error when dir
// cannot be read.
func CheckPluginDir(dir string) error {
	agentUID := uint32(os.Geteuid())
	if err := checkDir(dir, agentUID); err != nil {
		return err
	}
	return checkParents(dir)
}

// checkDir checks the plugin directory dir itself (following a symlink:
// the configured path may be one).
func checkDir(dir string, agentUID uint32) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("plugin directory %q: %w", dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("plugin directory %q is not a directory", dir)
	}
	uid, ok := ownerOf(fi)
	if !ok {
		return fmt.Errorf("plugin directory %q: no unix stat data", dir)
	}
	probs := dirProblems(fi.Mode(), uid, agentUID, nil)
	if len(probs) == 0 {
		return nil
	}
	return &UntrustedDirError{Path: dir, Mode: fi.Mode(), UID: uid, Problems: probs, Fix: dirFix(dir, fi.Mode(), probs, agentUID)}
}

// checkParents checks every parent of dir, and of where it resolves to.
func checkParents(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("plugin directory %q: %w", dir, err)
	}
	paths := []string{abs}
	if real, err := filepath.EvalSymlinks(abs); err == nil && real != abs {
		paths = append(paths, real)
	}
	seen := make(map[string]bool)
	for _, p := range paths {
		for parent := filepath.Dir(p); !seen[parent]; parent = filepath.Dir(parent) {
			seen[parent] = true
			fi, err := os.Stat(parent)
			if err != nil {
				return fmt.Errorf("parent %q of the plugin directory: %w", parent, err)
			}
			if prob := parentProblem(fi.Mode()); prob != "" {
				uid, _ := ownerOf(fi)
				return &UntrustedDirError{Path: parent, Parent: true, Mode: fi.Mode(), UID: uid,
					Problems: []string{prob}, Fix: "chmod o-w " + parent + " (or chmod +t " + parent + ")"}
			}
			if parent == filepath.Dir(parent) {
				break // the root
			}
		}
	}
	return nil
}
