package e2e

import (
	"slices"
	"strings"
	"testing"

	"github.com/csisupd/csisupd/test/deploy"
)

// TestPodmanQuadletVolume runs the podman volume create command that
// quadlet generates from deploy/podman/csisupd-data.volume
// (deploy.QuadletVolumeCreate, checked in test/deploy) against a client
// agent's Docker volume plugin: the cluster volume systemd-csisupd-data
// is created with the agent's default plugin and the unit's options, and
// podman keeps the unit's label. The same command on a second host, as
// each host's generated service runs it at boot, adopts the volume.
//
// Debian 12's podman 4.3 predates quadlet (4.4) and has no --ignore for
// volume create; where it lacks it the test drops it, saying so: the
// adoption is the plugin's either way.
func TestPodmanQuadletVolume(t *testing.T) {
	n, rec, conf := startPodman(t, claimNodeOptions{})
	args, name, err := deploy.QuadletVolumeCreate(deployQuadletVolume)
	if err != nil {
		t.Fatal(err)
	}
	host := newPodmanHost(t, conf)
	if help := host.must(t, "volume", "create", "--help"); !strings.Contains(help, "--ignore") {
		t.Logf("this podman's volume create has no --ignore (quadlet's podman has): run without it")
		args = slices.DeleteFunc(args, func(a string) bool { return a == "--ignore" })
	}
	t.Logf("quadlet's command: podman %s", strings.Join(args, " "))
	host.must(t, args...)
	wantCreateOpts(t, rec, name, map[string]string{"size": "1GiB", "access_mode": "single-node-writer"})
	vol, ok := volumeState(t, n.serverAddr, name)
	if !ok || vol.PluginID != "tp" || vol.CapacityBytes != 1<<30 {
		t.Fatalf("cluster volume %s: %+v (exists: %v), want one of the default plugin tp of 1GiB", name, vol, ok)
	}
	if got := host.must(t, "volume", "inspect", "--format", `{{index .Labels "app"}}`, name); got != "data" {
		t.Fatalf("podman's volume %s has label app=%q, want data", name, got)
	}

	other := newPodmanHost(t, conf)
	other.must(t, args...)
	if got := n.controller.Stats().Calls["CreateVolume"]; got != 1 {
		t.Fatalf("the plugin saw %d CreateVolume calls after the second host's service, want 1 (adopted)", got)
	}

	host.must(t, "volume", "rm", name)
	if _, ok := volumeState(t, n.serverAddr, name); ok {
		t.Fatalf("volume %s still exists after podman volume rm", name)
	}
}
