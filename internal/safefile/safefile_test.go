package safefile

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// spec is the Spec of the tests: a private file unless a case says not.
func spec(private bool) Spec { return Spec{What: "secrets file", MaxSize: 64, Private: private} }

// writeFile writes a file of mode exactly mode (past the umask).
func writeFile(t *testing.T, path, content string, mode os.FileMode) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	return path
}

// mkdir makes a directory of mode exactly mode.
func mkdir(t *testing.T, path string, mode os.FileMode) string {
	t.Helper()
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	return path
}

func symlink(t *testing.T, target, link string) string {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	return link
}

// TestReadRefusesWhatIsNotARegularFile reads each kind of file, directly
// and through a symlink: only regular files are read, and every refusal
// names the file (the path given), its type and, for a symlink, its
// target. A FIFO nobody writes to would block an open without
// O_NONBLOCK, so its case also proves the refusal comes before any open.
func TestReadRefusesWhatIsNotARegularFile(t *testing.T) {
	dir, err := os.MkdirTemp("", "safefile")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	good := writeFile(t, filepath.Join(dir, "good.hcl"), "x = 1", 0o600)
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	sub := mkdir(t, filepath.Join(dir, "sub"), 0o700)

	cases := []struct {
		name, path string
		want       []string // in the error; none: read succeeds
	}{
		{"regular file", good, nil},
		{"symlink to a regular file", symlink(t, good, filepath.Join(dir, "good-link")), nil},
		{"FIFO", fifo, []string{"secrets file " + fifo + ": not a regular file (a FIFO)"}},
		{"socket", sock, []string{"secrets file " + sock + ": not a regular file (a socket)"}},
		{"directory", sub, []string{"secrets file " + sub + ": not a regular file (a directory)"}},
		{"character device", "/dev/null", []string{"secrets file /dev/null: not a regular file (a character device)"}},
		{"symlink to a FIFO", symlink(t, fifo, filepath.Join(dir, "fifo-link")),
			[]string{filepath.Join(dir, "fifo-link"), "resolves to " + fifo, "not a regular file (a FIFO)"}},
		{"symlink to a device", symlink(t, "/dev/zero", filepath.Join(dir, "zero-link")),
			[]string{filepath.Join(dir, "zero-link"), "resolves to /dev/zero", "not a regular file (a character device)"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Devices lie in /dev, which private files may not; the type
			// is what is tested here.
			data, err := Read(context.Background(), tc.path, spec(false))
			if tc.want == nil {
				if err != nil || string(data) != "x = 1" {
					t.Fatalf("Read = %q, %v; want the file's contents", data, err)
				}
				if err := Check(tc.path, spec(false)); err != nil {
					t.Errorf("Check: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Read = %q, want a refusal", data)
			}
			if !errors.Is(err, ErrNotRegular) {
				t.Errorf("error %q does not match ErrNotRegular", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if cerr := Check(tc.path, spec(false)); cerr == nil || cerr.Error() != err.Error() {
				t.Errorf("Check = %v, want Read's error", cerr)
			}
		})
	}
}

func TestReadCapsAndMissing(t *testing.T) {
	dir := t.TempDir()
	big := writeFile(t, filepath.Join(dir, "big"), strings.Repeat("#", 65), 0o600)
	if _, err := Read(context.Background(), big, spec(true)); err == nil || !strings.Contains(err.Error(), "larger than 64 bytes") {
		t.Errorf("a file over MaxSize: %v", err)
	}
	exact := writeFile(t, filepath.Join(dir, "exact"), strings.Repeat("#", 64), 0o600)
	if data, err := Read(context.Background(), exact, spec(true)); err != nil || len(data) != 64 {
		t.Errorf("a file of exactly MaxSize: %d bytes, %v", len(data), err)
	}
	missing := filepath.Join(dir, "missing")
	_, err := Read(context.Background(), missing, spec(true))
	if !errors.Is(err, fs.ErrNotExist) || !strings.HasPrefix(err.Error(), "secrets file "+missing+": ") {
		t.Errorf("a missing file: %v, want ErrNotExist naming it", err)
	}
	dangling := symlink(t, missing, filepath.Join(dir, "dangling"))
	if _, err := Read(context.Background(), dangling, spec(true)); err == nil || !strings.Contains(err.Error(), dangling) {
		t.Errorf("a dangling symlink: %v", err)
	}
	if _, err := Read(context.Background(), exact, Spec{What: "x"}); err == nil || !strings.Contains(err.Error(), "MaxSize") {
		t.Errorf("no MaxSize: %v", err)
	}
}

// TestPrivateFiles checks the owner and mode rules of a private file and
// of the directories above it, and of the target's directories for a
// symlink.
func TestPrivateFiles(t *testing.T) {
	root := t.TempDir() // 0700, ours
	open := mkdir(t, filepath.Join(root, "open"), 0o777)
	groupW := mkdir(t, filepath.Join(root, "group"), 0o770)
	sticky := mkdir(t, filepath.Join(root, "sticky"), 0o777|fs.ModeSticky)
	closed := mkdir(t, filepath.Join(root, "closed"), 0o755)
	inOpen := writeFile(t, filepath.Join(open, "s.hcl"), "x = 1", 0o600)
	inGroup := writeFile(t, filepath.Join(groupW, "s.hcl"), "x = 1", 0o600)
	inSticky := writeFile(t, filepath.Join(sticky, "s.hcl"), "x = 1", 0o600)
	good := writeFile(t, filepath.Join(closed, "s.hcl"), "x = 1", 0o600)
	readOnly := writeFile(t, filepath.Join(closed, "ro.hcl"), "x = 1", 0o400)
	readable := writeFile(t, filepath.Join(closed, "r.hcl"), "x = 1", 0o644)
	// A link in a closed directory to a file in an open one: the target's
	// directories are what count.
	linkToOpen := symlink(t, inOpen, filepath.Join(closed, "link.hcl"))
	// A link in an open directory to a file in a closed one: the link's
	// own directory does not hold the file.
	linkFromOpen := symlink(t, good, filepath.Join(open, "link.hcl"))

	stickyWant := []string{"directory " + sticky, "writable by others", "chmod go-w " + sticky}
	if os.Geteuid() == 0 {
		stickyWant = nil // root's sticky directory, as /tmp
	}
	cases := []struct {
		name, path string
		want       []string
	}{
		{"mode 0600 in a closed directory", good, nil},
		{"mode 0400", readOnly, nil},
		{"mode 0644", readable, []string{readable, "mode 0644", "chmod 0600 " + readable}},
		{"directory writable by others", inOpen, []string{inOpen, "directory " + open, "writable by its group and others", "chmod go-w " + open}},
		{"directory writable by its group", inGroup, []string{inGroup, "directory " + groupW, "writable by its group", "chmod go-w " + groupW}},
		{"sticky directory writable by others", inSticky, stickyWant},
		{"symlink to a file in an open directory", linkToOpen, []string{linkToOpen, "directory " + open, "writable by"}},
		{"symlink from an open directory", linkFromOpen, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Read(context.Background(), tc.path, spec(true))
			if tc.want == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
	// Not private, the same files are read.
	if _, err := Read(context.Background(), inOpen, spec(false)); err != nil {
		t.Errorf("a file in an open directory, not private: %v", err)
	}
}

// TestPrivateFileOwners needs root, to give files and directories to
// another user.
func TestPrivateFileOwners(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
	root := t.TempDir()
	theirs := writeFile(t, filepath.Join(root, "theirs.hcl"), "x = 1", 0o600)
	dir := mkdir(t, filepath.Join(root, "dir"), 0o755)
	inTheirDir := writeFile(t, filepath.Join(dir, "s.hcl"), "x = 1", 0o600)
	for _, p := range []string{theirs, dir} {
		if err := os.Chown(p, 1234, 1234); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Read(context.Background(), theirs, spec(true)); err == nil || !strings.Contains(err.Error(), "owned by uid 1234") ||
		!strings.Contains(err.Error(), "chown 0 "+theirs) {
		t.Errorf("another user's file: %v", err)
	}
	if _, err := Read(context.Background(), inTheirDir, spec(true)); err == nil || !strings.Contains(err.Error(), "directory "+dir+" is owned by uid 1234") {
		t.Errorf("a file in another user's directory: %v", err)
	}
}

// TestReadBoundedDeadline reads a pipe nobody writes to, as a file on a
// hung file system would behave: the read is abandoned at the deadline
// and reported, naming the file; its goroutine ends once the read does.
func TestReadBoundedDeadline(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = readBounded(ctx, r, "/some/file", spec(false))
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "secrets file /some/file: not read in time") {
		t.Errorf("a read that never ends: %v", err)
	}
	// The writer's close ends the abandoned read; goleak checks that its
	// goroutine is gone.
}

func TestDescribe(t *testing.T) {
	for mode, want := range map[fs.FileMode]string{
		0o644:                             "a regular file",
		fs.ModeDir | 0o755:                "a directory",
		fs.ModeSymlink:                    "a symlink",
		fs.ModeNamedPipe:                  "a FIFO",
		fs.ModeSocket:                     "a socket",
		fs.ModeDevice | fs.ModeCharDevice: "a character device",
		fs.ModeDevice:                     "a block device",
	} {
		if got := Describe(mode); got != want {
			t.Errorf("Describe(%s) = %q, want %q", mode, got, want)
		}
	}
}
