package e2e

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
	"github.com/csisupd/csisupd/test/deploy"
)

// The podman files of deploy/podman/: the containers.conf entry that
// makes csisupd a volume plugin of podman, and a quadlet volume unit.
const (
	deployContainersConf = "../../deploy/podman/containers.conf"
	deployQuadletVolume  = "../../deploy/podman/csisupd-data.volume"
)

// podmanDriver is the volume plugin's name in deploy/podman/containers.conf:
// `podman volume create --driver csisupd`.
const podmanDriver = "csisupd"

// podmanMountID is the ID Podman sends with every Mount and Unmount of a
// volume plugin's volume, whichever container mounts it: Podman counts a
// volume's users itself, calls Mount for the first and Unmount after the
// last, always with this pseudo container id (pseudoCtrID in libpod, the
// sha256 of "placeholder\n"; Podman 4.3 to 5 alike). A podman volume's
// claim is therefore the workload docker-<podmanMountID>, not
// docker-<container id>.
const podmanMountID = "2f73349cfc4630255319c6c8dfc1b46a8996ace9d14d8e07563b165915918ec2"

// containersConfHarness are the settings Debian's podman needs to run a
// container on the CI machines, beside those of deploy/podman: no default
// ulimits (the container's limits cannot be raised here), cgroupfs and
// runc (crun refuses the hybrid cgroup layout), and events in a file.
var containersConfHarness = map[string][][2]string{
	"containers": {{"default_ulimits", "[]"}},
	"engine":     {{"cgroup_manager", `"cgroupfs"`}, {"runtime", `"runc"`}, {"events_logger", `"file"`}},
}

// podmanHost is one host's podman: a store of its own (root, runroot and
// tmpdir in a temporary directory), which knows its own containers and
// volumes, and the containers.conf that names the volume plugin. Two
// podmanHosts of one test are two hosts sharing the cluster.
type podmanHost struct {
	conf  string // its containers.conf
	env   []string
	store []string // the global flags of its store
	image string   // the busybox image, once imported
}

// podmanConf writes the containers.conf of the tests' podmans: that of
// deploy/podman with the plugin's socket moved to socket, and the
// settings of containersConfHarness. It returns the file's path.
func podmanConf(t *testing.T, socket string) string {
	t.Helper()
	sections, err := deploy.ReadConfTables(deployContainersConf)
	if err != nil {
		t.Fatal(err)
	}
	plugins := sections["engine.volume_plugins"]
	i := slices.IndexFunc(plugins, func(kv [2]string) bool { return kv[0] == podmanDriver })
	if i < 0 {
		t.Fatalf("%s: no %s entry in [engine.volume_plugins]", deployContainersConf, podmanDriver)
	}
	plugins[i][1] = fmt.Sprintf("%q", socket)
	for name, kvs := range containersConfHarness {
		sections[name] = append(sections[name], kvs...)
	}
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(sections)) {
		fmt.Fprintf(&b, "[%s]\n", name)
		for _, kv := range sections[name] {
			fmt.Fprintf(&b, "%s = %s\n", kv[0], kv[1])
		}
	}
	path := filepath.Join(testutil.TempDir(t), "containers.conf")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// newPodmanHost returns a podman with a store of its own that reads conf;
// when the test ends, its containers are removed, at once, and then its
// store.
func newPodmanHost(t *testing.T, conf string) *podmanHost {
	t.Helper()
	dir := testutil.TempDir(t)
	h := &podmanHost{
		conf: conf,
		env:  append(cleanEnv(), "CONTAINERS_CONF="+conf),
		store: []string{"--root", filepath.Join(dir, "root"), "--runroot", filepath.Join(dir, "runroot"),
			"--tmpdir", filepath.Join(dir, "tmp"), "--storage-driver", "vfs", "--events-backend", "file",
			"--cgroup-manager", "cgroupfs", "--runtime", "runc"},
	}
	t.Cleanup(func() {
		if _, stderr, err := h.run(t, "rm", "--all", "--force", "--time", "0"); err != nil {
			t.Errorf("podman rm --all: %v: %s", err, stderr)
		}
	})
	return h
}

// run runs podman with args in h's store and returns its output.
func (h *podmanHost) run(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	return runEngine(t, h.env, "podman", append(slices.Clone(h.store), args...)...)
}

// must runs podman with args in h's store, fails the test unless it
// succeeds, and returns its stdout, trimmed.
func (h *podmanHost) must(t *testing.T, args ...string) string {
	t.Helper()
	stdout, stderr, err := h.run(t, args...)
	if err != nil {
		t.Fatalf("podman %s: %v\n%s%s", strings.Join(args, " "), err, stdout, stderr)
	}
	return strings.TrimSpace(stdout)
}

// importBusybox imports the busybox image into h's store and returns its
// name.
func (h *podmanHost) importBusybox(t *testing.T) string {
	t.Helper()
	h.image = "localhost/csisupd-busybox:test"
	h.must(t, "import", "--quiet", busyboxImage(t, testutil.TempDir(t)), h.image)
	return h.image
}

// start starts a container of h's image with volume mounted at /data,
// running script in sh, without a network, and returns its id.
func (h *podmanHost) start(t *testing.T, volume, script string) string {
	t.Helper()
	return h.must(t, "run", "--detach", "--network=none", "--volume", volume+":/data", h.image, "sh", "-c", script)
}

// startPodman checks that podman can run here, starts a cluster whose
// client c0 serves the Docker volume plugin, and returns it with the
// recorder in front of c0's plugin and a containers.conf naming the
// recorder as the csisupd plugin.
func startPodman(t *testing.T, opts claimNodeOptions) (*claimNode, *pluginRecorder, string) {
	t.Helper()
	requireEngine(t, "podman", "podman", "runc", "conmon")
	if opts.docker == nil {
		opts.docker = &dockerOptions{}
	}
	n := startClaimNodeWith(t, opts)
	waitPluginSocket(t, n.clientAgent)
	rec := recordPlugin(t, n.dockerSocket)
	return n, rec, podmanConf(t, rec.socket)
}

// waitPluginSocket waits until c's Docker volume plugin socket exists.
func waitPluginSocket(t *testing.T, c *clientAgent) {
	t.Helper()
	testutil.WaitFor(t, 30*time.Second, "the Docker volume plugin socket "+c.dockerSocket, func() bool {
		info, err := os.Stat(c.dockerSocket)
		return err == nil && info.Mode()&os.ModeSocket != 0
	})
}

// serveAPI runs podman's Docker-compatible API service for h's store on
// a socket in a temporary directory until the test ends, and returns the
// socket's path; the service may still be starting.
func (h *podmanHost) serveAPI(t *testing.T) string {
	t.Helper()
	socket := filepath.Join(testutil.TempDir(t), "podman.sock")
	testutil.StartProcess(t, []string{"CONTAINERS_CONF=" + h.conf}, "podman",
		append(slices.Clone(h.store), "system", "service", "--time=0", "unix://"+socket)...)
	return socket
}
