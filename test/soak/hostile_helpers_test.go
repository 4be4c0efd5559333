//go:build fault

package soak

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/csisupd/csisupd/internal/testutil"
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
		l.err = testutil.Build(pkg, race, "", l.path)
	})
	if l.err != nil {
		t.Fatal(l.err)
	}
	return l.path
}
