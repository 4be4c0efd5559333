package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/csisupd/csisupd/internal/plugin"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// These tests hold the registry to its bounds whatever the plugins do:
// plugins that stop reading, stop altogether, break the protocol, or sit at
// paths nobody can connect to.

// slack is what a loaded machine (and the race detector) may add to a
// bound the design promises.
const slack = time.Second

// discoveryBound is how soon a new plugin socket must be registered.
const discoveryBound = time.Second

// stalledListener serves a unix socket at path that accepts connections
// and never reads from them, like a plugin hung in its serving loop. It is
// closed, with every connection, when the test ends.
func stalledListener(t *testing.T, path string) {
	t.Helper()
	l := listenUnix(t, path)
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		_ = l.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
}

// pluginProcess is a csi-testplugin process.
type pluginProcess struct {
	cmd  *exec.Cmd
	out  *testutil.SyncBuffer
	done chan struct{}
}

// startPluginProcess runs csi-testplugin with args and waits until it
// serves. It is killed (stopped or not) when the test ends.
func startPluginProcess(t *testing.T, args ...string) *pluginProcess {
	t.Helper()
	p := &pluginProcess{out: &testutil.SyncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(testPluginBin, append(args, "--state-dir", testutil.TempDir(t))...)
	p.cmd.Stdout = p.out
	p.cmd.Stderr = p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start csi-testplugin: %v", err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill() // SIGKILL ends a stopped process too
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			t.Errorf("csi-testplugin did not exit within 10s of SIGKILL")
		}
	})
	testutil.WaitFor(t, 10*time.Second, "csi-testplugin serving", func() bool {
		if isClosed(p.done) {
			t.Fatalf("csi-testplugin exited: %s", p.out)
		}
		return strings.Contains(p.out.String(), "serving")
	})
	return p
}

// stopWithin stops a manager through stop (from runManager) and fails the
// test unless Run returns within bound; on timeout it calls unblock, if
// any, so that the test can still end. It returns how long the stop took.
func stopWithin(t *testing.T, stop func(), bound time.Duration, unblock func()) time.Duration {
	t.Helper()
	begin := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		stop()
	}()
	select {
	case <-done:
		return time.Since(begin)
	case <-time.After(bound):
	}
	t.Errorf("Manager.Run did not return within %s of its context ending", bound)
	if unblock != nil {
		unblock()
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("Manager.Run still running %s after its context ended", bound+10*time.Second)
	}
	return time.Since(begin)
}

func (p *pluginProcess) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %s to csi-testplugin: %v", sig, err)
	}
}

