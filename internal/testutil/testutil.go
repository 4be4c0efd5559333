// Package testutil holds the few helpers that csisupd's tests share:
// waiting on a condition with a deadline (never sleeping as
// synchronisation), short temporary directories for unix sockets, distinct
// free loopback ports, and a log buffer safe for concurrent writers. It is
// imported by tests only.
package testutil

import (
	"bytes"
	"net"
	"os"
	"sync"
	"testing"
	"time"
)

// pollInterval is how often WaitFor checks its condition.
const pollInterval = 5 * time.Millisecond

// WaitFor checks cond until it holds, and fails t when timeout passes
// first, naming what it waited for.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(pollInterval)
	}
}

// TempDir returns a new temporary directory removed when the test ends.
// Unlike t.TempDir its path is short: unix socket paths are limited to
// 108 bytes, and test names make t.TempDir paths long.
func TempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "csi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// FreePorts returns n distinct free loopback TCP ports. Every listener
// stays open until all ports are chosen, so the kernel cannot hand out one
// twice.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// SyncBuffer is a bytes.Buffer safe for concurrent use, for capturing the
// logs of code that runs in other goroutines or processes.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
