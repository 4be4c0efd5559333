package rpc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/acl"
	"github.com/csisupd/csisupd/internal/testutil"
	"github.com/csisupd/csisupd/internal/tlsutil"
)

// callerHeader is the response header the echo services below answer
// with: the acl.CallerNode the Authorizer gave their handler.
const callerHeader = "test-caller-node"

// echoCluster answers NodeHeartbeat with the caller's CallerNode in a
// header; the other Cluster methods stay unimplemented.
type echoCluster struct {
	csisupdv1.UnimplementedClusterServer
}

func (echoCluster) NodeHeartbeat(ctx context.Context, _ *csisupdv1.NodeHeartbeatRequest) (*csisupdv1.NodeHeartbeatResponse, error) {
	return &csisupdv1.NodeHeartbeatResponse{}, grpc.SetHeader(ctx, callerMD(ctx))
}

// callerMD is the header that shows the CallerNode of ctx.
func callerMD(ctx context.Context) metadata.MD {
	return metadata.Pairs(callerHeader, acl.CallerNodeFromContext(ctx).String())
}

// echoAgent answers Status, and the stream WatchEvents, the same way.
type echoAgent struct {
	csisupdv1.UnimplementedAgentServer
}

func (echoAgent) Status(ctx context.Context, _ *csisupdv1.StatusRequest) (*csisupdv1.StatusResponse, error) {
	return &csisupdv1.StatusResponse{}, grpc.SetHeader(ctx, callerMD(ctx))
}

func (echoAgent) WatchEvents(_ *csisupdv1.WatchEventsRequest, s grpc.ServerStreamingServer[csisupdv1.Event]) error {
	return s.SendHeader(callerMD(s.Context()))
}

// nodePKI is a CA, a server certificate in files, and certificates of
// clients with and without a node name, a CLI and a server in memory.
type nodePKI struct {
	dir   string
	pool  *x509.CertPool
	pairs map[string]tls.Certificate
}

func newNodePKI(t *testing.T) *nodePKI {
	t.Helper()
	caCert, caKey, err := tlsutil.GenerateCA(tlsutil.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p := &nodePKI{dir: testutil.TempDir(t), pool: x509.NewCertPool(), pairs: map[string]tls.Certificate{}}
	p.pool.AppendCertsFromPEM(caCert)
	mp := &matrixPKI{dir: p.dir}
	mp.write(t, "ca.pem", caCert)
	for name, opts := range map[string]tlsutil.CertOptions{
		"server":      {Role: tlsutil.RoleServer},
		"client":      {Role: tlsutil.RoleClient},
		"client-node": {Role: tlsutil.RoleClient, NodeName: "node-1"},
		"cli":         {Role: tlsutil.RoleCLI},
	} {
		opts.CACertPEM, opts.CAKeyPEM = caCert, caKey
		c, k, err := tlsutil.GenerateCert(opts)
		if err != nil {
			t.Fatal(err)
		}
		if name == "server" {
			mp.write(t, "server.pem", c)
			mp.write(t, "server-key.pem", k)
		}
		pair, err := tls.X509KeyPair(c, k)
		if err != nil {
			t.Fatal(err)
		}
		p.pairs[name] = pair
	}
	return p
}

// serve starts a gRPC server on loopback with TLS (verify_incoming), ACLs
// resolving tokens, and verify_node_name as given, serving the echo
// services.
func (p *nodePKI) serve(t *testing.T, verifyNodeName bool, tokens map[string]*acl.ACL) string {
	t.Helper()
	conf, err := tlsutil.New(tlsutil.Config{
		CAFile: filepath.Join(p.dir, "ca.pem"), CertFile: filepath.Join(p.dir, "server.pem"),
		KeyFile: filepath.Join(p.dir, "server-key.pem"), VerifyIncoming: true,
	}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	auth, err := NewAuthorizer(AuthConfig{TLS: true, ACL: true, VerifyNodeName: verifyNodeName,
		Resolver: TokenResolverFunc(func(_ context.Context, secret string) (*acl.ACL, error) {
			if a, ok := tokens[secret]; ok {
				return a, nil
			}
			return nil, fmt.Errorf("token: %w", acl.ErrTokenNotFound)
		})})
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(append(auth.ServerOptions(), grpc.Creds(credentials.NewTLS(conf.IncomingConfig())))...)
	csisupdv1.RegisterClusterServer(g, echoCluster{})
	csisupdv1.RegisterAgentServer(g, echoAgent{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testutil.ServeGRPC(t, ln, g)
	return ln.Addr().String()
}

// dial connects with the certificate named cert and sends token.
func (p *nodePKI) dial(t *testing.T, addr, cert, token string) *grpc.ClientConn {
	t.Helper()
	pair := p.pairs[cert]
	tc := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: p.pool, ServerName: "localhost", Certificates: []tls.Certificate{pair}}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tc))}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(csisupdv1.TokenCredentials{Secret: token}))
	}
	return testutil.DialGRPC(t, addr, opts...)
}