// TestIntegrationStalledPluginDoesNotStallTheRegistry runs the whole
// registry next to two plugins that stop reading their connections: it
// must still notice them, find new plugins, deregister them and shut down
// in time.
func TestIntegrationStalledPluginDoesNotStallTheRegistry(t *testing.T) {
	const (
		probeInterval = 200 * time.Millisecond
		probeTimeout  = 100 * time.Millisecond
		grace         = 300 * time.Millisecond
		stopTimeout   = 500 * time.Millisecond
	)
	tests := []struct {
		name string
		// setup creates the plugins p0000 and p0001 in dir
		// (<dir>/<id>/csi.sock); it returns a function that stalls them,
		// or nil when they are stalled from the start.
		setup func(t *testing.T, dir string) (stall func())
		// wantDesc starts the stalled plugins' health description.
		wantDesc string
	}{
		{
			name: "listeners that accept and never read",
			setup: func(t *testing.T, dir string) func() {
				stalledListener(t, filepath.Join(dir, "p0000", SocketName))
				stalledListener(t, filepath.Join(dir, "p0001", SocketName))
				return nil
			},
			// Never answered: the first fingerprint times out.
			wantDesc: "fingerprint failed: GetPluginInfo: ",
		},
		{
			name: "plugin process stopped with SIGSTOP",
			setup: func(t *testing.T, dir string) func() {
				p := startPluginProcess(t, "--dir", dir, "--count", "2")
				return func() { p.signal(t, syscall.SIGSTOP) }
			},
			wantDesc: fmt.Sprintf("probe timed out after %s", probeTimeout),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := testutil.TempDir(t)
			data := filepath.Join(testutil.TempDir(t), "data")
			stall := tt.setup(t, dir)
			m := newTestManager(t, ManagerConfig{
				PluginDir: dir, DataDir: data,
				ProbeInterval: probeInterval, ProbeTimeout: probeTimeout,
				DeregisterGrace: grace, StopTimeout: stopTimeout,
			})
			stop := runManager(t, m)
			awaitReady(t, m)
			reg := m.Registry()
			stalled := time.Now()
			if stall != nil {
				for _, id := range []string{"p0000", "p0001"} {
					testutil.WaitFor(t, waitLong, id+" healthy", func() bool { return healthOf(reg, id) == "healthy" })
				}
				stall()
				stalled = time.Now()
			}

			// Noticed within a probe timeout and one interval.
			for _, id := range []string{"p0000", "p0001"} {
				testutil.WaitFor(t, probeTimeout+probeInterval+slack, id+" unhealthy", func() bool { return healthOf(reg, id) == "unhealthy" })
			}
			t.Logf("stalled plugins unhealthy %s after the stall", time.Since(stalled))
			for _, id := range []string{"p0000", "p0001"} {
				if p, _ := reg.Get(id); !strings.HasPrefix(p.Health.Description, tt.wantDesc) {
					t.Errorf("%s: description %q, want prefix %q", id, p.Health.Description, tt.wantDesc)
				}
			}

			// A plugin created meanwhile is found as fast as ever.
			created := time.Now()
			startPlugin(t, filepath.Join(dir, "good"+SocketSuffix), testplugin.Config{})
			testutil.WaitFor(t, discoveryBound, "good registered", func() bool { _, ok := reg.Get("good"); return ok })
			t.Logf("new plugin registered %s after its socket appeared", time.Since(created))
			testutil.WaitFor(t, waitLong, "good healthy", func() bool { return healthOf(reg, "good") == "healthy" })

			// Removing a stalled plugin's socket deregisters it after the
			// grace period.
			removed := time.Now()
			if err := os.Remove(filepath.Join(dir, "p0000", SocketName)); err != nil {
				t.Fatal(err)
			}
			testutil.WaitFor(t, grace+slack, "p0000 deregistered", func() bool { return healthOf(reg, "p0000") == "absent" })
			t.Logf("stalled plugin deregistered %s after its socket was removed (grace %s)", time.Since(removed), grace)
			if took := time.Since(removed); took < grace {
				t.Errorf("deregistered %s after removal, before the %s grace period", took, grace)
			}

			// Shutdown with the other stalled plugin still supervised.
			took := stopWithin(t, stop, stopTimeout+slack, nil)
			t.Logf("shutdown took %s (stop timeout %s)", took, stopTimeout)
			// Closing the connection first fails whatever waits on the
			// plugin: every supervisor, the deregistered one's too, stopped
			// in time.
			if n := m.AbandonedSupervisors(); n != 0 {
				t.Errorf("%d supervisors abandoned, want none: a stalled plugin's supervisor must stop once its connection is closed", n)
			}
			saved, err := readStateFile(filepath.Join(data, StateFileName))
			if err != nil {
				t.Fatalf("registry not persisted at shutdown: %v", err)
			}
			var ids []string
			for _, p := range saved {
				ids = append(ids, p.ID)
			}
			if want := []string{"good", "p0001"}; !slices.Equal(ids, want) {
				t.Errorf("persisted plugins %v, want %v", ids, want)
			}
		})
	}
}

