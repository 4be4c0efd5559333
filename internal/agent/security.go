package agent

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/acl"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/rpc"
	"github.com/csisupd/csisupd/internal/tlsutil"
)

// tlsConfig maps the tls block to the certificates' configuration.
func tlsConfig(cfg *config.Config) tlsutil.Config {
	t := cfg.TLS
	return tlsutil.Config{
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

// setupTokenResolver decides where the agent's API looks tokens up: the
// replicated state on a server, the servers (through a cache) on an agent
// without the server role.
func (a *Agent) setupTokenResolver() error {
	if a.server != nil {
		return nil
	}
	if a.nodes == nil {
		return errors.New("agent: acl.enabled: an agent without the server role needs client.servers (or Consul discovery) to look tokens up")
	}
	cache, err := rpc.NewTokenCache(rpc.TokenCacheConfig{Fetch: a.nodes.ResolveToken})
	if err != nil {
		return err
	}
	a.tokens = cache
	return nil
}

// resolveToken finds the ACL a caller's token grants (rpc.TokenResolver).
func (a *Agent) resolveToken(ctx context.Context, secret string) (*acl.ACL, error) {
	switch {
	case a.server != nil:
		granted, _, err := a.server.ResolveToken(secret)
		return granted, err
	case a.tokens != nil:
		return a.tokens.ResolveToken(ctx, secret)
	}
	return nil, errors.New("no token resolver: ACLs are not enabled")
}

// expiryCheckInterval is how often the certificates' expiry is checked
// (also at start and on reload); a warning repeats at each check.
const expiryCheckInterval = 12 * time.Hour

// watchExpiry warns about certificates close to expiry until ctx ends.
func (a *Agent) watchExpiry(ctx context.Context) error {
	t := time.NewTicker(expiryCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			a.tls.CheckExpiry(now)
		}
	}
}
