package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// claimWait bounds the waits for a claim to appear or go: a Mount or an
// Unmount is a claim or a release through the servers.
const claimWait = 60 * time.Second

// volumeState returns volume id as the servers see it; ok is false when
// it does not exist.
func volumeState(t *testing.T, addr, id string) (v volumeDoc, ok bool) {
	t.Helper()
	res := cli(t, addr, "volume", "status", id, "--json")
	if res.code != 0 {
		if !strings.Contains(res.stderr, "not found") {
			t.Fatalf("volume status %s: exit %d: %s", id, res.code, res.stderr)
		}
		return v, false
	}
	if !jsonInto(res.stdout, &v) {
		t.Fatalf("volume status %s --json: %s", id, res.stdout)
	}
	return v, true
}

// waitContainerClaim waits until volume id has exactly one claim, taken
// on c's node by the engine's Mount with mountID, and returns it.
func waitContainerClaim(t *testing.T, addr string, c *clientAgent, id, mountID string) claimDoc {
	t.Helper()
	var claim claimDoc
	testutil.WaitFor(t, claimWait, "the claim of "+id+" by workload docker-"+mountID, func() bool {
		v, ok := volumeState(t, addr, id)
		if !ok || len(v.Claims) != 1 {
			return false
		}
		claim = v.Claims[0]
		return claim.State == "taken"
	})
	if claim.WorkloadID != "docker-"+mountID || claim.Owner != "docker" || claim.CSINodeID != "csi-"+c.name || claim.HostPath == "" {
		t.Fatalf("claim of %s: %+v, want workload docker-%s, owner docker, on csi-%s, with a host path", id, claim, mountID, c.name)
	}
	return claim
}

// waitNoClaims waits until volume id has no claim left.
func waitNoClaims(t *testing.T, addr, id, why string) {
	t.Helper()
	testutil.WaitFor(t, claimWait, "no claim of "+id+" "+why, func() bool {
		v, ok := volumeState(t, addr, id)
		return ok && len(v.Claims) == 0
	})
}

// waitFileContent waits until the file at path holds want.
func waitFileContent(t *testing.T, path, want string) {
	t.Helper()
	testutil.WaitFor(t, claimWait, path+" holding "+want, func() bool {
		b, err := os.ReadFile(path)
		return err == nil && string(b) == want
	})
}

