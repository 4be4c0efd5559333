package rpc

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/acl"
	"github.com/csisupd/csisupd/internal/testutil"
	"github.com/csisupd/csisupd/internal/tlsutil"
)

// The expected access of every method, written out here independently of
// package acl's table, so that a change to either shows up as a failure:
//
//	open          anyone, without a token
//	servers       server certificates only, without a token
//	any-token     any valid token
//	management    a management token
//	<res>:<level> a token that allows it; ":ops" means servers and
//	              operators (CLI certificates) may call it, ":agents"
//	              servers and agents (client certificates), ":all" any role
//
// Client certificates reach the Control calls of an agent's local claims
// (list, get, create, delete, claim, release, sync): the Docker volume
// plugin and Agent.ClaimVolume make them with the agent's credentials.
var wantAccess = map[string]string{
	"/grpc.health.v1.Health/Check": "open",
	"/grpc.health.v1.Health/Watch": "open",
	"/grpc.health.v1.Health/List":  "open",

	"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo":      "any-token",
	"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": "any-token",

	"/csisupd.v1.Agent/Status":        "agent:read:all",
	"/csisupd.v1.Agent/ListPlugins":   "plugin:read:all",
	"/csisupd.v1.Agent/GetPlugin":     "plugin:read:all",
	"/csisupd.v1.Agent/WatchEvents":   "plugin:read:all",
	"/csisupd.v1.Agent/Monitor":       "agent:read:all",
	"/csisupd.v1.Agent/Metrics":       "agent:read:all",
	"/csisupd.v1.Agent/Config":        "agent:read:all",
	"/csisupd.v1.Agent/Profile":       "agent:write:all",
	"/csisupd.v1.Agent/HoldLease":     "agent:write:all",
	"/csisupd.v1.Agent/DropLease":     "agent:write:all",
	"/csisupd.v1.Agent/ClaimVolume":   "volume:write:all",
	"/csisupd.v1.Agent/ReleaseVolume": "volume:write:all",

	"/csisupd.v1.ClientCSI/ControllerGetCapabilities":  "volume:read:ops",
	"/csisupd.v1.ClientCSI/ControllerValidateVolume":   "volume:read:ops",
	"/csisupd.v1.ClientCSI/ControllerListVolumes":      "volume:read:ops",
	"/csisupd.v1.ClientCSI/ControllerGetVolume":        "volume:read:ops",
	"/csisupd.v1.ClientCSI/ControllerGetCapacity":      "volume:read:ops",
	"/csisupd.v1.ClientCSI/ControllerListSnapshots":    "volume:read:ops",
	"/csisupd.v1.ClientCSI/ControllerGetSnapshot":      "volume:read:ops",
	"/csisupd.v1.ClientCSI/ControllerGetVolumeHealth":  "volume:read:ops",
	"/csisupd.v1.ClientCSI/ControllerListVolumeHealth": "volume:read:ops",
	"/csisupd.v1.ClientCSI/ControllerAttachVolume":     "volume:write:ops",
	"/csisupd.v1.ClientCSI/ControllerDetachVolume":     "volume:write:ops",
	"/csisupd.v1.ClientCSI/ControllerCreateVolume":     "volume:write:ops",
	"/csisupd.v1.ClientCSI/ControllerDeleteVolume":     "volume:write:ops",
	"/csisupd.v1.ClientCSI/ControllerExpandVolume":     "volume:write:ops",
	"/csisupd.v1.ClientCSI/ControllerCreateSnapshot":   "volume:write:ops",
	"/csisupd.v1.ClientCSI/ControllerDeleteSnapshot":   "volume:write:ops",
	"/csisupd.v1.ClientCSI/ControllerModifyVolume":     "volume:write:ops",

	"/csisupd.v1.Cluster/PeerInfo":          "servers",
	"/csisupd.v1.Cluster/Join":              "servers",
	"/csisupd.v1.Cluster/ServerStats":       "servers",
	"/csisupd.v1.Cluster/NodeRegister":      "node:write:agents",
	"/csisupd.v1.Cluster/NodeUpdatePlugins": "node:write:agents",
	"/csisupd.v1.Cluster/NodeHeartbeat":     "node:write:agents",
	"/csisupd.v1.Cluster/ResolveToken":      "node:write:agents",
	"/csisupd.v1.Cluster/NodeClaims":        "node:write:agents",
	"/csisupd.v1.Cluster/NodeVolumeHealth":  "node:write:agents",
	// An agent renews the leases it holds, for its own node only.
	"/csisupd.v1.Cluster/NodeRenewClaims": "node:write:agents",

	"/csisupd.v1.NodeVolumes/MountVolume":   "volume:write:ops",
	"/csisupd.v1.NodeVolumes/UnmountVolume": "volume:write:ops",
	"/csisupd.v1.NodeVolumes/ExpandVolume":  "volume:write:ops",
	"/csisupd.v1.NodeVolumes/VolumeStats":   "volume:read:ops",
	"/csisupd.v1.NodeVolumes/VolumeHealth":  "volume:read:ops",
	"/csisupd.v1.NodeVolumes/StorageHealth": "volume:read:ops",
	"/csisupd.v1.NodeVolumes/ListMounts":    "volume:read:ops",

	"/csisupd.v1.Control/ListPlugins":    "plugin:read:ops",
	"/csisupd.v1.Control/GetPlugin":      "plugin:read:ops",
	"/csisupd.v1.Control/ListNodes":      "node:read:ops",
	"/csisupd.v1.Control/GetNode":        "node:read:ops",
	"/csisupd.v1.Control/RekeyNode":      "operator:write:ops",
	"/csisupd.v1.Control/ListVolumes":    "volume:read:all",
	"/csisupd.v1.Control/GetVolume":      "volume:read:all",
	"/csisupd.v1.Control/CreateVolume":   "volume:write:all",
	"/csisupd.v1.Control/RegisterVolume": "volume:write:ops",
	"/csisupd.v1.Control/DeleteVolume":   "volume:write:all",
	"/csisupd.v1.Control/ClaimVolume":    "volume:write:all",
	"/csisupd.v1.Control/ReleaseVolume":  "volume:write:all",
	"/csisupd.v1.Control/ExpandVolume":   "volume:write:ops",
	"/csisupd.v1.Control/ModifyVolume":   "volume:write:ops",
	// Renewing a lease keeps a claim taken: a write of the volume.
	"/csisupd.v1.Control/RenewClaims": "volume:write:ops",

	"/csisupd.v1.Control/SetVolumeAvailability": "volume:write:ops",
	"/csisupd.v1.Control/DrainPlugin":           "operator:write:ops",
	"/csisupd.v1.Control/GetPluginDrain":        "plugin:read:ops",
	"/csisupd.v1.Control/GetPluginCapacity":     "plugin:read:ops",
	"/csisupd.v1.Control/GetVolumeHealth":       "volume:read:ops",
	"/csisupd.v1.Control/ListExternalVolumes":   "volume:read:ops",
	"/csisupd.v1.Control/ListExternalSnapshots": "volume:read:ops",

	// A scheduler's sync releases claims; a placement check only reads.
	"/csisupd.v1.Control/SyncNodeClaims": "volume:write:all",
	"/csisupd.v1.Control/CheckClaim":     "volume:read:ops",

	"/csisupd.v1.Control/CreateVolumeSnapshot": "volume:write:ops",
	"/csisupd.v1.Control/ListVolumeSnapshots":  "volume:read:ops",
	"/csisupd.v1.Control/GetVolumeSnapshot":    "volume:read:ops",
	"/csisupd.v1.Control/DeleteVolumeSnapshot": "volume:write:ops",
	"/csisupd.v1.Control/RaftPeers":            "operator:read:ops",
	"/csisupd.v1.Control/RemovePeer":           "operator:write:ops",
	"/csisupd.v1.Control/SnapshotSave":         "operator:write:ops",
	"/csisupd.v1.Control/SnapshotRestore":      "management:ops",
	"/csisupd.v1.Control/WatchEvents":          "node:read:ops",

	"/csisupd.v1.ACL/Bootstrap":    "open:ops",
	"/csisupd.v1.ACL/TokenSelf":    "any-token:ops",
	"/csisupd.v1.ACL/UpsertPolicy": "management:ops",
	"/csisupd.v1.ACL/ListPolicies": "management:ops",
	"/csisupd.v1.ACL/GetPolicy":    "management:ops",
	"/csisupd.v1.ACL/DeletePolicy": "management:ops",
	"/csisupd.v1.ACL/CreateToken":  "management:ops",
	"/csisupd.v1.ACL/ListTokens":   "management:ops",
	"/csisupd.v1.ACL/GetToken":     "management:ops",
	"/csisupd.v1.ACL/DeleteToken":  "management:ops",
}

