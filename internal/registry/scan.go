package registry

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/ids"
	"github.com/csisupd/csisupd/internal/plugin"
)

// SocketName is the socket file name inside a plugin's own directory:
// <plugin_dir>/<id>/csi.sock.
const SocketName = "csi.sock"

// SocketSuffix ends a socket placed directly in the plugin directory:
// <plugin_dir>/<id>.sock.
const SocketSuffix = ".sock"

// desiredState is the result of one scan of the plugin directory.
type desiredState struct {
	// Sockets maps plugin id to the identity of its socket.
	Sockets map[string]plugin.Instance
	// Ignored lists entries that are not supervised, sorted by path.
	Ignored []plugin.Ignored
	// Refused are the entries of Ignored that are not trusted (see
	// trustPolicy), with their plugin id, sorted by path. Each is
	// reported by a plugin-socket-ignored event.
	Refused []refusal
	// TopProblem is why the plugin directory itself is not trusted, or
	// "". While it is set no socket in it is dialled.
	TopProblem string
	// Expect maps a declared plugin's id to the type it must have.
	Expect map[string]plugin.Type
	// Shadowed are the <id>.sock sockets not supervised because an
	// <id>/csi.sock exists too, by id; each is listed in Ignored. One that
	// holds its plugin id still claims it (see addClaims).
	Shadowed map[string]plugin.Instance
}

// refusal is a candidate plugin socket, or plugin subdirectory, that is not
// dialled because it is not trusted.
type refusal struct {
	ID, Path, Reason string
}

// scanPluginDir reads dir once (readdir, plus one lstat per candidate
// socket and per plugin subdirectory, plus one stat of dir) and returns the
// desired set. Entries that pol does not trust are ignored and listed as
// refused. watchSubdir is called for every plugin subdirectory before the
// socket inside it is looked at, so a socket created right after the look
// still produces a file system event.
func scanPluginDir(dir string, pol trustPolicy, watchSubdir func(path string)) (desiredState, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return desiredState{}, fmt.Errorf("read plugin directory %q: %w", dir, err)
	}
	st := desiredState{Sockets: make(map[string]plugin.Instance), Shadowed: make(map[string]plugin.Instance)}
	ignore := func(path, reason string) {
		st.Ignored = append(st.Ignored, plugin.Ignored{Path: path, Reason: reason})
	}
	refuse := func(id, path, reason string) {
		ignore(path, reason)
		st.Refused = append(st.Refused, refusal{ID: id, Path: path, Reason: reason})
	}
	// Sockets of the <id>.sock form, added after the <id>/csi.sock form
	// so that the latter wins when both exist.
	type flat struct {
		id string
		si plugin.Instance
	}
	var flats []flat
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		path := filepath.Join(dir, name)
		switch {
		case e.IsDir():
			sock := filepath.Join(path, SocketName)
			if watchSubdir != nil {
				watchSubdir(path)
			}
			if !ids.ValidPluginID(name) {
				// Only worth reporting once it holds a socket path.
				if _, err := os.Lstat(sock); err == nil {
					ignore(sock, invalidIDReason(name))
				}
				continue
			}
			fi, err := e.Info()
			switch {
			case errors.Is(err, fs.ErrNotExist):
				continue // removed since readdir
			case err != nil:
				ignore(path, "cannot stat: "+err.Error())
				continue
			}
			if reason := pol.subdirProblem(path, fi); reason != "" {
				refuse(name, path, reason)
				continue
			}
			si, reason, refused, err := pol.inspectSocket(sock, dir)
			switch {
			case errors.Is(err, fs.ErrNotExist):
				// A plugin directory whose socket is not there (yet).
			case err != nil:
				ignore(sock, "cannot stat: "+err.Error())
			case refused:
				refuse(name, sock, reason)
			case reason != "":
				ignore(sock, reason)
			default:
				st.Sockets[name] = si
			}
		case strings.HasSuffix(name, SocketSuffix):
			id := strings.TrimSuffix(name, SocketSuffix)
			if !ids.ValidPluginID(id) {
				ignore(path, invalidIDReason(id))
				continue
			}
			si, reason, refused, err := pol.inspectSocket(path, dir)
			switch {
			case errors.Is(err, fs.ErrNotExist):
				// Removed since readdir.
			case err != nil:
				ignore(path, "cannot stat: "+err.Error())
			case refused:
				refuse(id, path, reason)
			case reason != "":
				ignore(path, reason)
			default:
				flats = append(flats, flat{id: id, si: si})
			}
		case e.Type()&fs.ModeSymlink != 0 && ids.ValidPluginID(name):
			// A symlink as the <id> directory: never followed.
			refuse(name, path, symlinkReason(path, dir))
		default:
			ignore(path, fmt.Sprintf("not a plugin socket (%s): expected <id>%s or <id>/%s",
				describeMode(e.Type()), SocketSuffix, SocketName))
		}
	}
	for _, f := range flats {
		if prev, ok := st.Sockets[f.id]; ok {
			ignore(f.si.Path, fmt.Sprintf("duplicate plugin id %q: already served by %s", f.id, prev.Path))
			st.Shadowed[f.id] = f.si
			continue
		}
		st.Sockets[f.id] = f.si
	}
	if st.TopProblem = pol.topProblem(dir); st.TopProblem != "" {
		for id, si := range st.Sockets {
			refuse(id, si.Path, "the plugin directory is not trusted: "+st.TopProblem)
		}
		clear(st.Sockets)
	}
	slices.SortFunc(st.Ignored, func(a, b plugin.Ignored) int { return strings.Compare(a.Path, b.Path) })
	st.Refused = sortedRefusals(st.Refused)
	return st, nil
}

