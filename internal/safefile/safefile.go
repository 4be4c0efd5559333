// Package safefile reads the files the agent and the CLI are given
// (secrets files, token files, TLS certificates and keys, configuration
// files) so that no file can wedge the process that reads it.
//
// A path is inspected with lstat before anything opens it. A FIFO, a
// device, a socket or a directory where a regular file is expected is
// refused, naming the file and its type: opening a FIFO blocks until a
// writer appears, and reading a device may never end. A symlink is
// resolved, and its target is inspected the same way. The target is then
// opened non-blocking and without following a symlink, so that a FIFO or
// a link put in its place after the inspection cannot block the open, and
// fstat must find the very file that lstat inspected. The read is capped
// in size and bounded in time.
//
// A private file (Spec.Private), such as a secrets file, must also belong
// to root or to the process's user, give no permission to group or
// others, and lie in directories that only root or that user can change
// (see Spec.Private for the rule).
//
// WriteFile writes the small state files the agent keeps in its data
// directory atomically: a crash leaves the old file or the new one.
package safefile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// DefaultTimeout bounds a read whose context has no earlier deadline. A
// local file is read in microseconds; one on a hung network file system
// is given up after this.
const DefaultTimeout = 10 * time.Second

// ErrNotRegular is matched (errors.Is) by the error of a file that is not
// a regular file: a FIFO, a device, a socket or a directory.
var ErrNotRegular = errors.New("not a regular file")

// Spec says what a file is and how it may be read.
type Spec struct {
	// What names the file in errors, before its path: "secrets file",
	// "tls.ca_file", "CSISUPD_TOKEN_FILE". Required.
	What string
	// MaxSize caps the file's size in bytes. Required.
	MaxSize int64
	// Private requires a file that only root and the process's user can
	// read or replace: owned by root or by the process's effective user,
	// with no permission for group or others; and every directory above
	// it (above its target, for a symlink) owned by root or that user and
	// writable by neither group nor others. A directory owned by root with
	// the sticky bit (as /tmp) is accepted although others may write it:
	// there nobody can rename or remove an entry that is not theirs.
	Private bool
}

// Read returns the contents of the regular file at path, checked as the
// package describes. The read ends by ctx's deadline or after
// DefaultTimeout, whichever comes first; a read that overruns it is
// abandoned (its goroutine ends, and closes the file, when the read
// returns) and reported. Every error names spec.What and path; one for a
// missing file matches fs.ErrNotExist.
func Read(ctx context.Context, path string, spec Spec) ([]byte, error) {
	target, info, err := inspect(path, spec)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(target, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, spec.fail(path, unwrapPath(err))
	}
	opened, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, spec.fail(path, unwrapPath(err))
	}
	if !os.SameFile(info, opened) {
		_ = f.Close()
		return nil, spec.fail(path, fmt.Errorf("replaced while being opened (now %s); try again", Describe(opened.Mode())))
	}
	if err := spec.check(path, target, opened); err != nil {
		_ = f.Close()
		return nil, err
	}
	return readBounded(ctx, f, path, spec)
}

// Check inspects the file at path as Read does, without opening it: for
// files that another library opens by path, so that a FIFO or a device
// never reaches it.
func Check(path string, spec Spec) error {
	_, _, err := inspect(path, spec)
	return err
}

// Describe names a file type for messages: "a FIFO", "a directory".
func Describe(mode fs.FileMode) string {
	switch t := mode.Type(); {
	case t == 0:
		return "a regular file"
	case t&fs.ModeDir != 0:
		return "a directory"
	case t&fs.ModeSymlink != 0:
		return "a symlink"
	case t&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case t&fs.ModeSocket != 0:
		return "a socket"
	case t&fs.ModeCharDevice != 0:
		return "a character device"
	case t&fs.ModeDevice != 0:
		return "a block device"
	default:
		return "an irregular file (" + t.String() + ")"
	}
}

// inspect lstats path and, for a symlink, its target, and returns the
// regular file to open with what lstat found there.
func inspect(path string, spec Spec) (string, fs.FileInfo, error) {
	if spec.MaxSize <= 0 {
		return "", nil, spec.fail(path, fmt.Errorf("safefile: Spec.MaxSize must be positive, got %d", spec.MaxSize))
	}
	info, err := os.Lstat(path)
	if err != nil {
		return "", nil, spec.fail(path, unwrapPath(err))
	}
	target := path
	if info.Mode().Type() == fs.ModeSymlink {
		if target, err = filepath.EvalSymlinks(path); err != nil {
			return "", nil, spec.fail(path, fmt.Errorf("symlink cannot be resolved: %w", unwrapPath(err)))
		}
		if info, err = os.Lstat(target); err != nil {
			return "", nil, spec.fail(path, fmt.Errorf("resolves to %s: %w", target, unwrapPath(err)))
		}
	}
	if err := spec.check(path, target, info); err != nil {
		return "", nil, err
	}
	if spec.Private {
		if err := spec.checkParents(path, target); err != nil {
			return "", nil, err
		}
	}
	return target, info, nil
}

