//go:build nemesis

package nemesis

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/netlab"
	"github.com/csisupd/csisupd/internal/nodevolumes"
	"github.com/csisupd/csisupd/internal/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
)

// Ports every csisupd process listens on, at its host's lab address.
const (
	rpcPort  = 4780
	raftPort = 4781
	httpPort = 4782
)

// ctlHost is the lab host the test's clients run on.
const ctlHost = "ctl"

// Bounds of the cluster's operations.
const (
	cliTimeout    = 15 * time.Second // one CLI command in the ctl host
	exitTimeout   = 10 * time.Second // a killed process to be reaped
	formTimeout   = 90 * time.Second // the cluster to form and report every plugin
	signalTimeout = 5 * time.Second  // a stopped or continued process to show its new state
	pollInterval  = 250 * time.Millisecond
	// slowDelay is how long a slowed plugin waits before each call: longer
	// than the agents' probe timeout (so probes fail and the instance
	// flaps), shorter than a claim's deadline (so some claims still go
	// through, late).
	slowDelay = 3 * time.Second
)

// Options configure StartCluster.
type Options struct {
	// Servers and Agents are the numbers of server and agent hosts
	// (default 3 each).
	Servers, Agents int
	// Seed seeds the fault schedule; 0 takes -seed, and a -seed of 0 one
	// from the clock. The seed used is logged.
	Seed int64
	// Bin is the csisupd binary of the servers and agents (default the
	// one TestMain built; a defect test gives a defective build).
	Bin string
	// GCGrace is the servers' claim_gc_grace (default theirs).
	GCGrace time.Duration
	// SharedWithoutPublish starts the shared plugin without
	// PUBLISH_UNPUBLISH_VOLUME, as many network drivers run: no
	// controller then refuses a single-node volume on a second node, and
	// only csisupd's access-mode rule keeps it on one.
	SharedWithoutPublish bool
}

// withoutPublish are the test plugin's default controller capabilities
// but PUBLISH_UNPUBLISH_VOLUME (and LIST_VOLUMES_PUBLISHED_NODES, which
// needs it).
const withoutPublish = "CREATE_DELETE_VOLUME,LIST_VOLUMES,GET_CAPACITY,CREATE_DELETE_SNAPSHOT,LIST_SNAPSHOTS,EXPAND_VOLUME,GET_VOLUME"

// Event is one fault or control action, for the run's fault schedule.
type Event struct {
	Time time.Time
	// Action is kill, restart, restart-clock-<offset>, stop, cont, cut,
	// heal, isolate, rejoin, heal-all, cut-servers, heal-servers,
	// cut-from-servers, heal-from-servers, plugin-slow, plugin-fast,
	// plugin-crash-armed or wipe-mount-records.
	Action string
	Target string // a process name, "from->to" or a host
	Err    error
}

