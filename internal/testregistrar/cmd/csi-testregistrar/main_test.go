package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/csisupd/csisupd/internal/kubeletreg"
	"github.com/csisupd/csisupd/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// wait bounds every wait on the process.
const wait = 30 * time.Second

// proc is a running csi-testregistrar.
type proc struct {
	cmd    *exec.Cmd
	lines  chan string   // standard output, line by line
	exited chan struct{} // closed when the process has been waited for
	stderr *testutil.SyncBuffer
}

// build compiles the command into a temporary directory.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "csi-testregistrar")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "reg")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// start runs the command and waits until its socket accepts connections.
// The file alone is not enough: a listener binds its socket a moment
// before it listens, and a dial in between is refused.
func start(t *testing.T, bin, socket string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(bin, args...), lines: make(chan string, 16), exited: make(chan struct{}), stderr: &testutil.SyncBuffer{}}
	p.cmd.Stderr = p.stderr
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		defer close(p.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	go func() {
		<-read // Wait closes the pipe: read it all first
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
	})
	deadline := time.After(wait)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if conn, err := net.Dial("unix", socket); err == nil {
			conn.Close()
			return p
		}
		select {
		case <-tick.C:
		case <-p.exited:
			t.Fatalf("exited with status %d before its socket %s accepted connections; stderr: %s", p.cmd.ProcessState.ExitCode(), socket, p.stderr)
		case <-deadline:
			t.Fatalf("socket %s did not accept connections within %v; stderr: %s", socket, wait, p.stderr)
		}
	}
}

// exitCode waits for the process to exit and returns its status.
func (p *proc) exitCode(t *testing.T) int {
	t.Helper()
	select {
	case <-p.exited:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(wait):
		t.Fatalf("still running after %v; stderr: %s", wait, p.stderr)
		return -1
	}
}

// line waits for the next line of standard output.
func (p *proc) line(t *testing.T) string {
	t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			t.Fatalf("standard output closed; stderr: %s", p.stderr)
		}
		return l
	case <-time.After(wait):
		t.Fatalf("no output line within %v; stderr: %s", wait, p.stderr)
		return ""
	}
}

func (p *proc) running(t *testing.T) {
	t.Helper()
	select {
	case <-p.exited:
		t.Fatalf("exited with status %d, want it running; stderr: %s", p.cmd.ProcessState.ExitCode(), p.stderr)
	default:
	}
}

func gone(t *testing.T, socket string) {
	t.Helper()
	if _, err := os.Lstat(socket); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket %s after exit: %v, want it removed", socket, err)
	}
}

func ctx(t *testing.T) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), wait)
	t.Cleanup(cancel)
	return c
}

