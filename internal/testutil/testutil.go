// Package testutil holds the few helpers that csisupd's tests share:
// waiting on a condition with a deadline (never sleeping as
// synchronisation), short temporary directories for unix sockets, distinct
// free loopback ports outside the kernel's ephemeral range, a log buffer
// safe for concurrent writers, and serving and dialling gRPC for the
// length of a test. It is imported by tests only.
package testutil

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
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
// twice, and every port stays claimed until the process ends (see
// portClaims), so no other call, in this test process or another, returns
// it again.
//
// The ports come from outside the kernel's ephemeral range whenever there
// is room. A port freed by its reservation and bound again a moment later
// by the code under test would otherwise be open to every outgoing
// connection on the machine as a source port, and one long-lived client
// connection that took it keeps the bind failing for good.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	pick := portPicker(ephemeralPortRange())
	for len(ports) < n {
		ln, err := reservePort(pick)
		if err != nil {
			t.Fatalf("reserve a loopback port: %v", err)
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// FreeAddr returns a loopback address ("127.0.0.1:port") on a port that
// nothing listens on, chosen like FreePorts' ports.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePorts(t, 1)[0]))
}

// Bounds of the ports FreePorts chooses from outside the ephemeral range:
// below it down to lowestPort, or above it up to 65535.
const (
	lowestPort       = 10000
	minPortsOutside  = 1000
	pickAttempts     = 200
	defaultEphemLow  = 32768
	defaultEphemHigh = 60999
)

// ephemeralPortRange reads the range the kernel takes source ports from,
// or returns Linux's default when it cannot be read.
func ephemeralPortRange() (low, high int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return defaultEphemLow, defaultEphemHigh
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return defaultEphemLow, defaultEphemHigh
	}
	lo, err1 := strconv.Atoi(f[0])
	hi, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || lo > hi {
		return defaultEphemLow, defaultEphemHigh
	}
	return lo, hi
}

// portPicker returns a function giving random candidate ports outside
// [low, high], or nil when too few ports lie outside it; callers then let
// the kernel choose.
func portPicker(low, high int) func() int {
	below := max(0, low-lowestPort)
	above := max(0, 65535-high)
	if below+above < minPortsOutside {
		return nil
	}
	return func() int {
		i := rand.IntN(below + above)
		if i < below {
			return lowestPort + i
		}
		return high + 1 + i - below
	}
}

// reservePort binds a loopback port from pick that no test process has
// claimed, and claims it; it tries others while the ones drawn are taken.
// With a nil pick the kernel chooses.
func reservePort(pick func() int) (net.Listener, error) {
	var err error
	for range pickAttempts {
		var ln net.Listener
		if pick == nil {
			ln, err = net.Listen("tcp", "127.0.0.1:0")
		} else {
			ln, err = net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(pick())))
		}
		if err != nil {
			continue
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ok, claimErr := portClaims.claim(port)
		if claimErr != nil {
			portClaimWarning.Do(func() {
				fmt.Fprintf(os.Stderr, "testutil: ports are claimed within this process only: %v\n", claimErr)
			})
		}
		if ok {
			return ln, nil
		}
		ln.Close()
		err = fmt.Errorf("port %d is claimed by another test", port)
	}
	return nil, fmt.Errorf("no free port in %d attempts: %w", pickAttempts, err)
}

// portClaimWarning says once per process that claims cannot reach other
// processes.
var portClaimWarning sync.Once

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

// HoldsFor checks cond every 100 ms for d, failing the test the first
// time it does not hold: a state that must last a while, which no event
// announces the end of (a lease someone renews, say).
func HoldsFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	for time.Since(start) < d {
		if !cond() {
			t.Fatalf("%s: lost after %v, want it kept for %v", what, time.Since(start).Round(time.Millisecond), d)
		}
		<-tick.C
	}
}