func (e Event) String() string {
	s := e.Time.Format(time.RFC3339Nano) + " " + e.Action + " " + e.Target
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Cluster is csisupd servers and agents, with the agents' test plugins, as
// processes on the hosts of a lab.
type Cluster struct {
	t       testing.TB
	lab     *netlab.Lab
	Seed    int64
	servers []string // host names s1..sN
	agents  []string // host names a1..aM
	journal string   // directory of the plugins' journals

	mu     sync.Mutex
	procs  map[string]*proc
	events []Event
	exits  []string // processes that exited without being killed or armed to crash
	closed bool
	dirs   map[string]string                   // each host's directory: agent.hcl, data
	conns  map[string]*grpc.ClientConn         // Control clients by server host
	clocks map[time.Duration]*testutil.Process // time-namespace holders by offset
}

// proc is one process of the cluster and how to start it again.
type proc struct {
	name, host string
	bin        string
	args       []string
	p          *testutil.Process // the current run; nil before the first start
	stopped    bool              // SIGSTOP sent and no SIGCONT since
	killed     bool              // the current run was sent SIGKILL
	crashArmed bool              // the current run was told to crash (a plugin)
	scanned    bool              // the current run's complete output was checked for crashes
	slow       bool              // the current run is in slow mode (a plugin)
	clock      time.Duration     // monotonic clock offset of the current run
	plugin     bool              // a test plugin, not csisupd
	agent      string            // the agent host of a plugin
}

// journalPath is where agent's plugin writes its call journal.
func (c *Cluster) journalPath(agent, plugin string) string {
	return filepath.Join(c.journal, agent+"."+plugin+".journal")
}

// StartCluster builds the lab, starts every process and waits until a
// leader exists and every agent's plugin is healthy in the cluster. It
// skips the test where netlab cannot build a lab. Everything is stopped
// and removed when the test ends.
func StartCluster(t *testing.T, opts Options) *Cluster {
	t.Helper()
	if ok, reason := netlab.Available(); !ok {
		t.Skipf("no network lab here: %s", reason)
	}
	if opts.Servers == 0 {
		opts.Servers = 3
	}
	if opts.Agents == 0 {
		opts.Agents = 3
	}
	if opts.Seed == 0 {
		opts.Seed = *seedFlag
	}
	if opts.Bin == "" {
		opts.Bin = csisupdBin
	}
	gcGrace := ""
	if opts.GCGrace > 0 {
		gcGrace = fmt.Sprintf("  claim_gc_grace         = %q\n", opts.GCGrace)
	}
	if opts.Seed == 0 {
		opts.Seed = time.Now().UnixNano()
	}
	t.Logf("nemesis seed %d (rerun with make nemesis SEED=%d)", opts.Seed, opts.Seed)

	c := &Cluster{t: t, Seed: opts.Seed, procs: map[string]*proc{}, journal: t.TempDir(),
		dirs: map[string]string{}, conns: map[string]*grpc.ClientConn{}, clocks: map[time.Duration]*testutil.Process{}}
	hosts := []string{ctlHost}
	for i := 1; i <= opts.Servers; i++ {
		c.servers = append(c.servers, fmt.Sprintf("s%d", i))
	}
	for i := 1; i <= opts.Agents; i++ {
		c.agents = append(c.agents, fmt.Sprintf("a%d", i))
	}
	hosts = append(append(hosts, c.servers...), c.agents...)
	lab, err := netlab.New(t, netlab.Config{Hosts: hosts})
	if err != nil {
		t.Fatal(err)
	}
	c.lab = lab
	// Registered after the lab's cleanup, so it runs before it: the
	// processes stop before their namespaces go.
	t.Cleanup(c.Close)

	var join []string
	for _, s := range c.servers {
		join = append(join, c.RPCAddr(s))
	}
	for _, s := range c.servers {
		cfg := c.writeConfig(s, fmt.Sprintf(`client { enabled = false }
server {
  enabled                = true
  bootstrap_expect       = %d
  retry_join             = %s
  min_heartbeat_ttl      = "2s"
  heartbeat_grace        = "3s"
  failover_heartbeat_ttl = "10s"
%s}
`, opts.Servers, hclList(join), gcGrace))
		c.add(&proc{name: s, host: s, bin: opts.Bin, args: []string{"agent", "--config", cfg}})
	}
	for _, a := range c.agents {
		// Short paths: unix socket paths are limited to 108 bytes.
		pluginDir := testutil.TempDir(t)
		stateDir := filepath.Join(t.TempDir(), "state")
		cfg := c.writeConfig(a, fmt.Sprintf(`client {
  plugin_dir     = %q
  servers        = %s
  probe_interval = "1s"
  probe_timeout  = "1s"
}
`, pluginDir, hclList(join)))
		for _, id := range plugins {
			args := []string{
				"--socket", filepath.Join(pluginDir, id, "csi.sock"),
				"--state-dir", filepath.Join(stateDir, id),
				"--node-id", a,
				"--journal", c.journalPath(a, id),
				"--slow-delay", slowDelay.String(),
			}
			if id == localPlugin {
				args = append(args, "--node-local")
			} else {
				args = append(args, "--foreign-volumes", "--known-node-ids", "*")
				if opts.SharedWithoutPublish {
					args = append(args, "--controller-capabilities", withoutPublish)
				}
			}
			c.add(&proc{name: PluginName(a, id), host: a, bin: testPluginBin, args: args, plugin: true, agent: a})
		}
		c.add(&proc{name: a, host: a, bin: opts.Bin, args: []string{"agent", "--config", cfg}})
	}
	for _, name := range c.names() {
		if err := c.start(name, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.WaitLeader(formTimeout); err != nil {
		t.Fatal(err)
	}
	for _, id := range plugins {
		if err := c.WaitHealthyPlugins(id, len(c.agents), formTimeout); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// writeConfig writes host's agent configuration with body added and
// returns its path. The data dir is the host's own and survives restarts.
func (c *Cluster) writeConfig(host, body string) string {
	c.t.Helper()
	dir := filepath.Join(c.t.TempDir(), host)
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o700); err != nil {
		c.t.Fatal(err)
	}
	c.mu.Lock()
	c.dirs[host] = dir
	c.mu.Unlock()
	content := fmt.Sprintf(`name      = %q
data_dir  = %q
bind_addr = %q
log_level = "info"
ports {
  rpc  = %d
  raft = %d
  http = %d
}
consul { enabled = false }
%s`, host, filepath.Join(dir, "data"), c.lab.Addr(host), rpcPort, raftPort, httpPort, body)
	path := filepath.Join(dir, "agent.hcl")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		c.t.Fatal(err)
	}
	return path
}

// dataDir is host's csisupd data dir.
func (c *Cluster) dataDir(host string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return filepath.Join(c.dirs[host], "data")
}

func hclList(items []string) string {
	q := make([]string, len(items))
	for i, s := range items {
		q[i] = fmt.Sprintf("%q", s)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

func (c *Cluster) add(p *proc) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.procs[p.name] = p
}

// names returns the process names: servers, then each agent's plugin
// before the agent.
func (c *Cluster) names() []string {
	var out []string
	out = append(out, c.servers...)
	for _, a := range c.agents {
		for _, id := range plugins {
			out = append(out, PluginName(a, id))
		}
		out = append(out, a)
	}
	return out
}

// Servers and Agents return the host names of the servers and agents.
func (c *Cluster) Servers() []string { return slices.Clone(c.servers) }
func (c *Cluster) Agents() []string  { return slices.Clone(c.agents) }

// Lab is the cluster's network lab.
func (c *Cluster) Lab() *netlab.Lab { return c.lab }

// RPCAddr is the gRPC address of the csisupd process on host.
func (c *Cluster) RPCAddr(host string) string {
	return fmt.Sprintf("%s:%d", c.lab.Addr(host), rpcPort)
}

// Journals returns the paths of the call journals of plugin's instances,
// one per agent host; they outlive the plugins' restarts.
func (c *Cluster) Journals(plugin string) []string {
	var out []string
	for _, a := range c.agents {
		out = append(out, c.journalPath(a, plugin))
	}
	return out
}

// Events returns the faults and controls applied so far, in order.
func (c *Cluster) Events() []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.events)
}

// record logs and keeps one event, returning its error.
func (c *Cluster) record(action, target string, err error) error {
	e := Event{Time: time.Now(), Action: action, Target: target, Err: err}
	c.mu.Lock()
	c.events = append(c.events, e)
	c.mu.Unlock()
	c.t.Logf("nemesis: %s", e)
	return err
}

func (c *Cluster) proc(name string) (*proc, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("nemesis: the cluster is closed")
	}
	p, ok := c.procs[name]
	if !ok {
		return nil, fmt.Errorf("nemesis: no process %q", name)
	}
	return p, nil
}

// start runs name's command in its host's namespace, with its monotonic
// clock offset by clock (0: the host's clocks); it must not be running.
func (c *Cluster) start(name string, clock time.Duration) error {
	p, err := c.proc(name)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if p.p != nil && !p.p.Exited() {
		return fmt.Errorf("nemesis: %s is running", name)
	}
	c.noteExitLocked(p)
	c.noteCrashLocked(p)
	// ip netns exec (and nsenter) replace themselves with the program:
	// the process is the program itself, and signals reach it.
	args := []string{"netns", "exec", c.lab.Namespace(p.host)}
	if clock != 0 {
		ns, err := c.clockNamespaceLocked(clock)
		if err != nil {
			return err
		}
		args = append(args, "nsenter", "--time="+ns)
	}
	args = append(append(args, p.bin), p.args...)
	p.p = testutil.StartProcess(c.t, nil, "ip", args...)
	p.p.Name = name
	p.stopped, p.killed, p.crashArmed, p.scanned, p.slow, p.clock = false, false, false, false, false, clock
	return nil
}

// noteExitLocked records the end of p's current run when nothing the test
// did explains it: not killed, and not a plugin armed to crash.
func (c *Cluster) noteExitLocked(p *proc) {
	if p.p == nil || !p.p.Exited() || p.killed || p.crashArmed {
		return
	}
	c.exits = append(c.exits, fmt.Sprintf("%s exited by itself with status %d; stderr:\n%s", p.name, p.p.ExitCode(), tail(p.p.Stderr.String(), 4096)))
	p.killed = true // noted once
}

// crashSigns are what a Go program prints when it panics, dies or races.
var crashSigns = []string{"panic: ", "fatal error: ", "WARNING: DATA RACE"}

// noteCrashLocked records a panic, fatal error or data race in the output
// of p's current run (csisupd only), once, before that run is replaced or
// at the end.
func (c *Cluster) noteCrashLocked(p *proc) {
	if p.plugin || p.p == nil || p.scanned {
		return
	}
	out := p.p.Stderr.String()
	for _, sign := range crashSigns {
		if i := strings.Index(out, sign); i >= 0 {
			c.exits = append(c.exits, fmt.Sprintf("%s printed %q:\n%s", p.name, sign, tail(out[i:], 4096)))
		}
	}
	if p.p.Exited() {
		p.scanned = true // its output is complete
	}
}

// tail returns the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// UnexpectedExits returns the processes that exited or crashed without the
// test killing them (a plugin told to crash excepted), and every csisupd
// process whose output shows a panic or a data race, even if it was killed
// afterwards.
func (c *Cluster) UnexpectedExits() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, name := range slices.Sorted(maps.Keys(c.procs)) {
		c.noteExitLocked(c.procs[name])
		c.noteCrashLocked(c.procs[name])
	}
	return slices.Clone(c.exits)
}