// nodeTokens are the tokens of the tests: one that allows node:write
// without an identity, two with node identities, and one with the identity
// of node-1 and a policy that allows agent:read and plugin:read.
func nodeTokens(t *testing.T) map[string]*acl.ACL {
	t.Helper()
	parse := func(rules string) *acl.Policy {
		p, err := acl.ParsePolicy("p", "p.hcl", []byte(rules))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	return map[string]*acl.ACL{
		"shared":     acl.Compile(parse(`node { policy = "write" }` + "\n" + `agent { policy = "read" }`)),
		"node-1":     acl.DenyAll().WithNodeIdentity("node-1"),
		"node-2":     acl.DenyAll().WithNodeIdentity("node-2"),
		"node-1+ops": acl.Compile(parse(`agent { policy = "read" }` + "\n" + `plugin { policy = "read" }`)).WithNodeIdentity("node-1"),
	}
}

// callerOf is the outcome of a call: the CallerNode its handler saw, or
// the refusal's code and message.
func callerOf(err error, md metadata.MD) string {
	if err != nil {
		return status.Code(err).String() + ": " + status.Convert(err).Message()
	}
	if v := md.Get(callerHeader); len(v) == 1 {
		return v[0]
	}
	return fmt.Sprintf("no caller header in %v", md)
}

// TestAuthorizerCallerNode checks the acl.CallerNode the Authorizer puts
// into the handler's context, unary and streaming, for callers bound by a
// token, by a certificate with verify_node_name, by both, and by neither,
// and by what a forwarding server passed on; and that a node-identity
// token allows no other method.
func TestAuthorizerCallerNode(t *testing.T) {
	pki := newNodePKI(t)
	tokens := nodeTokens(t)
	servers := map[bool]string{false: pki.serve(t, false, tokens), true: pki.serve(t, true, tokens)}
	forwarded := func(values ...string) metadata.MD {
		md := metadata.MD{}
		for _, v := range values {
			md.Append(acl.CallerNodeMetadataKey, v)
		}
		return md
	}
	tests := []struct {
		name       string
		verify     bool
		cert       string
		token      string
		md         metadata.MD
		method     string // "heartbeat", "status" or "watch"
		want       string
		wantNodeOK []string // of node-1 and node-2, those Check allows
	}{
		{name: "neither", cert: "client", token: "shared", method: "heartbeat", want: "unbound", wantNodeOK: []string{"node-1", "node-2"}},
		{name: "neither, a node certificate without verify_node_name", cert: "client-node", token: "shared", method: "heartbeat",
			want: "unbound", wantNodeOK: []string{"node-1", "node-2"}},
		{name: "token", cert: "client", token: "node-1", method: "heartbeat", want: "token=node-1", wantNodeOK: []string{"node-1"}},
		{name: "certificate", verify: true, cert: "client-node", token: "shared", method: "heartbeat",
			want: "certificate=node-1", wantNodeOK: []string{"node-1"}},
		{name: "both, agreeing", verify: true, cert: "client-node", token: "node-1", method: "heartbeat",
			want: "certificate=node-1,token=node-1", wantNodeOK: []string{"node-1"}},
		{name: "both, disagreeing: no node", verify: true, cert: "client-node", token: "node-2", method: "heartbeat",
			want: "certificate=node-1,token=node-2"},
		{name: "streaming: certificate and token", verify: true, cert: "client-node", token: "node-1+ops", method: "watch",
			want: "certificate=node-1,token=node-1", wantNodeOK: []string{"node-1"}},
		{name: "a forwarding server passes the caller's bindings on", verify: true, cert: "server",
			md: forwarded("token=node-1", "certificate=node-1"), method: "heartbeat",
			want: "token=node-1,certificate=node-1", wantNodeOK: []string{"node-1"}},
		{name: "a client's own metadata only narrows", verify: true, cert: "client-node", token: "shared",
			md: forwarded("token=node-2"), method: "heartbeat", want: "certificate=node-1,token=node-2"},
		{name: "unreadable forwarded metadata binds to no node", cert: "server", md: forwarded("node-1"), method: "heartbeat",
			want: "malformed=node-1"},
		{name: "a node-identity token allows no other method", cert: "cli", token: "node-1", method: "status",
			want: "PermissionDenied: /csisupd.v1.Agent/Status needs agent:read, which the token does not allow"},
		{name: "a node-identity token with a policy allows it too", cert: "cli", token: "node-1+ops", method: "status",
			want: "token=node-1", wantNodeOK: []string{"node-1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn := pki.dial(t, servers[tt.verify], tt.cert, tt.token)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if tt.md != nil {
				ctx = metadata.NewOutgoingContext(ctx, tt.md)
			}
			var md metadata.MD
			var err error
			switch tt.method {
			case "heartbeat":
				_, err = csisupdv1.NewClusterClient(conn).NodeHeartbeat(ctx, &csisupdv1.NodeHeartbeatRequest{}, grpc.Header(&md))
			case "status":
				_, err = csisupdv1.NewAgentClient(conn).Status(ctx, &csisupdv1.StatusRequest{}, grpc.Header(&md))
			case "watch":
				var s grpc.ServerStreamingClient[csisupdv1.Event]
				if s, err = csisupdv1.NewAgentClient(conn).WatchEvents(ctx, &csisupdv1.WatchEventsRequest{}); err == nil {
					// A refused stream ends without headers; its status
					// comes with the first receive.
					if md, err = s.Header(); err == nil && len(md) == 0 {
						_, err = s.Recv()
					}
				}
			}
			if got := callerOf(err, md); got != tt.want {
				t.Fatalf("caller %q, want %q", got, tt.want)
			}
			if err != nil {
				return
			}
			// The bindings the header shows allow exactly the nodes wanted.
			c := bindingsOf(t, tt.want)
			var ok []string
			for _, n := range []string{"node-1", "node-2"} {
				if c.Check(n) == nil {
					ok = append(ok, n)
				}
			}
			if strings.Join(ok, ",") != strings.Join(tt.wantNodeOK, ",") {
				t.Errorf("the caller may act as %v, want %v", ok, tt.wantNodeOK)
			}
		})
	}
}

