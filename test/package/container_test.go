//go:build package

package pkgtest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
	"github.com/csisupd/csisupd/test/deploy"
)

// The podman command of deploy/container/README.md, in the sh block after
// containerMarker, names these host paths and image; the test moves the
// paths below a test directory, keeping each mount at one path inside and
// outside the container, as the page requires.
const (
	containerReadme    = repoRoot + "/deploy/container/README.md"
	containerMarker    = "<!-- podman run -->"
	documentedDataDir  = "/var/lib/csisupd"
	documentedConfDir  = "/etc/csisupd.d"
	documentedImage    = "csisupd:<version>"
	containerNodeName  = "container-node"
	testPluginPackage  = "github.com/csisupd/csisupd/internal/testplugin/cmd/csi-testplugin"
	containerWaitLimit = 30 * time.Second
)

// documentedPodmanRun returns the arguments of the podman command in the
// sh block after containerMarker in deploy/container/README.md, "run"
// first.
func documentedPodmanRun(t *testing.T) []string {
	t.Helper()
	args, err := deploy.DocumentedCommand(containerReadme, containerMarker, "podman")
	if err != nil {
		t.Fatal(err)
	}
	if len(args) < 2 || args[1] != "run" {
		t.Fatalf("%s: the command after %q is not podman run: %q", containerReadme, containerMarker, args)
	}
	return args[1:]
}

// mountPoints returns the mount points that /proc/<pid>/mountinfo lists:
// those of the mount namespace of process pid ("self": this one's).
func mountPoints(t *testing.T, pid string) map[string]bool {
	t.Helper()
	f, err := os.Open(filepath.Join("/proc", pid, "mountinfo"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	points := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 {
			points[fields[4]] = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return points
}

// runAgentContainer runs the image with the podman command of
// deploy/container/README.md, as written but for the paths, on a test
// plugin serving on the host: the agent must read the env file, find the
// plugin healthy, and have it publish a volume whose mount, made on the
// host after the container started, shows in the container (the rshared
// mount's propagation); unpublished, its directories must go.
func runAgentContainer(t *testing.T, dist string) {
	p := newPodman(t)
	args := documentedPodmanRun(t)

	root := testutil.TempDir(t)
	dataDir := filepath.Join(root, documentedDataDir)
	confDir := filepath.Join(root, documentedConfDir)
	pluginDir := filepath.Join(dataDir, "plugins")
	for dir, mode := range map[string]os.FileMode{confDir: 0o755, dataDir: 0o700} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(pluginDir, 0o750); err != nil {
		t.Fatal(err)
	}
	// Mounts propagate only from a shared host mount: under systemd / is
	// one, elsewhere the data directory is made one of its own, as the
	// page tells.
	mustRun(t, "mount", "--bind", dataDir, dataDir)
	t.Cleanup(func() { _, _ = run(t, "umount", "--recursive", "--lazy", dataDir) })
	mustRun(t, "mount", "--make-shared", dataDir)

	ports := testutil.FreePorts(t, 3)
	agentHCL := fmt.Sprintf(`data_dir = %q
bind_addr = "127.0.0.1"
ports {
  rpc  = %d
  http = %d
  raft = %d
}
client {
  plugin_dir = %q
}
server {
  enabled          = true
  bootstrap_expect = 1
}
consul {
  enabled = false
}
`, dataDir, ports[0], ports[1], ports[2], pluginDir)
	files := map[string]string{
		"agent.hcl":   agentHCL,
		"csisupd.env": "# the agent's environment\nCSISUPD_NAME=" + containerNodeName + "\n",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(confDir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	plugin := filepath.Join(root, "csi-testplugin")
	if err := testutil.Build(testPluginPackage, false, "", plugin); err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(root, "plugin-state")
	testutil.StartProcess(t, nil, plugin, "--socket", filepath.Join(pluginDir, "tp.sock"),
		"--mounts", "bind", "--state-dir", stateDir)

	image := p.load(dist)
	for i, a := range args {
		a = strings.ReplaceAll(a, documentedDataDir, dataDir)
		a = strings.ReplaceAll(a, documentedConfDir, confDir)
		if a == documentedImage {
			a = image
		}
		args[i] = a
	}
	for _, v := range deploy.FlagValues(args, "--volume") {
		parts := strings.Split(v, ":")
		if len(parts) < 2 || parts[0] != parts[1] {
			t.Errorf("%s: --volume %s: the mount must be at the same path inside and outside the container", containerReadme, v)
		}
	}
	names := deploy.FlagValues(args, "--name")
	if len(names) != 1 {
		t.Fatalf("%s: the command names the container %q, want one --name", containerReadme, names)
	}
	name := names[0]
	p.must(args...)
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := p.run("logs", name)
			t.Logf("agent container's log:\n%s", logs)
		}
		if out, err := p.run("rm", "--force", name); err != nil {
			t.Errorf("podman rm --force %s: %v\n%s", name, err, out)
		}
	})
	pid := strings.TrimSpace(p.must("inspect", "--format", "{{.State.Pid}}", name))

	cli := func(args ...string) (string, error) {
		base := []string{"--address", fmt.Sprintf("127.0.0.1:%d", ports[0]), "--timeout", "5s"}
		return run(t, filepath.Join(dist, "csisupd"), append(base, args...)...)
	}
	var status struct {
		Name    string `json:"name"`
		Plugins []struct {
			ID      string `json:"id"`
			Healthy bool   `json:"healthy"`
		} `json:"plugins"`
	}
	testutil.WaitFor(t, containerWaitLimit, "the agent in the container to report plugin tp healthy", func() bool {
		out, err := cli("status", "--json")
		if err != nil || json.Unmarshal([]byte(out), &status) != nil {
			return false
		}
		return len(status.Plugins) == 1 && status.Plugins[0].ID == "tp" && status.Plugins[0].Healthy
	})
	if status.Name != containerNodeName {
		t.Errorf("the agent's name is %q, want %q from the env file", status.Name, containerNodeName)
	}

	var created string
	testutil.WaitFor(t, containerWaitLimit, "volume create through the agent's server", func() bool {
		out, err := cli("volume", "create", "v1", "--plugin", "tp", "--capacity", "16MiB")
		created = out
		return err == nil
	})
	out, err := cli("volume", "mount", "v1", "--workload", "w1")
	if err != nil {
		t.Fatalf("volume mount v1: %v\n%s (create: %s)", err, out, created)
	}
	hostPath := strings.TrimSpace(out)
	if !strings.HasPrefix(hostPath, filepath.Join(dataDir, "volumes", "tp")+"/") {
		t.Fatalf("volume mount printed %q, want a path under the mount root %s", hostPath, filepath.Join(dataDir, "volumes", "tp"))
	}
	if !mountPoints(t, "self")[hostPath] {
		t.Fatalf("the plugin did not mount %s on the host", hostPath)
	}
	if !mountPoints(t, pid)[hostPath] {
		t.Errorf("the plugin's mount %s does not show in the agent's container: the data directory's mount does not propagate", hostPath)
	}

	if out, err := cli("volume", "unmount", "v1", "--workload", "w1"); err != nil {
		t.Fatalf("volume unmount v1: %v\n%s", err, out)
	}
	testutil.WaitFor(t, containerWaitLimit, "the agent to remove the publish directory "+hostPath, func() bool {
		_, err := os.Lstat(hostPath)
		return os.IsNotExist(err)
	})
	if mountPoints(t, "self")[hostPath] || mountPoints(t, pid)[hostPath] {
		t.Errorf("%s is still a mount point after volume unmount", hostPath)
	}
}