// clockNamespaceLocked returns the path of a time namespace whose
// monotonic and boot-time clocks are offset by clock, made once per
// offset: a holder process (unshare's child) lives in it, and a program
// started with nsenter --time joins it.
func (c *Cluster) clockNamespaceLocked(clock time.Duration) (string, error) {
	h, ok := c.clocks[clock]
	if !ok {
		secs := strconv.FormatInt(int64(clock/time.Second), 10)
		h = testutil.StartProcess(c.t, nil, "unshare", "--time", "--monotonic", secs, "--boottime", secs,
			"--fork", "--kill-child", "sleep", "1d")
		c.clocks[clock] = h
	}
	// unshare itself stays outside: the namespace is its child's.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(signalTimeout)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", h.Pid(), h.Pid()))
		if f := strings.Fields(string(b)); err == nil && len(f) > 0 {
			return "/proc/" + f[0] + "/ns/time", nil
		}
		if h.Exited() || time.Now().After(deadline) {
			return "", fmt.Errorf("nemesis: no time namespace with offset %s: unshare: %v %s", clock, err, h.Stderr)
		}
		<-tick.C
	}
}

// Kill sends SIGKILL to the process name and waits until it is gone.
func (c *Cluster) Kill(name string) error {
	return c.record("kill", name, c.kill(name))
}

