package testutil

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Process is a started subprocess of a test. It is killed when the test
// ends (a stopped one is continued first, so that it dies like any other),
// and its command line and output are logged when the test failed.
type Process struct {
	// Name is the binary's base name, for messages.
	Name           string
	Cmd            *exec.Cmd
	Stdout, Stderr *SyncBuffer

	done chan struct{}
	err  error // set before done is closed
}

// StartProcess starts bin with args, and env added to the environment.
func StartProcess(t testing.TB, env []string, bin string, args ...string) *Process {
	t.Helper()
	p := &Process{
		Name:   filepath.Base(bin),
		Stdout: &SyncBuffer{}, Stderr: &SyncBuffer{},
		done: make(chan struct{}),
	}
	p.Cmd = exec.Command(bin, args...)
	p.Cmd.Env = append(os.Environ(), env...)
	p.Cmd.Stdout, p.Cmd.Stderr = p.Stdout, p.Stderr
	if err := p.Cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	go func() {
		p.err = p.Cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.Cmd.Process.Signal(syscall.SIGCONT)
		_ = p.Cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("%s %s\nstdout:\n%s\nstderr:\n%s", p.Name, strings.Join(args, " "), p.Stdout, p.Stderr)
		}
	})
	return p
}

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Pid is the process id.
func (p *Process) Pid() int { return p.Cmd.Process.Pid }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// ExitCode is the process's exit code (-1 when it did not exit normally);
// the process must have exited.
func (p *Process) ExitCode() int {
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	if p.err != nil {
		return -1
	}
	return 0
}

// Wait waits for the process to exit and returns its exit code, or fails
// the test after timeout.
func (p *Process) Wait(t testing.TB, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.ExitCode()
	case <-time.After(timeout):
		t.Fatalf("%s did not exit within %s", p.Name, timeout)
		return -1
	}
}

// Signal sends sig to the process.
func (p *Process) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := p.Cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to %s: %v", sig, p.Name, err)
	}
}

// WaitOutput waits until the process's standard output contains s and
// returns when it saw it; it fails the test when the process exits first
// or timeout passes.
func (p *Process) WaitOutput(t testing.TB, s string, timeout time.Duration) time.Time {
	t.Helper()
	WaitFor(t, timeout, fmt.Sprintf("%s to print %q", p.Name, s), func() bool {
		if p.Exited() {
			t.Fatalf("%s exited with %d before printing %q:\n%s", p.Name, p.ExitCode(), s, p.Stderr)
		}
		return strings.Contains(p.Stdout.String(), s)
	})
	return time.Now()
}
