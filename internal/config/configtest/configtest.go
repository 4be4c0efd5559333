// Package configtest lays out the broken agent configurations kept in
// internal/config's testdata/invalid, so that the configuration loader's
// tests and the tests of `csisupd validate` check the same set.
//
// A case is a file NAME.hcl, or a directory NAME of *.hcl files, beside
// NAME.want, the whole error loading it gives, one problem a line. The
// error names a file case's file agent.hcl and a directory case's files
// conf.d/FILE, the names the case is laid out and loaded by.
package configtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Names the cases are laid out by, which their .want files name.
const (
	fileName = "agent.hcl"
	dirName  = "conf.d"
)

// Broken is one broken configuration.
type Broken struct {
	// Name is the case's file name without .hcl, or its directory's name.
	Name string
	// Want is the error loading it gives, one problem a line.
	Want string

	src string // the absolute path of the case's .hcl file or directory
	dir bool
}

// Invalid returns the cases of dir, in the order of their names. It fails
// t when dir holds none, or a .want without its configuration.
func Invalid(t testing.TB, dir string) []Broken {
	t.Helper()
	// Absolute, as Lay reads the case from another working directory.
	dir, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	wants, err := filepath.Glob(filepath.Join(dir, "*.want"))
	if err != nil {
		t.Fatal(err)
	}
	if len(wants) == 0 {
		t.Fatalf("no broken configuration in %s", dir)
	}
	var cases []Broken
	for _, w := range wants {
		want, err := os.ReadFile(w)
		if err != nil {
			t.Fatal(err)
		}
		b := Broken{Name: strings.TrimSuffix(filepath.Base(w), ".want"), Want: strings.TrimSuffix(string(want), "\n")}
		b.src = filepath.Join(dir, b.Name)
		if fi, err := os.Stat(b.src); err == nil && fi.IsDir() {
			b.dir = true
		} else {
			b.src += ".hcl"
			if _, err := os.Stat(b.src); err != nil {
				t.Fatalf("case %s: %v", b.Name, err)
			}
		}
		cases = append(cases, b)
	}
	return cases
}

// Lay copies the case into a new working directory of t, a file as
// agent.hcl and a directory as conf.d, and returns the path to load.
func (b Broken) Lay(t *testing.T) string {
	t.Helper()
	t.Chdir(t.TempDir())
	if !b.dir {
		copyFile(t, b.src, fileName)
		return fileName
	}
	entries, err := os.ReadDir(b.src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dirName, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			t.Fatalf("case %s: %s is not a regular file", b.Name, e.Name())
		}
		copyFile(t, filepath.Join(b.src, e.Name()), filepath.Join(dirName, e.Name()))
	}
	return dirName
}

// copyFile copies the file src to dst.
func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, data, 0o644); err != nil {
		t.Fatal(err)
	}
}