func (c *Cluster) kill(name string) error {
	p, err := c.proc(name)
	if err != nil {
		return err
	}
	c.mu.Lock()
	run := p.p
	if run == nil || run.Exited() {
		c.mu.Unlock()
		return fmt.Errorf("nemesis: %s is not running", name)
	}
	p.stopped, p.killed = false, true
	c.mu.Unlock()
	if err := run.Cmd.Process.Kill(); err != nil {
		return err
	}
	select {
	case <-run.Done():
		return nil
	case <-time.After(exitTimeout):
		return fmt.Errorf("nemesis: %s did not exit within %s of SIGKILL", name, exitTimeout)
	}
}

// Restart starts the process name again, with the same configuration and
// data, after Kill (or after it exited by itself), on the host's clocks.
func (c *Cluster) Restart(name string) error {
	return c.record("restart", name, c.start(name, 0))
}

// RestartWithClock is Restart with the process's monotonic and boot-time
// clocks offset by clock from the host's, in a time namespace: to the
// process, its clocks jumped by the difference from its last run's.
func (c *Cluster) RestartWithClock(name string, clock time.Duration) error {
	return c.record("restart-clock-"+clock.String(), name, c.start(name, clock))
}

// Clock returns the monotonic clock offset of name's current run.
func (c *Cluster) Clock(name string) time.Duration {
	p, err := c.proc(name)
	if err != nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return p.clock
}

