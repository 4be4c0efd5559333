package testcluster

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/testutil"
)

// Config describes a cluster to build.
type Config struct {
	// Servers is the number of servers started together (default 3).
	Servers int
	// BootstrapExpect is given to every server; default Servers. Tests of
	// a mismatch set Configure instead.
	BootstrapExpect int
	// Logger receives every server's logs; default: warnings and errors to
	// the test log.
	Logger hclog.Logger
	// Configure, when set, adjusts each server's config (index i) after the
	// cluster's defaults are applied.
	Configure func(i int, c *server.Config)
	// Register, when set, registers extra services on each server's gRPC
	// server.
	Register func(i int, g *grpc.Server)
	// ServerOptions, when set, returns extra options for each server's
	// gRPC server (interceptors that observe the calls, for example).
	ServerOptions func(i int) []grpc.ServerOption
	// Agents is the number of client-only agents (see Agent) started once
	// the servers have a leader. Each lists every server in client.servers.
	Agents int
	// AgentConfig, when set, returns HCL appended to agent i's
	// configuration file, whose directory is dir (plugin blocks, say).
	AgentConfig func(i int, dir string) string
}

// Cluster is a set of servers on loopback.
type Cluster struct {
	t      testing.TB
	cfg    Config
	logger hclog.Logger
	dir    string // holds every member's data dir

	mu      sync.Mutex
	members []*Member
	agents  []*Agent
	conns   []*grpc.ClientConn
}

// Member is one server of the cluster. Its id, addresses and data dir stay
// the same across restarts.
type Member struct {
	Index    int
	ID       string
	RPCAddr  string
	RaftAddr string
	DataDir  string

	c    *Cluster
	gate *netGate

	mu      sync.Mutex
	srv     *server.Server
	grpc    *grpc.Server
	serveWG sync.WaitGroup
}

// New starts cfg.Servers servers at once. Without agents it returns without
// waiting for a leader; with cfg.Agents it waits for one (30 s), then starts
// the agents and waits until each is ready (serving, first plugin directory
// scan done; its node registers with the servers in the background).
// Everything is stopped by t.Cleanup.
func New(t testing.TB, cfg Config) *Cluster {
	t.Helper()
	if cfg.Servers == 0 {
		cfg.Servers = 3
	}
	if cfg.BootstrapExpect == 0 {
		cfg.BootstrapExpect = cfg.Servers
	}
	c := &Cluster{t: t, cfg: cfg, logger: cfg.Logger}
	if c.logger == nil {
		w := &testWriter{t: t}
		t.Cleanup(w.close) // registered first: runs after every shutdown
		c.logger = hclog.New(&hclog.LoggerOptions{Level: hclog.Warn, Output: w})
	}
	// The data dirs' removal must run after Shutdown: cleanups run last
	// registered first, and a running server still writes there.
	c.dir = t.TempDir()
	t.Cleanup(c.Shutdown)
	for i := 0; i < cfg.Servers; i++ {
		c.members = append(c.members, c.newMember(i))
	}
	var wg sync.WaitGroup
	errs := make([]error, len(c.members))
	for i, m := range c.members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = m.start()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("testcluster: %v", err)
		}
	}
	if cfg.Agents > 0 {
		c.WaitForLeader(t, 30*time.Second)
		for i := 0; i < cfg.Agents; i++ {
			c.AddAgent()
		}
	}
	return c
}

// newMember reserves the member's ports and data dir.
func (c *Cluster) newMember(i int) *Member {
	c.t.Helper()
	id := fmt.Sprintf("server-%d", i)
	dataDir := filepath.Join(c.dir, id)
	if err := os.Mkdir(dataDir, 0o700); err != nil {
		c.t.Fatalf("testcluster: data dir: %v", err)
	}
	ports := testutil.FreePorts(c.t, 2)
	return &Member{Index: i, ID: id, c: c, gate: newNetGate(), DataDir: dataDir,
		RPCAddr:  fmt.Sprintf("127.0.0.1:%d", ports[0]),
		RaftAddr: fmt.Sprintf("127.0.0.1:%d", ports[1]),
	}
}

func (c *Cluster) gateFor(addr string) *netGate {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range c.members {
		if m.RPCAddr == addr || m.RaftAddr == addr {
			return m.gate
		}
	}
	return nil
}

func (c *Cluster) retryJoin() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, m := range c.members {
		out = append(out, m.RPCAddr)
	}
	return out
}

