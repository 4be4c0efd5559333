package nodeclient

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/retry"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// Node identifies a node to the servers.
type Node struct {
	// ID is the node's stable id.
	ID string
	// Name is the node's human name.
	Name string
	// Address is the gRPC address of the node's ClientCSI service.
	Address string
	// Secret is the node secret, presented on every call: the servers
	// refuse a call for this node with another one. Never logged.
	Secret string
}

// Discover returns the gRPC addresses (host:port) of the servers as they
// are known now (Consul's catalog, for example).
type Discover func(ctx context.Context) ([]string, error)

// Config configures a NodeClient.
type Config struct {
	// Servers are the gRPC addresses of the servers; the client fails over
	// between them.
	Servers []string
	// DiscoverServers, when Servers is empty, finds the servers (Consul's
	// catalog, for example). The client asks it again after a failed call
	// and every DiscoverInterval, so a new server is used and a removed one
	// dropped.
	DiscoverServers Discover
	// DiscoverInterval is how long a discovered server list is used before
	// it is refreshed. Required with DiscoverServers.
	DiscoverInterval time.Duration
	// Node identifies this node.
	Node Node
	// Plugins is the node's plugin state. The client subscribes to its
	// changes and sends the latest List with every registration and
	// plugin update.
	Plugins plugin.Source
	// DialOptions are used for the server connections. None means
	// insecure transport credentials.
	DialOptions []grpc.DialOption
	// RPCTimeout bounds one call. Required.
	RPCTimeout time.Duration
	// Retry spaces the calls after a failed one (config.Retry.NodeClient).
	// Its jitter spreads the nodes that lost their server in the same
	// instant, so that they do not all come back to it in the same
	// instant. Required.
	Retry retry.Policy
	// Connect spaces gRPC's reconnects of the connection to a server
	// (config.DefaultRetry().ServerConnect). Required.
	Connect retry.Policy
	// QuietStart is how long after Run starts a server's "no cluster
	// leader" answer is logged at debug rather than warn, until the node
	// first registers: servers that are still electing their first leader
	// are the expected start of a cluster, not a fault.
	QuietStart time.Duration
	// Watchdog, when set, watches the registration loop ("node
	// registration").
	Watchdog *watchdog.Monitor
}

// Client keeps one node registered with the servers: it registers,
// pushes coalesced plugin updates, heartbeats at the TTL the servers return,
// re-registers when a server does not know the node, and fails over between
// servers.
type Client struct {
	cfg    Config
	logger hclog.Logger
	conn   *serverConn

	mu         sync.Mutex
	registered bool
	// sent is the plugin list the servers accepted last.
	sent []*csisupdv1.Plugin
	// everRegistered ends the quiet start; firstRegistered is closed
	// then (WaitRegistered).
	everRegistered  bool
	firstRegistered chan struct{}
	ttl             time.Duration
	server          int
	// With DiscoverServers: the servers found last, when, and whether a
	// failed call asks for a new look.
	discovered   []string
	discoveredAt time.Time
	rediscover   bool
}

// validate checks cfg; it fills in nothing: the defaults live in the
// config package.
func (cfg *Config) validate() error {
	var errs []error
	if len(cfg.Servers) == 0 && cfg.DiscoverServers == nil {
		errs = append(errs, errors.New("node client: client.servers is empty and no server discovery is configured"))
	}
	if cfg.Node.ID == "" {
		errs = append(errs, errors.New("node client: node id is required"))
	}
	if cfg.Node.Address == "" {
		errs = append(errs, errors.New("node client: node address is required"))
	}
	if cfg.Node.Secret == "" {
		errs = append(errs, errors.New("node client: node secret is required"))
	}
	if cfg.Plugins == nil {
		errs = append(errs, errors.New("node client: plugins source is required"))
	}
	if cfg.RPCTimeout <= 0 {
		errs = append(errs, fmt.Errorf("node client: RPCTimeout must be positive, got %s", cfg.RPCTimeout))
	}
	if cfg.DiscoverServers != nil && cfg.DiscoverInterval <= 0 {
		errs = append(errs, fmt.Errorf("node client: DiscoverInterval must be positive, got %s", cfg.DiscoverInterval))
	}
	if err := cfg.Retry.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("node client: Retry: %w", err))
	}
	if err := cfg.Connect.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("node client: Connect: %w", err))
	}
	return errors.Join(errs...)
}

