package server

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/acl"
	"github.com/csisupd/csisupd/internal/ids"
	"github.com/csisupd/csisupd/internal/safefile"
	"github.com/csisupd/csisupd/internal/server/fsm"
	"github.com/csisupd/csisupd/internal/server/raftnode"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
	"github.com/hashicorp/go-hclog"
)

// ACLBootstrapResetFile is the name, in a server's data dir, of the file an
// operator writes the current bootstrap index into to allow one more ACL
// bootstrap on the leader.
const ACLBootstrapResetFile = "acl-bootstrap-reset"

// bootstrapTokenName is the name of the token Bootstrap creates.
const bootstrapTokenName = "Bootstrap Token"

// aclService implements csisupd.v1.ACL. Writes and reads run on the
// leader; TokenSelf resolves on the server called, from its replicated
// state, because a forwarded request does not carry the caller's token.
// Who may call which method is checked by the gRPC interceptor, not here.
type aclService struct {
	csisupdv1.UnimplementedACLServer
	fwd    *forwarder
	node   *raftnode.Node
	state  func() *state.Store
	logger hclog.Logger
	// resetPath is the ACL bootstrap reset file in this server's data dir.
	resetPath string
}

// routeACL is route for the ACL service.
func routeACL[Resp any](ctx context.Context, f *forwarder, read bool,
	remote func(context.Context, csisupdv1.ACLClient) (Resp, error),
	local func() (Resp, error),
) (Resp, error) {
	return routeVia(ctx, f, false, read, csisupdv1.NewACLClient, remote, local)
}

// ResolveToken resolves a secret id against this server's replicated
// state (any server can answer; a follower may lag the leader briefly).
// An empty secret gets the rules of the policy named acl.AnonymousPolicy,
// or acl.DenyAll when there is none, and a nil token. An unknown secret
// is an error that matches acl.ErrTokenNotFound. A management token gets
// acl.Management; a client token the rules of its policies that exist.
// The token returned has no secret id.
func (s *Server) ResolveToken(secret string) (*acl.ACL, *csisupdv1.ACLToken, error) {
	a, tok, _, err := s.State().ResolveToken(secret)
	if err != nil {
		return nil, nil, fmt.Errorf("resolve acl token: %w", err)
	}
	return a, statepb.ACLTokenView(tok), nil
}

func (a *aclService) Bootstrap(ctx context.Context, req *csisupdv1.ACLBootstrapRequest) (*csisupdv1.ACLBootstrapResponse, error) {
	return routeACL(ctx, a.fwd, false,
		func(ctx context.Context, cl csisupdv1.ACLClient) (*csisupdv1.ACLBootstrapResponse, error) {
			return cl.Bootstrap(ctx, req)
		},
		func() (*csisupdv1.ACLBootstrapResponse, error) {
			tok, err := a.bootstrap()
			if err != nil {
				return nil, err
			}
			return &csisupdv1.ACLBootstrapResponse{Token: tok}, nil
		})
}

// bootstrap creates the first management token on the leader, or one
// more when the reset file names the current bootstrap index.
func (a *aclService) bootstrap() (*csisupdv1.ACLToken, error) {
	resetPath := a.resetPath
	var reset uint64
	if cur := a.state().ACLBootstrapIndex(); cur != 0 {
		named, err := readResetIndex(resetPath)
		if err != nil {
			return nil, bootstrapDoneStatus(cur, resetPath, err)
		}
		reset = named
	}
	accessor, err := acl.NewAccessorID()
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	secret, err := acl.NewSecretID()
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	now := timestamppb.Now()
	rec := &statepb.ACLTokenRecord{AccessorId: accessor, SecretHash: acl.HashSecret(secret),
		Name: bootstrapTokenName, Type: acl.TypeManagement, CreateTime: now}
	idx, err := a.node.Apply(&statepb.LogEntry{Time: now, Command: &statepb.LogEntry_AclBootstrap{
		AclBootstrap: &statepb.ACLBootstrapCommand{Token: rec, ResetIndex: reset},
	}})
	if err != nil {
		var done *fsm.BootstrappedError
		if errors.As(err, &done) {
			var why error
			if reset != 0 {
				why = fmt.Errorf("the reset file %s names index %d", resetPath, reset)
			}
			return nil, bootstrapDoneStatus(done.Index, resetPath, why)
		}
		return nil, toStatus(err)
	}
	if reset != 0 {
		if err := os.Remove(resetPath); err != nil && !os.IsNotExist(err) {
			a.logger.Warn("remove the ACL bootstrap reset file", "path", resetPath, "error", err)
		}
		a.logger.Warn("ACL bootstrap reset: created a new management token", "accessor_id", accessor, "index", idx, "reset_index", reset)
	} else {
		a.logger.Info("ACL bootstrapped", "accessor_id", accessor, "index", idx)
	}
	tok := statepb.ACLTokenView(rec)
	tok.SecretId = secret
	return tok, nil
}

