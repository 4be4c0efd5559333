package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// dockerPluginSpecDir is where dockerd looks for plugin spec files, a
// fixed directory: a file NAME.spec holding unix://SOCKET makes the volume
// driver NAME.
const dockerPluginSpecDir = "/etc/docker/plugins"

// dockerDaemon is a dockerd of the test's own, with its data and exec
// roots and its API socket in a temporary directory, the vfs storage
// driver, and no iptables or bridge (Debian's docker.io on the CI
// machines), and a volume plugin of a unique name whose spec file points
// at the recorder.
type dockerDaemon struct {
	env    []string
	host   string // the -H of the docker CLI
	socket string // its API socket
	driver string // the volume plugin's name
	image  string // the busybox image
	dir    string // its data and exec roots are under it
}

// startDocker starts a dockerd whose volume plugin is the recorder's
// socket, imports the busybox image, and stops it when the test ends,
// its containers removed first.
func startDocker(t *testing.T, plugin string) *dockerDaemon {
	t.Helper()
	requireEngine(t, "docker", "dockerd", "docker", "containerd", "runc")
	d := &dockerDaemon{env: cleanEnv(), dir: testutil.TempDir(t)}
	d.socket = filepath.Join(d.dir, "docker.sock")
	d.host = "unix://" + d.socket
	suffix := make([]byte, 4)
	if _, err := rand.Read(suffix); err != nil {
		t.Fatal(err)
	}
	d.driver = "csisupd-e2e-" + hex.EncodeToString(suffix)
	if err := os.MkdirAll(dockerPluginSpecDir, 0o755); err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(dockerPluginSpecDir, d.driver+".spec")
	if err := os.WriteFile(spec, []byte("unix://"+plugin+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(spec) })

	dockerd := testutil.StartProcess(t, nil, "dockerd", "--data-root", filepath.Join(d.dir, "data"),
		"--exec-root", filepath.Join(d.dir, "exec"), "--pidfile", filepath.Join(d.dir, "docker.pid"), "--host", d.host,
		"--storage-driver", "vfs", "--iptables=false", "--ip6tables=false", "--bridge=none",
		"--containerd-namespace", d.driver, "--containerd-plugins-namespace", d.driver+"-plugins")
	// Before StartProcess's kill: the containers go, then dockerd stops
	// with its containerd.
	t.Cleanup(func() {
		if stdout, _, err := d.run(t, "ps", "--all", "--quiet"); err == nil {
			if ids := strings.Fields(stdout); len(ids) > 0 {
				d.run(t, append([]string{"rm", "--force"}, ids...)...)
			}
		}
		_ = dockerd.Cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-dockerd.Done():
		case <-time.After(30 * time.Second):
			t.Errorf("dockerd did not stop within 30s of SIGTERM")
		}
	})
	ping := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", d.socket)
		},
	}}
	defer ping.CloseIdleConnections()
	testutil.WaitFor(t, 60*time.Second, "dockerd's API", func() bool {
		if dockerd.Exited() {
			t.Fatalf("dockerd exited with %d before serving:\n%s", dockerd.ExitCode(), dockerd.Stderr)
		}
		resp, err := ping.Get("http://docker/_ping")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	d.image = "csisupd-busybox:test"
	d.must(t, "import", busyboxImage(t, testutil.TempDir(t)), d.image)
	return d
}

// run runs the docker CLI with args against d.
func (d *dockerDaemon) run(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	return runEngine(t, d.env, "docker", append([]string{"--host", d.host}, args...)...)
}

// must runs the docker CLI with args against d, fails the test unless it
// succeeds, and returns its stdout, trimmed.
func (d *dockerDaemon) must(t *testing.T, args ...string) string {
	t.Helper()
	stdout, stderr, err := d.run(t, args...)
	if err != nil {
		t.Fatalf("docker %s: %v\n%s%s", strings.Join(args, " "), err, stdout, stderr)
	}
	return strings.TrimSpace(stdout)
}

// start starts a container of d's image with volume mounted at /data,
// running script in sh, without a network, and returns its id.
func (d *dockerDaemon) start(t *testing.T, volume, script string) string {
	t.Helper()
	return d.must(t, "run", "--detach", "--network=none", "--volume", volume+":/data", d.image, "sh", "-c", script)
}

// mountID returns the ID dockerd gave the mount of volume in container
// id, from the container's record in its data root: Docker sends it with
// Mount and Unmount, a random id of the mount rather than the container's.
func (d *dockerDaemon) mountID(t *testing.T, id, volume string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(d.dir, "data", "containers", id, "config.v2.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		MountPoints map[string]struct{ Name, ID string }
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatalf("container %s's record: %v", id, err)
	}
	for _, m := range cfg.MountPoints {
		if m.Name == volume {
			return m.ID
		}
	}
	t.Fatalf("container %s has no mount of %s: %+v", id, volume, cfg.MountPoints)
	return ""
}

// TestDockerVolumeFlow is TestPodmanVolumeFlow with Docker, where Docker
// can run (Debian's docker.io, as root): docker volume create makes the
// cluster volume, and again adopts it; a container's mount is claimed on
// the agent's node by owner docker while it runs, for the workload
// docker-<the mount's id>, and freed when it stops; a second container
// reads the file back; docker volume rm deletes the cluster volume, and
// nothing is left mounted. Docker refuses to remove a volume that one of
// its containers uses without asking the plugin, so the plugin's own
// refusal is TestPodmanVolumeFlow's.
func TestDockerVolumeFlow(t *testing.T) {
	requireEngine(t, "docker", "dockerd", "docker", "containerd", "runc")
	n := startClaimNodeWith(t, claimNodeOptions{docker: &dockerOptions{}})
	waitPluginSocket(t, n.clientAgent)
	rec := recordPlugin(t, n.dockerSocket)
	d := startDocker(t, rec.socket)

	d.must(t, "volume", "create", "--driver", d.driver, "--opt", "plugin=tp", "--opt", "size=16MiB", "v1")
	wantCreateOpts(t, rec, "v1", map[string]string{"plugin": "tp", "size": "16MiB"})
	wantPluginError(t, rec.first(t, "/VolumeDriver.Get", "v1"), "no such volume")
	vol, ok := volumeState(t, n.serverAddr, "v1")
	if !ok || vol.PluginID != "tp" || vol.CapacityBytes < 16<<20 {
		t.Fatalf("cluster volume after docker volume create: %+v (exists: %v)", vol, ok)
	}
	d.must(t, "volume", "create", "--driver", d.driver, "--opt", "plugin=tp", "--opt", "size=16MiB", "v1")
	if got := n.controller.Stats().Calls["CreateVolume"]; got != 1 {
		t.Fatalf("the plugin saw %d CreateVolume calls after a second docker volume create, want 1 (adopted)", got)
	}

	writer := d.start(t, "v1", "echo hi > /data/f; exec sleep 600")
	mountID := d.mountID(t, writer, "v1")
	if sent := rec.mountID(t, "v1"); sent != mountID {
		t.Fatalf("docker's Mount carried ID %s, its record says %s", sent, mountID)
	}
	claim := waitContainerClaim(t, n.serverAddr, n.clientAgent, "v1", mountID)
	waitFileContent(t, filepath.Join(claim.HostPath, "f"), "hi\n")
	wantMountPoints(t, n.node, true, claim.HostPath)
	if _, stderr, err := d.run(t, "volume", "rm", "v1"); err == nil || !strings.Contains(stderr, "in use") {
		t.Fatalf("docker volume rm while a container runs: %v: %s", err, stderr)
	}
	d.must(t, "stop", "--time", "0", writer)
	waitNoClaims(t, n.serverAddr, "v1", "after the writer stopped")
	wantMountPoints(t, n.node, false, claim.HostPath)
	d.must(t, "rm", writer)

	reader := d.start(t, "v1", "cat /data/f; exec sleep 600")
	claim = waitContainerClaim(t, n.serverAddr, n.clientAgent, "v1", d.mountID(t, reader, "v1"))
	testutil.WaitFor(t, claimWait, "the reader's output", func() bool { return d.must(t, "logs", reader) == "hi" })
	d.must(t, "stop", "--time", "0", reader)
	waitNoClaims(t, n.serverAddr, "v1", "after the reader stopped")
	wantMountPoints(t, n.node, false, claim.HostPath)
	d.must(t, "rm", reader)

	d.must(t, "volume", "rm", "v1")
	if v, ok := volumeState(t, n.serverAddr, "v1"); ok {
		t.Fatalf("volume v1 still exists after docker volume rm: %+v", v)
	}
	if left := mountsLeft(t, n.node); len(left) != 0 {
		t.Fatalf("still mounted after the flow: %q", left)
	}
	if i := slices.IndexFunc(rec.Calls(), func(c recordedCall) bool { return c.Path == "/VolumeDriver.Capabilities" }); i < 0 {
		t.Errorf("docker never asked the plugin's capabilities:\n%s", rec)
	} else if c := rec.Calls()[i]; c.Status != http.StatusOK || !strings.Contains(c.Answer, `"global"`) {
		t.Errorf("Capabilities answered %d %s, want the global scope", c.Status, c.Answer)
	}
	t.Logf("docker's calls:\n%s", rec)
}