// New validates cfg and returns a client; Run starts it.
func New(cfg Config, logger hclog.Logger) (*Client, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Node.Name == "" {
		cfg.Node.Name = cfg.Node.ID // a node without a name is known by its id
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &Client{
		cfg:             cfg,
		logger:          logger.Named("node-client"),
		conn:            newServerConn(cfg.Connect, cfg.Node.Secret, cfg.DialOptions),
		firstRegistered: make(chan struct{}),
	}, nil
}

// WaitRegistered waits until the node has registered with the servers
// once since Run started (the servers know it, so its claims can be
// made), or ctx ends: an agent that just started, and the units that
// start with it, ask for claims before its first registration.
func (c *Client) WaitRegistered(ctx context.Context) error {
	select {
	case <-c.firstRegistered:
		return nil
	case <-ctx.Done():
		return status.Errorf(codes.Unavailable, "this node has not registered with the servers yet (%v): check that the agent reaches client.servers", context.Cause(ctx))
	}
}

// Registered reports whether the node is currently registered.
func (c *Client) Registered() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.registered
}

// Servers returns the servers the client uses: Servers, or the ones it
// discovered last.
func (c *Client) Servers() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.cfg.Servers) > 0 {
		return slices.Clone(c.cfg.Servers)
	}
	return slices.Clone(c.discovered)
}

// TTL returns the heartbeat TTL the servers returned last.
func (c *Client) TTL() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ttl
}

// errNoServers is a discovery that found no server.
var errNoServers = errors.New("no servers found")

func (c *Client) client(ctx context.Context) (csisupdv1.ClusterClient, string, error) {
	conn, addr, err := c.serverConn(ctx)
	if err != nil {
		return nil, addr, err
	}
	return csisupdv1.NewClusterClient(conn), addr, nil
}

// serverConn returns the connection to the server to call, and its
// address.
func (c *Client) serverConn(ctx context.Context) (*grpc.ClientConn, string, error) {
	addr, err := c.serverAddr(ctx)
	if err != nil {
		return nil, "", err
	}
	conn, err := c.conn.get(addr)
	if err != nil {
		return nil, addr, err
	}
	return conn, addr, nil
}

// serverAddr is the server to call: from Servers, or from the discovered
// list, which is refreshed when it is older than DiscoverInterval or a call
// failed.
func (c *Client) serverAddr(ctx context.Context) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.cfg.Servers) > 0 {
		return c.cfg.Servers[c.server%len(c.cfg.Servers)], nil
	}
	if len(c.discovered) == 0 || c.rediscover || time.Since(c.discoveredAt) >= c.cfg.DiscoverInterval {
		c.mu.Unlock()
		found, err := c.cfg.DiscoverServers(ctx)
		c.mu.Lock()
		if err != nil {
			return "", fmt.Errorf("discover servers: %w", err)
		}
		c.setDiscoveredLocked(found)
	}
	if len(c.discovered) == 0 {
		return "", fmt.Errorf("discover servers: %w", errNoServers)
	}
	return c.discovered[c.server%len(c.discovered)], nil
}

// setDiscoveredLocked replaces the discovered servers, staying with the
// current server while it is still listed.
func (c *Client) setDiscoveredLocked(found []string) {
	var current string
	if len(c.discovered) > 0 {
		current = c.discovered[c.server%len(c.discovered)]
	}
	if !slices.Equal(found, c.discovered) {
		c.logger.Info("discovered servers", "servers", strings.Join(found, ","))
	}
	c.discovered, c.discoveredAt, c.rediscover = slices.Clone(found), time.Now(), false
	if i := slices.Index(found, current); i >= 0 {
		c.server = i
	}
}

func (c *Client) failover() {
	c.mu.Lock()
	c.server++
	c.rediscover = true
	c.mu.Unlock()
}

// failoverFrom moves on from the server at addr unless another caller
// already did, so that two calls failing on the same server move one
// step, not two (which could bring them back to it).
func (c *Client) failoverFrom(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var current string
	switch {
	case len(c.cfg.Servers) > 0:
		current = c.cfg.Servers[c.server%len(c.cfg.Servers)]
	case len(c.discovered) > 0:
		current = c.discovered[c.server%len(c.discovered)]
	}
	if current == addr {
		c.server++
		c.rediscover = true
	}
}

// plugins is what the servers are told about the node's plugins: the
// read model, without the time of the last probe. The servers keep no
// probe times: replicating one would be a raft write per probe, and the
// node's heartbeat already says that its agent is alive.
func (c *Client) plugins() []*csisupdv1.Plugin {
	ps := c.cfg.Plugins.List()
	for _, p := range ps {
		p.LastProbe = nil
	}
	return ps
}

// Synced reports whether the servers hold the node's plugins as they are
// now: the node is registered and the plugin list the servers accepted
// last is the current one.
func (c *Client) Synced() bool {
	now := c.plugins()
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.registered && slices.EqualFunc(c.sent, now, func(a, b *csisupdv1.Plugin) bool { return proto.Equal(a, b) })
}

func (c *Client) setSent(ps []*csisupdv1.Plugin) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sent = ps
}