// check refuses a file that is not regular, is too large or, when
// private, may be used or replaced by others. info describes target, the
// file path resolves to.
func (s Spec) check(path, target string, info fs.FileInfo) error {
	via := ""
	if target != path {
		via = "resolves to " + target + ", "
	}
	if !info.Mode().IsRegular() {
		return s.fail(path, fmt.Errorf("%s%w (%s)", via, ErrNotRegular, Describe(info.Mode())))
	}
	if info.Size() > s.MaxSize {
		return s.fail(path, fmt.Errorf("%slarger than %d bytes", via, s.MaxSize))
	}
	if !s.Private {
		return nil
	}
	euid := os.Geteuid()
	if uid, ok := ownerOf(info); !ok || (uid != 0 && uid != euid) {
		return s.fail(path, fmt.Errorf("%sowned by uid %d, not by root or the agent's user (uid %d); fix: chown %d %s",
			via, uid, euid, euid, target))
	}
	if perm := info.Mode().Perm(); perm&0o077 != 0 {
		return s.fail(path, fmt.Errorf("%smode %04o lets group or others use it; fix: chmod 0600 %s", via, perm, target))
	}
	return nil
}

// checkParents checks every directory above target (a resolved path, so
// none is a symlink) as Spec.Private says.
func (s Spec) checkParents(path, target string) error {
	abs, err := filepath.Abs(target)
	if err != nil {
		return s.fail(path, err)
	}
	via := ""
	if target != path {
		via = "resolves to " + target + ", but "
	}
	euid := os.Geteuid()
	for dir := filepath.Dir(abs); ; dir = filepath.Dir(dir) {
		if err := dirProblem(dir, euid); err != nil {
			return s.fail(path, fmt.Errorf("%s%w", via, err))
		}
		if dir == filepath.Dir(dir) {
			return nil
		}
	}
}

// dirProblem returns why others than root and euid could replace a file
// in dir, with the fix, or nil.
func dirProblem(dir string, euid int) error {
	info, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("directory %s: %w", dir, unwrapPath(err))
	}
	uid, ok := ownerOf(info)
	if !ok || (uid != 0 && uid != euid) {
		return fmt.Errorf("directory %s is owned by uid %d, not by root or the agent's user (uid %d), who could replace the file; fix: chown %d %s",
			dir, uid, euid, euid, dir)
	}
	mode := info.Mode()
	if mode&0o022 == 0 || (uid == 0 && mode&fs.ModeSticky != 0) {
		return nil
	}
	who := "others"
	if mode&0o002 == 0 {
		who = "its group"
	} else if mode&0o020 != 0 {
		who = "its group and others"
	}
	return fmt.Errorf("directory %s (mode %s) is writable by %s, who could replace the file; fix: chmod go-w %s", dir, mode, who, dir)
}

// readBounded reads f, which it closes, to at most spec.MaxSize bytes
// before ctx's deadline or DefaultTimeout.
func readBounded(ctx context.Context, f *os.File, path string, spec Spec) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, DefaultTimeout)
	defer cancel()
	type result struct {
		data []byte
		err  error
	}
	done := make(chan result, 1)
	go func() {
		defer f.Close()
		data, err := io.ReadAll(io.LimitReader(f, spec.MaxSize+1))
		done <- result{data, err}
	}()
	select {
	case r := <-done:
		switch {
		case r.err != nil:
			return nil, spec.fail(path, unwrapPath(r.err))
		case int64(len(r.data)) > spec.MaxSize:
			return nil, spec.fail(path, fmt.Errorf("larger than %d bytes", spec.MaxSize))
		}
		return r.data, nil
	case <-ctx.Done():
		return nil, spec.fail(path, fmt.Errorf("not read in time, abandoned: %w", ctx.Err()))
	}
}

// fail names the file before err.
func (s Spec) fail(path string, err error) error {
	return fmt.Errorf("%s %s: %w", s.What, path, err)
}

// ownerOf returns the owner of the file info describes.
func ownerOf(info fs.FileInfo) (int, bool) {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return -1, false
	}
	return int(st.Uid), true
}

// unwrapPath returns the error inside a *fs.PathError, so that messages
// that already name the file do not name it twice.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
