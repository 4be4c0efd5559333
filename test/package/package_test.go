//go:build package

package pkgtest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// repoRoot is the repository the packages are built from.
const repoRoot = "../.."

func requireTools(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("installs a package: needs root")
	}
	for _, tool := range []string{"dpkg", "dpkg-deb", "make", "systemd-analyze"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
}

// makePackage runs make package into a directory of its own and returns it.
func makePackage(t *testing.T) string {
	t.Helper()
	dist := filepath.Join(testutil.TempDir(t), "dist")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "make", "-s", "package", "DIST="+dist)
	cmd.Dir = repoRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make package: %v\n%s", err, out)
	}
	return dist
}

// run runs a command with a deadline and returns its combined output.
func run(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out), err
}

func mustRun(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := run(t, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func TestPackages(t *testing.T) {
	requireTools(t)
	first, second := makePackage(t), makePackage(t)
	sums := func(dist string) []byte {
		data, err := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	if a, b := sums(first), sums(second); !bytes.Equal(a, b) {
		t.Fatalf("two make package runs differ:\n%s\n%s", a, b)
	}
	debs, _ := filepath.Glob(filepath.Join(first, "*.deb"))
	rpms, _ := filepath.Glob(filepath.Join(first, "*.rpm"))
	if len(debs) != 1 || len(rpms) != 1 {
		t.Fatalf("make package wrote debs %q and rpms %q, want one of each", debs, rpms)
	}
	deb := debs[0]
	t.Run("no builder path", func(t *testing.T) { noBuilderPath(t, first, deb) })
	t.Run("rpm", func(t *testing.T) { readRPM(t, rpms[0]) })
	t.Run("image", func(t *testing.T) { readImage(t, first) })
	t.Run("podman", func(t *testing.T) { runImage(t, first) })
	t.Run("container", func(t *testing.T) { runAgentContainer(t, first) })
	t.Run("lintian", func(t *testing.T) { runLintian(t, deb) })
	t.Run("install", func(t *testing.T) { install(t, deb) })
}

// noBuilderPath: neither the repository's absolute path nor the output
// directory's is in any file written, nor in the .deb's files.
func noBuilderPath(t *testing.T, dist, deb string) {
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	fsys, err := exec.Command("dpkg-deb", "--fsys-tarfile", deb).Output()
	if err != nil {
		t.Fatalf("dpkg-deb --fsys-tarfile: %v", err)
	}
	check := func(name string, data []byte) {
		for _, path := range []string{root, dist} {
			if bytes.Contains(data, []byte(path)) {
				t.Errorf("%s holds the builder's path %s", name, path)
			}
		}
	}
	check(deb+" (files)", fsys)
	err = filepath.WalkDir(dist, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		check(path, data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// readRPM lists the .rpm's files and scripts with rpm, where installed.
func readRPM(t *testing.T, rpm string) {
	if _, err := exec.LookPath("rpm"); err != nil {
		t.Skip("rpm is not installed")
	}
	list := mustRun(t, "rpm", "-qlp", rpm)
	for _, want := range []string{"/usr/bin/csisupd", "/usr/lib/systemd/system/csisupd.service", "/etc/csisupd.d/agent.hcl",
		"/etc/csisupd.d/csisupd.env", "/var/lib/csisupd/plugins", "/usr/share/zsh/site-functions/_csisupd"} {
		if !strings.Contains(list, want+"\n") {
			t.Errorf("rpm -qlp lists no %s:\n%s", want, list)
		}
	}
	if slices.Contains(strings.Split(list, "\n"), "/lib/systemd/system/csisupd.service") {
		t.Errorf("the .rpm holds the deb's unit path:\n%s", list)
	}
	if scripts := mustRun(t, "rpm", "-qp", "--scripts", rpm); !strings.Contains(scripts, "systemctl daemon-reload") {
		t.Errorf("rpm --scripts has no daemon-reload:\n%s", scripts)
	}
}

// runLintian runs lintian on the .deb, where installed: no errors (the
// tags that do not apply are overridden in the package, each with why).
func runLintian(t *testing.T, deb string) {
	if _, err := exec.LookPath("lintian"); err != nil {
		t.Skip("lintian is not installed")
	}
	out, err := run(t, "lintian", "--fail-on", "error", deb)
	if err != nil || strings.Contains(out, "\nE: ") || strings.HasPrefix(out, "E: ") {
		t.Errorf("lintian %s: %v\n%s", deb, err, out)
	}
	t.Logf("lintian:\n%s", out)
}

// install installs the .deb, checks the unit and the agent it installs,
// then removes and purges it.
func install(t *testing.T, deb string) {
	if _, err := os.Stat("/usr/bin/csisupd"); err == nil {
		t.Skip("/usr/bin/csisupd is there already: not replacing what this machine has")
	}
	mustRun(t, "dpkg", "-i", deb)
	t.Cleanup(func() { _, _ = run(t, "dpkg", "-P", "csisupd") })

	for path, mode := range map[string]os.FileMode{
		"/usr/bin/csisupd": 0o755, "/etc/csisupd.d/csisupd.env": 0o600,
		"/var/lib/csisupd": os.ModeDir | 0o700, "/var/lib/csisupd/plugins": os.ModeDir | 0o750,
	} {
		if fi, err := os.Stat(path); err != nil || fi.Mode()&(os.ModeDir|os.ModePerm) != mode {
			t.Errorf("%s: %v, %v; want mode %v", path, fi, err, mode)
		}
	}
	if out, err := run(t, "systemd-analyze", "verify", "/lib/systemd/system/csisupd.service"); err != nil {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	startInstalledAgent(t)

	mustRun(t, "dpkg", "-r", "csisupd")
	if _, err := os.Stat("/usr/bin/csisupd"); err == nil {
		t.Error("dpkg -r left /usr/bin/csisupd")
	}
	for _, kept := range []string{"/etc/csisupd.d/agent.hcl", "/etc/csisupd.d/csisupd.env", "/var/lib/csisupd/node-id"} {
		if _, err := os.Stat(kept); err != nil {
			t.Errorf("dpkg -r did not keep %s: %v", kept, err)
		}
	}
	mustRun(t, "dpkg", "-P", "csisupd")
	for _, gone := range []string{"/etc/csisupd.d", "/var/lib/csisupd"} {
		if _, err := os.Stat(gone); err == nil {
			t.Errorf("dpkg -P left %s", gone)
		}
	}
}

// startInstalledAgent starts the installed agent from /etc/csisupd.d, with
// an override of the ports (other agents may hold the defaults), waits for
// it to answer status, and stops it with SIGTERM: it must exit 0.
func startInstalledAgent(t *testing.T) {
	ports := testutil.FreePorts(t, 2)
	override := filepath.Join(testutil.TempDir(t), "ports.hcl")
	if err := os.WriteFile(override, fmt.Appendf(nil, "ports {\n  rpc = %d\n  http = %d\n}\n", ports[0], ports[1]), 0o600); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	agent := exec.Command("/usr/bin/csisupd", "agent", "--config", "/etc/csisupd.d", "--config", override)
	agent.Stdout, agent.Stderr = &log, &log
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- agent.Wait() }()
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	deadline := time.Now().Add(30 * time.Second)
	var status string
	for {
		out, err := run(t, "/usr/bin/csisupd", "--address", addr, "--timeout", "2s", "status")
		if err == nil {
			status = out
			break
		}
		if time.Now().After(deadline) {
			_ = agent.Process.Kill()
			<-done
			t.Fatalf("the installed agent did not answer status within 30s: %s\nagent log:\n%s", out, log.String())
		}
		select {
		case err := <-done:
			t.Fatalf("the installed agent exited: %v\n%s", err, log.String())
		case <-time.After(200 * time.Millisecond):
		}
	}
	if !strings.Contains(status, "Plugin dir: /var/lib/csisupd/plugins") {
		t.Errorf("status of the installed agent:\n%s", status)
	}
	if err := agent.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("the installed agent's stop: %v\n%s", err, log.String())
		}
	case <-time.After(30 * time.Second):
		_ = agent.Process.Kill()
		<-done
		t.Fatalf("the installed agent did not stop within 30s of SIGTERM:\n%s", log.String())
	}
}
