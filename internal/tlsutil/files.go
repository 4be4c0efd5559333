package tlsutil

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/csisupd/csisupd/internal/safefile"
)

// File modes of written certificates and keys.
const (
	CertFileMode fs.FileMode = 0o644
	KeyFileMode  fs.FileMode = 0o600
)

// MaxPEMFileSize caps a CA, certificate or key file: a bundle of a few
// certificates is a few KiB.
const MaxPEMFileSize = 1 << 20

// ReadPEMFile reads a CA, certificate or key file (package safefile: a
// regular file, or a symlink to one, read non-blocking, at most
// MaxPEMFileSize bytes, within safefile.DefaultTimeout). Errors name the
// file as what (the configuration key or flag) and path.
func ReadPEMFile(what, path string) ([]byte, error) {
	return safefile.Read(context.Background(), path, safefile.Spec{What: what, MaxSize: MaxPEMFileSize})
}

// File is one file for WriteFiles: a name in the directory, its contents
// and its mode.
type File struct {
	Name string
	Data []byte
	Mode fs.FileMode
}

// CertFile is a certificate file: mode 0644.
func CertFile(name string, data []byte) File { return File{Name: name, Data: data, Mode: CertFileMode} }

// KeyFile is a private key file: mode 0600.
func KeyFile(name string, data []byte) File { return File{Name: name, Data: data, Mode: KeyFileMode} }

// WriteFiles writes files into dir and returns their paths. It never
// overwrites a file: each is created exclusively (O_EXCL), and when one
// already exists, or a write fails, the files this call created are
// removed and the error names the file (an existing one matches
// fs.ErrExist). Each file gets exactly its Mode, whatever the umask.
func WriteFiles(dir string, files ...File) ([]string, error) {
	var written []string
	undo := func() {
		for _, p := range written {
			_ = os.Remove(p)
		}
	}
	for _, f := range files {
		p := filepath.Join(dir, f.Name)
		if err := writeExclusive(p, f.Data, f.Mode); err != nil {
			undo()
			return nil, err
		}
		written = append(written, p)
	}
	return written, nil
}

// writeExclusive creates path, which must not exist, with data and mode.
func writeExclusive(path string, data []byte, mode fs.FileMode) (err error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%s: %w: refusing to overwrite it", path, fs.ErrExist)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, unwrapPath(err))
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("%s: %w", path, unwrapPath(cerr))
		}
		if err != nil {
			_ = os.Remove(path)
		}
	}()
	if err := f.Chmod(mode); err != nil {
		return fmt.Errorf("%s: %w", path, unwrapPath(err))
	}
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("%s: %w", path, unwrapPath(err))
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("%s: %w", path, unwrapPath(err))
	}
	return nil
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