func TestManagerShutdownIsBoundedWithAStuckSupervisor(t *testing.T) {
	t.Parallel()
	const stopTimeout = 300 * time.Millisecond
	dir := testutil.TempDir(t)
	data := filepath.Join(testutil.TempDir(t), "data")
	startPlugin(t, filepath.Join(dir, "a"+SocketSuffix), testplugin.Config{})
	startPlugin(t, filepath.Join(dir, "b"+SocketSuffix), testplugin.Config{})
	m := newTestManager(t, ManagerConfig{PluginDir: dir, DataDir: data, StopTimeout: stopTimeout})
	stop := runManager(t, m)
	awaitReady(t, m)
	reg := m.Registry()
	for _, id := range []string{"a", "b"} {
		testutil.WaitFor(t, waitLong, id+" healthy", func() bool { return healthOf(reg, id) == "healthy" })
	}
	_, release := hangStop(t, m.rec, "a")

	took := stopWithin(t, stop, stopTimeout+slack, release)
	t.Logf("shutdown took %s with a supervisor that does not stop (stop timeout %s)", took, stopTimeout)
	if got := m.AbandonedSupervisors(); got != 1 {
		t.Errorf("AbandonedSupervisors() = %d, want 1", got)
	}
	saved, err := readStateFile(filepath.Join(data, StateFileName))
	if err != nil {
		t.Fatalf("registry not persisted at shutdown: %v", err)
	}
	if len(saved) != 2 {
		t.Errorf("persisted %d plugins, want a and b: %+v", len(saved), saved)
	}
	release()
}

// violatingPlugin is a CSI Identity service whose replies can be made
// larger than the manager's message size limit: a protocol violation.
type violatingPlugin struct {
	csi.UnimplementedIdentityServer
	bigInfo, bigProbe atomic.Bool
	// hangUp closes the connection right after every oversized reply, so
	// the connection's loss is reported as the violation is.
	hangUp bool

	mu    sync.Mutex
	calls map[string][]violatingCall
}

type violatingCall struct {
	at  time.Time
	big bool
}

// oversize is the size of a padded reply; the tests' limit is 1 KiB.
const oversize = 8 << 10

// pad adds an unknown field of oversize bytes to m: still a valid message,
// only too large.
func pad(m proto.Message) {
	b := protowire.AppendTag(nil, 4242, protowire.BytesType)
	m.ProtoReflect().SetUnknown(protowire.AppendBytes(b, make([]byte, oversize)))
}

func (p *violatingPlugin) record(method string, big bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls[method] = append(p.calls[method], violatingCall{at: time.Now(), big: big})
}

// bigCalls returns when the oversized replies to method were sent.
func (p *violatingPlugin) bigCalls(method string) []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []time.Time
	for _, c := range p.calls[method] {
		if c.big {
			out = append(out, c.at)
		}
	}
	return out
}

func (p *violatingPlugin) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	big := p.bigInfo.Load()
	p.record("GetPluginInfo", big)
	resp := &csi.GetPluginInfoResponse{Name: "violator", VendorVersion: "1.0.0"}
	if big {
		pad(resp)
	}
	return resp, nil
}

func (p *violatingPlugin) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	p.record("GetPluginCapabilities", false)
	return &csi.GetPluginCapabilitiesResponse{}, nil
}

func (p *violatingPlugin) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	big := p.bigProbe.Load()
	p.record("Probe", big)
	resp := &csi.ProbeResponse{}
	if big {
		pad(resp)
	}
	return resp, nil
}

// serveViolating serves p on a unix socket at path until the test ends.
func serveViolating(t *testing.T, path string, p *violatingPlugin) {
	t.Helper()
	p.calls = make(map[string][]violatingCall)
	var l net.Listener = listenUnix(t, path)
	if p.hangUp {
		l = hangUpListener{l}
	}
	srv := grpc.NewServer()
	csi.RegisterIdentityServer(srv, p)
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(l) })
	t.Cleanup(func() {
		srv.Stop()
		wg.Wait()
	})
}

// hangUpListener's connections close right after they sent an oversized
// reply.
type hangUpListener struct{ net.Listener }

func (l hangUpListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return hangUpConn{c}, nil
}

type hangUpConn struct{ net.Conn }

func (c hangUpConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if len(b) >= oversize {
		_ = c.Conn.Close()
	}
	return n, err
}

