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

// BinDirEnv names the environment variable of a directory of binaries
// built beforehand (CI builds each once for every test package). A binary
// found there as PrebuiltName says is used instead of a build of its own;
// one that is not there is built as usual. Whoever sets it builds the
// binaries from the same tree as the tests.
const BinDirEnv = "CSISUPD_TEST_BINDIR"

// PrebuiltName is the file name of pkg's binary in the BinDirEnv
// directory: the last element of its import path, with "-race" after it
// when it is built with the race detector, or "-" and the build tags when
// it is built with some.
func PrebuiltName(pkg string, race bool, tags string) string {
	name := filepath.Base(pkg)
	if tags != "" {
		name += "-" + strings.ReplaceAll(tags, ",", "-")
	}
	if race {
		name += "-race"
	}
	return name
}

// Build builds pkg into out with the race detector if race and with the
// build tags tags (comma-separated, or none), unless the BinDirEnv
// directory holds it: then out is a link to that one.
func Build(pkg string, race bool, tags, out string) error {
	if dir := os.Getenv(BinDirEnv); dir != "" {
		pre := filepath.Join(dir, PrebuiltName(pkg, race, tags))
		if st, err := os.Stat(pre); err == nil && st.Mode().IsRegular() {
			if err := os.Symlink(pre, out); err != nil {
				return fmt.Errorf("link the prebuilt %s: %w", pre, err)
			}
			return nil
		}
	}
	args := []string{"build", "-o", out}
	if race {
		args = append(args, "-race")
	}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	args = append(args, pkg)
	if b, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, b)
	}
	return nil
}

// RunWithBinaries builds bins into a temporary directory (or links the
// prebuilt ones of BinDirEnv), runs the tests with goleak's check, removes
// the directory and exits: the whole of a TestMain that starts the
// project's commands as processes. A failed build exits 1 with go's
// output.
func RunWithBinaries(m *testing.M, bins ...Binary) {
	dir, err := os.MkdirTemp("", "csisupd-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "temp dir:", err)
		os.Exit(1)
	}
	for _, b := range bins {
		*b.Path = filepath.Join(dir, filepath.Base(b.Pkg))
		if err := Build(b.Pkg, b.Race, "", *b.Path); err != nil {
			fmt.Fprintln(os.Stderr, err)
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