// readResetIndex reads the bootstrap index an operator wrote into the
// reset file; errors say why it allows no reset.
func readResetIndex(path string) (uint64, error) {
	data, err := safefile.Read(context.Background(), path, safefile.Spec{What: "ACL bootstrap reset file", MaxSize: 4 << 10})
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	text := strings.TrimSpace(string(data))
	n, err := strconv.ParseUint(text, 10, 64)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("the reset file %s holds %q, not a bootstrap index", path, text)
	}
	return n, nil
}

// bootstrapDoneStatus is the refusal of a second bootstrap: it names the
// index to write into the reset file, and why, when given, the file there
// allowed no reset.
func bootstrapDoneStatus(index uint64, resetPath string, why error) error {
	msg := fmt.Sprintf("ACL bootstrap already done at index %d", index)
	if why != nil {
		msg += "; " + why.Error()
	}
	msg += fmt.Sprintf("; to reset, write %d into %s on the leader and bootstrap again", index, resetPath)
	return status.Error(codes.FailedPrecondition, msg)
}

func (a *aclService) UpsertPolicy(ctx context.Context, req *csisupdv1.ACLUpsertPolicyRequest) (*csisupdv1.ACLUpsertPolicyResponse, error) {
	p := req.GetPolicy()
	if p == nil {
		return nil, status.Error(codes.InvalidArgument, "acl policy upsert: policy is required")
	}
	entry := &statepb.ACLPolicy{Name: p.GetName(), Description: p.GetDescription(), Rules: p.GetRules()}
	if _, err := state.ParsePolicyRules(entry); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "acl policy upsert: %v", err)
	}
	return routeACL(ctx, a.fwd, false,
		func(ctx context.Context, cl csisupdv1.ACLClient) (*csisupdv1.ACLUpsertPolicyResponse, error) {
			return cl.UpsertPolicy(ctx, req)
		},
		func() (*csisupdv1.ACLUpsertPolicyResponse, error) {
			idx, err := a.node.Apply(&statepb.LogEntry{Command: &statepb.LogEntry_AclPolicyUpsert{AclPolicyUpsert: entry}})
			if err != nil {
				return nil, toStatus(err)
			}
			a.logger.Info("ACL policy written", "policy", p.GetName(), "index", idx)
			stored := a.state().ACLPolicy(p.GetName())
			if stored == nil {
				return nil, status.Errorf(codes.Aborted, "acl policy %q was deleted while it was written", p.GetName())
			}
			return &csisupdv1.ACLUpsertPolicyResponse{Policy: statepb.ACLPolicyToAPI(stored)}, nil
		})
}

func (a *aclService) ListPolicies(ctx context.Context, req *csisupdv1.ACLListPoliciesRequest) (*csisupdv1.ACLListPoliciesResponse, error) {
	return routeACL(ctx, a.fwd, true,
		func(ctx context.Context, cl csisupdv1.ACLClient) (*csisupdv1.ACLListPoliciesResponse, error) {
			return cl.ListPolicies(ctx, req)
		},
		func() (*csisupdv1.ACLListPoliciesResponse, error) {
			return &csisupdv1.ACLListPoliciesResponse{Policies: statepb.ACLPoliciesToAPI(a.state().ACLPolicies())}, nil
		})
}

func (a *aclService) GetPolicy(ctx context.Context, req *csisupdv1.ACLGetPolicyRequest) (*csisupdv1.ACLGetPolicyResponse, error) {
	return routeACL(ctx, a.fwd, true,
		func(ctx context.Context, cl csisupdv1.ACLClient) (*csisupdv1.ACLGetPolicyResponse, error) {
			return cl.GetPolicy(ctx, req)
		},
		func() (*csisupdv1.ACLGetPolicyResponse, error) {
			p := a.state().ACLPolicy(req.GetName())
			if p == nil {
				return nil, status.Errorf(codes.NotFound, "acl policy %q not found", req.GetName())
			}
			return &csisupdv1.ACLGetPolicyResponse{Policy: statepb.ACLPolicyToAPI(p)}, nil
		})
}