// SlowPlugin turns the slow mode of a plugin process on or off: every
// Node and Controller call waits slowDelay first, and acts even when its
// caller gave up.
func (c *Cluster) SlowPlugin(name string, on bool) error {
	sig, action := syscall.SIGUSR2, "plugin-fast"
	if on {
		sig, action = syscall.SIGUSR1, "plugin-slow"
	}
	err := c.send(name, sig, false)
	if err == nil {
		if p, perr := c.proc(name); perr == nil {
			c.mu.Lock()
			p.slow = on
			c.mu.Unlock()
		}
	}
	return c.record(action, name, err)
}

// Slow reports whether the plugin process name's current run was slowed
// and not made fast again.
func (c *Cluster) Slow(name string) bool {
	return c.procIs(name, func(p *proc) bool { return p.slow })
}

// CrashPlugin tells a plugin process to exit in its next mutating call,
// after the call's work and before its answer.
func (c *Cluster) CrashPlugin(name string) error {
	return c.record("plugin-crash-armed", name, c.send(name, syscall.SIGHUP, true))
}

// send sends sig to name's current run; arm marks the run as told to
// crash.
func (c *Cluster) send(name string, sig syscall.Signal, arm bool) error {
	p, err := c.proc(name)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if p.p == nil || p.p.Exited() {
		return fmt.Errorf("nemesis: %s is not running", name)
	}
	if arm {
		p.crashArmed = true
	}
	return p.p.Cmd.Process.Signal(sig)
}

// WipeMountRecords removes agent's volume mount records, the disk fault
// of a lost record; the agent must not be running.
func (c *Cluster) WipeMountRecords(agent string) error {
	err := func() error {
		if c.Running(agent) {
			return fmt.Errorf("nemesis: %s is running", agent)
		}
		p, err := c.proc(agent)
		if err != nil {
			return err
		}
		return os.RemoveAll(filepath.Join(c.dataDir(p.host), nodevolumes.RecordsDir))
	}()
	return c.record("wipe-mount-records", agent, err)
}

// Stop sends SIGSTOP to the process name and waits until it is stopped.
func (c *Cluster) Stop(name string) error {
	return c.record("stop", name, c.signal(name, syscall.SIGSTOP, true))
}

// Cont sends SIGCONT to the process name and waits until it runs.
func (c *Cluster) Cont(name string) error {
	return c.record("cont", name, c.signal(name, syscall.SIGCONT, false))
}

