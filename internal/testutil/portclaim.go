package testutil

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
)

// portClaims keeps every port FreePorts handed out claimed for the rest of
// the process, against this process and against every other test process
// of the same user on the machine.
//
// A reservation listener alone is not enough: it is closed before the code
// under test binds the port, and in that gap `go test ./...`, which runs
// packages in parallel, can hand the same port to a test in another
// process (seen in CI: "bind: address already in use"). Within one
// process, a port given to a finished test and given again to the next
// one receives the connections of the first test's clients that still
// redial it (seen as raft's "unknown rpc type 80", an HTTP/2 preface on a
// raft port). A claim is an flock on a file named after the port: the
// kernel drops it when the process exits, however it exits, so a crashed
// test run never leaves ports claimed.
//
// It is process-wide state on purpose: the ports it guards are.
var portClaims = newPortClaimer(filepath.Join(os.TempDir(), "csisupd-test-ports-"+strconv.Itoa(os.Getuid())))

// portClaimer claims ports through lock files in one directory.
type portClaimer struct {
	dir string

	mu   sync.Mutex
	held map[int]*os.File // nil value: claimed in this process only
}

func newPortClaimer(dir string) *portClaimer {
	return &portClaimer{dir: dir, held: map[int]*os.File{}}
}

// claim claims port and reports whether it was free to claim. When the
// lock directory cannot be used, claims hold within this process only.
func (c *portClaimer) claim(port int) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.held[port]; ok {
		return false, nil
	}
	f, err := c.lock(port)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return false, nil
	}
	if err != nil {
		c.held[port] = nil
		return true, err
	}
	c.held[port] = f
	return true, nil
}

// lock opens the port's lock file and takes its lock without waiting. The
// file stays open, and so locked, until the process ends.
func (c *portClaimer) lock(port int) (*os.File, error) {
	if err := os.MkdirAll(c.dir, 0o700); err != nil {
		return nil, fmt.Errorf("port lock directory %s: %w", c.dir, err)
	}
	name := filepath.Join(c.dir, strconv.Itoa(port))
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("port lock file %s: %w", name, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("lock %s: %w", name, err)
	}
	return f, nil
}
