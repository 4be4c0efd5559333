//go:build fault

package agent_test

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat:
// 100 on every Linux architecture the project builds for.
const clockTicks = 100

// cpuTicks returns the user plus system time of process pid, in clock
// ticks, from /proc/<pid>/stat.
func cpuTicks(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The command name, in parentheses, may hold spaces: fields are
	// counted after its closing parenthesis. utime and stime are fields
	// 14 and 15 of the line, 12 and 13 after the name.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("/proc/%d/stat: cannot read utime and stime from %q", pid, s)
	}
	return utime + stime
}

// badRegistrars serves registration sockets that never answer (accept
// and hold the connection) or answer garbage (write junk and hang up),
// and counts the connections each accepted.
type badRegistrars struct {
	mu       sync.Mutex
	accepted map[string]int
	conns    []net.Conn
	wg       sync.WaitGroup
	lis      []net.Listener
}

func (b *badRegistrars) serve(t *testing.T, socket string, garbage bool) {
	t.Helper()
	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	b.lis = append(b.lis, lis)
	b.wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			b.mu.Lock()
			b.accepted[socket]++
			if garbage {
				_, _ = c.Write([]byte("\x00\x01garbage, not a registrar\n"))
				_ = c.Close()
			} else {
				b.conns = append(b.conns, c)
			}
			b.mu.Unlock()
		}
	})
}

// dials returns how many connections the sockets accepted in all.
func (b *badRegistrars) dials() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, c := range b.accepted {
		n += c
	}
	return n
}

// untried returns how many sockets have not been dialled yet.
func (b *badRegistrars) untried() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, c := range b.accepted {
		if c == 0 {
			n++
		}
	}
	return n
}

func (b *badRegistrars) close() {
	for _, l := range b.lis {
		_ = l.Close()
	}
	b.wg.Wait()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.conns {
		_ = c.Close()
	}
}

// 200 registration sockets that never answer and 20 that answer garbage
// cost the agent at most 2 % of a core, measured from /proc/<pid>/stat
// over 30 s once every socket has been asked; a driver whose registrar
// appears meanwhile is healthy within its usual time.
//
//	go test -tags fault -count=1 -run HungRegistrationSockets -v ./test/agent/
func TestHungRegistrationSocketsCostLittle(t *testing.T) {
	const (
		hung, garbage = 200, 20
		window        = 30 * time.Second
		maxCore       = 0.02
		usual         = 10 * time.Second
	)
	dir := testutil.TempDir(t)
	regDir := filepath.Join(dir, "plugins_registry")
	endpoint := filepath.Join(dir, "kubelet", "plugins", "drv", "csi.sock")
	for _, d := range []string{regDir, filepath.Dir(endpoint)} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	cfgFile := writeFile(t, dir, "agent.hcl", fmt.Sprintf(`
data_dir = %q
client {
  plugin_dir               = %q
  kubelet_registration_dir = %q
}
consul {
  enabled = false
}
`, filepath.Join(dir, "data"), filepath.Join(dir, "plugins"), regDir))
	a := startAgent(t, nil, "--config", cfgFile)

	bad := &badRegistrars{accepted: make(map[string]int)}
	t.Cleanup(bad.close)
	for i := range hung + garbage {
		socket := filepath.Join(regDir, fmt.Sprintf("bad%03d-reg.sock", i))
		bad.mu.Lock()
		bad.accepted[socket] = 0
		bad.mu.Unlock()
		bad.serve(t, socket, i >= hung)
	}
	testutil.WaitFor(t, 60*time.Second, "every registration socket asked", func() bool { return bad.untried() == 0 })

	start, before, dialsBefore := time.Now(), cpuTicks(t, a.Pid()), bad.dials()
	end := start.Add(window)

	// A real driver and its registrar appear a third into the window.
	timer := time.NewTimer(window / 3)
	select {
	case <-timer.C:
	case <-a.Done():
		t.Fatalf("agent exited: %s", a.Stderr)
	}
	startTestPlugin(t, endpoint, "--type", "node")
	appeared := time.Now()
	testutil.StartProcess(t, nil, testRegistrarBin, "--registration-dir", regDir, "--driver-name", "drv", "--endpoint", endpoint)
	a.waitHealthy(t, "drv")
	took := time.Since(appeared)
	t.Logf("the driver registered meanwhile was healthy %s after it appeared", took.Round(time.Millisecond))
	if took > usual {
		t.Errorf("the registered driver was healthy %s after it appeared, want within %s", took, usual)
	}

	timer.Reset(time.Until(end))
	select {
	case <-timer.C:
	case <-a.Done():
		t.Fatalf("agent exited: %s", a.Stderr)
	}
	used := float64(cpuTicks(t, a.Pid())-before) / clockTicks
	elapsed := time.Since(start).Seconds()
	share := used / elapsed
	t.Logf("agent CPU with %d hung and %d garbage registration sockets: %.2fs in %.1fs = %.2f%% of a core; %d dials",
		hung, garbage, used, elapsed, 100*share, bad.dials()-dialsBefore)
	if share > maxCore {
		t.Errorf("the agent used %.2f%% of a core, want at most %.0f%%", 100*share, 100*maxCore)
	}
}