// logFailure logs a failed server call: at debug while the servers are
// still electing their first leader (QuietStart), else at warn.
func (c *Client) logFailure(started time.Time, op, addr string, err error) {
	c.mu.Lock()
	quiet := !c.everRegistered && csisupdv1.IsNoLeader(err) && time.Since(started) < c.cfg.QuietStart
	c.mu.Unlock()
	if quiet {
		c.logger.Debug("waiting for the servers to elect a leader", "op", op, "server", addr, "error", err)
		return
	}
	c.logger.Warn("server call failed", "op", op, "server", addr, "error", err)
}

// Run keeps the node registered until ctx ends. It returns nil then.
func (c *Client) Run(ctx context.Context) error {
	defer c.conn.close()
	loop := c.cfg.Watchdog.Loop("node registration")
	defer loop.Done()
	changes := c.cfg.Plugins.Subscribe()
	defer changes.Close()
	backoff := c.cfg.Retry.NewBackOff()
	started := time.Now()
	fail := func(op, addr string, err error) {
		c.logFailure(started, op, addr, err)
		if addr == "" { // no server to call: look again
			c.failover()
			return
		}
		c.failoverFrom(addr)
	}
	var (
		heartbeat = time.NewTimer(time.Hour)
		// beatDue is when heartbeat fires; zero while it is stopped.
		beatDue time.Time
		retryAt <-chan time.Time
		dirty   bool
	)
	heartbeat.Stop()
	defer heartbeat.Stop()
	beatIn := func(d time.Duration) {
		heartbeat.Reset(d)
		beatDue = time.Now().Add(d)
	}
	wait := func() bool {
		return loop.Wait(ctx, backoff.NextBackOff()) == nil
	}
	// busy marks the loop as in a server call, which RPCTimeout bounds.
	busy := func() { loop.Busy(time.Now().Add(c.cfg.RPCTimeout)) }
	for {
		loop.Beat()
		if !c.Registered() {
			select {
			case <-changes.C(): // the registration carries the latest plugins
			default:
			}
			busy()
			ttl, addr, err := c.register(ctx)
			if ctx.Err() != nil {
				return nil
			}
			if err != nil {
				fail("register", addr, err)
				if !wait() {
					return nil
				}
				continue
			}
			backoff.Reset()
			dirty, retryAt = false, nil
			beatIn(ttl)
			select {
			case <-c.conn.lost: // the leader has just heard from this node
			default:
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-loop.C():
		case <-changes.C():
			dirty = true
		case <-retryAt:
			retryAt = nil
		case <-c.conn.lost:
			// The server this node talked to went away, and with it,
			// perhaps, the leader: a new leader has not heard from this
			// node, and shows it initializing until it does. Heartbeat
			// soon, at a random moment that spreads the nodes that lost
			// their server at once, unless the heartbeat is due sooner.
			if d := earlyHeartbeatDelay(c.TTL()); !beatDue.IsZero() && time.Now().Add(d).Before(beatDue) {
				c.logger.Debug("lost the connection to the server; heartbeating early", "in", d)
				beatIn(d)
			}
		case <-heartbeat.C:
			beatDue = time.Time{}
			busy()
			ttl, addr, err := c.heartbeat(ctx)
			switch {
			case ctx.Err() != nil:
				return nil
			case status.Code(err) == codes.NotFound:
				c.logger.Info("server does not know this node; registering again", "server", addr)
				c.setRegistered(false, 0)
				continue
			case err != nil:
				fail("heartbeat", addr, err)
				beatIn(backoff.NextBackOff())
			default:
				backoff.Reset()
				beatIn(ttl)
			}
		}
		if dirty && retryAt == nil {
			busy()
			addr, err := c.update(ctx)
			switch {
			case ctx.Err() != nil:
				return nil
			case status.Code(err) == codes.NotFound:
				c.setRegistered(false, 0)
			case err != nil:
				fail("update plugins", addr, err)
				retryAt = time.After(backoff.NextBackOff())
			default:
				dirty = false
			}
		}
	}
}

// earlyHeartbeatSpread divides a node's TTL into the window in which it
// heartbeats after losing its server. The servers scale the TTL with the
// node count so that the leader sees at most its configured heartbeats per
// second; a tenth of the TTL spreads the nodes that lost their server in
// one instant at up to ten times that rate: at the defaults, 10,000 nodes
// have TTLs of 200 s and more and come back within 20 s and more, and a
// small cluster's nodes, with TTLs of 10 s and more, within a second.
const earlyHeartbeatSpread = 10

// earlyHeartbeatDelay returns a random delay in [0, ttl/earlyHeartbeatSpread).
func earlyHeartbeatDelay(ttl time.Duration) time.Duration {
	window := ttl / earlyHeartbeatSpread
	if window <= 0 {
		return 0
	}
	return rand.N(window)
}

func (c *Client) setRegistered(ok bool, ttl time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.registered, c.ttl = ok, ttl
	if ok && !c.everRegistered {
		close(c.firstRegistered)
	}
	c.everRegistered = c.everRegistered || ok
}

func (c *Client) register(ctx context.Context) (time.Duration, string, error) {
	cl, addr, err := c.client(ctx)
	if err != nil {
		return 0, addr, err
	}
	cctx, cancel := context.WithTimeout(ctx, c.cfg.RPCTimeout)
	defer cancel()
	plugins := c.plugins()
	resp, err := cl.NodeRegister(cctx, &csisupdv1.NodeRegisterRequest{
		NodeId: c.cfg.Node.ID, Name: c.cfg.Node.Name, Address: c.cfg.Node.Address, Plugins: plugins,
	})
	if err != nil {
		return 0, addr, fmt.Errorf("register node %s with %s: %w", c.cfg.Node.ID, addr, err)
	}
	c.setSent(plugins)
	ttl := time.Duration(resp.GetHeartbeatTtlMs()) * time.Millisecond
	c.setRegistered(true, ttl)
	c.logger.Info("node registered", "server", addr, "ttl", ttl)
	return ttl, addr, nil
}

func (c *Client) heartbeat(ctx context.Context) (time.Duration, string, error) {
	cl, addr, err := c.client(ctx)
	if err != nil {
		return 0, addr, err
	}
	cctx, cancel := context.WithTimeout(ctx, c.cfg.RPCTimeout)
	defer cancel()
	resp, err := cl.NodeHeartbeat(cctx, &csisupdv1.NodeHeartbeatRequest{NodeId: c.cfg.Node.ID})
	if err != nil {
		return 0, addr, fmt.Errorf("heartbeat node %s to %s: %w", c.cfg.Node.ID, addr, err)
	}
	ttl := time.Duration(resp.GetHeartbeatTtlMs()) * time.Millisecond
	c.setRegistered(true, ttl)
	return ttl, addr, nil
}

func (c *Client) update(ctx context.Context) (string, error) {
	cl, addr, err := c.client(ctx)
	if err != nil {
		return addr, err
	}
	cctx, cancel := context.WithTimeout(ctx, c.cfg.RPCTimeout)
	defer cancel()
	plugins := c.plugins()
	_, err = cl.NodeUpdatePlugins(cctx, &csisupdv1.NodeUpdatePluginsRequest{NodeId: c.cfg.Node.ID, Plugins: plugins})
	if err != nil {
		return addr, fmt.Errorf("update plugins of node %s on %s: %w", c.cfg.Node.ID, addr, err)
	}
	c.setSent(plugins)
	return addr, nil
}

// ResolveToken asks a server what the token with secret grants
// (Cluster/ResolveToken), for the agent's API when ACLs are on. A server
// that cannot be reached is failed over from, and the next one asked, up
// to two servers per call. The secret is never logged.
func (c *Client) ResolveToken(ctx context.Context, secret string) (*csisupdv1.ResolveTokenResponse, error) {
	return callCluster(ctx, c, "resolve token", func(ctx context.Context, cl csisupdv1.ClusterClient) (*csisupdv1.ResolveTokenResponse, error) {
		return cl.ResolveToken(ctx, &csisupdv1.ResolveTokenRequest{SecretId: secret})
	})
}

// NodeClaims asks the servers for the volume claims they hold for this
// node, moving on to the next server once when one is unreachable. The
// node volume manager removes the cluster mounts the answer lacks.
func (c *Client) NodeClaims(ctx context.Context) ([]*csisupdv1.NodeClaimRef, uint64, error) {
	resp, err := callCluster(ctx, c, "read node claims", func(ctx context.Context, cl csisupdv1.ClusterClient) (*csisupdv1.NodeClaimsResponse, error) {
		return cl.NodeClaims(ctx, &csisupdv1.NodeClaimsRequest{NodeId: c.cfg.Node.ID})
	})
	if err != nil {
		return nil, 0, err
	}
	return resp.GetClaims(), resp.GetIndex(), nil
}

// NodeVolumeHealth reports what this node saw of a mounted volume's
// health to the servers (they record it only when it changed).
func (c *Client) NodeVolumeHealth(ctx context.Context, volumeID string, abnormal bool, message string) error {
	_, err := callCluster(ctx, c, "report volume health", func(ctx context.Context, cl csisupdv1.ClusterClient) (*csisupdv1.NodeVolumeHealthResponse, error) {
		return cl.NodeVolumeHealth(ctx, &csisupdv1.NodeVolumeHealthRequest{NodeId: c.cfg.Node.ID, VolumeId: volumeID, Abnormal: abnormal, Message: message})
	})
	return err
}
