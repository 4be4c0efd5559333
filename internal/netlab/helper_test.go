package netlab

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// The test binary is also the helper program the tests run on lab hosts:
// with helperEnv set it runs the helper named by its value instead of the
// tests. A helper is a TCP echo server ("serve ADDR"), a client that keeps
// one connection open and answers the test's pings ("client ADDR
// DIAL_TIMEOUT"), a client that dials and pings once ("once ADDR
// DIAL_TIMEOUT PING_TIMEOUT"), or a process that prints "ready" and waits
// for its standard input to close ("idle").
const helperEnv = "NETLAB_TEST_HELPER"

// port is the echo servers' port; each host has a network of its own.
const port = "7000"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(helperMain(mode, os.Args[1:]))
	}
	goleak.VerifyTestMain(m)
}

func helperMain(mode string, args []string) int {
	out := &lockedWriter{w: os.Stdout}
	switch {
	case mode == "serve" && len(args) == 1:
		return serve(out, args[0])
	case mode == "client" && len(args) == 2:
		return client(out, args[0], args[1])
	case mode == "once" && len(args) == 3:
		return once(out, args[0], args[1], args[2])
	case mode == "idle" && len(args) == 0:
		out.println("ready")
		_, _ = io.Copy(io.Discard, os.Stdin)
		return 0
	}
	fmt.Fprintf(os.Stderr, "helper: bad mode %q or arguments %q\n", mode, args)
	return 2
}

// serve echoes each line it receives on ADDR:port and prints "recv LINE",
// until its standard input closes.
func serve(out *lockedWriter, addr string) int {
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, port))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					out.println("recv " + sc.Text())
					if _, err := io.WriteString(c, sc.Text()+"\n"); err != nil {
						return
					}
				}
			}()
		}
	}()
	out.println("listening")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// client dials ADDR:port and prints "connected" or "dial-error ERR"; then
// for each "ping TAG MILLISECONDS" on its standard input it sends TAG and
// prints "ok TAG" when TAG comes back within the time, or "timeout TAG".
// Echoes of earlier pings that timed out are skipped.
func client(out *lockedWriter, addr, dialTimeout string) int {
	c, ok := dial(out, addr, dialTimeout)
	if !ok {
		return 1
	}
	defer c.Close()
	out.println("connected")
	r := bufio.NewReader(c)
	var partial string
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		var tag string
		var ms int
		if _, err := fmt.Sscanf(sc.Text(), "ping %s %d", &tag, &ms); err != nil {
			out.println("error bad command " + strconv.Quote(sc.Text()))
			continue
		}
		out.println(ping(c, r, &partial, tag, time.Duration(ms)*time.Millisecond))
	}
	return 0
}

// once dials ADDR:port and pings once, printing "dial-error ERR", "ok" or
// "timeout".
func once(out *lockedWriter, addr, dialTimeout, pingTimeout string) int {
	c, ok := dial(out, addr, dialTimeout)
	if !ok {
		return 0
	}
	defer c.Close()
	d, err := time.ParseDuration(pingTimeout)
	if err != nil {
		out.println("error " + err.Error())
		return 2
	}
	var partial string
	res := ping(c, bufio.NewReader(c), &partial, "once", d)
	out.println(strings.TrimSuffix(res, " once"))
	return 0
}

func dial(out *lockedWriter, addr, timeout string) (net.Conn, bool) {
	d, err := time.ParseDuration(timeout)
	if err != nil {
		out.println("error " + err.Error())
		return nil, false
	}
	c, err := net.DialTimeout("tcp", net.JoinHostPort(addr, port), d)
	if err != nil {
		out.println("dial-error " + err.Error())
		return nil, false
	}
	return c, true
}

// ping sends tag and waits for its echo. partial keeps a line cut short by
// a deadline for the next read.
func ping(c net.Conn, r *bufio.Reader, partial *string, tag string, timeout time.Duration) string {
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return "error " + tag + " " + err.Error()
	}
	if _, err := io.WriteString(c, tag+"\n"); err != nil {
		return errResult(tag, err)
	}
	for {
		s, err := r.ReadString('\n')
		*partial += s
		if err != nil {
			return errResult(tag, err)
		}
		line := strings.TrimSuffix(*partial, "\n")
		*partial = ""
		if line == tag {
			return "ok " + tag
		}
	}
}

func errResult(tag string, err error) string {
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return "timeout " + tag
	}
	return "error " + tag + " " + err.Error()
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) println(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = io.WriteString(l.w, s+"\n")
}

// proc is a helper running on a lab host, read line by line with
// deadlines.
type proc struct {
	t      testing.TB
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    *os.File
	r      *bufio.Reader
	stderr lockedBuffer
}