// The tokens of the matrix: no token, the anonymous policy alone, read on
// every resource, write on every resource, management, and an unknown one.
const (
	tokNone    = ""
	tokAnon    = "anonymous-only"
	tokRead    = "read-everything"
	tokWrite   = "write-everything"
	tokMgmt    = "management"
	tokUnknown = "f3c1e2d4-no-such-token"
)

func matrixTokens(t *testing.T) map[string]*acl.ACL {
	t.Helper()
	policy := func(name, level string) *acl.Policy {
		var b strings.Builder
		for _, r := range acl.Resources() {
			fmt.Fprintf(&b, "%s {\n  policy = %q\n}\n", r, level)
		}
		if level == "" {
			b.Reset()
		}
		p, err := acl.ParsePolicy(name, name+".hcl", []byte(b.String()))
		if err != nil {
			t.Fatalf("policy %s: %v", name, err)
		}
		return p
	}
	anonymous := policy(acl.AnonymousPolicy, "") // no rules: denies everything
	return map[string]*acl.ACL{
		tokNone:  acl.Compile(anonymous),
		tokAnon:  acl.Compile(anonymous),
		tokRead:  acl.Compile(policy("read", "read")),
		tokWrite: acl.Compile(policy("write", "write")),
		tokMgmt:  acl.Management(),
	}
}