// TestCommand builds the command once and runs it through its life cycles.
func TestCommand(t *testing.T) {
	bin := build(t)

	t.Run("registered, then SIGTERM", func(t *testing.T) {
		dir := shortDir(t)
		socket := filepath.Join(dir, "hostpath.csi.k8s.io-reg.sock")
		// A stale file at the path, as a killed registrar leaves, is replaced.
		if err := os.WriteFile(socket, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		p := start(t, bin, socket, "--registration-dir", dir, "--driver-name", "hostpath.csi.k8s.io",
			"--endpoint", "/var/lib/kubelet/plugins/hostpath/csi.sock", "--supported-versions", "1.0.0,1.5.0")
		info, err := kubeletreg.GetInfo(ctx(t), socket)
		if err != nil {
			t.Fatal(err)
		}
		if info.Type != registerapi.CSIPlugin || info.Name != "hostpath.csi.k8s.io" ||
			info.Endpoint != "/var/lib/kubelet/plugins/hostpath/csi.sock" || !slices.Equal(info.SupportedVersions, []string{"1.0.0", "1.5.0"}) {
			t.Fatalf("GetInfo = %+v, want the configured info", info)
		}
		if err := kubeletreg.Check(info); err != nil {
			t.Fatalf("Check refused the registrar: %v", err)
		}
		if err := kubeletreg.Notify(ctx(t), socket, true, ""); err != nil {
			t.Fatal(err)
		}
		if l := p.line(t); l != "registered" {
			t.Fatalf("output line %q, want %q", l, "registered")
		}
		// Still serving after registration.
		if _, err := kubeletreg.GetInfo(ctx(t), socket); err != nil {
			t.Fatalf("GetInfo after registration: %v", err)
		}
		p.running(t)

		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := p.exitCode(t); code != exitOK {
			t.Fatalf("exit status %d after SIGTERM, want %d; stderr: %s", code, exitOK, p.stderr)
		}
		gone(t, socket)
	})

	t.Run("refused", func(t *testing.T) {
		dir := shortDir(t)
		socket := filepath.Join(dir, "old.csi-reg.sock")
		p := start(t, bin, socket, "--registration-dir", dir, "--driver-name", "old.csi", "--endpoint", "/run/old.sock",
			"--supported-versions", "0.3.0")
		info, err := kubeletreg.GetInfo(ctx(t), socket)
		if err != nil {
			t.Fatal(err)
		}
		refusal := kubeletreg.Check(info)
		if refusal == nil {
			t.Fatalf("Check accepted %+v, want CSI 0.3.0 refused", info)
		}
		if err := kubeletreg.Notify(ctx(t), socket, false, refusal.Error()); err != nil {
			t.Fatal(err)
		}
		if code := p.exitCode(t); code != exitError {
			t.Fatalf("exit status %d after a refusal, want %d; stderr: %s", code, exitError, p.stderr)
		}
		gone(t, socket)
		if !strings.Contains(p.stderr.String(), "csisupd speaks CSI 1.x") {
			t.Fatalf("stderr does not log the reason: %s", p.stderr)
		}
	})

	t.Run("other type, SIGINT", func(t *testing.T) {
		dir := shortDir(t)
		socket := filepath.Join(dir, "gpu.example.com-reg.sock")
		p := start(t, bin, socket, "--registration-dir", dir, "--driver-name", "gpu.example.com", "--endpoint", "/run/dra.sock",
			"--type", registerapi.DRAPlugin, "--supported-versions", "")
		info, err := kubeletreg.GetInfo(ctx(t), socket)
		if err != nil {
			t.Fatal(err)
		}
		if info.Type != registerapi.DRAPlugin || len(info.SupportedVersions) != 0 {
			t.Fatalf("GetInfo = %+v, want type %s and no versions", info, registerapi.DRAPlugin)
		}
		if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		if code := p.exitCode(t); code != exitOK {
			t.Fatalf("exit status %d after SIGINT, want %d; stderr: %s", code, exitOK, p.stderr)
		}
		gone(t, socket)
	})
}

func TestUsage(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no dir", []string{"--driver-name", "d", "--endpoint", "/e"}, "--registration-dir is required"},
		{"no driver", []string{"--registration-dir", "r", "--endpoint", "/e"}, "--driver-name is required"},
		{"no endpoint", []string{"--registration-dir", "r", "--driver-name", "d"}, "--endpoint is required"},
		{"argument", []string{"--registration-dir", "r", "--driver-name", "d", "--endpoint", "/e", "extra"}, `unexpected argument "extra"`},
		{"unknown flag", []string{"--nope"}, "nope"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(tt.args, &stdout, &stderr); code != exitUsage {
				t.Fatalf("exit status %d, want %d; stderr: %s", code, exitUsage, stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.want) {
				t.Fatalf("stderr %q does not mention %q", stderr.String(), tt.want)
			}
		})
	}
}

func TestStartFailureIsAnError(t *testing.T) {
	var stdout, stderr bytes.Buffer
	args := []string{"--registration-dir", filepath.Join(shortDir(t), "missing"), "--driver-name", "d", "--endpoint", "/e"}
	if code := run(args, &stdout, &stderr); code != exitError {
		t.Fatalf("exit status %d, want %d; stderr: %s", code, exitError, stderr.String())
	}
	if !strings.Contains(stderr.String(), "listen") {
		t.Fatalf("stderr %q does not say what failed", stderr.String())
	}
}
