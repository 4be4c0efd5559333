package testutil

import (
	"encoding/binary"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// NotifySocket is a fake systemd notify socket: a unixgram socket, named
// by NOTIFY_SOCKET for the rest of the test, whose datagrams (sd_notify
// messages, "WATCHDOG=1" pings among them) are delivered in order by
// Next, Ping and Drain, and also recorded with the time they were read.
type NotifySocket struct {
	conn *net.UnixConn
	msgs chan string
	done chan struct{}

	mu  sync.Mutex
	log []NotifyMessage
}

// NotifyMessage is one sd_notify message and when it was sent: the
// kernel's timestamp of the datagram (SO_TIMESTAMP), so a test process
// slow to read it does not move it.
type NotifyMessage struct {
	At   time.Time
	Text string
}

// notifyBuffer is how many messages wait for Next, Ping or Drain; a test
// that only reads Record lets later ones go (Record keeps them all).
const notifyBuffer = 1024

// NewNotifySocket listens on a new notify socket and sets NOTIFY_SOCKET to
// it until the test ends, when the socket closes.
func NewNotifySocket(t *testing.T) *NotifySocket {
	t.Helper()
	path := filepath.Join(TempDir(t), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	if err := enableTimestamps(conn); err != nil {
		_ = conn.Close()
		t.Fatal(err)
	}
	s := &NotifySocket{conn: conn, msgs: make(chan string, notifyBuffer), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		buf, oob := make([]byte, 4096), make([]byte, 128)
		for {
			n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			m := string(buf[:n])
			s.mu.Lock()
			s.log = append(s.log, NotifyMessage{At: sentAt(oob[:oobn]), Text: m})
			s.mu.Unlock()
			select {
			case s.msgs <- m:
			default:
			}
		}
	}()
	t.Cleanup(func() { _ = conn.Close(); <-s.done })
	t.Setenv("NOTIFY_SOCKET", path)
	return s
}

// enableTimestamps makes the kernel stamp every datagram conn receives
// with the time it was sent.
func enableTimestamps(conn *net.UnixConn) error {
	raw, err := conn.SyscallConn()
	if err != nil {
		return fmt.Errorf("notify socket: %w", err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMP, 1)
	}); err != nil {
		return fmt.Errorf("notify socket: %w", err)
	}
	if serr != nil {
		return fmt.Errorf("notify socket: SO_TIMESTAMP: %w", serr)
	}
	return nil
}

// sentAt is the kernel's timestamp in the control messages oob, or now
// when there is none.
func sentAt(oob []byte) time.Time {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return time.Now()
	}
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_TIMESTAMP {
			continue
		}
		// A struct timeval: seconds and microseconds, two words.
		switch d := m.Data; {
		case len(d) >= 16 && unsafe.Sizeof(unix.Timeval{}) == 16:
			sec, usec := binary.NativeEndian.Uint64(d), binary.NativeEndian.Uint64(d[8:])
			return time.Unix(int64(sec), int64(usec)*1000)
		case len(d) >= 8 && unsafe.Sizeof(unix.Timeval{}) == 8:
			sec, usec := binary.NativeEndian.Uint32(d), binary.NativeEndian.Uint32(d[4:])
			return time.Unix(int64(int32(sec)), int64(int32(usec))*1000)
		}
	}
	return time.Now()
}

// Record returns every message read so far, in order.
func (s *NotifySocket) Record() []NotifyMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.log)
}

// Next returns the next message that is not a watchdog ping, failing the
// test after timeout; pings counts the pings skipped.
func (s *NotifySocket) Next(t *testing.T, timeout time.Duration, pings *int) string {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		select {
		case m := <-s.msgs:
			if m == "WATCHDOG=1" {
				*pings++
				continue
			}
			return m
		case <-deadline.C:
			t.Fatalf("no sd_notify message within %s", timeout)
			return ""
		}
	}
}

// Ping waits for a watchdog ping and reports whether one came within d;
// other messages are appended to other.
func (s *NotifySocket) Ping(d time.Duration, other *[]string) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		select {
		case m := <-s.msgs:
			if m == "WATCHDOG=1" {
				return true
			}
			*other = append(*other, m)
		case <-deadline.C:
			return false
		}
	}
}

// Drain appends every queued message but pings to other.
func (s *NotifySocket) Drain(other *[]string) {
	for {
		select {
		case m := <-s.msgs:
			if m != "WATCHDOG=1" {
				*other = append(*other, m)
			}
		default:
			return
		}
	}
}
