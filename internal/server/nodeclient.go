package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// NodeInfo identifies a node to the servers.
type NodeInfo struct {
	// ID is the node's stable id.
	ID string
	// Name is the node's human name.
	Name string
	// Address is the gRPC address of the node's ClientCSI service.
	Address string
}

// NodePlugin is one plugin on the node as the agent reports it.
type NodePlugin struct {
	ID string
	// Type is one of controller, node, monolith, unknown.
	Type string
	// Healthy is the latest probe result; HealthState is one of unknown,
	// healthy, unhealthy.
	Healthy           bool
	HealthState       string
	HealthDescription string
	VendorName        string
	VendorVersion     string
	// NodeID is the node id the plugin reports (NodeGetInfo).
	NodeID                 string
	MaxVolumes             int64
	AccessibleTopology     map[string]string
	PluginCapabilities     []string
	ControllerCapabilities []string
	NodeCapabilities       []string
}

func (p NodePlugin) proto() *csisupdv1.Plugin {
	return &csisupdv1.Plugin{
		Id: p.ID, Type: p.Type, Healthy: p.Healthy, HealthState: p.HealthState,
		HealthDescription: p.HealthDescription, VendorName: p.VendorName, VendorVersion: p.VendorVersion,
		NodeId: p.NodeID, MaxVolumes: int32(min(max(p.MaxVolumes, -1<<31), 1<<31-1)), AccessibleTopology: p.AccessibleTopology,
		PluginCapabilities: p.PluginCapabilities, ControllerCapabilities: p.ControllerCapabilities,
		NodeCapabilities: p.NodeCapabilities,
	}
}

// NodeClientConfig configures a NodeClient.
type NodeClientConfig struct {
	// Servers are the gRPC addresses of the servers; the client fails over
	// between them.
	Servers []string
	// DiscoverServers, when Servers is empty, finds the servers (Consul's
	// catalog, for example). The client asks it again after a failed call
	// and every DiscoverInterval, so a new server is used and a removed one
	// dropped.
	DiscoverServers Discover
	// DiscoverInterval is how long a discovered server list is used before
	// it is refreshed (default 30 s).
	DiscoverInterval time.Duration
	// Node identifies this node.
	Node NodeInfo
	// Plugins returns the node's current plugins. It is called for every
	// registration and plugin update, so updates always carry the latest
	// state.
	Plugins func() []NodePlugin
	// DialOptions are used for the server connections. Defaults to
	// insecure transport credentials.
	DialOptions []grpc.DialOption
	// RPCTimeout bounds one call (default 10 s).
	RPCTimeout time.Duration
	// MinRetry and MaxRetry bound the backoff after a failed call
	// (defaults 500 ms and 30 s).
	MinRetry, MaxRetry time.Duration
}

// NodeClient keeps one node registered with the servers: it registers,
// pushes coalesced plugin updates, heartbeats at the TTL the servers return,
// re-registers when a server does not know the node, and fails over between
// servers.
type NodeClient struct {
	cfg     NodeClientConfig
	logger  hclog.Logger
	conns   *connPool
	changed chan struct{}

	mu         sync.Mutex
	registered bool
	ttl        time.Duration
	server     int
	// With DiscoverServers: the servers found last, when, and whether a
	// failed call asks for a new look.
	discovered   []string
	discoveredAt time.Time
	rediscover   bool
}

// NewNodeClient validates cfg and returns a client; Run starts it.
func NewNodeClient(cfg NodeClientConfig, logger hclog.Logger) (*NodeClient, error) {
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
	if cfg.Plugins == nil {
		errs = append(errs, errors.New("node client: plugins source is required"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.Node.Name == "" {
		cfg.Node.Name = cfg.Node.ID
	}
	if cfg.RPCTimeout == 0 {
		cfg.RPCTimeout = 10 * time.Second
	}
	if cfg.MinRetry == 0 {
		cfg.MinRetry = 500 * time.Millisecond
	}
	if cfg.MaxRetry == 0 {
		cfg.MaxRetry = 30 * time.Second
	}
	if cfg.DiscoverInterval == 0 {
		cfg.DiscoverInterval = 30 * time.Second
	}
	if logger == nil {
		logger = hclog.NewNullLogger()
	}
	return &NodeClient{
		cfg:     cfg,
		logger:  logger.Named("node-client"),
		conns:   newConnPool(cfg.DialOptions),
		changed: make(chan struct{}, 1),
	}, nil
}

// PluginsChanged tells the client the plugin list changed. It never
// blocks; several calls before the next push become one update.
func (c *NodeClient) PluginsChanged() {
	select {
	case c.changed <- struct{}{}:
	default:
	}
}

// Registered reports whether the node is currently registered.
func (c *NodeClient) Registered() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.registered
}

// Servers returns the servers the client uses: Servers, or the ones it
// discovered last.
func (c *NodeClient) Servers() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.cfg.Servers) > 0 {
		return slices.Clone(c.cfg.Servers)
	}
	return slices.Clone(c.discovered)
}

