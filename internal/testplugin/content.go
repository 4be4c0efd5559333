package testplugin

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DefaultMaxContentBytes is the default of Config.MaxContentBytes: the
// most file bytes one snapshot, restore or clone copies. Volumes are
// directories on the state directory's file system, so an unbounded copy
// could fill it; tests need far less.
const DefaultMaxContentBytes int64 = 256 << 20

// MaxContentEntries is the most files, directories and links one
// snapshot, restore or clone copies, whatever their size.
const MaxContentEntries = 100000

// copyMode are the mode bits a copy keeps: permissions and the set-id and
// sticky bits, which carry a mount group's ownership rules.
const copyMode = fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky

// contentLimitError is a copy that went past the byte or entry limit.
type contentLimitError struct {
	src   string
	limit string
}

func (e *contentLimitError) Error() string {
	return fmt.Sprintf("content of %q is more than %s", e.src, e.limit)
}

// unsupportedFileError is a file a copy cannot take: not a regular file,
// directory or symbolic link.
type unsupportedFileError struct {
	path string
	mode fs.FileMode
}

func (e *unsupportedFileError) Error() string {
	return fmt.Sprintf("%q is a %s: only regular files, directories and symbolic links are copied", e.path, e.mode.Type())
}

// contentStatus turns a copy error into a status for the call copying
// what: ResourceExhausted above the limits, FailedPrecondition for files
// that cannot be copied, Internal otherwise.
func contentStatus(what string, err error) error {
	var limit *contentLimitError
	var unsupported *unsupportedFileError
	switch {
	case errors.As(err, &limit):
		return status.Errorf(codes.ResourceExhausted, "%s: %v", what, err)
	case errors.As(err, &unsupported):
		return status.Errorf(codes.FailedPrecondition, "%s: %v", what, err)
	}
	return status.Errorf(codes.Internal, "%s: %v", what, err)
}

// copyContent copies the tree at src to dst, which must not exist: regular
// files, directories and symbolic links (not followed), with their mode
// bits, and with their owner when this process runs as root. It copies
// into a temporary sibling of dst and renames it, so dst appears whole or
// not at all. A missing src copies as an empty directory. It stops with a
// *contentLimitError past maxBytes file bytes or maxEntries entries.
func copyContent(src, dst string, maxBytes int64, maxEntries int) (err error) {
	tmp := filepath.Join(filepath.Dir(dst), "."+filepath.Base(dst)+".tmp")
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("remove stale copy %q: %w", tmp, err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(tmp)
		}
	}()
	if _, err := os.Lstat(src); errors.Is(err, os.ErrNotExist) {
		if err := os.Mkdir(tmp, 0o755); err != nil {
			return err
		}
		return os.Rename(tmp, dst)
	}
	// Directory modes are set after their content is written: a read-only
	// directory could not be filled otherwise.
	type dirMode struct {
		path string
		info fs.FileInfo
	}
	var dirs []dirMode
	var bytes int64
	entries := 0
	walkErr := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		entries++
		if entries > maxEntries {
			return &contentLimitError{src: src, limit: fmt.Sprintf("%d entries", maxEntries)}
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(tmp, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.Mkdir(target, 0o700); err != nil {
				return err
			}
			dirs = append(dirs, dirMode{target, info})
			return nil
		case d.Type()&fs.ModeSymlink != 0:
			dest, err := os.Readlink(path)
			if err != nil {
				return err
			}
			if err := os.Symlink(dest, target); err != nil {
				return err
			}
			return copyOwner(target, info)
		case d.Type().IsRegular():
			if bytes+info.Size() > maxBytes {
				return &contentLimitError{src: src, limit: fmt.Sprintf("%d bytes", maxBytes)}
			}
			n, err := copyFile(path, target, maxBytes-bytes)
			bytes += n
			if err != nil {
				return err
			}
			if err := copyOwner(target, info); err != nil {
				return err
			}
			return os.Chmod(target, info.Mode()&copyMode)
		}
		return &unsupportedFileError{path: path, mode: info.Mode()}
	})
	if walkErr != nil {
		return walkErr
	}
	for _, d := range dirs {
		if err := copyOwner(d.path, d.info); err != nil {
			return err
		}
		if err := os.Chmod(d.path, d.info.Mode()&copyMode); err != nil {
			return err
		}
	}
	return os.Rename(tmp, dst)
}

// copyFile copies the regular file src to the new file dst, at most budget
// bytes: a file that grew past its budget since it was listed is a
// *contentLimitError. It returns the bytes written.
func copyFile(src, dst string, budget int64) (int64, error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(out, io.LimitReader(in, budget+1))
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil && n > budget {
		err = &contentLimitError{src: src, limit: "its byte limit"}
	}
	return n, err
}

// copyOwner gives path the owner of info when this process runs as root;
// others cannot give files away, and their copies keep their own owner.
func copyOwner(path string, info fs.FileInfo) error {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok || os.Geteuid() != 0 {
		return nil
	}
	return os.Lchown(path, int(st.Uid), int(st.Gid))
}
