package rpc

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/acl"
	"github.com/csisupd/csisupd/internal/testutil"
)

// servers answers Cluster/ResolveToken as the servers would, from a map
// the test changes, and counts the calls.
type servers struct {
	mu      sync.Mutex
	tokens  map[string]*csisupdv1.ResolveTokenResponse
	calls   int
	failing error
}

func (s *servers) fetch(_ context.Context, secret string) (*csisupdv1.ResolveTokenResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if s.failing != nil {
		return nil, s.failing
	}
	if r, ok := s.tokens[secret]; ok {
		return r, nil
	}
	return nil, status.Error(codes.NotFound, "token not found")
}

func (s *servers) set(secret string, r *csisupdv1.ResolveTokenResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r == nil {
		delete(s.tokens, secret)
		return
	}
	s.tokens[secret] = r
}

func (s *servers) callCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls
}

var (
	volumeWrite = acl.Capability{Resource: acl.ResourceVolume, Level: acl.LevelWrite}
	volumeRead  = acl.Capability{Resource: acl.ResourceVolume, Level: acl.LevelRead}
)

func readerToken() *csisupdv1.ResolveTokenResponse {
	return &csisupdv1.ResolveTokenResponse{
		Token:    &csisupdv1.ACLToken{AccessorId: "a1", Type: acl.TypeClient, Policies: []string{"reader"}},
		Policies: []*csisupdv1.ACLPolicy{{Name: "reader", Rules: `volume { policy = "read" }`}},
	}
}

func TestTokenCacheRemembersAnswersForTTL(t *testing.T) {
	clock := testutil.NewClock(time.Unix(1000, 0))
	srv := &servers{tokens: map[string]*csisupdv1.ResolveTokenResponse{
		"reader": readerToken(),
		"admin":  {Token: &csisupdv1.ACLToken{AccessorId: "a2", Type: acl.TypeManagement}},
	}}
	cache, err := NewTokenCache(TokenCacheConfig{Fetch: srv.fetch, TTL: 30 * time.Second, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	for range 3 {
		got, err := cache.ResolveToken(ctx, "reader")
		if err != nil || !got.Allows(volumeRead) || got.Allows(volumeWrite) {
			t.Fatalf("reader: %v, %v", got, err)
		}
	}
	if n := srv.callCount(); n != 1 {
		t.Fatalf("3 lookups within the TTL made %d calls to the servers, want 1", n)
	}
	if got, err := cache.ResolveToken(ctx, "admin"); err != nil || !got.IsManagement() {
		t.Fatalf("management token: %v, %v", got, err)
	}

	// Unknown tokens are remembered too.
	for range 3 {
		if _, err := cache.ResolveToken(ctx, "nope"); !errors.Is(err, acl.ErrTokenNotFound) {
			t.Fatalf("unknown token: %v, want ErrTokenNotFound", err)
		}
	}
	if n := srv.callCount(); n != 3 {
		t.Fatalf("calls to the servers = %d, want 3 (reader, admin, one for the unknown token)", n)
	}

	// A token deleted on the servers stops working once the TTL passed.
	srv.set("reader", nil)
	if _, err := cache.ResolveToken(ctx, "reader"); err != nil {
		t.Fatalf("within the TTL the deleted token still resolves from the cache: %v", err)
	}
	clock.Advance(30 * time.Second)
	if _, err := cache.ResolveToken(ctx, "reader"); !errors.Is(err, acl.ErrTokenNotFound) {
		t.Fatalf("after the TTL the deleted token: %v, want ErrTokenNotFound", err)
	}
}

func TestTokenCacheDoesNotRememberFailures(t *testing.T) {
	clock := testutil.NewClock(time.Unix(1000, 0))
	srv := &servers{tokens: map[string]*csisupdv1.ResolveTokenResponse{"reader": readerToken()},
		failing: status.Error(codes.Unavailable, "no server reachable")}
	cache, err := NewTokenCache(TokenCacheConfig{Fetch: srv.fetch, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cache.ResolveToken(context.Background(), "reader"); status.Code(err) != codes.Unavailable {
		t.Fatalf("servers unreachable: %v, want Unavailable", err)
	}
	srv.mu.Lock()
	srv.failing = nil
	srv.mu.Unlock()
	if got, err := cache.ResolveToken(context.Background(), "reader"); err != nil || !got.Allows(volumeRead) {
		t.Fatalf("after the servers came back: %v, %v", got, err)
	}
}

func TestTokenCacheIsBounded(t *testing.T) {
	clock := testutil.NewClock(time.Unix(1000, 0))
	srv := &servers{tokens: map[string]*csisupdv1.ResolveTokenResponse{}}
	cache, err := NewTokenCache(TokenCacheConfig{Fetch: srv.fetch, Size: 8, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		_, _ = cache.ResolveToken(context.Background(), string(rune('a'+i%26))+time.Duration(i).String())
	}
	cache.mu.Lock()
	n := len(cache.entries)
	cache.mu.Unlock()
	if n > 8 {
		t.Fatalf("cache holds %d entries, cap 8", n)
	}
}

func TestACLFromResolved(t *testing.T) {
	// No token (the anonymous policy) and no policy: nothing allowed.
	if got, err := ACLFromResolved(&csisupdv1.ResolveTokenResponse{}); err != nil || got.Allows(volumeRead) {
		t.Fatalf("anonymous without a policy: %v, %v", got, err)
	}
	anon := &csisupdv1.ResolveTokenResponse{Policies: []*csisupdv1.ACLPolicy{{Name: acl.AnonymousPolicy, Rules: `volume { policy = "read" }`}}}
	if got, err := ACLFromResolved(anon); err != nil || !got.Allows(volumeRead) || got.Allows(volumeWrite) {
		t.Fatalf("anonymous with a read policy: %v, %v", got, err)
	}
	bad := &csisupdv1.ResolveTokenResponse{Policies: []*csisupdv1.ACLPolicy{{Name: "broken", Rules: `volume { policy = "root" }`}}}
	if _, err := ACLFromResolved(bad); err == nil || !strings.Contains(err.Error(), `policy "broken"`) {
		t.Fatalf("a policy that does not parse: %v", err)
	}
	// A token with a node identity and no policy: node:write bound to its
	// node, and nothing else.
	nodeWrite := acl.Capability{Resource: acl.ResourceNode, Level: acl.LevelWrite}
	node := &csisupdv1.ResolveTokenResponse{Token: &csisupdv1.ACLToken{Type: acl.TypeClient, NodeIdentity: "node-1"}}
	if got, err := ACLFromResolved(node); err != nil || !got.Allows(nodeWrite) || got.Allows(volumeRead) || got.NodeIdentity() != "node-1" {
		t.Fatalf("node identity alone: %v, identity %q, %v", got, got.NodeIdentity(), err)
	}
	node.Policies = anon.Policies
	if got, err := ACLFromResolved(node); err != nil || !got.Allows(nodeWrite) || !got.Allows(volumeRead) || got.NodeIdentity() != "node-1" {
		t.Fatalf("node identity with a policy: %v, identity %q, %v", got, got.NodeIdentity(), err)
	}
}
