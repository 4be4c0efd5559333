package agent

import (
	"context"
	"fmt"
	"net"
	"strconv"

	"github.com/hashicorp/go-hclog"

	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/server"
)

// setupServer creates the server role with server.enabled (raft opened,
// nothing started); nil otherwise. Run starts it after the gRPC server
// and shuts it down after the parts; its part shuts it down for an agent
// whose Run never starts.
func (a *Agent) setupServer(cfg *config.Config, dial dialing) (*server.Server, part, error) {
	if !cfg.Server.Enabled {
		return nil, part{}, nil
	}
	srv, err := server.New(server.Config{
		ServerSettings:   cfg.ServerSettings(),
		ID:               a.nodeID,
		Name:             cfg.Name,
		DataDir:          ServerDataDir(cfg.DataDir),
		RaftAddr:         net.JoinHostPort(cfg.AdvertiseAddr, strconv.Itoa(cfg.Ports.Raft)),
		RPCAddr:          a.advertised(cfg.Ports.RPC, a.rpcLn),
		DiscoverServers:  a.discoverServers(cfg.ServerAutoJoin()),
		Join:             a.retry.ServerJoin,
		RaftLogLevel:     raftLogLevel(cfg.RaftLogLevel),
		Connect:          a.retry.ServerConnect,
		DialOptions:      dial.servers,
		AgentDialOptions: dial.agents,
		TLS:              a.tls,
		Metrics:          a.registerer(),
		Watchdog:         a.watchdog,
	}, a.log)
	if err != nil {
		return nil, part{}, fmt.Errorf("agent: server role: %w", err)
	}
	return srv, part{close: func() { _ = srv.Shutdown(context.Background()) }}, nil
}

// raftLogLevel is the level of config.Config.RaftLogLevel; NoLevel when
// it is empty, so that raft's lines follow the agent's level.
func raftLogLevel(level string) hclog.Level {
	if level == "" {
		return hclog.NoLevel
	}
	return hclog.LevelFromString(level)
}