// start binds the member's ports and starts its server.
func (m *Member) start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.srv != nil {
		return fmt.Errorf("server %s is already running", m.ID)
	}
	rpcLn, err := listen(m.RPCAddr)
	if err != nil {
		return fmt.Errorf("server %s: listen rpc %s: %w", m.ID, m.RPCAddr, err)
	}
	raftLn, err := listen(m.RaftAddr)
	if err != nil {
		rpcLn.Close()
		return fmt.Errorf("server %s: listen raft %s: %w", m.ID, m.RaftAddr, err)
	}
	// The production join policy at 100 ms instead of 2 s, so that
	// clusters form quickly; its jitter is kept.
	join := config.DefaultRetry().ServerJoin
	join.Base, join.Cap = join.Base/20, join.Cap/20
	// Production sizes; timings short enough for tests. Raft's at
	// multiplier 5 (a 500 ms leader lease, 1 s heartbeat timeout): the
	// suite runs with the race detector beside other work on small
	// machines, where a goroutine can wait a few hundred milliseconds for
	// a core, and a shorter lease makes leaders step down in tests that
	// are not about elections.
	settings := config.DefaultServerSettings()
	settings.BootstrapExpect, settings.RetryJoin, settings.RaftMultiplier = m.c.cfg.BootstrapExpect, m.c.retryJoin(), 5
	settings.RPCTimeout, settings.ApplyTimeout = 2*time.Second, 5*time.Second
	settings.MinHeartbeatTTL, settings.HeartbeatGrace = time.Second, time.Second
	settings.FailoverHeartbeatTTL, settings.DeadServerTimeout = 5*time.Second, 5*time.Second
	cfg := server.Config{
		ServerSettings: settings,
		ID:             m.ID,
		DataDir:        m.DataDir,
		RPCAddr:        m.RPCAddr,
		RaftLayer:      &raftLayer{gatedListener: &gatedListener{Listener: raftLn, gate: m.gate, raft: true}, gate: m.gate, lookup: m.c.gateFor},
		Join:           join,
		Connect:        config.DefaultRetry().ServerConnect,
		DialOptions: []grpc.DialOption{
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithConnectParams(grpc.ConnectParams{
				Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, MaxDelay: 200 * time.Millisecond},
				MinConnectTimeout: time.Second,
			}),
			grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
				return m.gate.dial(ctx, m.c.gateFor(addr), addr, false)
			}),
		},
	}
	if m.c.cfg.Configure != nil {
		m.c.cfg.Configure(m.Index, &cfg)
	}
	srv, err := server.New(cfg, m.c.logger.With("member", m.ID))
	if err != nil {
		rpcLn.Close()
		raftLn.Close()
		return err
	}
	var opts []grpc.ServerOption
	if m.c.cfg.ServerOptions != nil {
		opts = m.c.cfg.ServerOptions(m.Index)
	}
	g := grpc.NewServer(opts...)
	srv.Register(g)
	if m.c.cfg.Register != nil {
		m.c.cfg.Register(m.Index, g)
	}
	m.serveWG.Add(1)
	go func() {
		defer m.serveWG.Done()
		g.Serve(&gatedListener{Listener: rpcLn, gate: m.gate})
	}()
	if err := srv.Start(context.Background()); err != nil {
		g.Stop()
		m.serveWG.Wait()
		srv.Shutdown(context.Background())
		return err
	}
	m.srv, m.grpc = srv, g
	return nil
}

// listen binds addr, retrying briefly while a previous socket lingers.
func listen(addr string) (net.Listener, error) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		ln, err := net.Listen("tcp", addr)
		if err == nil || time.Now().After(deadline) {
			return ln, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop shuts the member down; graceful transfers leadership first.
func (m *Member) stop(graceful bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if !graceful {
		m.gate.setBlocked(true)
		m.grpc.Stop()
		cancel() // no leadership transfer
	}
	if err := m.srv.Shutdown(ctx); err != nil {
		m.c.logger.Error("shutdown", "member", m.ID, "error", err)
	}
	m.grpc.Stop()
	m.serveWG.Wait()
	m.gate.setBlocked(false)
	m.srv, m.grpc = nil, nil
}

// Server returns the running server, or nil when the member is stopped.
func (m *Member) Server() *server.Server {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.srv
}

// Running reports whether the member's server runs.
func (m *Member) Running() bool { return m.Server() != nil }

// Members returns every member, running or not, in index order.
func (c *Cluster) Members() []*Member {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*Member(nil), c.members...)
}

// Member returns member i.
func (c *Cluster) Member(i int) *Member { return c.Members()[i] }

