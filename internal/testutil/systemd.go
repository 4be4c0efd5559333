package testutil

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// SystemdVerify runs `systemd-analyze verify` on the unit file at path. It
// fails t on a non-zero exit and on every line of its output that names
// the unit (verify exits 0 on most complaints, such as an unknown key or a
// value it cannot parse); lines about the machine's own units (verify
// loads the default targets too) are only logged. It skips t when
// systemd-analyze is not installed; call it before any costly setup.
func SystemdVerify(t testing.TB, path string) {
	t.Helper()
	analyze := SystemdAnalyze(t)
	out, err := exec.Command(analyze, "verify", path).CombinedOutput()
	if err != nil {
		t.Errorf("systemd-analyze verify %s: %v\n%s", path, err, out)
	}
	name := filepath.Base(path)
	for line := range strings.Lines(string(out)) {
		line = strings.TrimSpace(line)
		switch {
		case line == "":
		case strings.Contains(line, name):
			t.Errorf("systemd-analyze verify %s: %s", path, line)
		default:
			t.Logf("systemd-analyze: %s", line)
		}
	}
}

// SystemdAnalyze returns the path of systemd-analyze, and skips t when it
// is not installed.
func SystemdAnalyze(t testing.TB) string {
	t.Helper()
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed (Debian: apt-get install systemd): the unit is not verified")
	}
	return analyze
}