// TestPodmanVolumeFlow runs Podman against a client agent's Docker
// volume plugin, through the containers.conf of deploy/podman, as a user
// would: podman volume create makes the cluster volume; while a container
// that mounts it runs, the volume is claimed for the container on the
// agent's node by owner docker, and the file it writes lands in the
// plugin's volume; the claim is freed when it stops; a second container
// reads the file back under a claim of its own, freed after. A second
// host's podman adopts the volume rather than creating another, and its
// podman volume rm is refused, with our message, while a container runs;
// afterwards podman volume rm deletes the cluster volume, and nothing is
// left mounted.
//
// Podman sends one pseudo container id with every Mount and Unmount
// (podmanMountID), so the claim's workload is docker-<that id>: the test
// reads the id the engine sent from the recorder between the two.
func TestPodmanVolumeFlow(t *testing.T) {
	n, rec, conf := startPodman(t, claimNodeOptions{})
	host := newPodmanHost(t, conf)
	host.importBusybox(t)

	host.must(t, "volume", "create", "--driver", podmanDriver, "-o", "plugin=tp", "-o", "size=16MiB", "v1")
	vol, ok := volumeState(t, n.serverAddr, "v1")
	if !ok || vol.PluginID != "tp" || vol.CapacityBytes < 16<<20 {
		t.Fatalf("cluster volume after podman volume create: %+v (exists: %v), want plugin tp of 16MiB or more", vol, ok)
	}
	wantCreateOpts(t, rec, "v1", map[string]string{"plugin": "tp", "size": "16MiB"})
	// Podman asks for the volume first: unknown, answered as an error
	// that says so.
	wantPluginError(t, rec.first(t, "/VolumeDriver.Get", "v1"), "no such volume")

	// The first container writes the file and stays until stopped.
	writer := host.start(t, "v1", "echo hi > /data/f; exec sleep 600")
	mountID := rec.mountID(t, "v1")
	if mountID != podmanMountID {
		t.Logf("podman mounted with ID %s, not its usual pseudo container id %s", mountID, podmanMountID)
	}
	claim := waitContainerClaim(t, n.serverAddr, n.clientAgent, "v1", mountID)
	waitFileContent(t, filepath.Join(claim.HostPath, "f"), "hi\n")
	wantMountPoints(t, n.node, true, claim.HostPath)

	// A second host sharing the cluster: its create adopts the volume.
	other := newPodmanHost(t, conf)
	other.must(t, "volume", "create", "--driver", podmanDriver, "-o", "plugin=tp", "-o", "size=16MiB", "v1")
	if got := n.controller.Stats().Calls["CreateVolume"]; got != 1 {
		t.Fatalf("the plugin saw %d CreateVolume calls after the second host's create, want 1 (adopted)", got)
	}
	if again, _ := volumeState(t, n.serverAddr, "v1"); again.ExternalID != vol.ExternalID {
		t.Fatalf("volume v1 is now %s, was %s", again.ExternalID, vol.ExternalID)
	}
	// Its rm reaches the plugin, whose refusal names the claim.
	_, stderr, err := other.run(t, "volume", "rm", "v1")
	if err == nil || !strings.Contains(stderr, "docker-"+mountID) {
		t.Fatalf("podman volume rm on the second host while a container runs: %v, want refused naming the claim:\n%s", err, stderr)
	}
	wantPluginError(t, rec.last(t, "/VolumeDriver.Remove", "v1"), "docker-"+mountID)
	if _, ok := volumeState(t, n.serverAddr, "v1"); !ok {
		t.Fatal("volume v1 deleted while claimed")
	}
	// The first host's podman refuses on its own: it knows the container.
	if _, stderr, err := host.run(t, "volume", "rm", "v1"); err == nil {
		t.Fatalf("podman volume rm of a volume its running container uses succeeded:\n%s", stderr)
	}

	host.must(t, "stop", "--time", "0", writer)
	waitNoClaims(t, n.serverAddr, "v1", "after the writer stopped")
	wantMountPoints(t, n.node, false, claim.HostPath)
	host.must(t, "rm", writer)

	// The second container reads the file back, under a claim of its own.
	reader := host.start(t, "v1", "cat /data/f; exec sleep 600")
	claim = waitContainerClaim(t, n.serverAddr, n.clientAgent, "v1", rec.mountID(t, "v1"))
	testutil.WaitFor(t, claimWait, "the reader's output", func() bool {
		return host.must(t, "logs", reader) == "hi"
	})
	host.must(t, "stop", "--time", "0", reader)
	waitNoClaims(t, n.serverAddr, "v1", "after the reader stopped")
	wantMountPoints(t, n.node, false, claim.HostPath)
	host.must(t, "rm", reader)
	if mounts, unmounts := rec.count("/VolumeDriver.Mount"), rec.count("/VolumeDriver.Unmount"); mounts != 2 || unmounts != 2 {
		t.Fatalf("podman called Mount %d and Unmount %d times, want 2 each:\n%s", mounts, unmounts, rec)
	}

	// With no container left, rm deletes the cluster volume.
	host.must(t, "volume", "rm", "v1")
	if v, ok := volumeState(t, n.serverAddr, "v1"); ok {
		t.Fatalf("volume v1 still exists after podman volume rm: %+v", v)
	}
	if _, ok := readPluginVolume(t, n.ctrlState, vol.ExternalID); ok {
		t.Fatalf("the plugin still holds %s after podman volume rm", vol.ExternalID)
	}
	if left := mountsLeft(t, n.node); len(left) != 0 {
		t.Fatalf("still mounted after the flow: %q", left)
	}
	t.Logf("podman's calls:\n%s", rec)
}

// wantCreateOpts fails the test unless the last Create of volume carried
// exactly opts.
func wantCreateOpts(t *testing.T, rec *pluginRecorder, volume string, opts map[string]string) {
	t.Helper()
	var create struct{ Opts map[string]string }
	c := rec.last(t, "/VolumeDriver.Create", volume)
	c.request(t, &create)
	want, _ := json.Marshal(opts)
	got, _ := json.Marshal(create.Opts)
	if string(got) != string(want) {
		t.Fatalf("Create of %s carried %s, want %s", volume, got, want)
	}
}
