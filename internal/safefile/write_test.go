package safefile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWriteFileReplacesAtomically writes a file twice: the second write
// replaces the first whole, with the mode asked for, and leaves no
// temporary file behind.
func TestWriteFileReplacesAtomically(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	for _, content := range []string{"first, longer content", "second"} {
		if err := WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatalf("WriteFile: %v", err)
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != content {
			t.Fatalf("file holds %q, want %q", got, content)
		}
	}
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if mode := info.Mode().Perm(); mode != 0o600 {
		t.Errorf("mode %v, want 0600", mode)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want the file alone: %v", len(entries), entries)
	}
}

// TestWriteFileNamesTheFile writes into a directory that does not exist:
// the error names the file.
func TestWriteFileNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing", "state.json")
	err := WriteFile(path, []byte("x"), 0o600)
	if err == nil {
		t.Fatal("WriteFile into a missing directory succeeded")
	}
	if !strings.Contains(err.Error(), path) {
		t.Errorf("error %q does not name %s", err, path)
	}
}