// startHelper starts the helper mode on host and stops it at the end of
// the test.
func startHelper(t testing.TB, lab *Lab, host, mode string, args ...string) *proc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, name: mode + "@" + host, cmd: lab.Command(host, exe, args...)}
	p.cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	p.cmd.Stderr = &p.stderr
	p.cmd.WaitDelay = time.Second
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout = w
	if err := p.cmd.Start(); err != nil {
		_ = r.Close()
		_ = w.Close()
		t.Fatalf("%s: %v", p.name, err)
	}
	_ = w.Close()
	p.out, p.r = r, bufio.NewReader(r)
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
		_ = p.out.Close()
	})
	return p
}

// line returns the helper's next line of output, failing the test if none
// comes within d.
func (p *proc) line(d time.Duration) string {
	p.t.Helper()
	if err := p.out.SetReadDeadline(time.Now().Add(d)); err != nil {
		p.t.Fatal(err)
	}
	s, err := p.r.ReadString('\n')
	if err != nil {
		p.t.Fatalf("%s: no line of output within %v: %v (stderr %q)", p.name, d, err, p.stderr.String())
	}
	return strings.TrimSuffix(s, "\n")
}

// expect reads lines until one is want, failing the test if none is within
// d.
func (p *proc) expect(want string, d time.Duration) {
	p.t.Helper()
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			p.t.Fatalf("%s: no line %q within %v", p.name, want, d)
		}
		if p.line(left) == want {
			return
		}
	}
}

func (p *proc) send(s string) {
	p.t.Helper()
	if _, err := io.WriteString(p.stdin, s+"\n"); err != nil {
		p.t.Fatalf("%s: %v", p.name, err)
	}
}

// ping sends a ping with timeout on the client's connection and returns
// its result: "ok TAG", "timeout TAG" or "error TAG ...".
func (p *proc) ping(tag string, timeout time.Duration) string {
	p.t.Helper()
	p.send(fmt.Sprintf("ping %s %d", tag, timeout.Milliseconds()))
	return p.line(timeout + 5*time.Second)
}

// server starts an echo server on host and waits until it listens.
func server(t testing.TB, lab *Lab, host string) *proc {
	t.Helper()
	p := startHelper(t, lab, host, "serve", lab.Addr(host))
	if got := p.line(10 * time.Second); got != "listening" {
		t.Fatalf("%s: got %q, want listening (stderr %q)", p.name, got, p.stderr.String())
	}
	return p
}

// connect opens a connection from host from to the echo server on to, and
// checks it round-trips.
func connect(t testing.TB, lab *Lab, from, to string) *proc {
	t.Helper()
	p := startHelper(t, lab, from, "client", lab.Addr(to), "5s")
	if got := p.line(10 * time.Second); got != "connected" {
		t.Fatalf("%s to %s: got %q, want connected (stderr %q)", p.name, to, got, p.stderr.String())
	}
	if got := p.ping("first", 5*time.Second); got != "ok first" {
		t.Fatalf("%s to %s: first ping: %q", p.name, to, got)
	}
	return p
}

// onceTo dials the echo server on host to from host from with dialTimeout
// and pings it once, returning "ok", "timeout", "dial-error ERR" or
// "error ERR".
func onceTo(t testing.TB, lab *Lab, from, to string, dialTimeout time.Duration) string {
	t.Helper()
	return onceAddr(t, lab, from, lab.Addr(to), dialTimeout)
}

func onceAddr(t testing.TB, lab *Lab, from, addr string, dialTimeout time.Duration) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout+20*time.Second)
	defer cancel()
	cmd := lab.CommandContext(ctx, from, exe, addr, dialTimeout.String(), "5s")
	cmd.Env = append(os.Environ(), helperEnv+"=once")
	cmd.WaitDelay = time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("once from %s to %s: %v (stderr %q)", from, addr, err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// wantOK fails the test unless a new connection from from to to works.
func wantOK(t testing.TB, lab *Lab, from, to string) {
	t.Helper()
	if got := onceTo(t, lab, from, to, 5*time.Second); got != "ok" {
		t.Errorf("new connection from %s to %s: %q, want ok", from, to, got)
	}
}

// wantNoConnect fails the test unless a new connection from from to to
// fails to open within a second.
func wantNoConnect(t testing.TB, lab *Lab, from, to string) {
	t.Helper()
	if got := onceTo(t, lab, from, to, time.Second); !strings.HasPrefix(got, "dial-error") || !strings.Contains(got, "timeout") {
		t.Errorf("new connection from %s to %s: %q, want a dial timeout", from, to, got)
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