// checkBackoffGaps checks that the times of consecutive violating calls
// are spaced by at least the backoff's shortest waits: the interval, then
// doubling, less the jitter.
func checkBackoffGaps(t *testing.T, what string, times []time.Time, interval time.Duration) {
	t.Helper()
	for k := 1; k < len(times); k++ {
		gap := times[k].Sub(times[k-1])
		min := max(interval, time.Duration(float64(interval<<(k-1))*(1-violationJitter))) - 5*time.Millisecond
		if gap < min {
			t.Errorf("%s: %s between violations %d and %d, want at least %s", what, gap, k, k+1, min)
		}
		t.Logf("%s: %s between violations %d and %d", what, gap, k, k+1)
	}
}

func TestIntegrationProtocolViolationsBackOff(t *testing.T) {
	const interval = 100 * time.Millisecond
	tests := []struct {
		name   string
		method string
		// violate turns the violation on (true) or off.
		violate func(p *violatingPlugin, on bool)
		// healthyFirst: the plugin answers well before it violates.
		healthyFirst bool
		// hangUp: the plugin closes the connection after every
		// violation; its loss must not cut the backoff short. csiclient
		// may see such a reply as a lost connection instead (its own
		// write lost the race with the hang-up), which is no violation and
		// may be probed again at once: the check is that no probe follows
		// a backoff decision sooner than the interval.
		hangUp bool
		// fingerprintInterval is the manager's; zero for the tests'.
		fingerprintInterval time.Duration
		// wantDesc matches the description after the third violation in a
		// row, and wantFirst the one after a first violation.
		wantDesc, wantFirst string
		// wantState is the health meanwhile.
		wantState string
	}{
		{
			name:         "probes",
			method:       "Probe",
			violate:      func(p *violatingPlugin, on bool) { p.bigProbe.Store(on) },
			healthyFirst: true,
			wantDesc:     `^plugin violates the gRPC protocol \(3 times in a row\): .+; next probe in \d+ms$`,
			wantFirst:    `^plugin violates the gRPC protocol: .+; next probe in 100ms$`,
			wantState:    "unhealthy",
		},
		{
			name:         "probes of a plugin that hangs up after each",
			method:       "Probe",
			violate:      func(p *violatingPlugin, on bool) { p.bigProbe.Store(on) },
			healthyFirst: true,
			hangUp:       true,
			wantFirst:    `^plugin violates the gRPC protocol: .+; next probe in 100ms$`,
			wantState:    "unhealthy",
		},
		{
			name:      "fingerprints",
			method:    "GetPluginInfo",
			violate:   func(p *violatingPlugin, on bool) { p.bigInfo.Store(on) },
			wantDesc:  `^fingerprint failed: plugin violates the gRPC protocol \(3 times in a row\): GetPluginInfo: .+; next fingerprint in \d+ms$`,
			wantFirst: `^fingerprint failed: plugin violates the gRPC protocol: GetPluginInfo: .+; next fingerprint in 100ms$`,
			wantState: "unhealthy",
		},
		{
			// Probes answer, so the plugin stays healthy; its fingerprint,
			// taken at every probe, does not.
			name:                "refingerprints of a healthy plugin",
			method:              "GetPluginInfo",
			violate:             func(p *violatingPlugin, on bool) { p.bigInfo.Store(on) },
			healthyFirst:        true,
			fingerprintInterval: interval,
			wantDesc:            `^healthy, but fingerprint failed: plugin violates the gRPC protocol \(3 times in a row\): GetPluginInfo: .+; next fingerprint in \d+ms$`,
			wantFirst:           `^healthy, but fingerprint failed: plugin violates the gRPC protocol: GetPluginInfo: .+; next fingerprint in 100ms$`,
			wantState:           "healthy",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := testutil.TempDir(t)
			p := &violatingPlugin{hangUp: tt.hangUp}
			if !tt.healthyFirst {
				tt.violate(p, true)
			}
			serveViolating(t, filepath.Join(dir, "v"+SocketSuffix), p)
			logs := &testutil.SyncBuffer{}
			// 8 KiB replies are well-formed; only this limit makes them a
			// violation, so the limit must reach the connection.
			m := startManager(t, ManagerConfig{
				PluginDir: dir, ProbeInterval: interval, ProbeTimeout: interval,
				FingerprintInterval:  tt.fingerprintInterval,
				MaxPluginMessageSize: 1 << 10,
				Logger:               teeLogger(t, logs),
			})
			reg := m.Registry()
			if tt.healthyFirst {
				testutil.WaitFor(t, waitLong, "v healthy", func() bool { return healthOf(reg, "v") == "healthy" })
				tt.violate(p, true)
			}

			first := regexp.MustCompile(tt.wantFirst)
			third := regexp.MustCompile(tt.wantDesc)
			testutil.WaitFor(t, waitLong, "a first violation", func() bool {
				pl, _ := reg.Get("v")
				return first.MatchString(pl.Health.Description)
			})
			if tt.wantDesc != "" {
				testutil.WaitFor(t, waitLong, "three violations in a row", func() bool {
					pl, _ := reg.Get("v")
					return third.MatchString(pl.Health.Description)
				})
			}
			if pl, _ := reg.Get("v"); string(pl.Health.State) != tt.wantState && !tt.hangUp {
				t.Errorf("health = %s, want %s", pl.Health.State, tt.wantState)
			} else {
				t.Logf("description: %s", pl.Health.Description)
			}
			if tt.hangUp {
				testutil.WaitFor(t, waitLong, "three backoff decisions", func() bool {
					return len(backoffDecisions(t, logs)) >= 3
				})
				checkNoProbeWithinInterval(t, backoffDecisions(t, logs), p.bigCalls(tt.method), interval)
			} else {
				testutil.WaitFor(t, waitLong, "a fourth violation", func() bool { return len(p.bigCalls(tt.method)) >= 4 })
				checkBackoffGaps(t, tt.method, p.bigCalls(tt.method)[:4], interval)
			}

			// An answer ends the series: healthy again, and the next
			// violation is a first one.
			tt.violate(p, false)
			testutil.WaitFor(t, waitLong, "v healthy after the violations", func() bool {
				pl, _ := reg.Get("v")
				return pl.Health.State == "healthy" && pl.Health.Description == "healthy"
			})
			if tt.healthyFirst {
				tt.violate(p, true)
				testutil.WaitFor(t, waitLong, "a first violation again", func() bool {
					pl, _ := reg.Get("v")
					return first.MatchString(pl.Health.Description)
				})
			}
			if pl, _ := reg.Get("v"); !pl.Fingerprinted || pl.Fingerprint.VendorName != "violator" {
				t.Errorf("fingerprint = %+v (fingerprinted %v), want violator's", pl.Fingerprint, pl.Fingerprinted)
			}
			// A changing description is no new event: one unhealthy
			// event per series.
			evs := eventsOf(reg, "v")
			if n := strings.Count(fmt.Sprint(evs), string(plugin.EventUnhealthy)); n > 2 {
				t.Errorf("events %v: %d unhealthy events, want one per series of violations", evs, n)
			}
		})
	}
}

