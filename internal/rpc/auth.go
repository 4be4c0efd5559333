package rpc

import (
	"context"
	"crypto/tls"
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
	// VerifyNodeName (tls.verify_node_name; needs TLS) trusts the node
	// name a client certificate carries (tlsutil.PeerNodeName): it binds
	// the caller to that node, and a node method (acl.Rule.Node) called
	// with a client certificate that names no node is refused.
	VerifyNodeName bool
	// Logger receives one debug line per refused call (never a token).
	Logger hclog.Logger
}

// Authorizer checks, for every call of the gRPC server it is installed on,
// the rule of acl.RuleFor for the method: the caller's role, proven by its
// certificate, and the capability its token grants. It is the one place
// where access is decided; the services do not check again, except which
// node a caller may act as: the Authorizer does not know node ids, so it
// puts the caller's acl.CallerNode (its token's node identity, its
// certificate's node name with VerifyNodeName, and the bindings a
// forwarding server passed on) into the handler's context, and the
// servers' Cluster service checks it against the node each call is for.
type Authorizer struct {
	cfg AuthConfig
	log hclog.Logger
}

// NewAuthorizer validates cfg and returns the Authorizer.
func NewAuthorizer(cfg AuthConfig) (*Authorizer, error) {
	if cfg.ACL && cfg.Resolver == nil {
		return nil, errors.New("rpc: auth: ACLs are on but no token resolver is given")
	}
	if cfg.VerifyNodeName && !cfg.TLS {
		return nil, errors.New("rpc: auth: verify_node_name needs TLS: node names are read from client certificates")
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
	ctx, err := a.AuthorizeRequest(ctx, info.FullMethod, req)
	if err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (a *Authorizer) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, err := a.Authorize(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	return handler(srv, contextStream{ServerStream: ss, ctx: ctx})
}

// contextStream is a server stream whose handler sees ctx.
type contextStream struct {
	grpc.ServerStream
	ctx context.Context
}

// Context returns the context the Authorizer made for the handler.
func (s contextStream) Context() context.Context { return s.ctx }

// Authorize decides one call of fullMethod with the caller of ctx. It
// returns the context for the method's handler, which carries the
// caller's acl.CallerNode, or a status error: PermissionDenied for a
// method without a rule, a caller whose role may not call it, a client
// certificate that names no node where one must, or a token that does not
// allow it; Unauthenticated for a missing or unknown token.
func (a *Authorizer) Authorize(ctx context.Context, fullMethod string) (context.Context, error) {
	return a.AuthorizeRequest(ctx, fullMethod, nil)
}

// AuthorizeRequest is Authorize for a call with request req, which may
// need more than its method (acl.RaisedRuleFor): a forced release or
// deregistration needs operator:write too.
func (a *Authorizer) AuthorizeRequest(ctx context.Context, fullMethod string, req any) (context.Context, error) {
	rule, ok := acl.RuleFor(fullMethod)
	var bound acl.CallerNode
	var err error
	if !ok {
		// Fail closed: a method added without a rule is never open.
		err = status.Errorf(codes.PermissionDenied, "%s has no access rule", fullMethod)
	} else {
		bound, err = a.authorize(ctx, fullMethod, rule)
	}
	if raised, ok := acl.RaisedRuleFor(fullMethod, req); err == nil && ok {
		_, err = a.authorize(ctx, fullMethod+" (forced)", raised)
	}
	if err != nil {
		addr := "unknown"
		if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
			addr = p.Addr.String()
		}
		a.log.Debug("call refused", "method", fullMethod, "peer", addr, "error", err)
		return ctx, err
	}
	// What a forwarding server passed on can only narrow what the caller's
	// own credentials allow, so it is read from any peer.
	return acl.WithCallerNode(ctx, bound.Merge(acl.CallerNodeFromIncoming(ctx))), nil
}

// authorize decides one call of method (named in errors) under rule, and
// returns the node bindings of the caller's credentials.
func (a *Authorizer) authorize(ctx context.Context, method string, rule acl.Rule) (acl.CallerNode, error) {
	var bound acl.CallerNode
	role := tlsutil.RoleCLI
	if a.cfg.TLS {
		state, verified := peerTLS(ctx)
		if verified {
			if r, ok := tlsutil.PeerRole(state, a.cfg.Region); ok {
				role = r
			}
		}
		if rule.Peers&peersOf(role) == 0 {
			return bound, status.Errorf(codes.PermissionDenied, "%s cannot be called with a %s certificate (%s)",
				method, role, describePeers(rule.Peers))
		}
		if a.cfg.VerifyNodeName && role == tlsutil.RoleClient {
			var err error
			if bound, err = certificateNode(state, a.cfg.Region, method, rule); err != nil {
				return bound, err
			}
		}
		if rule.ServerIdentity && role == tlsutil.RoleServer {
			return bound, nil
		}
	}
	if !a.cfg.ACL || rule.Token == acl.TokenNone {
		return bound, nil
	}
	secret := acl.TokenFromContext(ctx)
	if secret == "" && rule.Token != acl.TokenCapability {
		return bound, status.Errorf(codes.Unauthenticated, "%s needs a token: none was given", method)
	}
	granted, err := a.cfg.Resolver.ResolveToken(ctx, secret)
	switch {
	case errors.Is(err, acl.ErrTokenNotFound):
		return bound, status.Errorf(codes.Unauthenticated, "%s: the token given is unknown (deleted, or from another cluster)", method)
	case err != nil:
		if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown {
			return bound, status.Errorf(s.Code(), "%s: resolve token: %s", method, s.Message())
		}
		return bound, status.Errorf(codes.Unavailable, "%s: resolve token: %v", method, err)
	}
	if id := granted.NodeIdentity(); id != "" {
		bound = bound.BindToken(id)
	}
	switch rule.Token {
	case acl.TokenAny:
		return bound, nil
	case acl.TokenManagement:
		if granted.IsManagement() {
			return bound, nil
		}
		return bound, status.Errorf(codes.PermissionDenied, "%s needs a management token", method)
	}
	if granted.Allows(rule.Capability) {
		return bound, nil
	}
	if secret == "" {
		return bound, status.Errorf(codes.Unauthenticated, "%s needs a token that allows %s: none was given, and the %q policy does not allow it",
			method, rule.Capability, acl.AnonymousPolicy)
	}
	return bound, status.Errorf(codes.PermissionDenied, "%s needs %s, which the token does not allow", method, rule.Capability)
}

// certificateNode binds a caller with a client certificate, with
// VerifyNodeName, to the node its certificate names. A node method needs
// a certificate that names one; a certificate that names two nodes is
// refused for every method.
func certificateNode(state tls.ConnectionState, region, method string, rule acl.Rule) (acl.CallerNode, error) {
	name, err := tlsutil.PeerNodeName(state, region)
	switch {
	case err != nil:
		return acl.CallerNode{}, status.Errorf(codes.PermissionDenied, "%s: the client %v", method, err)
	case name != "":
		return acl.CallerNode{}.BindCertificate(name), nil
	case rule.Node:
		return acl.CallerNode{}, status.Errorf(codes.PermissionDenied,
			"%s needs a client certificate that names its node (tls.verify_node_name is on), and this one names none: "+
				"make one with `csisupd tls cert create --client --node NAME`", method)
	}
	return acl.CallerNode{}, nil
}

// peerTLS returns the TLS state of the caller's connection; false when
// the connection is not TLS.
func peerTLS(ctx context.Context) (tls.ConnectionState, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return tls.ConnectionState{}, false
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return tls.ConnectionState{}, false
	}
	return info.State, true
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