// TTL returns the heartbeat TTL the servers returned last.
func (c *NodeClient) TTL() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ttl
}

// errNoServers is a discovery that found no server.
var errNoServers = errors.New("no servers found")

func (c *NodeClient) client(ctx context.Context) (csisupdv1.ClusterClient, string, error) {
	addr, err := c.serverAddr(ctx)
	if err != nil {
		return nil, "", err
	}
	conn, err := c.conns.get(addr)
	if err != nil {
		return nil, addr, err
	}
	return csisupdv1.NewClusterClient(conn), addr, nil
}

// serverAddr is the server to call: from Servers, or from the discovered
// list, which is refreshed when it is older than DiscoverInterval or a call
// failed.
func (c *NodeClient) serverAddr(ctx context.Context) (string, error) {
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
func (c *NodeClient) setDiscoveredLocked(found []string) {
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

func (c *NodeClient) failover() {
	c.mu.Lock()
	c.server++
	c.rediscover = true
	c.mu.Unlock()
}

func (c *NodeClient) plugins() []*csisupdv1.Plugin {
	var out []*csisupdv1.Plugin
	for _, p := range c.cfg.Plugins() {
		out = append(out, p.proto())
	}
	return out
}

// Run keeps the node registered until ctx ends. It returns nil then.
func (c *NodeClient) Run(ctx context.Context) error {
	defer c.conns.close()
	backoff := c.cfg.MinRetry
	fail := func(op, addr string, err error) {
		c.logger.Warn("server call failed", "op", op, "server", addr, "error", err)
		c.failover()
	}
	var (
		heartbeat = time.NewTimer(time.Hour)
		retry     <-chan time.Time
		dirty     bool
	)
	heartbeat.Stop()
	defer heartbeat.Stop()
	wait := func() bool {
		t := time.NewTimer(backoff)
		defer t.Stop()
		backoff = min(backoff*2, c.cfg.MaxRetry)
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	for {
		if !c.Registered() {
			select {
			case <-c.changed: // the registration carries the latest plugins
			default:
			}
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
			backoff = c.cfg.MinRetry
			dirty, retry = false, nil
			heartbeat.Reset(ttl)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-c.changed:
			dirty = true
		case <-retry:
			retry = nil
		case <-heartbeat.C:
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
				heartbeat.Reset(backoff)
				backoff = min(backoff*2, c.cfg.MaxRetry)
			default:
				backoff = c.cfg.MinRetry
				heartbeat.Reset(ttl)
			}
		}
		if dirty && retry == nil {
			addr, err := c.update(ctx)
			switch {
			case ctx.Err() != nil:
				return nil
			case status.Code(err) == codes.NotFound:
				c.setRegistered(false, 0)
			case err != nil:
				fail("update plugins", addr, err)
				retry = time.After(backoff)
				backoff = min(backoff*2, c.cfg.MaxRetry)
			default:
				dirty = false
			}
		}
	}
}

func (c *NodeClient) setRegistered(ok bool, ttl time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.registered, c.ttl = ok, ttl
}

func (c *NodeClient) register(ctx context.Context) (time.Duration, string, error) {
	cl, addr, err := c.client(ctx)
	if err != nil {
		return 0, addr, err
	}
	cctx, cancel := context.WithTimeout(ctx, c.cfg.RPCTimeout)
	defer cancel()
	resp, err := cl.NodeRegister(cctx, &csisupdv1.NodeRegisterRequest{
		NodeId: c.cfg.Node.ID, Name: c.cfg.Node.Name, Address: c.cfg.Node.Address, Plugins: c.plugins(),
	})
	if err != nil {
		return 0, addr, fmt.Errorf("register node %s with %s: %w", c.cfg.Node.ID, addr, err)
	}
	ttl := time.Duration(resp.GetHeartbeatTtlMs()) * time.Millisecond
	c.setRegistered(true, ttl)
	c.logger.Info("node registered", "server", addr, "ttl", ttl)
	return ttl, addr, nil
}

func (c *NodeClient) heartbeat(ctx context.Context) (time.Duration, string, error) {
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

func (c *NodeClient) update(ctx context.Context) (string, error) {
	cl, addr, err := c.client(ctx)
	if err != nil {
		return addr, err
	}
	cctx, cancel := context.WithTimeout(ctx, c.cfg.RPCTimeout)
	defer cancel()
	_, err = cl.NodeUpdatePlugins(cctx, &csisupdv1.NodeUpdatePluginsRequest{NodeId: c.cfg.Node.ID, Plugins: c.plugins()})
	if err != nil {
		return addr, fmt.Errorf("update plugins of node %s on %s: %w", c.cfg.Node.ID, addr, err)
	}
	return addr, nil
}
