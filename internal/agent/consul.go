package agent

import (
	"fmt"
	"net"
	"strconv"

	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/consulsync"
	"github.com/csisupd/csisupd/internal/server"
)

// setupConsul creates the Consul sync with consul.enabled; nil otherwise.
// Its part runs it and, on Reload, applies the consul block but
// consul.enabled (with registration off there is nothing to apply: the
// values wait for consul.enabled, which needs a restart).
func (a *Agent) setupConsul(cfg *config.Config) (*consulsync.Syncer, part, error) {
	var syncer *consulsync.Syncer
	if cfg.Consul.Enabled {
		consulCfg, err := a.consulConfig(cfg)
		if err != nil {
			return nil, part{}, err
		}
		if syncer, err = consulsync.New(consulCfg); err != nil {
			return nil, part{}, fmt.Errorf("agent: consul: %w", err)
		}
	}
	reload := func(want, applied *config.Config) ([]string, error) {
		// Everything but consul.enabled, which starts or stops a
		// component. The registration is rebuilt from the running values
		// of the other keys (name, addresses, TLS), which do not change
		// live.
		next := *applied
		next.Consul = want.Consul
		next.Consul.Enabled = applied.Consul.Enabled
		if syncer != nil {
			consulCfg, err := a.consulConfig(&next)
			if err == nil {
				err = syncer.Reload(consulCfg)
			}
			if err != nil {
				return []string{"consul."}, fmt.Errorf("reload consul settings: %w", err)
			}
		}
		applied.Consul = next.Consul
		return nil, nil
	}
	p := part{name: "consul sync", reload: reload}
	if syncer != nil {
		p.run = syncer.Run
	}
	return syncer, p, nil
}

// consulShutdownTimeout bounds the Consul deregistration at shutdown, so an
// unreachable Consul leaves time for the rest of a stop within 5 s.
const consulShutdownTimeout = ShutdownTimeout / 2

// consulConfig builds the Consul sync's configuration from cfg, which
// holds every default: consulsync has none of its own.
func (a *Agent) consulConfig(cfg *config.Config) (consulsync.Config, error) {
	port := cfg.Ports.RPC
	if tcp, ok := a.rpcLn.Addr().(*net.TCPAddr); ok {
		port = tcp.Port
	}
	cs := cfg.Consul
	c := consulsync.Config{
		Plugins:              a.manager.Registry().Source(),
		Address:              cs.Address,
		Token:                string(cs.Token),
		ServiceName:          cs.ServiceName,
		PluginServiceName:    cs.PluginService,
		ServerService:        cfg.Server.Enabled,
		ServerServiceName:    cs.ServerServiceName,
		Tags:                 cs.Tags,
		EnableTagOverride:    cs.EnableTagOverride,
		DeregisterOnShutdown: cs.DeregisterOnShutdown,
		NodeName:             cfg.Name,
		ServiceAddress:       cfg.AdvertiseAddr,
		ServicePort:          port,
		GRPCCheck:            net.JoinHostPort(cfg.AdvertiseAddr, strconv.Itoa(port)),
		GRPCCheckInterval:    cs.CheckInterval,
		GRPCCheckTimeout:     cs.CheckTimeout(),
		SyncInterval:         cs.SyncInterval,
		CheckTTL:             cs.CheckTTL(),
		Probation:            config.DefaultConsulProbation,
		RequestTimeout:       config.DefaultConsulRequestTimeout,
		DiscoveryWait:        cs.DiscoveryWait,
		DiscoveryMinInterval: config.DefaultConsulDiscoveryMinInterval,
		ShutdownTimeout:      consulShutdownTimeout,
		Retry:                a.retry.ConsulSync,
		Logger:               a.log.Named("consul"),
		Metrics:              a.registerer(),
		Watchdog:             a.watchdog,
	}
	if a.tls != nil {
		c.GRPCCheckTLS, c.GRPCCheckTLSServerName = true, a.checkTLSServerName(cfg)
	}
	return c, nil
}

// checkTLSServerName is the name Consul's gRPC check verifies in the agent's
// certificate: consul.check_tls_server_name, else the first DNS name of the
// certificate the agent serves (the role name of a `csisupd tls` one), else
// "" (the address Consul dials).
func (a *Agent) checkTLSServerName(cfg *config.Config) string {
	if cfg.Consul.CheckTLSServerName != "" {
		return cfg.Consul.CheckTLSServerName
	}
	if names := a.tls.Certificate().DNSNames; len(names) > 0 {
		return names[0]
	}
	return ""
}

// discoverServers returns the servers as the Consul sync's one watch of
// the catalog last saw them when on is set and Consul registration runs,
// else nil.
func (a *Agent) discoverServers(on bool) server.Discover {
	if !on || a.consul == nil {
		return nil
	}
	return a.consul.Servers
}
