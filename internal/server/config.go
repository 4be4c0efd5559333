package server

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/retry"
	"github.com/csisupd/csisupd/internal/server/fsm"
	"github.com/csisupd/csisupd/internal/server/raftnode"
	"github.com/csisupd/csisupd/internal/server/volumeops"
	"github.com/csisupd/csisupd/internal/stream"
	"github.com/csisupd/csisupd/internal/tlsutil"
	"github.com/csisupd/csisupd/internal/watchdog"
)

// Discover returns the gRPC addresses (host:port) of the servers as they
// are known now, for servers and agents that find them through a catalog
// instead of a fixed list.
type Discover func(ctx context.Context) ([]string, error)

// Config configures one server: its settings, as config validated and
// defaulted them, and its wiring. The server fills in none of the
// settings; tests shrink them.
type Config struct {
	// ServerSettings holds the settings (how the cluster forms, the RPC
	// and apply timeouts, heartbeat TTLs, autopilot, snapshots, the event
	// buffer): the agent passes its config's, tests shorten
	// config.DefaultServerSettings. They reach the raft member as they
	// are. Required.
	config.ServerSettings

	// ID is the raft server id; it must be unique in the cluster and stable
	// across restarts.
	ID string
	// Name is a human name for logs; defaults to ID.
	Name string
	// DataDir holds the raft log, stable store and snapshots.
	DataDir string
	// RaftAddr is the host:port raft binds to and advertises.
	RaftAddr string
	// RaftLayer, when set, carries raft traffic instead of a TCP transport
	// bound to RaftAddr. Its Addr() is advertised. Tests use it to partition.
	RaftLayer raft.StreamLayer
	// TLS, when set, protects the raft port: raft connections are TLS in
	// both directions and only peers with a server certificate are
	// accepted or dialled. The gRPC port's TLS is set up by whoever serves
	// it (DialOptions for the outgoing side).
	TLS *tlsutil.Configurator
	// RPCAddr is the advertised gRPC address of this server (Control and
	// Cluster services).
	RPCAddr string
	// DiscoverServers, when RetryJoin is empty, returns the gRPC addresses
	// of the servers at each join attempt (Consul's catalog, for example).
	// Addresses may include this server's own. BootstrapExpect still
	// decides when the cluster forms.
	DiscoverServers Discover

	// Join spaces the join and bootstrap attempts, then the checks of this
	// server's address record, and a new leader's barrier retries, with
	// jitter so that servers started together do not ask each other in
	// step. Its Base is also autopilot's reconcile and update interval.
	// Required: config.Retry.ServerJoin; no default here.
	Join retry.Policy
	// RaftLogLevel, optional, is the least level of the raft library's own
	// log lines (raftnode.Config.RaftLogLevel); NoLevel, the zero value,
	// leaves them to the logger's level.
	RaftLogLevel hclog.Level
	// Connect spaces gRPC's reconnects of this server's connections to
	// the other servers and to agents. Required: config.DefaultRetry().ServerConnect.
	Connect retry.Policy
	// Controllers calls controller RPCs on a node's agent. Defaults to the
	// gRPC ClientCSI client.
	Controllers volumeops.ControllerClient
	// NodeVolumes mounts and unmounts claimed volumes on a node's agent.
	// Defaults to the gRPC NodeVolumes client.
	NodeVolumes volumeops.NodeVolumesClient
	// IsRetryable reports whether a ClientCSI error means the next
	// controller candidate should be tried. Defaults to
	// volumeops.DefaultIsRetryable.
	IsRetryable func(error) bool
	// DialOptions are used for the gRPC connections to the other servers,
	// and to agents unless AgentDialOptions is set. Defaults to insecure
	// transport credentials.
	DialOptions []grpc.DialOption
	// AgentDialOptions, when set, are used for the connections to agents
	// (ClientCSI) instead of DialOptions: with TLS, servers verify the
	// server role of servers, and only the chain of agents.
	AgentDialOptions []grpc.DialOption

	// Metrics, when set, receives the server's metrics (csisupd_server_*
	// and csisupd_cluster_*, read from the state at scrape time) and
	// raft's own (csisupd_raft_*). Raft reports those only to go-metrics'
	// process-wide global, which New then points at a sink in Metrics:
	// the last server created in a process owns it. Nil registers
	// nothing and leaves that global alone. Shutdown unregisters
	// everything New registered.
	Metrics prometheus.Registerer
	// Watchdog, when set, tracks the liveness of the server's loops: the
	// leadership monitor, the write batcher, the join loop, and while this
	// server leads, the leader loop and the volume watcher. Nil tracks
	// nothing.
	Watchdog *watchdog.Monitor
}

// eventBuffer sizes the cluster event buffer.
func (c Config) eventBuffer() stream.Config {
	return stream.Config{Size: c.EventBufferSize, MaxLag: c.EventMaxLag}
}

// raftNode is the configuration of the server's raft member, over f,
// reaching the other servers through conn.
func (c Config) raftNode(f *fsm.FSM, conn func(addr string) (grpc.ClientConnInterface, error)) raftnode.Config {
	return raftnode.Config{
		ServerSettings:  c.ServerSettings,
		ID:              c.ID,
		DataDir:         c.DataDir,
		RaftAddr:        c.RaftAddr,
		RaftLayer:       c.RaftLayer,
		TLS:             c.TLS,
		RPCAddr:         c.RPCAddr,
		DiscoverServers: raftnode.Discover(c.DiscoverServers),
		Join:            c.Join,
		RaftLogLevel:    c.RaftLogLevel,
		FSM:             f,
		ScratchEvents:   c.eventBuffer(),
		Conn:            conn,
		Watchdog:        c.Watchdog,
	}
}

// agentDialOptions are the options of connections to agents.
func (c Config) agentDialOptions() []grpc.DialOption {
	if c.AgentDialOptions != nil {
		return c.AgentDialOptions
	}
	return c.DialOptions
}

// withDefaults returns a copy of c with what is derived filled in: the
// name from the id. The settings have no defaults here
// (config.DefaultServerSettings); the volume operations default the retry rule.
func (c Config) withDefaults() Config {
	if c.Name == "" {
		c.Name = c.ID
	}
	return c
}

// Validate reports every problem with the config, naming the field: the
// wiring here, the settings by config.ServerSettings.Validate.
func (c Config) Validate() error {
	var errs []error
	if c.ID == "" {
		errs = append(errs, errors.New("server: id is required"))
	}
	if c.DataDir == "" {
		errs = append(errs, errors.New("server: data_dir is required"))
	}
	if c.RaftLayer == nil {
		if _, _, err := net.SplitHostPort(c.RaftAddr); err != nil {
			errs = append(errs, fmt.Errorf("server: raft address %q: %w", c.RaftAddr, err))
		}
	}
	if _, _, err := net.SplitHostPort(c.RPCAddr); err != nil {
		errs = append(errs, fmt.Errorf("server: rpc address %q: %w", c.RPCAddr, err))
	}
	if err := c.ServerSettings.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.BootstrapExpect > 1 && len(c.RetryJoin) == 0 && c.DiscoverServers == nil {
		errs = append(errs, fmt.Errorf("server: bootstrap_expect = %d needs retry_join addresses of the other servers, or a way to discover them", c.BootstrapExpect))
	}
	if err := c.Join.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("server: Join: %w", err))
	}
	if err := c.Connect.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("server: Connect: %w", err))
	}
	return errors.Join(errs...)
}
