package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// Binary is a command a test package builds once in TestMain.
type Binary struct {
	// Pkg is the import path of the main package.
	Pkg string
	// Race builds it with the race detector.
	Race bool
	// Path receives where it was built.
	Path *string
}

// RunWithBinaries builds bins into a temporary directory, runs the tests
// with goleak's check, removes the directory and exits: the whole of a
// TestMain that starts the project's commands as processes. A failed build
// exits 1 with go's output.
func RunWithBinaries(m *testing.M, bins ...Binary) {
	dir, err := os.MkdirTemp("", "csisupd-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "temp dir:", err)
		os.Exit(1)
	}
	for _, b := range bins {
		*b.Path = filepath.Join(dir, filepath.Base(b.Pkg))
		args := []string{"build", "-o", *b.Path}
		if b.Race {
			args = append(args, "-race")
		}
		args = append(args, b.Pkg)
		if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go %s: %v\n%s", strings.Join(args, " "), err, out)
			_ = os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	goleak.VerifyTestMain(removeAfter{m, dir}) // exits
}

// removeAfter removes the binaries after the tests, before goleak's check
// exits the process.
type removeAfter struct {
	m   *testing.M
	dir string
}

func (r removeAfter) Run() int {
	code := r.m.Run()
	_ = os.RemoveAll(r.dir)
	return code
}