// bindingsOf rebuilds a CallerNode from its String, as the handler's
// header carries it.
func bindingsOf(t *testing.T, s string) acl.CallerNode {
	t.Helper()
	if s == "unbound" {
		return acl.CallerNode{}
	}
	md := metadata.MD{}
	for _, v := range strings.Split(s, ",") {
		md.Append(acl.CallerNodeMetadataKey, v)
	}
	return acl.CallerNodeFromIncoming(metadata.NewIncomingContext(context.Background(), md))
}

// TestAuthorizerRefusesUnnamedNodeCertificate refuses, with
// verify_node_name, a node method called with a client certificate that
// names no node, saying how to make one, whatever the token; other methods
// and other roles are not affected, nor anything without verify_node_name.
func TestAuthorizerRefusesUnnamedNodeCertificate(t *testing.T) {
	pki := newNodePKI(t)
	tokens := nodeTokens(t)
	verifying, plain := pki.serve(t, true, tokens), pki.serve(t, false, tokens)
	const refusal = "PermissionDenied: /csisupd.v1.Cluster/NodeHeartbeat needs a client certificate that names its node " +
		"(tls.verify_node_name is on), and this one names none: make one with `csisupd tls cert create --client --node NAME`"
	tests := []struct {
		name, addr, cert, token, method, want string
	}{
		{"node method, unnamed client certificate, shared token", verifying, "client", "shared", "heartbeat", refusal},
		{"node method, unnamed client certificate, node-identity token", verifying, "client", "node-1", "heartbeat", refusal},
		{"node method, named client certificate", verifying, "client-node", "shared", "heartbeat", "certificate=node-1"},
		{"node method, server certificate", verifying, "server", "", "heartbeat", "unbound"},
		{"other method, unnamed client certificate", verifying, "client", "shared", "status", "unbound"},
		{"node method, unnamed client certificate, without verify_node_name", plain, "client", "shared", "heartbeat", "unbound"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn := pki.dial(t, tt.addr, tt.cert, tt.token)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var md metadata.MD
			var err error
			if tt.method == "heartbeat" {
				_, err = csisupdv1.NewClusterClient(conn).NodeHeartbeat(ctx, &csisupdv1.NodeHeartbeatRequest{}, grpc.Header(&md))
			} else {
				_, err = csisupdv1.NewAgentClient(conn).Status(ctx, &csisupdv1.StatusRequest{}, grpc.Header(&md))
			}
			if got := callerOf(err, md); got != tt.want {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestNewAuthorizerVerifyNodeNameNeedsTLS(t *testing.T) {
	_, err := NewAuthorizer(AuthConfig{VerifyNodeName: true})
	if err == nil || !strings.Contains(err.Error(), "verify_node_name needs TLS") {
		t.Fatalf("NewAuthorizer = %v, want a refusal naming verify_node_name", err)
	}
}
