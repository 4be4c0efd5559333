package netlab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// run runs name with args, stdin as its input, within timeout, and returns
// its standard output. A failure names the command and quotes its output.
func run(timeout time.Duration, stdin io.Reader, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdin = stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// A command that leaves a child holding its output open must not
	// hold Wait past the deadline.
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("no answer within %v: %w", timeout, err)
		}
		out := strings.TrimSpace(stderr.String() + stdout.String())
		return nil, fmt.Errorf("netlab: %s: %w: %q", strings.Join(append([]string{name}, args...), " "), err, out)
	}
	return stdout.Bytes(), nil
}

// listNamespaces returns the names of the named network namespaces.
func listNamespaces(timeout time.Duration) ([]string, error) {
	out, err := run(timeout, nil, "ip", "netns", "list")
	if err != nil {
		return nil, err
	}
	var names []string
	for line := range strings.Lines(string(out)) {
		// "NAME" or "NAME (id: N)"
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names, nil
}

// removeNamespaces kills the processes in each of names that exists and
// deletes it.
func removeNamespaces(names []string, timeout time.Duration) error {
	existing, err := listNamespaces(timeout)
	if err != nil {
		return err
	}
	var errs []error
	for _, ns := range names {
		if !slices.Contains(existing, ns) {
			continue
		}
		if err := killAll(ns, timeout); err != nil {
			errs = append(errs, err)
		}
		if _, err := run(timeout, nil, "ip", "netns", "del", ns); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// killAll kills the processes running in namespace ns. They belong to the
// lab: nothing else enters a lab's namespaces.
func killAll(ns string, timeout time.Duration) error {
	out, err := run(timeout, nil, "ip", "netns", "pids", ns)
	if err != nil {
		return err
	}
	var errs []error
	for _, f := range strings.Fields(string(out)) {
		pid, err := strconv.Atoi(f)
		if err != nil || pid <= 1 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("netlab: killing process %d in namespace %s: %w", pid, ns, err))
		}
	}
	return errors.Join(errs...)
}

// removeStale removes the namespaces of labs named with prefix whose
// process is gone, and of this process's labs that are closed.
func removeStale(prefix string, timeout time.Duration) error {
	names, err := listNamespaces(timeout)
	if err != nil {
		return err
	}
	var stale []string
	for _, ns := range names {
		id, pid, ok := parseName(prefix, ns)
		if !ok {
			continue
		}
		if pid == os.Getpid() {
			liveMu.Lock()
			alive := live[id]
			liveMu.Unlock()
			if !alive {
				stale = append(stale, ns)
			}
			continue
		}
		if !processExists(pid) {
			stale = append(stale, ns)
		}
	}
	return removeNamespaces(stale, timeout)
}

// parseName splits a lab namespace name <prefix>-<pid>-<n>-<host> of the
// given prefix into the lab's id and the pid that made it.
func parseName(prefix, ns string) (id string, pid int, ok bool) {
	f := strings.Split(ns, "-")
	if len(f) != 4 || f[0] != prefix || !hostRE.MatchString(f[3]) {
		return "", 0, false
	}
	pid, err := strconv.Atoi(f[1])
	if err != nil || pid <= 0 {
		return "", 0, false
	}
	if _, err := strconv.ParseUint(f[2], 10, 63); err != nil {
		return "", 0, false
	}
	return strings.Join(f[:3], "-"), pid, true
}

// processExists reports whether a process with this pid exists. A pid
// reused by an unrelated process keeps a dead lab's namespaces until that
// process ends too, which is harmless: names include the pid, and a live
// process never makes a lab under another's.
func processExists(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// restore applies rules to the router's tables in one iptables-restore
// transaction, leaving other chains as they are.
func (l *Lab) restore(rules string) error {
	// -w: iptables-legacy takes a lock shared by all namespaces.
	_, err := run(l.timeout, strings.NewReader(rules), "ip", "netns", "exec", l.RouterNamespace(), "iptables-restore", "--noflush", "-w", "5")
	return err
}

var available = sync.OnceValues(probe)

// Available reports whether this process can build labs and, if not, why:
// it needs root, ip (iproute2) and iptables, and the kernel must let it
// make a network namespace and iptables rules in it. The answer is worked
// out once per process, by making and removing a namespace.
func Available() (bool, string) { return available() }

func probe() (bool, string) {
	if euid := os.Geteuid(); euid != 0 {
		return false, fmt.Sprintf("network namespaces need root (euid %d)", euid)
	}
	for _, c := range []struct{ cmd, pkg string }{{"ip", "iproute2"}, {"iptables", "iptables"}, {"iptables-restore", "iptables"}, {"sh", "dash"}} {
		if _, err := exec.LookPath(c.cmd); err != nil {
			return false, fmt.Sprintf("no %s in PATH (Debian package %s)", c.cmd, c.pkg)
		}
	}
	// Named as a lab's router is, so that a probe left by a killed
	// process is removed by the next New with the default prefix.
	ns := fmt.Sprintf("%s-%d-%d-%s", DefaultPrefix, os.Getpid(), labSeq.Add(1), routerName)
	if _, err := run(defaultTimeout, nil, "ip", "netns", "add", ns); err != nil {
		return false, err.Error()
	}
	_, err := run(defaultTimeout, nil, "ip", "netns", "exec", ns, "iptables", "-w", "5", "-S")
	if derr := removeNamespaces([]string{ns}, defaultTimeout); derr != nil {
		return false, derr.Error()
	}
	if err != nil {
		return false, err.Error()
	}
	return true, ""
}
