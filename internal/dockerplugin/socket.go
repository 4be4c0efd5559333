package dockerplugin

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// socketMode is the mode of the plugin socket: root and the group may
// connect, no one else.
const socketMode = 0o660

// staleDialTimeout bounds the dial that tells a stale socket file from
// one that another process serves.
const staleDialTimeout = time.Second

// socket is the plugin's listening socket at path.
type socket struct {
	path string
	lis  *net.UnixListener
	// made is the socket file as listen left it, so that close removes
	// that file and never one a successor made at the same path.
	made os.FileInfo

	once sync.Once
	err  error
}

// resolveGroup returns the gid of group, a name or a numeric gid; -1 for
// "" (the socket keeps the group it was made with, root's for the agent).
func resolveGroup(group string) (int, error) {
	if group == "" {
		return -1, nil
	}
	if n, err := strconv.Atoi(group); err == nil {
		if n < 0 {
			return 0, fmt.Errorf("docker.group %q: a gid cannot be negative", group)
		}
		return n, nil
	}
	g, err := user.LookupGroup(group)
	if err != nil {
		return 0, fmt.Errorf("docker.group %q: %w", group, err)
	}
	gid, err := strconv.Atoi(g.Gid)
	if err != nil {
		return 0, fmt.Errorf("docker.group %q: gid %q is not a number", group, g.Gid)
	}
	return gid, nil
}

// listen makes the plugin socket at path with mode socketMode and group
// gid (unchanged when -1). It binds a temporary name in the same
// directory, sets mode and group there, and renames it into place, so that
// no one connects while the socket has the permissions of the umask. A
// stale socket at path (or at the temporary name) is removed when no one
// serves it; any other file there is an error.
func listen(path string, gid int) (*socket, error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("docker.socket %s: create its directory: %w", path, err)
	}
	tmp := filepath.Join(dir, "."+filepath.Base(path))
	for _, p := range []string{path, tmp} {
		if err := removeStale(p); err != nil {
			return nil, fmt.Errorf("docker.socket %s: %w", path, err)
		}
	}
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("docker.socket %s: listen: %w", path, err)
	}
	// The file moves to path: closing must not remove whatever then has
	// the temporary name. close removes path itself.
	lis.SetUnlinkOnClose(false)
	made, err := finishSocket(tmp, path, gid)
	if err != nil {
		_ = lis.Close()
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("docker.socket %s: %w", path, err)
	}
	return &socket{path: path, lis: lis, made: made}, nil
}

// finishSocket gives the socket file at tmp its mode and group and
// renames it to path, returning the file's information.
func finishSocket(tmp, path string, gid int) (os.FileInfo, error) {
	if err := os.Chmod(tmp, socketMode); err != nil {
		return nil, fmt.Errorf("set its mode: %w", err)
	}
	if gid >= 0 {
		if err := os.Chown(tmp, -1, gid); err != nil {
			return nil, fmt.Errorf("give it group %d (docker.group): %w", gid, err)
		}
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("move it into place: %w", err)
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	return fi, nil
}

// removeStale removes the socket file at path unless a process accepts
// connections on it. A missing file is fine; another kind of file is an
// error, left alone.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case fi.Mode().Type() != fs.ModeSocket:
		return fmt.Errorf("%s exists and is not a socket: remove it or choose another path", path)
	}
	if conn, err := net.DialTimeout("unix", path, staleDialTimeout); err == nil {
		_ = conn.Close()
		return fmt.Errorf("%s is served by another process (another agent?): stop it or choose another path", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the stale socket %s: %w", path, err)
	}
	return nil
}

// close closes the listener and removes the socket file, if it is still
// the one listen made; once.
func (s *socket) close() error {
	s.once.Do(func() {
		_ = s.lis.Close()
		fi, err := os.Lstat(s.path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			s.err = err
		case os.SameFile(fi, s.made):
			if err := os.Remove(s.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				s.err = err
			}
		}
	})
	return s.err
}
