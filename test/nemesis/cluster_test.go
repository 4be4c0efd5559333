//go:build nemesis

package nemesis

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/netlab"
	"github.com/csisupd/csisupd/internal/testutil"
)

// Ports every csisupd process listens on, at its host's lab address.
const (
	rpcPort  = 4780
	raftPort = 4781
	httpPort = 4782
)

// ctlHost is the lab host the test's clients run on.
const ctlHost = "ctl"

// pluginID is the id of every agent's test plugin (its socket's
// directory under plugin_dir).
const pluginID = "tp"

// Bounds of the cluster's operations.
const (
	cliTimeout    = 15 * time.Second // one CLI command in the ctl host
	exitTimeout   = 10 * time.Second // a killed process to be reaped
	formTimeout   = 90 * time.Second // the cluster to form and report every plugin
	signalTimeout = 5 * time.Second  // a stopped or continued process to show its new state
	pollInterval  = 250 * time.Millisecond
)

// Options configure StartCluster.
type Options struct {
	// Servers and Agents are the numbers of server and agent hosts
	// (default 3 each).
	Servers, Agents int
	// Seed seeds the fault schedule; 0 takes -seed, and a -seed of 0 one
	// from the clock. The seed used is logged.
	Seed int64
}

// Event is one fault or control action, for the run's fault schedule.
type Event struct {
	Time   time.Time
	Action string // kill, restart, stop, cont, cut, isolate, rejoin, heal-all
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
	closed bool
}

// proc is one process of the cluster and how to start it again.
type proc struct {
	name, host string
	bin        string
	args       []string
	p          *testutil.Process // the current run; nil before the first start
	stopped    bool              // SIGSTOP sent and no SIGCONT since
}

// PluginName is the process name of agent's test plugin.
func PluginName(agent string) string { return agent + "/plugin" }

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
	if opts.Seed == 0 {
		opts.Seed = time.Now().UnixNano()
	}
	t.Logf("nemesis seed %d (rerun with make nemesis SEED=%d)", opts.Seed, opts.Seed)

	c := &Cluster{t: t, Seed: opts.Seed, procs: map[string]*proc{}, journal: t.TempDir()}
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
}
`, opts.Servers, hclList(join)))
		c.add(&proc{name: s, host: s, bin: csisupdBin, args: []string{"agent", "--config", cfg}})
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
		c.add(&proc{name: PluginName(a), host: a, bin: testPluginBin, args: []string{
			"--socket", filepath.Join(pluginDir, pluginID, "csi.sock"),
			"--state-dir", stateDir,
			"--node-local", "--node-id", a,
			"--journal", filepath.Join(c.journal, a+".journal"),
		}})
		c.add(&proc{name: a, host: a, bin: csisupdBin, args: []string{"agent", "--config", cfg}})
	}
	for _, name := range c.names() {
		if err := c.start(name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.WaitLeader(formTimeout); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitHealthyPlugins(len(c.agents), formTimeout); err != nil {
		t.Fatal(err)
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
		out = append(out, PluginName(a), a)
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

// Journals returns the paths of the plugins' call journals, one per agent
// host; they outlive the plugins' restarts.
func (c *Cluster) Journals() []string {
	var out []string
	for _, a := range c.agents {
		out = append(out, filepath.Join(c.journal, a+".journal"))
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

// start runs name's command in its host's namespace; it must not be
// running.
func (c *Cluster) start(name string) error {
	p, err := c.proc(name)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if p.p != nil && !p.p.Exited() {
		return fmt.Errorf("nemesis: %s is running", name)
	}
	// ip netns exec replaces itself with the program: the process is the
	// program itself, and signals reach it.
	args := append([]string{"netns", "exec", c.lab.Namespace(p.host), p.bin}, p.args...)
	p.p = testutil.StartProcess(c.t, nil, "ip", args...)
	p.p.Name = name
	p.stopped = false
	return nil
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
	p.stopped = false
	c.mu.Unlock()
	if run == nil || run.Exited() {
		return fmt.Errorf("nemesis: %s is not running", name)
	}
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
// data, after Kill (or after it exited by itself).
func (c *Cluster) Restart(name string) error {
	return c.record("restart", name, c.start(name))
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
	p, err := c.proc(name)
	if err != nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return p.p != nil && !p.p.Exited()
}

// Stopped reports whether the process name was stopped and not continued.
func (c *Cluster) Stopped(name string) bool {
	p, err := c.proc(name)
	if err != nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return p.stopped
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

// HealthyPlugins returns the agents whose plugin instance is healthy in
// the cluster's view.
func (c *Cluster) HealthyPlugins() ([]string, error) {
	var p pluginDoc
	if err := c.query(&p, "plugin", "status", pluginID); err != nil {
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

// WaitHealthyPlugins waits until n plugin instances are healthy.
func (c *Cluster) WaitHealthyPlugins(n int, timeout time.Duration) error {
	return c.waitFor(timeout, fmt.Sprintf("%d healthy plugin instances", n), func() (bool, error) {
		got, err := c.HealthyPlugins()
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
