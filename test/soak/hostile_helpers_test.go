//go:build fault

package soak

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Helpers of the hostile-plugin soak test only (build tag fault).

// mib formats bytes as MiB.
func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// lazyBuild builds a binary at most once per test binary run.
type lazyBuild struct {
	once sync.Once
	path string
	err  error
}

func (l *lazyBuild) get(t testing.TB, name, pkg string, race bool) string {
	t.Helper()
	l.once.Do(func() {
		l.path = filepath.Join(filepath.Dir(agentBin), name)
		l.err = build(l.path, pkg, race)
	})
	if l.err != nil {
		t.Fatal(l.err)
	}
	return l.path
}

// build runs go build of pkg into out, with the race detector if asked.
func build(out, pkg string, race bool) error {
	args := []string{"build", "-o", out}
	if race {
		args = append(args, "-race")
	}
	if b, err := exec.Command("go", append(args, pkg)...).CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %v\n%s", strings.Join(append(args, pkg), " "), err, b)
	}
	return nil
}