func (a *aclService) DeletePolicy(ctx context.Context, req *csisupdv1.ACLDeletePolicyRequest) (*csisupdv1.ACLDeletePolicyResponse, error) {
	return routeACL(ctx, a.fwd, false,
		func(ctx context.Context, cl csisupdv1.ACLClient) (*csisupdv1.ACLDeletePolicyResponse, error) {
			return cl.DeletePolicy(ctx, req)
		},
		func() (*csisupdv1.ACLDeletePolicyResponse, error) {
			if a.state().ACLPolicy(req.GetName()) == nil {
				return nil, status.Errorf(codes.NotFound, "acl policy %q not found", req.GetName())
			}
			idx, err := a.node.Apply(&statepb.LogEntry{Command: &statepb.LogEntry_AclPolicyDelete{AclPolicyDelete: req.GetName()}})
			if err != nil {
				return nil, toStatus(err)
			}
			a.logger.Info("ACL policy deleted", "policy", req.GetName(), "index", idx)
			return &csisupdv1.ACLDeletePolicyResponse{}, nil
		})
}

// tokenRequest checks a CreateToken request and returns its type and
// policy names, duplicates dropped. A node identity needs a client token
// and a node name's syntax; with one, a client token needs no policy.
func tokenRequest(req *csisupdv1.ACLCreateTokenRequest) (string, []string, error) {
	typ := req.GetType()
	if typ == "" {
		typ = acl.TypeClient
	}
	if len(req.GetName()) > state.MaxACLTokenName {
		return "", nil, status.Errorf(codes.InvalidArgument, "acl token: name is %d bytes, at most %d are allowed", len(req.GetName()), state.MaxACLTokenName)
	}
	var names []string
	seen := map[string]bool{}
	for _, n := range req.GetPolicies() {
		if err := acl.ValidatePolicyName(n); err != nil {
			return "", nil, status.Errorf(codes.InvalidArgument, "acl token: %v", err)
		}
		if !seen[n] {
			seen[n] = true
			names = append(names, n)
		}
	}
	if id := req.GetNodeIdentity(); id != "" {
		if typ != acl.TypeClient {
			return "", nil, status.Errorf(codes.InvalidArgument, "acl token: node identity %q: a %s token takes no node identity, only a %s token", id, typ, acl.TypeClient)
		}
		if err := ids.CheckNodeName(id); err != nil {
			return "", nil, status.Errorf(codes.InvalidArgument, "acl token: node identity %v", err)
		}
	}
	switch typ {
	case acl.TypeClient:
		if len(names) == 0 && req.GetNodeIdentity() == "" {
			return "", nil, status.Error(codes.InvalidArgument, "acl token: a client token needs at least one policy or a node identity")
		}
		if len(names) > state.MaxACLTokenPolicies {
			return "", nil, status.Errorf(codes.InvalidArgument, "acl token: %d policies, at most %d are allowed", len(names), state.MaxACLTokenPolicies)
		}
	case acl.TypeManagement:
		if len(names) > 0 {
			return "", nil, status.Error(codes.InvalidArgument, "acl token: a management token takes no policies")
		}
	default:
		return "", nil, status.Errorf(codes.InvalidArgument, "acl token: type %q: want %s or %s", typ, acl.TypeClient, acl.TypeManagement)
	}
	return typ, names, nil
}

