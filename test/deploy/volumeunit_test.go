package deploy

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/csisupd/csisupd/internal/testutil"
)

// volumeUnitFile is the template unit that claims a volume for systemd
// services.
const volumeUnitFile = repoRoot + "/deploy/systemd/csisupd-volume@.service"

// TestVolumeUnitVerifies runs `systemd-analyze verify` on the instance
// csisupd-volume@data.service of the template and fails on anything it
// says about it. verify loads the units it names in Requires= from the
// unit's directory, so a copy of deploy/csisupd.service lies beside it;
// both run an executable stub in place of the installed binary, which
// verify checks exists.
func TestVolumeUnitVerifies(t *testing.T) {
	testutil.SystemdAnalyze(t)
	dir := t.TempDir()
	stub := filepath.Join(dir, "csisupd")
	if err := os.WriteFile(stub, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for src, name := range map[string]string{volumeUnitFile: "csisupd-volume@data.service", unitFile: "csisupd.service"} {
		unit, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(unit), "="+installedBinary+" ") {
			t.Fatalf("%s does not run %s", src, installedBinary)
		}
		copied := strings.ReplaceAll(string(unit), "="+installedBinary+" ", "="+stub+" ")
		if err := os.WriteFile(filepath.Join(dir, name), []byte(copied), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	testutil.SystemdVerify(t, filepath.Join(dir, "csisupd-volume@data.service"))
}

// TestVolumeUnitSettings checks the template's contract: a oneshot that
// stays active, bound to the agent's unit, that mounts volume %i for
// workload systemd-%i with owner systemd and a link at
// /run/csisupd/volumes/%i and unmounts it on stop, bounded in time, in the
// host's file system (no namespace of its own, which would keep the link
// from the services), with its header showing how a service uses it. The
// e2e test runs the commands themselves against a real agent.
func TestVolumeUnitSettings(t *testing.T) {
	sections := unitFileKeys(t, volumeUnitFile)
	unit, service := sections["Unit"], sections["Service"]
	want := map[string]map[string]string{
		"Unit": {"Requires": "csisupd.service", "After": "csisupd.service", "Documentation": "https://github.com/csisupd/csisupd"},
		"Service": {"Type": "oneshot", "RemainAfterExit": "yes", "EnvironmentFile": "-/etc/csisupd.d/csisupd.env",
			"TimeoutStartSec": "3min", "TimeoutStopSec": "3min"},
	}
	for section, keys := range want {
		for k, v := range keys {
			if got := sections[section][k]; !slices.Equal(got, []string{v}) {
				t.Errorf("%s: [%s] %s = %q, want %q", volumeUnitFile, section, k, got, v)
			}
		}
	}
	if len(unit["Description"]) != 1 {
		t.Errorf("%s: [Unit] needs a Description", volumeUnitFile)
	}
	const (
		link     = "--link /run/csisupd/volumes/%i"
		workload = "--workload systemd-%i"
	)
	start, stop := strings.Join(service["ExecStart"], "\n"), strings.Join(service["ExecStop"], "\n")
	for _, w := range []string{installedBinary + " volume mount %i ", workload, "--owner systemd", "--lease ", link, "--timeout "} {
		if len(service["ExecStart"]) != 1 || !strings.Contains(start, w) {
			t.Errorf("%s: ExecStart = %q, want one command with %q", volumeUnitFile, service["ExecStart"], w)
		}
	}
	for _, w := range []string{installedBinary + " volume unmount %i ", workload, link, "--timeout "} {
		if len(service["ExecStop"]) != 1 || !strings.Contains(stop, w) {
			t.Errorf("%s: ExecStop = %q, want one command with %q", volumeUnitFile, service["ExecStop"], w)
		}
	}
	for _, k := range []string{"ProtectSystem", "ProtectHome", "PrivateTmp", "ReadWritePaths", "ReadOnlyPaths",
		"InaccessiblePaths", "BindPaths", "TemporaryFileSystem", "RootDirectory", "PrivateMounts"} {
		if v, ok := service[k]; ok {
			t.Errorf("%s: %s=%s gives the unit a mount namespace of its own: its link would not be the services'", volumeUnitFile, k, v)
		}
	}
	data, err := os.ReadFile(volumeUnitFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"#   Requires=csisupd-volume@data.service", "#   After=csisupd-volume@data.service", "/run/csisupd/volumes/data"} {
		if !strings.Contains(string(data), w) {
			t.Errorf("%s: the header does not show %q", volumeUnitFile, w)
		}
	}
}
