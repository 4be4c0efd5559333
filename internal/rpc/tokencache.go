package rpc

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/acl"
)

// Defaults of a TokenCache.
const (
	// DefaultTokenCacheTTL is how long an agent uses an answer of the
	// servers about a token, as Nomad's clients do (acl.token_ttl 30s): a
	// deleted token or a changed policy takes effect on agents within it.
	DefaultTokenCacheTTL = 30 * time.Second
	// DefaultTokenCacheSize caps the tokens remembered; beyond it expired
	// answers are dropped first, then arbitrary ones.
	DefaultTokenCacheSize = 4096
)

// TokenCacheConfig configures a TokenCache.
type TokenCacheConfig struct {
	// Fetch asks the servers about a secret (Cluster/ResolveToken).
	// Required. An unknown secret is a NotFound status or an error
	// wrapping acl.ErrTokenNotFound.
	Fetch func(ctx context.Context, secret string) (*csisupdv1.ResolveTokenResponse, error)
	// TTL and Size default to DefaultTokenCacheTTL and DefaultTokenCacheSize.
	TTL  time.Duration
	Size int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// TokenCache resolves tokens on an agent that has no replicated state: it
// asks the servers and remembers each answer, unknown tokens included, for
// TTL. Entries are keyed by a hash of the secret, so the secrets
// themselves are not kept.
type TokenCache struct {
	cfg TokenCacheConfig

	mu      sync.Mutex
	entries map[[sha256.Size]byte]tokenEntry
}

type tokenEntry struct {
	acl     *acl.ACL // nil: the token is unknown
	expires time.Time
}

// NewTokenCache validates cfg and returns an empty cache.
func NewTokenCache(cfg TokenCacheConfig) (*TokenCache, error) {
	if cfg.Fetch == nil {
		return nil, errors.New("rpc: token cache: Fetch is required")
	}
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultTokenCacheTTL
	}
	if cfg.Size <= 0 {
		cfg.Size = DefaultTokenCacheSize
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &TokenCache{cfg: cfg, entries: map[[sha256.Size]byte]tokenEntry{}}, nil
}

// ResolveToken implements TokenResolver.
func (c *TokenCache) ResolveToken(ctx context.Context, secret string) (*acl.ACL, error) {
	key := sha256.Sum256([]byte(secret))
	now := c.cfg.Now()
	c.mu.Lock()
	e, ok := c.entries[key]
	c.mu.Unlock()
	if ok && now.Before(e.expires) {
		return e.found()
	}

	resp, err := c.cfg.Fetch(ctx, secret)
	var granted *acl.ACL
	switch {
	case errors.Is(err, acl.ErrTokenNotFound) || status.Code(err) == codes.NotFound:
		// Remembered too, so that a caller with a wrong token cannot make
		// every one of its calls a call to the servers.
	case err != nil:
		return nil, err
	default:
		if granted, err = ACLFromResolved(resp); err != nil {
			return nil, err
		}
	}
	c.put(key, tokenEntry{acl: granted, expires: now.Add(c.cfg.TTL)}, now)
	return tokenEntry{acl: granted}.found()
}

func (e tokenEntry) found() (*acl.ACL, error) {
	if e.acl == nil {
		return nil, acl.ErrTokenNotFound
	}
	return e.acl, nil
}

// put stores e, first making room when the cache is full.
func (c *TokenCache) put(key [sha256.Size]byte, e tokenEntry, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[key]; !ok && len(c.entries) >= c.cfg.Size {
		for k, old := range c.entries {
			if !now.Before(old.expires) {
				delete(c.entries, k)
			}
		}
		for k := range c.entries {
			if len(c.entries) < c.cfg.Size {
				break
			}
			delete(c.entries, k)
		}
	}
	c.entries[key] = e
}

// ACLFromResolved compiles the answer of Cluster/ResolveToken: a
// management token allows everything; a client token, or no token (the
// anonymous policy), what its policies allow, and a client token with a
// node identity node:write bound to that node besides.
func ACLFromResolved(resp *csisupdv1.ResolveTokenResponse) (*acl.ACL, error) {
	granted, err := aclOfPolicies(resp)
	if err != nil {
		return nil, err
	}
	return granted.WithNodeIdentity(resp.GetToken().GetNodeIdentity()), nil
}

// aclOfPolicies is ACLFromResolved without the node identity.
func aclOfPolicies(resp *csisupdv1.ResolveTokenResponse) (*acl.ACL, error) {
	if resp.GetToken().GetType() == acl.TypeManagement {
		return acl.Management(), nil
	}
	policies := make([]*acl.Policy, 0, len(resp.GetPolicies()))
	for _, p := range resp.GetPolicies() {
		parsed, err := acl.ParsePolicy(p.GetName(), "policy "+p.GetName(), []byte(p.GetRules()))
		if err != nil {
			return nil, fmt.Errorf("rpc: policy %q from the servers: %w", p.GetName(), err)
		}
		policies = append(policies, parsed)
	}
	if len(policies) == 0 {
		return acl.DenyAll(), nil
	}
	return acl.Compile(policies...), nil
}