// matrixPKI holds one CA and a certificate per role.
type matrixPKI struct {
	dir   string
	ca    []byte
	certs map[tlsutil.Role][2][]byte // cert, key
}

func newMatrixPKI(t testing.TB) *matrixPKI {
	t.Helper()
	caCert, caKey, err := tlsutil.GenerateCA(tlsutil.CAOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p := &matrixPKI{dir: testutil.TempDir(t), ca: caCert, certs: map[tlsutil.Role][2][]byte{}}
	for _, role := range []tlsutil.Role{tlsutil.RoleServer, tlsutil.RoleClient, tlsutil.RoleCLI} {
		c, k, err := tlsutil.GenerateCert(tlsutil.CertOptions{CACertPEM: caCert, CAKeyPEM: caKey, Role: role})
		if err != nil {
			t.Fatal(err)
		}
		p.certs[role] = [2][]byte{c, k}
	}
	p.write(t, "ca.pem", caCert)
	p.write(t, "server.pem", p.certs[tlsutil.RoleServer][0])
	p.write(t, "server-key.pem", p.certs[tlsutil.RoleServer][1])
	return p
}

func (p *matrixPKI) write(t testing.TB, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// dialOptions connect with the certificate of role, or none for "", and
// send token.
func (p *matrixPKI) dialOptions(t testing.TB, role tlsutil.Role, token string) []grpc.DialOption {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(p.ca)
	tc := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, ServerName: "localhost"}
	if role != "" {
		pair, err := tls.X509KeyPair(p.certs[role][0], p.certs[role][1])
		if err != nil {
			t.Fatal(err)
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tc))}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(csisupdv1.TokenCredentials{Secret: token}))
	}
	return opts
}