func (c *Cluster) signal(name string, sig syscall.Signal, stop bool) error {
	p, err := c.proc(name)
	if err != nil {
		return err
	}
	c.mu.Lock()
	run := p.p
	c.mu.Unlock()
	if run == nil || run.Exited() {
		return fmt.Errorf("nemesis: %s is not running", name)
	}
	if err := run.Cmd.Process.Signal(sig); err != nil {
		return err
	}
	// The signal is delivered asynchronously: poll the process's state
	// in /proc until it shows, within signalTimeout.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(signalTimeout)
	for {
		st, err := procState(run.Pid())
		if err != nil {
			return err
		}
		if (st == 'T') == stop {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nemesis: %s in state %c %s after %v", name, st, signalTimeout, sig)
		}
		<-tick.C
	}
	c.mu.Lock()
	p.stopped = stop
	c.mu.Unlock()
	return nil
}

// procState returns the state letter of /proc/PID/stat (R, S, T, ...).
func procState(pid int) (byte, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: the state
	// follows the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, fmt.Errorf("nemesis: cannot parse /proc/%d/stat", pid)
	}
	return b[i+2], nil
}

// Running reports whether the process name runs (stopped or not).
func (c *Cluster) Running(name string) bool {
	return c.procIs(name, func(p *proc) bool { return p.p != nil && !p.p.Exited() })
}

// Stopped reports whether the process name was stopped and not continued.
func (c *Cluster) Stopped(name string) bool {
	return c.procIs(name, func(p *proc) bool { return p.stopped })
}

// procIs reports what is of the process name, read under the cluster's
// lock; false for a process the cluster does not have.
func (c *Cluster) procIs(name string, is func(p *proc) bool) bool {
	p, err := c.proc(name)
	if err != nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return is(p)
}

// Cut drops what host from sends to host to (netlab.Lab.Cut).
func (c *Cluster) Cut(from, to string) error {
	return c.record("cut", from+"->"+to, c.lab.Cut(from, to))
}

// Isolate cuts host from every other host, ctl included.
func (c *Cluster) Isolate(host string) error {
	return c.record("isolate", host, c.lab.Isolate(host))
}

// Rejoin heals the cuts to and from host.
func (c *Cluster) Rejoin(host string) error {
	return c.record("rejoin", host, c.lab.Rejoin(host))
}

// HealAll removes every cut.
func (c *Cluster) HealAll() error {
	return c.record("heal-all", "", c.lab.HealAll())
}

// Close stops every process (continuing the stopped ones first, so that
// they die like the others) and removes the lab. It runs at the end of the
// test; calling it again does nothing.
func (c *Cluster) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	for _, conn := range c.conns {
		_ = conn.Close()
	}
	var runs []*testutil.Process
	for _, p := range c.procs {
		if p.p != nil {
			runs = append(runs, p.p)
		}
	}
	c.mu.Unlock()
	for _, r := range runs {
		_ = r.Cmd.Process.Signal(syscall.SIGCONT)
		_ = r.Cmd.Process.Kill()
	}
	for _, r := range runs {
		select {
		case <-r.Done():
		case <-time.After(exitTimeout):
			c.t.Errorf("nemesis: %s did not exit within %s of SIGKILL", r.Name, exitTimeout)
		}
	}
	if err := c.lab.Close(); err != nil {
		c.t.Errorf("nemesis: close the lab: %v", err)
	}
}

// Control returns a Control API client of the csisupd server on host,
// connected from the ctl host like the CLI. Its connection lives until
// Close and redials a restarted server within a second.
func (c *Cluster) Control(host string) (csisupdv1.ControlClient, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("nemesis: the cluster is closed")
	}
	if conn, ok := c.conns[host]; ok {
		return csisupdv1.NewControlClient(conn), nil
	}
	bo := backoff.DefaultConfig
	bo.MaxDelay = time.Second
	conn, err := grpc.NewClient("passthrough:///"+c.RPCAddr(host),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: 2 * time.Second}),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return c.lab.DialContext(ctx, ctlHost, "tcp", addr)
		}))
	if err != nil {
		return nil, fmt.Errorf("nemesis: control client of %s: %w", host, err)
	}
	c.conns[host] = conn
	return csisupdv1.NewControlClient(conn), nil
}