// teeLogger logs as testLogger does and also, as JSON with exact times,
// into buf.
func teeLogger(t *testing.T, buf *testutil.SyncBuffer) hclog.Logger {
	var out io.Writer = buf
	if testing.Verbose() {
		out = io.MultiWriter(buf, hclogWriter{t})
	}
	return hclog.New(&hclog.LoggerOptions{
		Name: t.Name(), Level: hclog.Debug, Output: out,
		JSONFormat: true, TimeFormat: time.RFC3339Nano,
	})
}

// backoffDecisions returns when the supervisor decided to back probes off,
// from its logs.
func backoffDecisions(t *testing.T, logs *testutil.SyncBuffer) []time.Time {
	t.Helper()
	var out []time.Time
	for _, line := range strings.Split(logs.String(), "\n") {
		var entry struct {
			Time    string `json:"@timestamp"`
			Message string `json:"@message"`
		}
		if json.Unmarshal([]byte(line), &entry) != nil || entry.Message != "plugin violates the gRPC protocol; backing off probes" {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, entry.Time)
		if err != nil {
			t.Fatalf("log time %q: %v", entry.Time, err)
		}
		out = append(out, at)
	}
	return out
}

// checkNoProbeWithinInterval checks that after every backoff decision the
// plugin saw no probe sooner than the interval.
func checkNoProbeWithinInterval(t *testing.T, decisions, probes []time.Time, interval time.Duration) {
	t.Helper()
	for i, d := range decisions {
		for _, p := range probes {
			if p.After(d) {
				if gap := p.Sub(d); gap < interval-5*time.Millisecond {
					t.Errorf("a probe %s after backoff decision %d, want none sooner than the interval %s", gap, i+1, interval)
				} else {
					t.Logf("next probe %s after backoff decision %d", gap, i+1)
				}
				break
			}
		}
	}
}

