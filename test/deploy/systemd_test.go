package deploy

import (
	"bufio"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/csisupd/csisupd/internal/testutil"
)

// unitFile is the systemd unit operators install.
const unitFile = repoRoot + "/deploy/csisupd.service"

// installedBinary is where the unit expects the csisupd binary.
const installedBinary = "/usr/local/bin/csisupd"

// TestSystemdUnitVerifies runs `systemd-analyze verify` on the unit and
// fails on anything it says about it, warnings included (verify exits 0
// on most of them, such as an unknown key or a value it cannot parse).
//
// verify checks that ExecStart's binary exists and is executable, and the
// machine running the test has no installed csisupd: the test verifies a
// copy of the unit whose ExecStart names an executable stub in a temporary
// directory; nothing else of the unit changes.
func TestSystemdUnitVerifies(t *testing.T) {
	testutil.SystemdAnalyze(t)
	unit, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(unit), "ExecStart="+installedBinary+" ") {
		t.Fatalf("ExecStart of %s does not run %s", unitFile, installedBinary)
	}
	dir := t.TempDir()
	stub := filepath.Join(dir, "csisupd")
	if err := os.WriteFile(stub, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	copyPath := filepath.Join(dir, "csisupd.service")
	copied := strings.ReplaceAll(string(unit), "ExecStart="+installedBinary+" ", "ExecStart="+stub+" ")
	if err := os.WriteFile(copyPath, []byte(copied), 0o644); err != nil {
		t.Fatal(err)
	}

	testutil.SystemdVerify(t, copyPath)
}

// TestSystemdUnitSettings reads the unit's [Service] section and checks
// the settings the agent's contract with systemd depends on: readiness and
// watchdog notifications from the main process, restarts on failure
// (watchdog timeouts included), reload by SIGHUP, and the hardening the
// README promises. It runs where systemd-analyze does not.
func TestSystemdUnitSettings(t *testing.T) {
	f, err := os.Open(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	service := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[':
			section = line
		case section == "[Service]":
			k, v, ok := strings.Cut(line, "=")
			if !ok {
				t.Errorf("%s: line %q is not key=value", unitFile, line)
				continue
			}
			service[k] = append(service[k], v)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"Type":                    "notify",
		"NotifyAccess":            "main",
		"WatchdogSec":             "30s",
		"Restart":                 "on-failure",
		"RestartSec":              "2s",
		"ExecReload":              "/bin/kill -HUP $MAINPID",
		"TimeoutStopSec":          "10s",
		"ProtectSystem":           "strict",
		"ReadWritePaths":          "/var/lib/csisupd",
		"NoNewPrivileges":         "yes",
		"PrivateTmp":              "yes",
		"ProtectHome":             "yes",
		"ProtectKernelTunables":   "yes",
		"ProtectControlGroups":    "yes",
		"RestrictSUIDSGID":        "yes",
		"LockPersonality":         "yes",
		"RestrictRealtime":        "yes",
		"RestrictNamespaces":      "yes",
		"SystemCallArchitectures": "native",
		"MemoryDenyWriteExecute":  "yes",
		"LimitNOFILE":             "65536",
	}
	for k, v := range want {
		if got := service[k]; !slices.Equal(got, []string{v}) {
			t.Errorf("%s: [Service] %s = %q, want %q", unitFile, k, got, v)
		}
	}
	// The plugins mount volumes in the host's mount namespace; the agent
	// must see those mounts, which MountFlags=private would hide.
	if v := service["MountFlags"]; len(v) > 0 && v[len(v)-1] == "private" {
		t.Errorf("%s: [Service] MountFlags=private hides the plugins' mounts from the agent", unitFile)
	}
}