// serverOptions are the TLS credentials (with the server certificate) and
// the Authorizer, with ACLs on, of a server resolving tokens with resolve.
func (p *matrixPKI) serverOptions(t testing.TB, verifyIncoming bool, resolve TokenResolver) []grpc.ServerOption {
	t.Helper()
	auth, err := NewAuthorizer(AuthConfig{TLS: true, ACL: true, Resolver: resolve})
	if err != nil {
		t.Fatal(err)
	}
	return append(auth.ServerOptions(), p.serverCreds(t, verifyIncoming))
}

// serverCreds returns the TLS credentials of a server with the PKI's
// server certificate.
func (p *matrixPKI) serverCreds(t testing.TB, verifyIncoming bool) grpc.ServerOption {
	t.Helper()
	conf, err := tlsutil.New(tlsutil.Config{
		CAFile: filepath.Join(p.dir, "ca.pem"), CertFile: filepath.Join(p.dir, "server.pem"),
		KeyFile: filepath.Join(p.dir, "server-key.pem"), VerifyIncoming: verifyIncoming,
		VerifyOutgoing: true, VerifyServerHostname: true,
	}, hclog.NewNullLogger())
	if err != nil {
		t.Fatal(err)
	}
	return grpc.Creds(credentials.NewTLS(conf.IncomingConfig()))
}

