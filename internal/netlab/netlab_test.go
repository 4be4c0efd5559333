package netlab

import (
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// newLab builds a lab of hosts, skipping the test where labs cannot be
// built.
func newTestLab(t *testing.T, cfg Config) *Lab {
	t.Helper()
	if ok, why := Available(); !ok {
		t.Skip("no network lab: " + why)
	}
	lab, err := New(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return lab
}

// sh runs a command of the test within a deadline and returns its output.
func sh(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := run(10*time.Second, nil, name, args...)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// rules returns the rules of the lab's chain.
func rules(t *testing.T, lab *Lab) []string {
	t.Helper()
	var out []string
	for line := range strings.Lines(sh(t, "ip", "netns", "exec", lab.RouterNamespace(), "iptables", "-w", "5", "-S", chain)) {
		if strings.HasPrefix(line, "-A ") {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return out
}

func namespaces(t *testing.T) []string {
	t.Helper()
	names, err := listNamespaces(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func TestConfigChecked(t *testing.T) {
	long := make([]string, MaxHosts+1)
	for i := range long {
		long[i] = "h" + strconv.Itoa(i)
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no hosts", Config{}, "0 hosts"},
		{"too many hosts", Config{Hosts: long}, "255 hosts"},
		{"upper case", Config{Hosts: []string{"A"}}, `host name "A"`},
		{"dash", Config{Hosts: []string{"a-b"}}, `host name "a-b"`},
		{"too long", Config{Hosts: []string{"abcdefghijklmnop"}}, "1 to 15"},
		{"router", Config{Hosts: []string{"a", "router"}}, "router's"},
		{"twice", Config{Hosts: []string{"a", "b", "a"}}, `"a" named twice`},
		{"bad prefix", Config{Hosts: []string{"a"}, Prefix: "my-lab"}, `prefix "my-lab"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(t, tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

// TestAddressPlan checks that every host's address, and the router's end
// of its link, is in 198.18.0.0/15 and that the links' /30s do not overlap.
func TestAddressPlan(t *testing.T) {
	hosts := make([]string, MaxHosts)
	for i := range hosts {
		hosts[i] = "h" + strconv.Itoa(i)
	}
	lab, err := newLab(Config{Hosts: hosts})
	if err != nil {
		t.Fatal(err)
	}
	bench := netip.MustParsePrefix("198.18.0.0/15")
	seen := map[netip.Prefix]string{}
	for _, h := range hosts {
		a := netip.MustParseAddr(lab.Addr(h))
		if !bench.Contains(a) {
			t.Fatalf("%s: %v is outside %v", h, a, bench)
		}
		link, _ := a.Prefix(30)
		if other, ok := seen[link]; ok {
			t.Fatalf("%s and %s share %v", h, other, link)
		}
		seen[link] = h
		if gw := a.Prev(); !link.Contains(gw) || gw == link.Addr() {
			t.Fatalf("%s: router address %v is not a host address of %v", h, gw, link)
		}
	}
	if got := lab.Addr("h0"); got != "198.18.1.2" {
		t.Errorf("first host's address %s, want 198.18.1.2", got)
	}
}

func TestParseName(t *testing.T) {
	for _, tc := range []struct {
		ns, id string
		pid    int
		ok     bool
	}{
		{"netlab-12-3-a", "netlab-12-3", 12, true},
		{"netlab-12-3-router", "netlab-12-3", 12, true},
		{"other-12-3-a", "", 0, false},
		{"netlab-12-a", "", 0, false},
		{"netlab-x-3-a", "", 0, false},
		{"netlab-12-3-a-b", "", 0, false},
		{"netlab-0-3-a", "", 0, false},
		{"netlab", "", 0, false},
	} {
		id, pid, ok := parseName("netlab", tc.ns)
		if id != tc.id || pid != tc.pid || ok != tc.ok {
			t.Errorf("parseName(%q) = %q, %d, %v; want %q, %d, %v", tc.ns, id, pid, ok, tc.id, tc.pid, tc.ok)
		}
	}
}

func TestRulesOfCuts(t *testing.T) {
	lab, err := newLab(Config{Hosts: []string{"a", "b", "c"}})
	if err != nil {
		t.Fatal(err)
	}
	got := lab.rules(map[link]bool{{"b", "a"}: true, {"a", "c"}: true})
	want := "*filter\n:NETLAB - [0:0]\n-F NETLAB\n-A NETLAB -i h1 -o h3 -j DROP\n-A NETLAB -i h2 -o h1 -j DROP\nCOMMIT\n"
	if got != want {
		t.Errorf("rules:\n%s\nwant:\n%s", got, want)
	}
}

// TestTopology checks the lab's routes: hosts reach each other through
// the router, and nothing leaves the lab.
func TestTopology(t *testing.T) {
	lab := newTestLab(t, Config{Hosts: []string{"a", "b"}})
	r := lab.RouterNamespace()
	if got := strings.TrimSpace(sh(t, "ip", "-n", r, "route", "show", "default")); got != "" {
		t.Errorf("the router has a default route: %q", got)
	}
	if got := strings.TrimSpace(sh(t, "ip", "netns", "exec", r, "cat", "/proc/sys/net/ipv4/ip_forward")); got != "1" {
		t.Errorf("router ip_forward = %q, want 1", got)
	}
	for _, h := range lab.Hosts() {
		got := sh(t, "ip", "-n", lab.Namespace(h), "route", "show", "default")
		gw := netip.MustParseAddr(lab.Addr(h)).Prev().String()
		if !strings.Contains(got, "default via "+gw+" dev eth0") {
			t.Errorf("%s: default route %q, want via %s", h, got, gw)
		}
		if got := sh(t, "ip", "-n", lab.Namespace(h), "-br", "link", "show", "lo"); !strings.Contains(got, "UP") {
			t.Errorf("%s: loopback %q is not up", h, got)
		}
	}
	server(t, lab, "a")
	wantOK(t, lab, "b", "a")
	// A TEST-NET-1 address outside the lab: the router has no route to it
	// and says so.
	if got := onceAddr(t, lab, "b", "192.0.2.1", 5*time.Second); !strings.HasPrefix(got, "dial-error") || !strings.Contains(got, "unreachable") {
		t.Errorf("connection out of the lab: %q, want unreachable", got)
	}
}

// TestCutStallsEstablishedConnections cuts b's packets to a: b's new
// connections time out while c's work, and b's open connection stalls
// until the cut heals.
func TestCutStallsEstablishedConnections(t *testing.T) {
	lab := newTestLab(t, Config{Hosts: []string{"a", "b", "c"}})
	srv := server(t, lab, "a")
	fromB := connect(t, lab, "b", "a")
	fromC := connect(t, lab, "c", "a")

	if err := lab.Cut("b", "a"); err != nil {
		t.Fatal(err)
	}
	if got, want := lab.Cuts(), []string{"b->a"}; !slices.Equal(got, want) {
		t.Errorf("Cuts() = %v, want %v", got, want)
	}
	if got := rules(t, lab); !slices.Equal(got, []string{"-A NETLAB -i h2 -o h1 -j DROP"}) {
		t.Errorf("rules after the cut: %q", got)
	}
	wantNoConnect(t, lab, "b", "a")
	wantOK(t, lab, "c", "a")
	if got := fromB.ping("b1", time.Second); got != "timeout b1" {
		t.Errorf("b's open connection during the cut: %q, want timeout", got)
	}
	if got := fromC.ping("c1", 5*time.Second); got != "ok c1" {
		t.Errorf("c's open connection during b's cut: %q", got)
	}

	if err := lab.Heal("b", "a"); err != nil {
		t.Fatal(err)
	}
	if got := rules(t, lab); len(got) != 0 {
		t.Errorf("rules after healing: %q", got)
	}
	wantOK(t, lab, "b", "a")
	// The stalled connection resumes at its next retransmission, which
	// may be seconds away after backing off.
	if got := fromB.ping("b2", 30*time.Second); got != "ok b2" {
		t.Errorf("b's open connection after healing: %q", got)
	}
	// The ping sent during the cut was held back, not lost: TCP delivered
	// it after the heal.
	srv.expect("recv b1", 10*time.Second)
}

// TestOneWayCut cuts a's packets to b, leaving b's to a: b's requests
// still reach a, but no answer comes back, and no new connection opens in
// either direction.
func TestOneWayCut(t *testing.T) {
	lab := newTestLab(t, Config{Hosts: []string{"a", "b", "c"}})
	srv := server(t, lab, "a")
	server(t, lab, "b")
	fromB := connect(t, lab, "b", "a")

	if err := lab.Cut("a", "b"); err != nil {
		t.Fatal(err)
	}
	wantNoConnect(t, lab, "b", "a") // SYN arrives, SYN-ACK is dropped
	wantNoConnect(t, lab, "a", "b") // SYN is dropped
	wantOK(t, lab, "c", "a")
	wantOK(t, lab, "c", "b")
	if got := fromB.ping("b1", time.Second); got != "timeout b1" {
		t.Errorf("b's open connection during a's one-way cut: %q, want timeout", got)
	}
	// b's bytes arrived: the server acted on a request whose answer is
	// lost.
	srv.expect("recv b1", 10*time.Second)

	if err := lab.Heal("a", "b"); err != nil {
		t.Fatal(err)
	}
	wantOK(t, lab, "b", "a")
	wantOK(t, lab, "a", "b")
	if got := fromB.ping("b2", 30*time.Second); got != "ok b2" {
		t.Errorf("b's open connection after healing: %q", got)
	}
}

// TestIsolateAndHealAll isolates a from b and c, which still reach each
// other, and heals everything.
func TestIsolateAndHealAll(t *testing.T) {
	lab := newTestLab(t, Config{Hosts: []string{"a", "b", "c"}})
	server(t, lab, "a")
	server(t, lab, "c")
	fromB := connect(t, lab, "b", "a")

	if err := lab.Isolate("a"); err != nil {
		t.Fatal(err)
	}
	if got, want := lab.Cuts(), []string{"a->b", "a->c", "b->a", "c->a"}; !slices.Equal(got, want) {
		t.Errorf("Cuts() = %v, want %v", got, want)
	}
	if got := rules(t, lab); len(got) != 4 {
		t.Errorf("rules of an isolated host of three: %q, want 4", got)
	}
	wantNoConnect(t, lab, "b", "a")
	wantNoConnect(t, lab, "c", "a")
	wantNoConnect(t, lab, "a", "c")
	wantOK(t, lab, "b", "c")
	if got := fromB.ping("b1", time.Second); got != "timeout b1" {
		t.Errorf("b's open connection to the isolated a: %q, want timeout", got)
	}

	if err := lab.HealAll(); err != nil {
		t.Fatal(err)
	}
	if got := rules(t, lab); len(got) != 0 {
		t.Errorf("rules after HealAll: %q", got)
	}
	if got := lab.Cuts(); len(got) != 0 {
		t.Errorf("Cuts() after HealAll: %v", got)
	}
	wantOK(t, lab, "b", "a")
	wantOK(t, lab, "a", "c")
	if got := fromB.ping("b2", 30*time.Second); got != "ok b2" {
		t.Errorf("b's open connection after HealAll: %q", got)
	}
}

func TestCutsCombine(t *testing.T) {
	lab := newTestLab(t, Config{Hosts: []string{"a", "b", "c"}})
	steps := []struct {
		name string
		do   func() error
		want []string
	}{
		{"cut both a b", func() error { return lab.CutBoth("a", "b") }, []string{"a->b", "b->a"}},
		{"cut again", func() error { return lab.Cut("a", "b") }, []string{"a->b", "b->a"}},
		{"isolate c", func() error { return lab.Isolate("c") }, []string{"a->b", "a->c", "b->a", "b->c", "c->a", "c->b"}},
		{"rejoin c", func() error { return lab.Rejoin("c") }, []string{"a->b", "b->a"}},
		{"heal one way", func() error { return lab.Heal("a", "b") }, []string{"b->a"}},
		{"heal uncut", func() error { return lab.Heal("a", "c") }, []string{"b->a"}},
		{"heal both", func() error { return lab.HealBoth("a", "b") }, nil},
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := lab.Cuts(); !slices.Equal(got, s.want) {
			t.Fatalf("%s: Cuts() = %v, want %v", s.name, got, s.want)
		}
		if got := rules(t, lab); len(got) != len(s.want) {
			t.Fatalf("%s: rules %q, want %d", s.name, got, len(s.want))
		}
	}
	for _, err := range []error{lab.Cut("a", "a"), lab.Cut("a", "x"), lab.Isolate("x"), lab.Rejoin("x")} {
		if err == nil {
			t.Error("a cut naming no host or a host and itself: no error")
		}
	}
	if err := lab.Command("x", "true").Run(); err == nil || !strings.Contains(err.Error(), `no host "x"`) {
		t.Errorf("Command on no host: %v", err)
	}
}

// TestCloseRemovesEverything closes a lab with a process still running on
// a host: the process is killed and no namespace of the lab is left.
func TestCloseRemovesEverything(t *testing.T) {
	lab := newTestLab(t, Config{Hosts: []string{"a", "b"}})
	if err := lab.Isolate("a"); err != nil {
		t.Fatal(err)
	}
	srv := server(t, lab, "a")
	ours := []string{lab.RouterNamespace(), lab.Namespace("a"), lab.Namespace("b")}
	if got := namespaces(t); !containsAll(got, ours) {
		t.Fatalf("namespaces %v, want %v among them", got, ours)
	}
	if err := lab.Close(); err != nil {
		t.Fatal(err)
	}
	if got := namespaces(t); containsAny(got, ours) {
		t.Errorf("namespaces after Close: %v", got)
	}
	if err := waitExit(srv.cmd, 10*time.Second); err == nil {
		t.Errorf("the server in the closed lab exited without being killed")
	}
	if err := lab.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := lab.Cut("a", "b"); err == nil {
		t.Error("Cut on a closed lab: no error")
	}
	// The lab's chain lived in the router's namespace only.
	if got := sh(t, "iptables", "-w", "5", "-S"); strings.Contains(got, chain) {
		t.Errorf("the lab's chain is in this namespace's rules:\n%s", got)
	}
}

// TestStaleNamespacesRemoved leaves namespaces named as a dead process's
// lab, one with a process in it, and one of a live process: New removes
// the dead process's, kills the process and keeps the live one's.
func TestStaleNamespacesRemoved(t *testing.T) {
	if ok, why := Available(); !ok {
		t.Skip("no network lab: " + why)
	}
	prefix := "stale" + strconv.Itoa(os.Getpid())
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	deadPid := dead.Process.Pid
	if processExists(deadPid) {
		t.Skipf("pid %d was reused at once", deadPid)
	}
	stale := []string{
		fmt.Sprintf("%s-%d-1-router", prefix, deadPid),
		fmt.Sprintf("%s-%d-1-a", prefix, deadPid),
		fmt.Sprintf("%s-%d-999999-a", prefix, os.Getpid()), // this process's, not a live lab
	}
	liveOwner := fmt.Sprintf("%s-1-1-a", prefix) // pid 1 is alive
	for _, ns := range append(slices.Clone(stale), liveOwner) {
		sh(t, "ip", "netns", "add", ns)
	}
	t.Cleanup(func() {
		if err := removeNamespaces(append(slices.Clone(stale), liveOwner), 10*time.Second); err != nil {
			t.Error(err)
		}
	})
	// A process left running in a stale namespace: the helper idling
	// until its input closes, which it says once it runs there.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	leftover := exec.Command("ip", "netns", "exec", stale[1], exe)
	leftover.Env = append(os.Environ(), helperEnv+"=idle")
	leftover.WaitDelay = time.Second
	stdin, err := leftover.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := leftover.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := leftover.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = leftover.Process.Kill()
		_ = leftover.Wait()
	})
	ready := make([]byte, len("ready\n"))
	if f, ok := out.(*os.File); !ok || f.SetReadDeadline(time.Now().Add(10*time.Second)) != nil {
		t.Fatal("no deadline on the helper's output")
	}
	if _, err := io.ReadFull(out, ready); err != nil || string(ready) != "ready\n" {
		t.Fatalf("the idle helper printed %q: %v", ready, err)
	}

	lab := newTestLab(t, Config{Hosts: []string{"a"}, Prefix: prefix})
	got := namespaces(t)
	if containsAny(got, stale) {
		t.Errorf("stale namespaces left: %v", got)
	}
	if !slices.Contains(got, liveOwner) {
		t.Errorf("the namespace of a live process's lab was removed")
	}
	if !slices.Contains(got, lab.Namespace("a")) {
		t.Errorf("the new lab's namespace is missing")
	}
	if err := waitExit(leftover, 10*time.Second); err == nil {
		t.Errorf("the process in a stale namespace exited without being killed")
	}
}

// waitExit waits up to d for cmd to exit and returns its Wait error; it
// kills the process if it is still running at d.
func waitExit(cmd *exec.Cmd, d time.Duration) error {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		_ = cmd.Process.Kill()
		<-done
		return nil
	}
}

func containsAll(list, want []string) bool {
	for _, w := range want {
		if !slices.Contains(list, w) {
			return false
		}
	}
	return true
}

func containsAny(list, want []string) bool {
	for _, w := range want {
		if slices.Contains(list, w) {
			return true
		}
	}
	return false
}
