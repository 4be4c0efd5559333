package netlab

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// TestDialContextFromHost dials from the test process as if it were on a
// host: the connection reaches a server on another host, a cut between
// the two stops new ones, and the test's own namespace is unchanged.
func TestDialContextFromHost(t *testing.T) {
	lab := newTestLab(t, Config{Hosts: []string{"a", "b"}})
	srv := server(t, lab, "a")
	before, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := lab.DialContext(ctx, "b", "tcp", net.JoinHostPort(lab.Addr("a"), port))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("from-b\n")); err != nil {
		t.Fatal(err)
	}
	if err := conn.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	got, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || strings.TrimSpace(got) != "from-b" {
		t.Fatalf("echo = %q, %v; want from-b", got, err)
	}
	srv.expect("recv from-b", 10*time.Second)
	// The connection's own end has b's address: it left from b.
	if local := conn.LocalAddr().(*net.TCPAddr).IP.String(); local != lab.Addr("b") {
		t.Errorf("local address %s, want b's %s", local, lab.Addr("b"))
	}

	// The root namespace has no route into the lab; the dialing thread
	// went back to it.
	after, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	if before != after {
		t.Errorf("test thread's network namespace changed: %s -> %s", before, after)
	}

	if err := lab.Cut("b", "a"); err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(context.Background(), time.Second)
	defer cancelShort()
	if c, err := lab.DialContext(short, "b", "tcp", net.JoinHostPort(lab.Addr("a"), port)); err == nil {
		c.Close()
		t.Fatal("dial across a cut succeeded")
	} else if !errors.Is(err, context.DeadlineExceeded) && !strings.Contains(err.Error(), "timeout") {
		t.Errorf("dial across a cut: %v, want a timeout", err)
	}

	if _, err := lab.DialContext(ctx, "nohost", "tcp", "198.18.1.2:1"); err == nil || !strings.Contains(err.Error(), `no host "nohost"`) {
		t.Errorf("dial from an unknown host: %v", err)
	}
}