// Leader returns the running, unpartitioned member that is the ready
// leader, when exactly one is and every other running, unpartitioned member
// follows it; else nil.
func (c *Cluster) Leader() *Member {
	var leader *Member
	for _, m := range c.Members() {
		s := m.Server()
		if s == nil || m.gate.isBlocked(true) || !s.IsLeader() {
			continue
		}
		if leader != nil {
			return nil
		}
		leader = m
	}
	if leader == nil || !leader.Server().Ready() {
		return nil
	}
	for _, m := range c.Members() {
		s := m.Server()
		if s == nil || m.gate.isBlocked(true) {
			continue
		}
		if s.Leader() != leader.ID {
			return nil
		}
	}
	return leader
}

// WaitForLeader waits until Leader returns a member and returns it; it
// fails the test after timeout.
func (c *Cluster) WaitForLeader(t testing.TB, timeout time.Duration) *Member {
	t.Helper()
	var leader *Member
	if !poll(timeout, func() bool { leader = c.Leader(); return leader != nil }) {
		t.Fatalf("testcluster: no single leader within %v: %s", timeout, c.describe())
	}
	return leader
}

func (c *Cluster) describe() string {
	var parts []string
	for _, m := range c.Members() {
		s := m.Server()
		if s == nil {
			parts = append(parts, m.ID+"=stopped")
			continue
		}
		parts = append(parts, fmt.Sprintf("%s=(leader:%v sees:%q term:%d partitioned:%v)",
			m.ID, s.IsLeader(), s.Leader(), s.Term(), m.gate.isBlocked(true)))
	}
	return strings.Join(parts, " ")
}

// Kill stops member i abruptly: its network is cut first and it does not
// transfer leadership.
func (c *Cluster) Kill(i int) { c.Member(i).stop(false) }

// Stop stops member i gracefully, transferring leadership when it leads.
func (c *Cluster) Stop(i int) { c.Member(i).stop(true) }

// Restart starts a stopped member again with the same id, data dir and
// addresses.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	if err := c.Member(i).start(); err != nil {
		c.t.Fatalf("testcluster: restart: %v", err)
	}
}

// Partition cuts member i off from every other server and client.
func (c *Cluster) Partition(i int) { c.Member(i).gate.setBlocked(true) }

// Heal ends the partition of member i.
func (c *Cluster) Heal(i int) { c.Member(i).gate.setBlocked(false) }

// PartitionRaft cuts member i's raft off from the other servers while its
// RPCs still pass: a leader so cut keeps answering clients until its
// lease runs out.
func (c *Cluster) PartitionRaft(i int) { c.Member(i).gate.setRaftBlocked(true) }

// HealRaft ends the raft partition of member i.
func (c *Cluster) HealRaft(i int) { c.Member(i).gate.setRaftBlocked(false) }

// AddServer starts one more server with the cluster's bootstrap_expect and
// every member in retry_join, and returns it.
func (c *Cluster) AddServer() *Member {
	c.t.Helper()
	c.mu.Lock()
	i := len(c.members)
	c.mu.Unlock()
	m := c.newMember(i)
	c.mu.Lock()
	c.members = append(c.members, m)
	c.mu.Unlock()
	if err := m.start(); err != nil {
		c.t.Fatalf("testcluster: add server: %v", err)
	}
	return m
}

// RPCAddrs returns the gRPC addresses of every member.
func (c *Cluster) RPCAddrs() []string { return c.retryJoin() }

// Conn returns a client connection to member i's gRPC address, closed at
// cleanup.
func (c *Cluster) Conn(i int) *grpc.ClientConn {
	c.t.Helper()
	conn, err := grpc.NewClient(c.Member(i).RPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, MaxDelay: 200 * time.Millisecond},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		c.t.Fatalf("testcluster: dial %s: %v", c.Member(i).RPCAddr, err)
	}
	c.mu.Lock()
	c.conns = append(c.conns, conn)
	c.mu.Unlock()
	return conn
}

// Control returns a Control client for member i.
func (c *Cluster) Control(i int) csisupdv1.ControlClient {
	return csisupdv1.NewControlClient(c.Conn(i))
}

// Shutdown stops every agent and its plugins, then every member, and closes
// client connections. It is safe to call more than once.
func (c *Cluster) Shutdown() {
	c.mu.Lock()
	conns := c.conns
	c.conns = nil
	c.mu.Unlock()
	for _, conn := range conns {
		conn.Close()
	}
	var wg sync.WaitGroup
	for _, a := range c.Agents() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.stop()
			a.stopPlugins()
			os.RemoveAll(a.Dir)
		}()
	}
	wg.Wait()
	for _, m := range c.Members() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.stop(false)
		}()
	}
	wg.Wait()
}

// poll calls cond until it is true or timeout passes.
func poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// testWriter sends log output to the test log until the test ends.
type testWriter struct {
	t      testing.TB
	mu     sync.Mutex
	closed bool
}

var _ io.Writer = (*testWriter)(nil)

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

func (w *testWriter) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
}