// listenUnixLong leaves a listening unix socket at path however long it
// is: bound at a short path, then renamed, as a plugin that binds a
// relative path from its working directory, or renames its socket into
// place, can do. The socket works at its new path for whoever can reach
// it, but nobody can connect by its full path. It closes when the test
// ends.
func listenUnixLong(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(testutil.TempDir(t), "s.sock")
	l := listenUnix(t, short)
	l.SetUnlinkOnClose(false)
	if err := os.Rename(short, path); err != nil {
		t.Fatalf("move the socket to its long path: %v", err)
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("no socket at %s: %v", path, err)
	}
}

func TestSocketPathProblem(t *testing.T) {
	pathOf := func(n int) string { return "/" + strings.Repeat("a", n-1) }
	tests := []struct {
		name string
		path string
		want []string // parts of the reason; none for a usable path
	}{
		{"short", "/run/csi/a.sock", nil},
		{"at the limit", pathOf(unixSocketPathMax), nil},
		{"one byte over", pathOf(unixSocketPathMax + 1), []string{"socket path too long: 108 bytes", "over the 107-byte limit"}},
		{"far over", pathOf(4096), []string{"4096 bytes", "107-byte limit"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := socketPathProblem(tt.path)
			if len(tt.want) == 0 {
				if got != "" {
					t.Errorf("reason = %q, want none", got)
				}
				return
			}
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("reason = %q, want it to contain %q", got, w)
				}
			}
		})
	}
}

func TestIntegrationTooLongSocketPathIsIgnored(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(testutil.TempDir(t), "plugins")
	long := "p" + strings.Repeat("x", 100) // a valid id, too long a path
	flat := filepath.Join(dir, long+SocketSuffix)
	nested := filepath.Join(dir, long+"-2", SocketName)
	listenUnixLong(t, flat)
	listenUnixLong(t, nested)
	m := startManager(t, ManagerConfig{PluginDir: dir})
	reg := m.Registry()
	startPlugin(t, filepath.Join(dir, "good"+SocketSuffix), testplugin.Config{})

	testutil.WaitFor(t, waitLong, "two ignored entries", func() bool { return len(reg.Ignored()) == 2 })
	for _, ig := range reg.Ignored() {
		want := fmt.Sprintf("socket path too long: %d bytes, over the 107-byte limit", len(ig.Path))
		if (ig.Path != flat && ig.Path != nested) || !strings.HasPrefix(ig.Reason, want) {
			t.Errorf("ignored %s: %q, want %s or %s with a reason starting %q", ig.Path, ig.Reason, flat, nested, want)
		}
	}
	testutil.WaitFor(t, waitLong, "good healthy", func() bool { return healthOf(reg, "good") == "healthy" })
	if got := reg.List(); len(got) != 1 {
		t.Errorf("registered %d plugins, want only good: %+v", len(got), got)
	}
	for _, id := range []string{long, long + "-2"} {
		if _, c, ok := m.Lookup(id); ok || c != nil {
			t.Errorf("Lookup(%s) = %v, %v: a plugin at a path nobody can connect to is supervised", id, c, ok)
		}
		if s := supervisorOf(m.rec, id); s != nil {
			t.Errorf("a supervisor runs for %s", id)
		}
	}
}