func invalidIDReason(id string) string {
	return fmt.Sprintf("invalid plugin id %q: must match %s", id, ids.PluginIDPattern)
}

// lstatSocket returns the identity of the unix socket at path, or a reason
// why the file there is not one csisupd can connect to (a symlink is not
// one).
func lstatSocket(path string) (plugin.Instance, string, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return plugin.Instance{}, "", err
	}
	return socketOf(path, fi)
}

// inspectSocket is lstatSocket for a candidate socket of the plugin
// directory dir, with the trust checks: refused is true, with the reason,
// for a symlink and for a socket whose owner is not allowed.
func (p trustPolicy) inspectSocket(path, dir string) (si plugin.Instance, reason string, refused bool, err error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return plugin.Instance{}, "", false, err
	}
	if fi.Mode().Type() == fs.ModeSymlink {
		return plugin.Instance{}, symlinkReason(path, dir), true, nil
	}
	return p.trustedSocket(path, fi)
}

// trustedSocket is the identity of the socket at path that fi (from
// lstat, not a symlink) describes, or why it is not one csisupd can
// connect to, or a refusal with the reason when its owner is not allowed.
func (p trustPolicy) trustedSocket(path string, fi fs.FileInfo) (si plugin.Instance, reason string, refused bool, err error) {
	si, reason, err = socketOf(path, fi)
	if err != nil || reason != "" {
		return plugin.Instance{}, reason, false, err
	}
	if reason := p.socketProblem(fi); reason != "" {
		return plugin.Instance{}, reason, true, nil
	}
	return si, "", false, nil
}

// socketOf returns the identity of the unix socket at path that fi (from
// lstat) describes, or a reason why it is not one csisupd can connect to.
func socketOf(path string, fi fs.FileInfo) (plugin.Instance, string, error) {
	if fi.Mode().Type() != fs.ModeSocket {
		return plugin.Instance{}, fmt.Sprintf("not a unix socket (%s)", describeMode(fi.Mode().Type())), nil
	}
	if reason := socketPathProblem(path); reason != "" {
		return plugin.Instance{}, reason, nil
	}
	return socketIDOf(path, fi)
}

// unixSocketPathMax is the longest path a unix socket address holds:
// sun_path is 108 bytes on Linux, the last one a NUL.
const unixSocketPathMax = 107

// socketPathProblem returns why no connection can be made to a socket at
// path, or "". A plugin can bind such a socket (through a relative path,
// from its own working directory) that nobody can connect to by its full
// path: supervising it would only ever time out, so it is reported as
// ignored instead, with what to change.
func socketPathProblem(path string) string {
	err := csiclient.CheckSocketPath(path)
	if err == nil {
		return ""
	}
	if len(path) > unixSocketPathMax {
		return fmt.Sprintf("socket path too long: %d bytes, over the %d-byte limit of a unix socket address; "+
			"shorten the plugin directory or the plugin id", len(path), unixSocketPathMax)
	}
	return "unusable socket path: " + err.Error()
}

// socketIDOf builds a SocketID from the stat data of a socket file.
func socketIDOf(path string, fi fs.FileInfo) (plugin.Instance, string, error) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return plugin.Instance{}, "", fmt.Errorf("stat %q: no unix stat data", path)
	}
	return plugin.Instance{
		Path: path,
		// The conversions matter on platforms where these are not uint64.
		Dev:   uint64(st.Dev),
		Inode: uint64(st.Ino),
		Mtime: st.Mtim.Nano(),
	}, "", nil
}

// describeMode names a file type for ignore reasons.
func describeMode(t fs.FileMode) string {
	switch {
	case t == 0:
		return "regular file"
	case t&fs.ModeDir != 0:
		return "directory"
	case t&fs.ModeSymlink != 0:
		return "symlink"
	case t&fs.ModeNamedPipe != 0:
		return "named pipe"
	case t&fs.ModeSocket != 0:
		return "unix socket"
	case t&fs.ModeCharDevice != 0:
		return "character device"
	case t&fs.ModeDevice != 0:
		return "block device"
	default:
		return "irregular file"
	}
}
