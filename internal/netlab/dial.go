package netlab

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// netnsDir is where `ip netns add` leaves a handle on each named network
// namespace.
const netnsDir = "/var/run/netns"

// DialContext opens a connection to addr from host's network namespace:
// the socket is made while the calling OS thread is in that namespace and
// stays there, so its traffic crosses the lab's router like a process's on
// that host. It lets a test talk to the lab with its own clients (a gRPC
// dialer, say) instead of starting a command on the host.
func (l *Lab) DialContext(ctx context.Context, host, network, addr string) (net.Conn, error) {
	if _, ok := l.index[host]; !ok {
		return nil, fmt.Errorf("netlab: no host %q in the lab (hosts %v)", host, l.hosts)
	}
	target, err := os.Open(filepath.Join(netnsDir, l.Namespace(host)))
	if err != nil {
		return nil, fmt.Errorf("netlab: dial from %s: open its network namespace: %w", host, err)
	}
	defer target.Close()
	// Only the socket's creation needs the namespace; dialing happens on a
	// goroutine of its own so that ctx bounds the connect.
	type result struct {
		conn net.Conn
		err  error
	}
	done := make(chan result, 1)
	go func() {
		conn, err := dialIn(ctx, int(target.Fd()), network, addr)
		done <- result{conn, err}
	}()
	r := <-done
	if r.err != nil {
		return nil, fmt.Errorf("netlab: dial %s from %s: %w", addr, host, r.err)
	}
	return r.conn, nil
}

// dialIn dials on a locked OS thread moved into the namespace of nsFD and
// back. A thread that cannot be moved back is never unlocked, so the
// runtime ends it with the goroutine instead of reusing it elsewhere.
func dialIn(ctx context.Context, nsFD int, network, addr string) (net.Conn, error) {
	runtime.LockOSThread()
	home, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("open this thread's network namespace: %w", err)
	}
	defer home.Close()
	if err := unix.Setns(nsFD, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("enter the host's network namespace: %w", err)
	}
	// The connect runs on this thread: net.Dialer makes the socket and
	// waits in the poller without switching threads for the socket call.
	var d net.Dialer
	conn, dialErr := d.DialContext(ctx, network, addr)
	if err := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); err != nil {
		if conn != nil {
			conn.Close()
		}
		return nil, fmt.Errorf("return to the test's network namespace: %w", err)
	}
	runtime.UnlockOSThread()
	return conn, dialErr
}
