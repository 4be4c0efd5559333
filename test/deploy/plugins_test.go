package deploy

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/testutil"
)

// The plugin examples of deploy/plugins/.
const (
	pluginUnitFile = repoRoot + "/deploy/plugins/csi-node-plugin@.service"
	quadletFile    = repoRoot + "/deploy/plugins/csi-node-plugin.container"
	pluginConfig   = repoRoot + "/deploy/plugins/plugin.hcl"
	// pluginUnitBinary is where the unit expects a plugin's binary, named
	// after the instance (the plugin id).
	pluginUnitBinary = "/usr/local/libexec/csi-plugins/%i"
)

// unitFileKeys reads a systemd-style unit file (ReadUnitFile), failing
// the test when it cannot.
func unitFileKeys(t *testing.T, path string) map[string]map[string][]string {
	t.Helper()
	sections, err := ReadUnitFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sections
}

// loadPluginExample loads deploy/plugins/plugin.hcl as the agent would,
// with more files after it, and returns the mounts of its one plugin.
func loadPluginExample(t *testing.T, more ...string) config.PluginMounts {
	t.Helper()
	cfg, err := config.Load(config.LoadInput{
		Files: append([]string{pluginConfig}, more...),
		Env:   func(string) string { return "" },
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Plugins) != 1 {
		t.Fatalf("%s declares %d plugins, want 1", pluginConfig, len(cfg.Plugins))
	}
	id := slices.Collect(maps.Keys(cfg.Plugins))[0]
	p := cfg.Plugins[id]
	if p.Socket == "" || p.Type != "node" || !p.Required || p.PluginMountDir == "" {
		t.Fatalf("%s: plugin %q must declare socket, type = node, required and plugin_mount_dir: %+v", pluginConfig, id, p)
	}
	pm, err := cfg.PluginMounts(id)
	if err != nil {
		t.Fatal(err)
	}
	return pm
}

// TestPluginUnitVerifies runs `systemd-analyze verify` on an instance of
// the plugin unit, its binary a stub, and fails on anything it says about
// the unit.
func TestPluginUnitVerifies(t *testing.T) {
	testutil.SystemdAnalyze(t)
	unit, err := os.ReadFile(pluginUnitFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(unit), "ExecStart="+pluginUnitBinary+" ") {
		t.Fatalf("ExecStart of %s does not run %s", pluginUnitFile, pluginUnitBinary)
	}
	dir := t.TempDir()
	const instance = "csi.example.com"
	if err := os.WriteFile(filepath.Join(dir, instance), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	copyPath := filepath.Join(dir, "csi-node-plugin@"+instance+".service")
	copied := strings.ReplaceAll(string(unit), "ExecStart="+pluginUnitBinary+" ", "ExecStart="+dir+"/%i ")
	if err := os.WriteFile(copyPath, []byte(copied), 0o644); err != nil {
		t.Fatal(err)
	}
	testutil.SystemdVerify(t, copyPath)
}

// TestPluginUnitSettings checks what the plugin unit's contract with
// csisupd depends on: the socket where csisupd looks for it, and no file
// system namespace setting, which would keep the plugin's mounts from the
// host.
func TestPluginUnitSettings(t *testing.T) {
	service := unitFileKeys(t, pluginUnitFile)["Service"]
	if got := service["PrivateMounts"]; !slices.Equal(got, []string{"no"}) {
		t.Errorf("%s: PrivateMounts = %q, want no", pluginUnitFile, got)
	}
	for _, k := range []string{"ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices", "ReadWritePaths",
		"ReadOnlyPaths", "InaccessiblePaths", "BindPaths", "BindReadOnlyPaths", "TemporaryFileSystem", "MountFlags",
		"RootDirectory", "RootImage", "ProtectKernelTunables", "ProtectKernelModules", "ProtectControlGroups",
		"ProtectProc", "ProtectClock", "ProtectKernelLogs", "ProtectHostname", "DynamicUser", "RuntimeDirectory"} {
		if v, ok := service[k]; ok {
			t.Errorf("%s: %s=%s gives the plugin a mount namespace of its own: its mounts would not reach the host", pluginUnitFile, k, v)
		}
	}

	// The socket is where csisupd finds the plugin with the defaults and
	// no plugin block, the id being the instance name.
	const id = "instance-id"
	c := config.Default()
	pm, err := c.PluginMounts(id)
	if err != nil {
		t.Fatal(err)
	}
	socket := strings.ReplaceAll(pm.Socket, "/"+id+"/", "/%i/")
	if got := service["Environment"]; !slices.Contains(got, "CSI_ENDPOINT=unix://"+socket) {
		t.Errorf("%s: Environment = %q, want CSI_ENDPOINT=unix://%s", pluginUnitFile, got, socket)
	}
	if got := service["ExecStartPre"]; !slices.Contains(got, "/usr/bin/install -d -m 0750 "+filepath.Dir(socket)) {
		t.Errorf("%s: ExecStartPre = %q, want the socket directory %s made", pluginUnitFile, got, filepath.Dir(socket))
	}
}

// quadletKeys are the keys podman-systemd.unit(5) documents for the
// sections of a .container file that the example uses. [Container] is
// quadlet's own (the table of its keys, less those of rootless and pod
// set-ups); [Unit] and [Service] pass to systemd unchanged (these are the
// systemd.unit(5) and systemd.service(5) keys such a plugin's quadlet
// needs); quadlet applies only Alias, WantedBy, RequiredBy, UpheldBy and
// DefaultInstance of [Install].
var quadletKeys = map[string][]string{
	"Container": {"AddCapability", "AddDevice", "AddHost", "Annotation", "AutoUpdate", "CgroupsMode", "ContainerName",
		"ContainersConfModule", "DNS", "DNSOption", "DNSSearch", "DropCapability", "Entrypoint", "Environment",
		"EnvironmentFile", "EnvironmentHost", "Exec", "ExposeHostPort", "GIDMap", "GlobalArgs", "Group", "GroupAdd",
		"HealthCmd", "HealthInterval", "HealthOnFailure", "HealthRetries", "HealthStartPeriod", "HealthTimeout",
		"HostName", "Image", "IP", "IP6", "Label", "LogDriver", "LogOpt", "Mask", "Memory", "Mount", "Network",
		"NetworkAlias", "NoNewPrivileges", "Notify", "PidsLimit", "PodmanArgs", "PublishPort", "Pull", "ReadOnly",
		"ReadOnlyTmpfs", "RunInit", "SeccompProfile", "Secret", "SecurityLabelDisable", "SecurityLabelFileType",
		"SecurityLabelLevel", "SecurityLabelNested", "SecurityLabelType", "ShmSize", "StopSignal", "StopTimeout",
		"Sysctl", "Timezone", "Tmpfs", "Ulimit", "Unmask", "User", "Volume", "WorkingDir"},
	"Unit": {"Description", "Documentation", "After", "Before", "Wants", "Requires", "PartOf", "BindsTo"},
	"Service": {"ExecStartPre", "ExecStartPost", "ExecStopPost", "Restart", "RestartSec", "TimeoutStartSec",
		"TimeoutStopSec", "Environment", "EnvironmentFile"},
	"Install": {"Alias", "WantedBy", "RequiredBy", "UpheldBy", "DefaultInstance"},
}

// TestQuadletKeysAndVolumes checks the quadlet with no podman needed:
// every key is one quadlet documents for its section, and its Volume=
// lines are, as a set, the mounts `csisupd plugin mounts` computes for
// deploy/plugins/plugin.hcl, so the two cannot drift apart.
func TestQuadletKeysAndVolumes(t *testing.T) {
	sections := unitFileKeys(t, quadletFile)
	for name, keys := range sections {
		known, ok := quadletKeys[name]
		if !ok {
			t.Errorf("%s: section [%s] is not one of a .container file's", quadletFile, name)
			continue
		}
		for k := range keys {
			if !slices.Contains(known, k) {
				t.Errorf("%s: [%s] %s is not a key podman-systemd.unit(5) documents there", quadletFile, name, k)
			}
		}
	}
	ctr := sections["Container"]
	if len(ctr["Image"]) != 1 {
		t.Errorf("%s: [Container] needs one Image=, has %q", quadletFile, ctr["Image"])
	}
	if !slices.Contains(ctr["PodmanArgs"], "--privileged") {
		t.Errorf("%s: the container must run --privileged (PodmanArgs=--privileged)", quadletFile)
	}

	pm := loadPluginExample(t)
	var want []string
	for _, m := range pm.Mounts {
		want = append(want, m.VolumeSpec())
	}
	got := slices.Clone(ctr["Volume"])
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("%s: Volume=\n  %q\nbut csisupd plugin mounts %s prints\n  %q", quadletFile, got, pm.PluginID, want)
	}
	if exec := strings.Join(ctr["Exec"], " "); !strings.Contains(exec, "unix://"+pm.Socket) {
		t.Errorf("%s: Exec=%s does not tell the plugin its socket %s", quadletFile, exec, pm.Socket)
	}
	// The sources must exist before podman starts the container.
	pre := strings.Join(sections["Service"]["ExecStartPre"], "\n")
	for _, m := range pm.Mounts {
		if m.Kind != config.MountDev && !strings.Contains(pre, " "+m.Source+"\n") && !strings.HasSuffix(pre, " "+m.Source) {
			t.Errorf("%s: no ExecStartPre makes %s", quadletFile, m.Source)
		}
	}
}

// TestQuadletGenerates runs podman's quadlet generator in dry-run mode on
// the example, where it is installed (podman 4.4 and later; Debian 12's
// podman 4.3 has none).
func TestQuadletGenerates(t *testing.T) {
	quadlet := "/usr/libexec/podman/quadlet"
	if _, err := os.Stat(quadlet); err != nil {
		t.Skipf("%s is not installed (podman before 4.4 has no quadlet generator): "+
			"the .container file is checked by TestQuadletKeysAndVolumes only", quadlet)
	}
	dir := t.TempDir()
	data, err := os.ReadFile(quadletFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, filepath.Base(quadletFile)), data, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(quadlet, "-dryrun")
	cmd.Env = append(os.Environ(), "QUADLET_UNIT_DIRS="+dir)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil || strings.Contains(stderr.String(), "unsupported key") {
		t.Fatalf("quadlet -dryrun: %v\n%s", err, stderr.String())
	}
	for _, m := range loadPluginExample(t).Mounts {
		if !strings.Contains(stdout.String(), m.VolumeSpec()) {
			t.Errorf("the generated service does not mount %s:\n%s", m.VolumeSpec(), stdout.String())
		}
	}
}

// TestPodmanAcceptsMounts creates (does not start) a container with the
// mounts of the example, with paths moved below a temporary directory so
// they exist, in a podman store of its own: podman must accept the
// --volume syntax as the command prints it.
func TestPodmanAcceptsMounts(t *testing.T) {
	podman, err := exec.LookPath("podman")
	if err != nil {
		t.Skip("podman is not installed (Debian: apt-get install podman): the --volume syntax is not tried")
	}
	if os.Geteuid() != 0 {
		t.Skip("not root: a privileged container with /dev mounted needs a rootful podman")
	}
	dir := t.TempDir()
	override := filepath.Join(dir, "override.hcl")
	pm0 := loadPluginExample(t)
	src := fmt.Sprintf("data_dir = %q\nclient {\n  plugin_dir = %q\n}\nplugin %q {\n  socket = %q\n}\n",
		filepath.Join(dir, "data"), filepath.Join(dir, "data", "plugins"), pm0.PluginID, filepath.Join(dir, "run", "csi.sock"))
	if err := os.WriteFile(override, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	pm := loadPluginExample(t, override)
	args := []string{"create", "--privileged"}
	for _, m := range pm.Mounts {
		if m.Kind != config.MountDev {
			if err := os.MkdirAll(m.Source, 0o700); err != nil {
				t.Fatal(err)
			}
		}
		args = append(args, "--volume="+m.VolumeSpec())
	}
	store := []string{"--root", filepath.Join(dir, "root"), "--runroot", filepath.Join(dir, "runroot"),
		"--tmpdir", filepath.Join(dir, "tmp"), "--storage-driver", "vfs", "--events-backend", "file",
		"--cgroup-manager", "cgroupfs"}
	run := func(args ...string) (string, error) {
		out, err := exec.Command(podman, append(store, args...)...).CombinedOutput()
		return string(out), err
	}
	empty := filepath.Join(dir, "empty.tar")
	if err := os.WriteFile(empty, make([]byte, 1024), 0o600); err != nil { // two zero blocks: an empty tar
		t.Fatal(err)
	}
	const image = "localhost/csisupd-empty:test"
	if out, err := run("import", "--quiet", empty, image); err != nil {
		t.Skipf("podman cannot import an image here (%v): %s", err, strings.TrimSpace(out))
	}
	out, err := run(append(args, image, "true")...)
	if err != nil {
		t.Fatalf("podman %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	if out, err := run("rm", "--force", strings.TrimSpace(out)); err != nil {
		t.Errorf("podman rm: %v\n%s", err, out)
	}
	// A wrong propagation is refused: the check above can fail.
	if out, err := run("create", "--volume="+dir+":/x:rsharedd", image, "true"); err == nil {
		t.Errorf("podman accepted a bad propagation: %s", out)
	}
}