// dial connects with the certificate of role, or none for "".
func (p *matrixPKI) dial(t *testing.T, addr string, role tlsutil.Role, token string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, p.dialOptions(t, role, token)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// startMatrixServer serves every service of the API, each with its
// Unimplemented handlers (a call that passes the Authorizer ends there),
// health and reflection, behind TLS and the Authorizer.
func startMatrixServer(t *testing.T, pki *matrixPKI, verifyIncoming bool) string {
	t.Helper()
	return startAuthServer(t, pki, verifyIncoming, matrixTokens(t))
}

// startAuthServer is startMatrixServer with tokens of the caller's own.
func startAuthServer(t *testing.T, pki *matrixPKI, verifyIncoming bool, tokens map[string]*acl.ACL) string {
	t.Helper()
	g := grpc.NewServer(pki.serverOptions(t, verifyIncoming, TokenResolverFunc(func(_ context.Context, secret string) (*acl.ACL, error) {
		if a, ok := tokens[secret]; ok {
			return a, nil
		}
		return nil, fmt.Errorf("token: %w", acl.ErrTokenNotFound)
	}))...)
	csisupdv1.RegisterAgentServer(g, csisupdv1.UnimplementedAgentServer{})
	csisupdv1.RegisterClientCSIServer(g, csisupdv1.UnimplementedClientCSIServer{})
	csisupdv1.RegisterClusterServer(g, csisupdv1.UnimplementedClusterServer{})
	csisupdv1.RegisterControlServer(g, csisupdv1.UnimplementedControlServer{})
	csisupdv1.RegisterACLServer(g, csisupdv1.UnimplementedACLServer{})
	csisupdv1.RegisterNodeVolumesServer(g, csisupdv1.UnimplementedNodeVolumesServer{})
	healthpb.RegisterHealthServer(g, health.NewServer())
	reflection.Register(g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	testutil.ServeGRPC(t, ln, g)
	return ln.Addr().String()
}

// servedMethods lists every method of the services the matrix serves,
// from the registered file descriptors: a method added to the API shows up
// here by itself.
func servedMethods(t *testing.T) []protoreflect.MethodDescriptor {
	t.Helper()
	services := map[protoreflect.FullName]bool{
		"grpc.health.v1.Health": true, "grpc.reflection.v1.ServerReflection": true,
		"grpc.reflection.v1alpha.ServerReflection": true,
	}
	var out []protoreflect.MethodDescriptor
	protoregistry.GlobalFiles.RangeFiles(func(fd protoreflect.FileDescriptor) bool {
		for i := 0; i < fd.Services().Len(); i++ {
			sd := fd.Services().Get(i)
			if fd.Package() != "csisupd.v1" && !services[sd.FullName()] {
				continue
			}
			for j := 0; j < sd.Methods().Len(); j++ {
				out = append(out, sd.Methods().Get(j))
			}
		}
		return true
	})
	if len(out) < 50 {
		t.Fatalf("found only %d methods: the API's descriptors are not all registered", len(out))
	}
	return out
}

func fullMethod(m protoreflect.MethodDescriptor) string {
	return "/" + string(m.Parent().FullName()) + "/" + string(m.Name())
}

// call makes one call of m with an empty request and returns its code.
func call(ctx context.Context, conn *grpc.ClientConn, m protoreflect.MethodDescriptor) codes.Code {
	in, out := dynamicpb.NewMessage(m.Input()), dynamicpb.NewMessage(m.Output())
	if !m.IsStreamingClient() && !m.IsStreamingServer() {
		return status.Code(conn.Invoke(ctx, fullMethod(m), in, out))
	}
	desc := &grpc.StreamDesc{ServerStreams: m.IsStreamingServer(), ClientStreams: m.IsStreamingClient()}
	s, err := conn.NewStream(ctx, desc, fullMethod(m))
	if err != nil {
		return status.Code(err)
	}
	if !m.IsStreamingClient() {
		if err := s.SendMsg(in); err != nil && !errors.Is(err, context.Canceled) {
			_ = err // the status comes with RecvMsg
		}
	}
	_ = s.CloseSend()
	err = s.RecvMsg(out)
	if err == nil {
		return codes.OK
	}
	return status.Code(err)
}

// expected is the outcome wantAccess gives for a caller with a
// certificate of role and token: "reached" (the Authorizer let it
// through), or the refusing code.
func expected(access string, role tlsutil.Role, token string) string {
	parts := strings.Split(access, ":")
	kind, peers := parts[0], "all"
	var level string
	switch kind {
	case "open", "any-token", "management":
		if len(parts) > 1 {
			peers = parts[1]
		}
	case "servers":
		peers = "servers"
	default:
		level, peers = parts[1], parts[2]
	}
	// The role first.
	switch {
	case peers == "servers" && role != tlsutil.RoleServer,
		peers == "ops" && role == tlsutil.RoleClient,
		peers == "agents" && role == tlsutil.RoleCLI:
		return codes.PermissionDenied.String()
	}
	reflectionRule := strings.HasPrefix(kind, "any-token") && peers == "all"
	if kind == "open" || kind == "servers" || (role == tlsutil.RoleServer && !reflectionRule) {
		return "reached"
	}
	known := token != tokUnknown
	switch {
	case !known:
		return codes.Unauthenticated.String()
	case kind == "any-token":
		if token == tokNone {
			return codes.Unauthenticated.String()
		}
		return "reached"
	case kind == "management":
		switch token {
		case tokNone:
			return codes.Unauthenticated.String()
		case tokMgmt:
			return "reached"
		}
		return codes.PermissionDenied.String()
	}
	allowed := token == tokMgmt || token == tokWrite || (token == tokRead && level == "read")
	switch {
	case allowed:
		return "reached"
	case token == tokNone:
		return codes.Unauthenticated.String()
	}
	return codes.PermissionDenied.String()
}

func outcome(c codes.Code) string {
	if c == codes.PermissionDenied || c == codes.Unauthenticated {
		return c.String()
	}
	return "reached"
}

// TestAuthorizationMatrix calls every method of every service with every
// token of the matrix and a certificate of every role, and compares the
// outcome with wantAccess.
func TestAuthorizationMatrix(t *testing.T) {
	pki := newMatrixPKI(t)
	addr := startMatrixServer(t, pki, true)
	methods := servedMethods(t)
	for _, m := range methods {
		if _, ok := wantAccess[fullMethod(m)]; !ok {
			t.Errorf("%s is served but has no expected access in wantAccess: decide its rule (package acl) and write it here", fullMethod(m))
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	roles := []tlsutil.Role{tlsutil.RoleServer, tlsutil.RoleClient, tlsutil.RoleCLI}
	tokens := []string{tokNone, tokAnon, tokRead, tokWrite, tokMgmt, tokUnknown}
	for _, role := range roles {
		for _, token := range tokens {
			conn := pki.dial(t, addr, role, token)
			t.Run(fmt.Sprintf("%s/token=%s", role, tokenName(token)), func(t *testing.T) {
				for _, m := range methods {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					got := outcome(call(ctx, conn, m))
					cancel()
					if want := expected(wantAccess[fullMethod(m)], role, token); got != want {
						t.Errorf("%s: got %s, want %s", fullMethod(m), got, want)
					}
				}
			})
		}
	}
}

func tokenName(t string) string {
	if t == "" {
		return "none"
	}
	return t
}

// TestAuthorizationWithoutClientCertificate: with verify_incoming off a
// caller without a certificate is an operator: it can never act as a
// server or an agent.
func TestAuthorizationWithoutClientCertificate(t *testing.T) {
	pki := newMatrixPKI(t)
	addr := startMatrixServer(t, pki, false)
	conn := pki.dial(t, addr, "", tokMgmt)
	for method, want := range map[string]codes.Code{
		"/csisupd.v1.Cluster/Join":         codes.PermissionDenied,
		"/csisupd.v1.Cluster/NodeRegister": codes.PermissionDenied,
		"/csisupd.v1.Control/DeleteVolume": codes.Unimplemented, // reached, with the management token
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := conn.Invoke(ctx, method, &csisupdv1.JoinRequest{}, &csisupdv1.JoinResponse{})
		cancel()
		if status.Code(err) != want {
			t.Errorf("%s without a client certificate: %v, want %s", method, err, want)
		}
	}
}

// TestAuthorizationErrorsNameTheCapability checks the messages operators
// read.
func TestAuthorizationErrorsNameTheCapability(t *testing.T) {
	pki := newMatrixPKI(t)
	addr := startMatrixServer(t, pki, true)
	tests := []struct {
		token, method, want string
		code                codes.Code
	}{
		{tokRead, "/csisupd.v1.Control/DeleteVolume", "needs volume:write, which the token does not allow", codes.PermissionDenied},
		{tokNone, "/csisupd.v1.Control/DeleteVolume", `none was given, and the "anonymous" policy does not allow it`, codes.Unauthenticated},
		{tokUnknown, "/csisupd.v1.Control/ListVolumes", "the token given is unknown", codes.Unauthenticated},
		{tokWrite, "/csisupd.v1.ACL/ListTokens", "needs a management token", codes.PermissionDenied},
	}
	for _, tt := range tests {
		conn := pki.dial(t, addr, tlsutil.RoleCLI, tt.token)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := conn.Invoke(ctx, tt.method, &csisupdv1.VolumeDeleteRequest{}, &csisupdv1.VolumeDeleteResponse{})
		cancel()
		if status.Code(err) != tt.code || !strings.Contains(status.Convert(err).Message(), tt.want) {
			t.Errorf("%s with %s: %v, want %s containing %q", tt.method, tokenName(tt.token), err, tt.code, tt.want)
		}
		if tt.token != "" && strings.Contains(status.Convert(err).Message(), tt.token) {
			t.Errorf("%s: the error shows the token: %v", tt.method, err)
		}
	}
	conn := pki.dial(t, addr, tlsutil.RoleClient, tokMgmt)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := conn.Invoke(ctx, "/csisupd.v1.Cluster/Join", &csisupdv1.JoinRequest{}, &csisupdv1.JoinResponse{})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "client certificate") ||
		!strings.Contains(err.Error(), "only servers may call it") {
		t.Errorf("Join with a client certificate: %v", err)
	}
}

// TestForcedCallsNeedOperatorWrite: a release forced on a node that is up
// (force 2) and a forced deregistration can leave a volume held on a
// live node, so they need operator:write besides the method's
// volume:write; a plain or once-forced release does not.
func TestForcedCallsNeedOperatorWrite(t *testing.T) {
	policy := func(name, text string) *acl.ACL {
		p, err := acl.ParsePolicy(name, name+".hcl", []byte(text))
		if err != nil {
			t.Fatalf("policy %s: %v", name, err)
		}
		return acl.Compile(p)
	}
	const volumes, operators, operatorsOnly = "volumes-only", "volumes-and-operator", "operator-only"
	pki := newMatrixPKI(t)
	addr := startAuthServer(t, pki, true, map[string]*acl.ACL{
		volumes:       policy("volumes", `volume { policy = "write" }`),
		operators:     policy("operators", "volume {\n  policy = \"write\"\n}\noperator {\n  policy = \"write\"\n}\n"),
		operatorsOnly: policy("operator", `operator { policy = "write" }`),
		tokMgmt:       acl.Management(),
	})
	release := func(force uint32) any { return &csisupdv1.VolumeReleaseRequest{Id: "v", NodeId: "n", Force: force} }
	deregister := func(force bool) any {
		return &csisupdv1.VolumeDeleteRequest{Id: "v", DeregisterOnly: true, Force: force}
	}
	const releaseMethod, deleteMethod = csisupdv1.Control_ReleaseVolume_FullMethodName, csisupdv1.Control_DeleteVolume_FullMethodName
	tests := []struct {
		role   tlsutil.Role
		token  string
		method string
		req    any
		want   codes.Code // Unimplemented: the Authorizer let it through
		msg    string
	}{
		{tlsutil.RoleCLI, volumes, releaseMethod, release(0), codes.Unimplemented, ""},
		{tlsutil.RoleCLI, volumes, releaseMethod, release(1), codes.Unimplemented, ""},
		{tlsutil.RoleCLI, volumes, releaseMethod, release(2), codes.PermissionDenied, "(forced) needs operator:write"},
		{tlsutil.RoleCLI, operators, releaseMethod, release(2), codes.Unimplemented, ""},
		{tlsutil.RoleCLI, operatorsOnly, releaseMethod, release(2), codes.PermissionDenied, "needs volume:write"},
		{tlsutil.RoleCLI, tokMgmt, releaseMethod, release(2), codes.Unimplemented, ""},
		{tlsutil.RoleCLI, volumes, deleteMethod, deregister(false), codes.Unimplemented, ""},
		{tlsutil.RoleCLI, volumes, deleteMethod, deregister(true), codes.PermissionDenied, "(forced) needs operator:write"},
		{tlsutil.RoleCLI, operators, deleteMethod, deregister(true), codes.Unimplemented, ""},
		// A server forwarding a forced call passes by its identity.
		{tlsutil.RoleServer, "", releaseMethod, release(2), codes.Unimplemented, ""},
	}
	for _, tt := range tests {
		conn := pki.dial(t, addr, tt.role, tt.token)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := conn.Invoke(ctx, tt.method, tt.req, &csisupdv1.VolumeReleaseResponse{})
		cancel()
		if status.Code(err) != tt.want || !strings.Contains(status.Convert(err).Message(), tt.msg) {
			t.Errorf("%s %v with %s (%s): %v, want %s containing %q", tt.method, tt.req, tt.token, tt.role, err, tt.want, tt.msg)
		}
	}
}
