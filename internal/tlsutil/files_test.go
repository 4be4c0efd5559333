package tlsutil

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestWriteFiles(t *testing.T) {
	dir := t.TempDir()
	paths, err := WriteFiles(dir, CertFile("a.pem", []byte("cert")), KeyFile("a-key.pem", []byte("key")))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(dir, "a.pem"), filepath.Join(dir, "a-key.pem")}
	if !slices.Equal(paths, want) {
		t.Fatalf("paths %v, want %v", paths, want)
	}
	for i, mode := range []fs.FileMode{0o644, 0o600} {
		info, err := os.Stat(paths[i])
		if err != nil {
			t.Fatal(err)
		}
		if info.Mode().Perm() != mode {
			t.Errorf("%s: mode %v, want %v", paths[i], info.Mode().Perm(), mode)
		}
	}
	if b, _ := os.ReadFile(paths[1]); string(b) != "key" {
		t.Errorf("a-key.pem holds %q", b)
	}

	// An existing file is never overwritten, and the files the call
	// created before it are removed.
	_, err = WriteFiles(dir, CertFile("b.pem", []byte("new")), KeyFile("a-key.pem", []byte("new key")))
	if !errors.Is(err, fs.ErrExist) || !strings.Contains(err.Error(), filepath.Join(dir, "a-key.pem")) {
		t.Fatalf("WriteFiles over an existing file = %v, want ErrExist naming it", err)
	}
	if b, _ := os.ReadFile(paths[1]); string(b) != "key" {
		t.Errorf("the existing file now holds %q", b)
	}
	if _, err := os.Stat(filepath.Join(dir, "b.pem")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("b.pem was left behind: %v", err)
	}

	if _, err := WriteFiles(filepath.Join(dir, "missing"), CertFile("c.pem", nil)); err == nil || !strings.Contains(err.Error(), "c.pem") {
		t.Errorf("WriteFiles into a missing directory = %v", err)
	}
}
