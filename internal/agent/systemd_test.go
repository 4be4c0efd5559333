package agent

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testutil"
)

// Under systemd (a fake notify socket and WATCHDOG_USEC=200000) the agent
// sends READY=1 with a STATUS line, pings the watchdog while its loops
// beat (and while one is busy in a call with a later deadline), stops
// pinging within one interval after a loop is wedged, resumes when it
// beats again, marks a reload with RELOADING=1 and READY=1, and says
// STOPPING=1 at shutdown, in that order.
func TestSystemdNotifyAndWatchdog(t *testing.T) {
	sock, interval := fakeSystemd(t)

	cfg := testConfig(t)
	startPlugin(t, cfg, "p1")
	a, err := New(Config{Config: cfg, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if got := a.watchdog.Timeout(); got != interval {
		t.Fatalf("watchdog timeout = %s, want %s from WATCHDOG_USEC", got, interval)
	}
	stop := runAgent(t, a)

	pings := 0
	ready := sock.Next(t, 10*time.Second, &pings)
	if !strings.HasPrefix(ready, "READY=1\nSTATUS=") || !strings.Contains(ready, "plugins") {
		t.Fatalf("first message = %q, want READY=1 with a STATUS line", ready)
	}
	var other []string
	for i := 0; i < 3; i++ {
		if !sock.Ping(10*interval, &other) {
			t.Fatalf("ping %d did not arrive while every loop beats", i)
		}
	}

	// A loop busy in a call whose deadline is far off stops no ping, even
	// long past the timeout.
	busy := a.watchdog.Loop("test busy loop")
	busySince := time.Now()
	busy.Busy(busySince.Add(time.Hour))
	for n := 0; n < 3 || time.Since(busySince) < 3*interval; n++ {
		if !sock.Ping(10*interval, &other) {
			t.Fatalf("no ping %s after a loop said it is busy in a call with a deadline an hour away", time.Since(busySince))
		}
	}
	if stale := a.watchdog.Stale(); len(stale) > 0 {
		t.Fatalf("Stale() = %v while the only other loop is busy until its deadline", stale)
	}
	busy.Done()

	// Wedge one loop: registered, then never beaten again.
	wedged := a.watchdog.Loop("test wedged loop")
	testutil.WaitFor(t, 10*interval, "the wedged loop to be stale", func() bool { return len(a.watchdog.Stale()) > 0 })
	// Pings sent before the loop went stale are queued, and one decided
	// just before may still be in flight; after that one interval passes
	// without any.
	sock.Drain(&other)
	_ = sock.Ping(interval/2, &other)
	if sock.Ping(interval, &other) {
		t.Fatal("watchdog pinged within an interval after a loop was wedged")
	}
	if sock.Ping(2*interval, &other) {
		t.Fatal("watchdog kept pinging while a loop is wedged")
	}
	// /v1/health tells the wedge too; /v1/ready does not depend on it.
	if code, body := httpGet(t, a, "/v1/health"); code != http.StatusServiceUnavailable || !strings.Contains(body, "test wedged loop") {
		t.Errorf("/v1/health with a wedged loop = %d %s, want 503 naming the loop", code, body)
	}
	wedged.Beat()
	wedged.Done()
	if !sock.Ping(10*interval, &other) {
		t.Fatal("no ping after the wedged loop was released")
	}

	if err := a.Reload(cfg); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	stop()
	// Messages in order, pings aside: STATUS updates may come anywhere.
	// The socket's reader may not have queued STOPPING=1 yet when Run has
	// returned, so wait for it rather than only draining the queue.
	seq := other
	for len(seq) == 0 || seq[len(seq)-1] != "STOPPING=1" {
		seq = append(seq, sock.Next(t, 10*time.Second, &pings))
	}
	sock.Drain(&seq)
	var kinds []string
	for _, m := range seq {
		switch {
		case m == "WATCHDOG=1", strings.HasPrefix(m, "STATUS="):
		case strings.HasPrefix(m, "RELOADING=1\nMONOTONIC_USEC="):
			kinds = append(kinds, "RELOADING")
		case m == "READY=1":
			kinds = append(kinds, "READY")
		case m == "STOPPING=1":
			kinds = append(kinds, "STOPPING")
		default:
			t.Errorf("unexpected sd_notify message %q", m)
		}
	}
	if got, want := strings.Join(kinds, ","), "RELOADING,READY,STOPPING"; got != want {
		t.Errorf("messages after start = %s, want %s (all: %q)", got, want, seq)
	}
}

// fakeSystemd makes the agents the test starts run as under systemd
// with a watchdog of interval: it returns the fake notify socket they
// report to.
func fakeSystemd(t *testing.T) (sock *testutil.NotifySocket, interval time.Duration) {
	t.Helper()
	sock = testutil.NewNotifySocket(t)
	t.Setenv("WATCHDOG_USEC", "200000")
	t.Setenv("WATCHDOG_PID", "")
	return sock, 200 * time.Millisecond
}

func TestStatusLine(t *testing.T) {
	cfg := testConfig(t)
	startPlugin(t, cfg, "p1")
	startPlugin(t, cfg, "p2")
	a, err := New(Config{Config: cfg, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, a)
	waitHealthy(t, a, "p1")
	waitHealthy(t, a, "p2")
	if got, want := a.statusLine(), "2 plugins, 2 healthy"; got != want {
		t.Errorf("statusLine() = %q, want %q", got, want)
	}
}

// /v1/ready answers 503 on a server without a leader (bootstrap_expect 2
// and no peer), while /v1/health, liveness, answers 200.
func TestReadyNeedsLeader(t *testing.T) {
	cfg := testConfig(t)
	cfg.Server.Enabled = true
	cfg.Server.BootstrapExpect = 2
	cfg.Client.Servers = nil
	ports := testutil.FreePorts(t, 2)
	cfg.Ports.Raft = ports[0]
	// A peer that never answers: the server waits for it for ever.
	cfg.Server.RetryJoin = []string{"127.0.0.1:" + strconv.Itoa(ports[1])}
	a, err := New(Config{Config: cfg, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, a)
	if code, body := httpGet(t, a, "/v1/ready"); code != http.StatusServiceUnavailable || !strings.Contains(body, "no cluster leader") {
		t.Errorf("/v1/ready without a leader = %d %s, want 503 saying no cluster leader", code, body)
	}
	if code, body := httpGet(t, a, "/v1/health"); code != http.StatusOK {
		t.Errorf("/v1/health without a leader = %d %s, want 200 (liveness)", code, body)
	}
}

func TestReadyClient(t *testing.T) {
	cfg := testConfig(t)
	a, err := New(Config{Config: cfg, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, a)
	code, body := httpGet(t, a, "/v1/ready")
	var doc map[string]any
	if err := json.Unmarshal([]byte(body), &doc); err != nil || code != http.StatusOK || doc["ready"] != true {
		t.Errorf("/v1/ready on a started client = %d %s, want 200 {\"ready\":true}", code, body)
	}
}

func httpGet(t *testing.T, a *Agent, path string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + a.HTTPAddr().String() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}