func (a *aclService) CreateToken(ctx context.Context, req *csisupdv1.ACLCreateTokenRequest) (*csisupdv1.ACLCreateTokenResponse, error) {
	typ, names, err := tokenRequest(req)
	if err != nil {
		return nil, err
	}
	return routeACL(ctx, a.fwd, false,
		func(ctx context.Context, cl csisupdv1.ACLClient) (*csisupdv1.ACLCreateTokenResponse, error) {
			return cl.CreateToken(ctx, req)
		},
		func() (*csisupdv1.ACLCreateTokenResponse, error) {
			st := a.state()
			for _, n := range names {
				if st.ACLPolicy(n) == nil {
					return nil, status.Errorf(codes.InvalidArgument, "acl token: policy %q does not exist", n)
				}
			}
			accessor, err := acl.NewAccessorID()
			if err != nil {
				return nil, status.Error(codes.Internal, err.Error())
			}
			secret, err := acl.NewSecretID()
			if err != nil {
				return nil, status.Error(codes.Internal, err.Error())
			}
			now := timestamppb.Now()
			rec := &statepb.ACLTokenRecord{AccessorId: accessor, SecretHash: acl.HashSecret(secret),
				Name: req.GetName(), Type: typ, Policies: names, NodeIdentity: req.GetNodeIdentity(), CreateTime: now}
			idx, err := a.node.Apply(&statepb.LogEntry{Time: now, Command: &statepb.LogEntry_AclTokenUpsert{AclTokenUpsert: rec}})
			if err != nil {
				return nil, toStatus(err)
			}
			a.logger.Info("ACL token created", "accessor_id", accessor, "type", typ, "policies", names,
				"node_identity", req.GetNodeIdentity(), "index", idx)
			tok := statepb.ACLTokenView(rec)
			tok.SecretId = secret
			return &csisupdv1.ACLCreateTokenResponse{Token: tok}, nil
		})
}

func (a *aclService) ListTokens(ctx context.Context, req *csisupdv1.ACLListTokensRequest) (*csisupdv1.ACLListTokensResponse, error) {
	return routeACL(ctx, a.fwd, true,
		func(ctx context.Context, cl csisupdv1.ACLClient) (*csisupdv1.ACLListTokensResponse, error) {
			return cl.ListTokens(ctx, req)
		},
		func() (*csisupdv1.ACLListTokensResponse, error) {
			recs := a.state().ACLTokens()
			out := make([]*csisupdv1.ACLToken, len(recs))
			for i, r := range recs {
				out[i] = statepb.ACLTokenView(r)
			}
			return &csisupdv1.ACLListTokensResponse{Tokens: out}, nil
		})
}

func (a *aclService) GetToken(ctx context.Context, req *csisupdv1.ACLGetTokenRequest) (*csisupdv1.ACLGetTokenResponse, error) {
	return routeACL(ctx, a.fwd, true,
		func(ctx context.Context, cl csisupdv1.ACLClient) (*csisupdv1.ACLGetTokenResponse, error) {
			return cl.GetToken(ctx, req)
		},
		func() (*csisupdv1.ACLGetTokenResponse, error) {
			r := a.state().ACLToken(req.GetAccessorId())
			if r == nil {
				return nil, status.Errorf(codes.NotFound, "acl token %q not found", req.GetAccessorId())
			}
			return &csisupdv1.ACLGetTokenResponse{Token: statepb.ACLTokenView(r)}, nil
		})
}

func (a *aclService) DeleteToken(ctx context.Context, req *csisupdv1.ACLDeleteTokenRequest) (*csisupdv1.ACLDeleteTokenResponse, error) {
	return routeACL(ctx, a.fwd, false,
		func(ctx context.Context, cl csisupdv1.ACLClient) (*csisupdv1.ACLDeleteTokenResponse, error) {
			return cl.DeleteToken(ctx, req)
		},
		func() (*csisupdv1.ACLDeleteTokenResponse, error) {
			if a.state().ACLToken(req.GetAccessorId()) == nil {
				return nil, status.Errorf(codes.NotFound, "acl token %q not found", req.GetAccessorId())
			}
			idx, err := a.node.Apply(&statepb.LogEntry{Command: &statepb.LogEntry_AclTokenDelete{AclTokenDelete: req.GetAccessorId()}})
			if err != nil {
				return nil, toStatus(err)
			}
			a.logger.Info("ACL token deleted", "accessor_id", req.GetAccessorId(), "index", idx)
			return &csisupdv1.ACLDeleteTokenResponse{}, nil
		})
}

func (a *aclService) TokenSelf(ctx context.Context, _ *csisupdv1.ACLTokenSelfRequest) (*csisupdv1.ACLTokenSelfResponse, error) {
	secret := acl.TokenFromContext(ctx)
	if secret == "" {
		return nil, status.Error(codes.Unauthenticated, "acl token self: the request carries no ACL token")
	}
	_, tok, _, err := a.state().ResolveToken(secret)
	if err != nil {
		err = fmt.Errorf("resolve acl token: %w", err)
		if errors.Is(err, acl.ErrTokenNotFound) {
			return nil, status.Error(codes.Unauthenticated, "acl token self: ACL token not found")
		}
		return nil, toStatus(err)
	}
	return &csisupdv1.ACLTokenSelfResponse{Token: statepb.ACLTokenView(tok)}, nil
}
