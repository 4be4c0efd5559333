package rpc

import (
	"context"
	"errors"
	"fmt"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/csisupd/csisupd/internal/acl"
	"github.com/csisupd/csisupd/internal/tlsutil"
)

// TokenResolver finds the ACL a token secret grants. The empty secret is a
// request without a token: its ACL is the anonymous policy's. An unknown
// secret is an error that wraps acl.ErrTokenNotFound.
type TokenResolver interface {
	ResolveToken(ctx context.Context, secret string) (*acl.ACL, error)
}

// TokenResolverFunc adapts a function to TokenResolver.
type TokenResolverFunc func(ctx context.Context, secret string) (*acl.ACL, error)

// ResolveToken calls f.
func (f TokenResolverFunc) ResolveToken(ctx context.Context, secret string) (*acl.ACL, error) {
	return f(ctx, secret)
}

// AuthConfig configures an Authorizer.
type AuthConfig struct {
	// TLS is true when the gRPC port serves TLS: callers' roles then come
	// from their certificates and each method's allowed roles are enforced.
	TLS bool
	// Region is the region of the role names certificates carry.
	Region string
	// ACL turns token checks on. Resolver is then required.
	ACL      bool
	Resolver TokenResolver
	// Logger receives one debug line per refused call (never a token).
	Logger hclog.Logger
}

// Authorizer checks, for every call of the gRPC server it is installed on,
// the rule of acl.RuleFor for the method: the caller's role, proven by its
// certificate, and the capability its token grants. It is the one place
// where access is decided; the services do not check again.
type Authorizer struct {
	cfg AuthConfig
	log hclog.Logger
}

// NewAuthorizer validates cfg and returns the Authorizer.
func NewAuthorizer(cfg AuthConfig) (*Authorizer, error) {
	if cfg.ACL && cfg.Resolver == nil {
		return nil, errors.New("rpc: auth: ACLs are on but no token resolver is given")
	}
	if cfg.Region == "" {
		cfg.Region = tlsutil.DefaultRegion
	}
	log := cfg.Logger
	if log == nil {
		log = hclog.NewNullLogger()
	}
	return &Authorizer{cfg: cfg, log: log}, nil
}

// ServerOptions returns the interceptors to install on a gRPC server.
func (a *Authorizer) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(a.unary),
		grpc.ChainStreamInterceptor(a.stream),
	}
}

func (a *Authorizer) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := a.AuthorizeRequest(ctx, info.FullMethod, req); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (a *Authorizer) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := a.Authorize(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}

// Authorize decides one call of fullMethod with the caller of ctx. It
// returns nil, or a status error: PermissionDenied for a method without a
// rule, a caller whose role may not call it, or a token that does not
// allow it; Unauthenticated for a missing or unknown token.
func (a *Authorizer) Authorize(ctx context.Context, fullMethod string) error {
	return a.AuthorizeRequest(ctx, fullMethod, nil)
}

// AuthorizeRequest is Authorize for a call with request req, which may
// need more than its method (acl.RaisedRuleFor): a forced release or
// deregistration needs operator:write too.
func (a *Authorizer) AuthorizeRequest(ctx context.Context, fullMethod string, req any) error {
	rule, ok := acl.RuleFor(fullMethod)
	var err error
	if !ok {
		// Fail closed: a method added without a rule is never open.
		err = status.Errorf(codes.PermissionDenied, "%s has no access rule", fullMethod)
	} else {
		err = a.authorize(ctx, fullMethod, rule)
	}
	if raised, ok := acl.RaisedRuleFor(fullMethod, req); err == nil && ok {
		err = a.authorize(ctx, fullMethod+" (forced)", raised)
	}
	if err != nil {
		addr := "unknown"
		if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
			addr = p.Addr.String()
		}
		a.log.Debug("call refused", "method", fullMethod, "peer", addr, "error", err)
	}
	return err
}

// authorize decides one call of method (named in errors) under rule.
func (a *Authorizer) authorize(ctx context.Context, method string, rule acl.Rule) error {
	role := tlsutil.RoleCLI
	if a.cfg.TLS {
		role = a.peerRole(ctx)
		if rule.Peers&peersOf(role) == 0 {
			return status.Errorf(codes.PermissionDenied, "%s cannot be called with a %s certificate (%s)",
				method, role, describePeers(rule.Peers))
		}
		if rule.ServerIdentity && role == tlsutil.RoleServer {
			return nil
		}
	}
	if !a.cfg.ACL || rule.Token == acl.TokenNone {
		return nil
	}
	secret := acl.TokenFromContext(ctx)
	if secret == "" && rule.Token != acl.TokenCapability {
		return status.Errorf(codes.Unauthenticated, "%s needs a token: none was given", method)
	}
	granted, err := a.cfg.Resolver.ResolveToken(ctx, secret)
	switch {
	case errors.Is(err, acl.ErrTokenNotFound):
		return status.Errorf(codes.Unauthenticated, "%s: the token given is unknown (deleted, or from another cluster)", method)
	case err != nil:
		if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown {
			return status.Errorf(s.Code(), "%s: resolve token: %s", method, s.Message())
		}
		return status.Errorf(codes.Unavailable, "%s: resolve token: %v", method, err)
	}
	switch rule.Token {
	case acl.TokenAny:
		return nil
	case acl.TokenManagement:
		if granted.IsManagement() {
			return nil
		}
		return status.Errorf(codes.PermissionDenied, "%s needs a management token", method)
	}
	if granted.Allows(rule.Capability) {
		return nil
	}
	if secret == "" {
		return status.Errorf(codes.Unauthenticated, "%s needs a token that allows %s: none was given, and the %q policy does not allow it",
			method, rule.Capability, acl.AnonymousPolicy)
	}
	return status.Errorf(codes.PermissionDenied, "%s needs %s, which the token does not allow", method, rule.Capability)
}

// peerRole is the role of the caller's verified certificate, RoleCLI for
// a caller without one (possible only with tls.verify_incoming = false).
func (a *Authorizer) peerRole(ctx context.Context) tlsutil.Role {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return tlsutil.RoleCLI
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return tlsutil.RoleCLI
	}
	role, ok := tlsutil.PeerRole(info.State, a.cfg.Region)
	if !ok {
		return tlsutil.RoleCLI
	}
	return role
}

// peersOf maps a certificate role to its bit in acl.Peers.
func peersOf(r tlsutil.Role) acl.Peers {
	switch r {
	case tlsutil.RoleServer:
		return acl.PeerServer
	case tlsutil.RoleClient:
		return acl.PeerClient
	default:
		return acl.PeerCLI
	}
}

// describePeers says who may call a method, for error messages.
func describePeers(p acl.Peers) string {
	var who []string
	if p&acl.PeerServer != 0 {
		who = append(who, "servers")
	}
	if p&acl.PeerClient != 0 {
		who = append(who, "agents")
	}
	if p&acl.PeerCLI != 0 {
		who = append(who, "operators")
	}
	switch len(who) {
	case 0:
		return "nobody may call it"
	case 1:
		return fmt.Sprintf("only %s may call it", who[0])
	}
	return fmt.Sprintf("only %s may call it", joinAnd(who))
}

func joinAnd(s []string) string {
	out := s[0]
	for i := 1; i < len(s); i++ {
		if i == len(s)-1 {
			out += " and " + s[i]
		} else {
			out += ", " + s[i]
		}
	}
	return out
}