// Usage is what a csisupd process uses: its goroutines, by its metrics,
// and its resident memory.
type Usage struct {
	Goroutines int
	RSSBytes   int64
}

// Usage reads the goroutines (go_goroutines on /metrics, fetched from the
// ctl host) and the resident set size (/proc) of the csisupd process on
// host.
func (c *Cluster) Usage(host string) (Usage, error) {
	p, err := c.proc(host)
	if err != nil {
		return Usage{}, err
	}
	c.mu.Lock()
	run := p.p
	c.mu.Unlock()
	if run == nil || run.Exited() {
		return Usage{}, fmt.Errorf("nemesis: %s is not running", host)
	}
	var u Usage
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", run.Pid()))
	if err != nil {
		return u, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" && f[2] == "kB" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			u.RSSBytes = kb << 10
		}
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return c.lab.DialContext(ctx, ctlHost, network, addr)
		},
	}}
	defer client.CloseIdleConnections()
	resp, err := client.Get(fmt.Sprintf("http://%s:%d/metrics", c.lab.Addr(host), httpPort))
	if err != nil {
		return u, fmt.Errorf("nemesis: metrics of %s: %w", host, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return u, fmt.Errorf("nemesis: metrics of %s: %w", host, err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "go_goroutines "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				return u, fmt.Errorf("nemesis: metrics of %s: go_goroutines %q: %w", host, v, err)
			}
			u.Goroutines = int(f)
			return u, nil
		}
	}
	return u, fmt.Errorf("nemesis: metrics of %s have no go_goroutines", host)
}

// CLIResult is one run of the csisupd CLI.
type CLIResult struct {
	stdout, stderr string
	code           int
}

// CLI runs the csisupd CLI in the ctl host against addr, bounded by
// cliTimeout. An error means the command could not run or timed out; a
// command that ran and failed gives its exit code.
func (c *Cluster) CLI(addr string, args ...string) (CLIResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cliTimeout)
	defer cancel()
	cmd := c.lab.CommandContext(ctx, ctlHost, csisupdBin,
		append([]string{"--address", addr, "--timeout", "5s"}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	res := CLIResult{stdout: out.String(), stderr: errb.String()}
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return res, fmt.Errorf("csisupd %s: no answer within %s", strings.Join(args, " "), cliTimeout)
	case errors.As(err, &exit):
		res.code = exit.ExitCode()
	case err != nil:
		return res, fmt.Errorf("csisupd %s: %w", strings.Join(args, " "), err)
	}
	return res, nil
}

// cliJSON runs the CLI with --json against addr and decodes a successful
// answer into v.
func (c *Cluster) cliJSON(addr string, v any, args ...string) error {
	res, err := c.CLI(addr, append(args, "--json")...)
	if err != nil {
		return err
	}
	if res.code != 0 {
		return fmt.Errorf("csisupd %s: exit %d: %s", strings.Join(args, " "), res.code, strings.TrimSpace(res.stderr))
	}
	if err := json.Unmarshal([]byte(res.stdout), v); err != nil {
		return fmt.Errorf("csisupd %s --json: %w", strings.Join(args, " "), err)
	}
	return nil
}

// liveServers returns the servers that run and are not stopped.
func (c *Cluster) liveServers() []string {
	var out []string
	for _, s := range c.servers {
		if c.Running(s) && !c.Stopped(s) {
			out = append(out, s)
		}
	}
	return out
}

type peersDoc struct {
	Peers []struct {
		ID         string `json:"id"`
		RPCAddress string `json:"rpc_address"`
		Leader     bool   `json:"leader"`
	} `json:"peers"`
}

