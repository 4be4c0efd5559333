package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/acl"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/rpc"
	"github.com/csisupd/csisupd/internal/tlsutil"
)

// tlsConfig maps the tls block to the certificates' configuration. With
// verify_node_name the agent's own client certificate must name the
// agent's node.
func tlsConfig(cfg *config.Config) tlsutil.Config {
	t := cfg.TLS
	node := ""
	if t.VerifyNodeName {
		node = cfg.Name
	}
	return tlsutil.Config{
		NodeName:             node,
		CAFile:               t.CAFile,
		CertFile:             t.CertFile,
		KeyFile:              t.KeyFile,
		VerifyIncoming:       t.VerifyIncoming,
		VerifyOutgoing:       t.VerifyOutgoing,
		VerifyServerHostname: t.VerifyServerHostname,
		Region:               cfg.Region,
	}
}

// agentTokenOption sends the agent's own token with its calls to the
// servers, when ACLs are on and it has one.
func agentTokenOption(cfg *config.Config) []grpc.DialOption {
	if !cfg.ACL.Enabled || cfg.ACL.AgentToken == "" {
		return nil
	}
	return []grpc.DialOption{grpc.WithPerRPCCredentials(csisupdv1.TokenCredentials{Secret: string(cfg.ACL.AgentToken)})}
}

// setupTLS loads the certificates of every port when the tls block turns
// TLS on; nil without TLS. Its part warns of certificates close to expiry
// and, on Reload, reads the certificate files again.
func (a *Agent) setupTLS(cfg *config.Config) (*tlsutil.Configurator, part, error) {
	if !cfg.TLS.Enabled() {
		return nil, part{}, nil
	}
	c, err := tlsutil.New(tlsConfig(cfg), a.log.Named("tls"))
	if err != nil {
		return nil, part{}, fmt.Errorf("agent: %w", err)
	}
	reload := func(_, applied *config.Config) ([]string, error) {
		if err := c.Reload(); err != nil {
			return []string{"tls."}, fmt.Errorf("reload certificates: %w", err)
		}
		leaf := c.Certificate()
		a.log.Info("certificates reloaded", "cert_file", applied.TLS.CertFile, "serial", leaf.SerialNumber.Text(16),
			"not_after", leaf.NotAfter.UTC().Format(time.RFC3339))
		return nil, nil
	}
	return c, part{name: "certificate expiry", run: func(ctx context.Context) error { return watchExpiry(ctx, c) }, reload: reload}, nil
}

// setupTokenResolver decides where the agent's API looks ACL tokens up:
// the replicated state on a server, the servers (through a cache) on an
// agent without the server role. Without ACLs it returns nil: no call
// needs a token.
func (a *Agent) setupTokenResolver(cfg *config.Config) (rpc.TokenResolver, error) {
	switch {
	case !cfg.ACL.Enabled:
		return nil, nil
	case a.server != nil:
		srv := a.server
		return rpc.TokenResolverFunc(func(_ context.Context, secret string) (*acl.ACL, error) {
			granted, _, err := srv.ResolveToken(secret)
			return granted, err
		}), nil
	case a.nodes == nil:
		return nil, errors.New("agent: acl.enabled: an agent without the server role needs client.servers (or Consul discovery) to look tokens up")
	}
	cache, err := rpc.NewTokenCache(rpc.TokenCacheConfig{Fetch: a.nodes.ResolveToken})
	if err != nil {
		return nil, fmt.Errorf("agent: token cache: %w", err)
	}
	return cache, nil
}

// expiryCheckInterval is how often the certificates' expiry is checked
// (also at start and on reload); a warning repeats at each check.
const expiryCheckInterval = 12 * time.Hour

// watchExpiry warns about certificates of c close to expiry until ctx
// ends.
func watchExpiry(ctx context.Context, c *tlsutil.Configurator) error {
	t := time.NewTicker(expiryCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			c.CheckExpiry(now)
		}
	}
}