// Leader returns the server a majority of the servers names as leader, or
// "" when there is none now. The question goes to every live server.
func (c *Cluster) Leader() string {
	votes := map[string]int{}
	for _, s := range c.liveServers() {
		var peers peersDoc
		if err := c.cliJSON(c.RPCAddr(s), &peers, "operator", "raft", "list-peers"); err != nil {
			continue
		}
		for _, p := range peers.Peers {
			if !p.Leader {
				continue
			}
			for _, cand := range c.servers {
				if p.RPCAddress == c.RPCAddr(cand) {
					votes[cand]++
				}
			}
		}
	}
	for s, n := range votes {
		if n > len(c.servers)/2 {
			return s
		}
	}
	return ""
}

// WaitLeader waits until Leader names a server.
func (c *Cluster) WaitLeader(timeout time.Duration) (string, error) {
	var leader string
	err := c.waitFor(timeout, "a leader", func() (bool, error) {
		leader = c.Leader()
		return leader != "", nil
	})
	return leader, err
}

// waitFor polls cond until it holds or timeout passes; the last error of
// cond is in the timeout's.
func (c *Cluster) waitFor(timeout time.Duration, what string, cond func() (bool, error)) error {
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := cond()
		if err == nil && ok {
			return nil
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			if last != nil {
				return fmt.Errorf("nemesis: no %s within %s (last error: %v)", what, timeout, last)
			}
			return fmt.Errorf("nemesis: no %s within %s", what, timeout)
		}
		<-tick.C
	}
}

// pluginDoc is `plugin status tp --json`, as far as the tests read it.
type pluginDoc struct {
	ID                 string `json:"id"`
	ControllersHealthy int    `json:"controllers_healthy"`
	NodesHealthy       int    `json:"nodes_healthy"`
	Instances          []struct {
		NodeName string `json:"node_name"`
		Healthy  bool   `json:"healthy"`
	} `json:"instances"`
}

// nodeDoc is one node of `node status --json`.
type nodeDoc struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	Status string `json:"status"`
}

// query runs a read against the first live server that answers.
func (c *Cluster) query(v any, args ...string) error {
	var last error = errors.New("nemesis: no live server")
	for _, s := range c.liveServers() {
		if last = c.cliJSON(c.RPCAddr(s), v, args...); last == nil {
			return nil
		}
	}
	return last
}

// HealthyPlugins returns the agents whose instance of plugin is healthy
// in the cluster's view.
func (c *Cluster) HealthyPlugins(plugin string) ([]string, error) {
	var p pluginDoc
	if err := c.query(&p, "plugin", "status", plugin); err != nil {
		return nil, err
	}
	var out []string
	for _, in := range p.Instances {
		if in.Healthy {
			out = append(out, in.NodeName)
		}
	}
	slices.Sort(out)
	return out, nil
}

// WaitHealthyPlugins waits until n instances of plugin are healthy.
func (c *Cluster) WaitHealthyPlugins(plugin string, n int, timeout time.Duration) error {
	return c.waitFor(timeout, fmt.Sprintf("%d healthy instances of plugin %s", n, plugin), func() (bool, error) {
		got, err := c.HealthyPlugins(plugin)
		return len(got) == n, err
	})
}

// NodeStatus returns the cluster's status of agent's node ("ready",
// "down", ...).
func (c *Cluster) NodeStatus(agent string) (string, error) {
	var list struct {
		Nodes []nodeDoc `json:"nodes"`
	}
	if err := c.query(&list, "node", "status"); err != nil {
		return "", err
	}
	for _, n := range list.Nodes {
		if n.Name == agent {
			return n.Status, nil
		}
	}
	return "", fmt.Errorf("nemesis: no node %q in the cluster", agent)
}

// WaitNodeStatus waits until agent's node has status want.
func (c *Cluster) WaitNodeStatus(agent, want string, timeout time.Duration) error {
	return c.waitFor(timeout, fmt.Sprintf("node %s %s", agent, want), func() (bool, error) {
		got, err := c.NodeStatus(agent)
		return got == want, err
	})
}
