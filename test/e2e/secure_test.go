package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// pki is a directory of certificates made with `csisupd tls`, as an
// operator makes them.
type pki struct{ dir string }

// newPKI creates a CA, servers server certificates, one client and one
// CLI certificate with the CLI.
func newPKI(t *testing.T, servers int) pki {
	t.Helper()
	p := pki{dir: testutil.TempDir(t)}
	p.tls(t, "ca", "create")
	for range servers {
		p.tls(t, "cert", "create", "--server")
	}
	p.tls(t, "cert", "create", "--client")
	p.tls(t, "cert", "create", "--cli")
	return p
}

func (p pki) tls(t *testing.T, args ...string) string {
	t.Helper()
	res := cli(t, "127.0.0.1:1", append(append([]string{"tls"}, args...), "--dir", p.dir)...)
	if res.code != 0 || !strings.Contains(res.stdout, "==> Saved") {
		t.Fatalf("csisupd tls %s: exit %d\n%s%s", strings.Join(args, " "), res.code, res.stdout, res.stderr)
	}
	return res.stdout
}

func (p pki) ca() string { return filepath.Join(p.dir, "csisupd-agent-ca.pem") }

// cert returns the certificate and key files of the n-th certificate of
// role (server, client, cli).
func (p pki) cert(role string, n int) (cert, key string) {
	base := filepath.Join(p.dir, fmt.Sprintf("global-%s-csisupd-%d", role, n))
	return base + ".pem", base + "-key.pem"
}

// tlsBlock is the tls block of an agent with the n-th certificate of role.
func (p pki) tlsBlock(role string, n int) string { return p.tlsBlockWith(role, n, "") }

// tlsBlockWith is tlsBlock with extra lines inside the block.
func (p pki) tlsBlockWith(role string, n int, extra string) string {
	cert, key := p.cert(role, n)
	return fmt.Sprintf("tls {\n  ca_file = %q\n  cert_file = %q\n  key_file = %q\n%s}\n", p.ca(), cert, key, extra)
}

// cliFlags are the CLI's TLS flags with the --cli certificate.
func (p pki) cliFlags() []string {
	cert, key := p.cert("cli", 0)
	return []string{"--ca-file", p.ca(), "--client-cert", cert, "--client-key", key}
}

// clientTLS is a TLS client configuration with the certificate of role.
func (p pki) clientTLS(t *testing.T, role string) *tls.Config {
	t.Helper()
	pem, err := os.ReadFile(p.ca())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	certFile, keyFile := p.cert(role, 0)
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, Certificates: []tls.Certificate{pair}}
}

// secureCLI runs the CLI with the --cli certificate and token.
func secureCLI(t *testing.T, p pki, addr, token string, args ...string) cliResult {
	t.Helper()
	flags := p.cliFlags()
	if token != "" {
		flags = append(flags, "--token", token)
	}
	return cli(t, addr, append(flags, args...)...)
}

func secureCLIJSON(t *testing.T, p pki, addr, token string, v any, args ...string) {
	t.Helper()
	res := secureCLI(t, p, addr, token, append(args, "--json")...)
	if res.code != 0 {
		t.Fatalf("csisupd %s: exit %d: %s", strings.Join(args, " "), res.code, res.stderr)
	}
	if err := json.Unmarshal([]byte(res.stdout), v); err != nil {
		t.Fatalf("csisupd %s --json: %v\n%s", strings.Join(args, " "), err, res.stdout)
	}
}

// tokenDoc is an ACL token as `--json` prints it.
type tokenDoc struct {
	AccessorID string `json:"accessor_id"`
	SecretID   string `json:"secret_id"`
	Type       string `json:"type"`
}

// secureServer is one server process of a TLS + ACL cluster.
type secureServer struct {
	*agentProcess
	rpc, raft string
	httpPort  int
	dataDir   string
}

// startSecureCluster starts 3 servers with TLS and ACLs on, each with its
// own server certificate, formed by bootstrap_expect = 3.
func startSecureCluster(t *testing.T, p pki) []*secureServer {
	t.Helper()
	return startSecureClusterWith(t, p, "")
}

// startSecureClusterWith is startSecureCluster with extra appended to
// every server's configuration.
func startSecureClusterWith(t *testing.T, p pki, extra string) []*secureServer {
	t.Helper()
	return startSecureClusterTLS(t, p, extra, "")
}

// startSecureClusterTLS is startSecureClusterWith with tlsExtra inside
// every server's tls block.
func startSecureClusterTLS(t *testing.T, p pki, extra, tlsExtra string) []*secureServer {
	t.Helper()
	ports := testutil.FreePorts(t, 9)
	var servers []*secureServer
	var join []string
	for i := range 3 {
		join = append(join, fmt.Sprintf("127.0.0.1:%d", ports[3*i]))
	}
	for i := range 3 {
		rpcPort, raftPort, httpPort := ports[3*i], ports[3*i+1], ports[3*i+2]
		dataDir := testutil.TempDir(t)
		cfg := agentHCLIn(t, fmt.Sprintf("s%d", i), dataDir, rpcPort, raftPort, httpPort, fmt.Sprintf(`client { enabled = false }
server {
  enabled          = true
  bootstrap_expect = 3
  retry_join       = %s
}
acl { enabled = true }
%s
%s`, hclList(join), p.tlsBlockWith("server", i, tlsExtra), extra))
		a := startAgentProcess(t, fmt.Sprintf("server s%d", i), httpPort, "--config", cfg)
		servers = append(servers, &secureServer{agentProcess: a, rpc: join[i], raft: fmt.Sprintf("127.0.0.1:%d", raftPort), httpPort: httpPort, dataDir: dataDir})
	}
	return servers
}

func hclList(items []string) string {
	quoted := make([]string, len(items))
	for i, s := range items {
		quoted[i] = fmt.Sprintf("%q", s)
	}
	return "[" + strings.Join(quoted, ", ") + "]"
}

// agentHCL writes the config file of an agent named name on loopback with
// the given ports, a data dir of its own, no Consul, and body, and returns
// its path.
func agentHCL(t *testing.T, name string, rpcPort, raftPort, httpPort int, body string) string {
	t.Helper()
	return agentHCLIn(t, name, testutil.TempDir(t), rpcPort, raftPort, httpPort, body)
}

// agentHCLIn is agentHCL with the data dir given.
func agentHCLIn(t *testing.T, name, dataDir string, rpcPort, raftPort, httpPort int, body string) string {
	t.Helper()
	content := fmt.Sprintf(`name = %q
data_dir = %q
bind_addr = "127.0.0.1"
ports {
  rpc  = %d
  raft = %d
  http = %d
}
consul { enabled = false }
%s`, name, dataDir, rpcPort, raftPort, httpPort, body)
	path := filepath.Join(testutil.TempDir(t), "agent.hcl")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestSecureCluster builds a 3-server cluster with TLS and ACLs on from
// certificates made with `csisupd tls`, bootstraps its ACLs, and checks
// that only the right certificate with the right token gets anything
// done: on the raft port, the server-only RPCs and the volume API.
func TestSecureCluster(t *testing.T) {
	p := newPKI(t, 3)
	servers := startSecureCluster(t, p)
	addr := servers[0].rpc

	// Before the bootstrap nothing but the bootstrap works, and a
	// plain-text client is not even spoken to.
	if res := secureCLI(t, p, addr, "", "operator", "raft", "list-peers"); res.code != 1 || !strings.Contains(res.stderr, "needs a token that allows operator:read") {
		t.Fatalf("list-peers without a token: exit %d: %s", res.code, res.stderr)
	}
	if res := cli(t, addr, "operator", "raft", "list-peers"); res.code != 1 {
		t.Fatalf("list-peers over plain text: exit %d: %s", res.code, res.stderr)
	}

	// The cluster forms through bootstrap_expect; the bootstrap needs a
	// leader, so it is retried until there is one.
	var mgmt tokenDoc
	testutil.WaitFor(t, 60*time.Second, "acl bootstrap", func() bool {
		res := secureCLI(t, p, addr, "", "acl", "bootstrap", "--json")
		return res.code == 0 && json.Unmarshal([]byte(res.stdout), &mgmt) == nil
	})
	if mgmt.Type != "management" || mgmt.SecretID == "" {
		t.Fatalf("bootstrap token: %+v", mgmt)
	}
	if res := secureCLI(t, p, addr, "", "acl", "bootstrap"); res.code != 1 || !strings.Contains(res.stderr, "acl-bootstrap-reset") {
		t.Fatalf("second bootstrap: exit %d: %s", res.code, res.stderr)
	}
	var peers peersDoc
	secureCLIJSON(t, p, addr, mgmt.SecretID, &peers, "operator", "raft", "list-peers")
	if len(peers.Peers) != 3 {
		t.Fatalf("raft peers: %+v", peers)
	}

	// Policies and tokens for the agent, a writer and a reader.
	policies := map[string]string{
		"agent":  `node { policy = "write" }`,
		"writer": "volume { policy = \"write\" }\nplugin { policy = \"read\" }\nnode { policy = \"read\" }",
		"reader": "volume { policy = \"read\" }\nplugin { policy = \"read\" }\nnode { policy = \"read\" }",
	}
	tokens := map[string]tokenDoc{}
	for name, rules := range policies {
		file := filepath.Join(p.dir, name+".hcl")
		if err := os.WriteFile(file, []byte(rules), 0o600); err != nil {
			t.Fatal(err)
		}
		if res := secureCLI(t, p, addr, mgmt.SecretID, "acl", "policy", "apply", name, file); res.code != 0 {
			t.Fatalf("policy apply %s: exit %d: %s", name, res.code, res.stderr)
		}
		var tok tokenDoc
		secureCLIJSON(t, p, addr, mgmt.SecretID, &tok, "acl", "token", "create", "--name", name, "--policy", name)
		tokens[name] = tok
	}

	// An agent with a client certificate and its agent token, with a
	// controller plugin.
	pluginDir := testutil.TempDir(t)
	plugin := startTestPlugin(t, testplugin.Config{
		Socket: filepath.Join(pluginDir, "tp", "csi.sock"), StateDir: testutil.TempDir(t),
		Type: testplugin.TypeMonolith, NodeID: "csi-node-0", KnownNodeIDs: []string{testplugin.AnyNode},
	})
	agentPorts := testutil.FreePorts(t, 3)
	agentCfg := agentHCL(t, "a0", agentPorts[0], agentPorts[1], agentPorts[2], fmt.Sprintf(`client {
  plugin_dir = %q
  servers    = %s
}
acl {
  enabled = true
  tokens { agent = %q }
}
%s`, pluginDir, hclList([]string{servers[0].rpc, servers[1].rpc, servers[2].rpc}), tokens["agent"].SecretID, p.tlsBlock("client", 0)))
	agent := startAgentProcess(t, "agent a0", agentPorts[2], "--config", agentCfg)
	reader, writer := tokens["reader"].SecretID, tokens["writer"].SecretID
	testutil.WaitFor(t, 60*time.Second, "plugin tp healthy in the cluster", func() bool {
		var doc pluginDoc
		res := secureCLI(t, p, addr, reader, "plugin", "status", "tp", "--json")
		return res.code == 0 && json.Unmarshal([]byte(res.stdout), &doc) == nil && doc.ControllersHealthy == 1
	})

	// The writer creates and claims a volume.
	var vol volumeDoc
	secureCLIJSON(t, p, addr, writer, &vol, "volume", "create", "v1", "--plugin", "tp", "--capacity", "1MiB")
	// The servers mount it through the agent's NodeVolumes with their
	// server certificates, without the writer's token.
	var claim claimDoc
	secureCLIJSON(t, p, addr, writer, &claim, "volume", "claim", "v1", "--node", "a0", "--workload", "w1")
	if claim.CSINodeID != "csi-node-0" || claim.State != "taken" || claim.HostPath == "" {
		t.Fatalf("claim: %+v", claim)
	}

	// The reader is refused, and nothing changes.
	before := plugin.Stats().Calls
	for _, args := range [][]string{
		{"volume", "create", "v2", "--plugin", "tp"},
		{"volume", "release", "v1", "--node", "a0", "--workload", "w1"},
		{"volume", "claim", "v1", "--node", "a0", "--workload", "w2"},
		{"volume", "delete", "v1"},
	} {
		res := secureCLI(t, p, addr, reader, args...)
		if res.code != 1 || !strings.Contains(res.stderr, "needs volume:write, which the token does not allow") {
			t.Errorf("%s with the read token: exit %d: %s", strings.Join(args, " "), res.code, res.stderr)
		}
	}
	var list volumeListDoc
	secureCLIJSON(t, p, addr, reader, &list, "volume", "list")
	if len(list.Volumes) != 1 || list.Volumes[0].ID != "v1" || len(list.Volumes[0].Claims) != 1 {
		t.Fatalf("volumes after the refused writes: %+v", list)
	}
	after := plugin.Stats().Calls
	for _, m := range []string{"CreateVolume", "DeleteVolume", "ControllerUnpublishVolume", "NodeUnpublishVolume", "NodePublishVolume"} {
		if after[m] != before[m] {
			t.Errorf("the plugin saw %s %d times after the refused writes, %d before", m, after[m], before[m])
		}
	}

	// The raft port: plain text and a client certificate are refused and
	// logged; nothing they send reaches raft.
	for _, s := range servers[:1] {
		assertClosedWithoutReply(t, "plain text on the raft port", func() (net.Conn, error) {
			c, err := net.DialTimeout("tcp", s.raft, 5*time.Second)
			if err == nil {
				_, err = c.Write([]byte{0, 0x81, 0xa4, 'T', 'e', 'r', 'm'}) // a raft AppendEntries header
			}
			return c, err
		})
		assertClosedWithoutReply(t, "a client certificate on the raft port", func() (net.Conn, error) {
			return tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", s.raft, withServerName(p.clientTLS(t, "client"), "localhost"))
		})
		testutil.WaitFor(t, 10*time.Second, "the refusals in the server's log", func() bool {
			logs := s.logs.String()
			return strings.Contains(logs, "reason=\"not TLS\"") && strings.Contains(logs, "certificate role client, want server")
		})
	}

	// Server-only RPCs: a client and a CLI certificate are refused even
	// with the management token; plain text is not served at all.
	for _, role := range []string{"client", "cli"} {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(withServerName(p.clientTLS(t, role), "localhost"))),
			grpc.WithPerRPCCredentials(csisupdv1.TokenCredentials{Secret: mgmt.SecretID}))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err = csisupdv1.NewClusterClient(conn).Join(ctx, &csisupdv1.JoinRequest{ServerId: "bogus", RaftAddress: "127.0.0.1:1", RpcAddress: "127.0.0.1:2"})
		cancel()
		conn.Close()
		if status.Code(err) != codes.PermissionDenied {
			t.Errorf("Cluster/Join with a %s certificate: %v, want PermissionDenied", role, err)
		}
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err = csisupdv1.NewClusterClient(conn).Join(ctx, &csisupdv1.JoinRequest{ServerId: "bogus", RaftAddress: "127.0.0.1:1", RpcAddress: "127.0.0.1:2"})
	cancel()
	conn.Close()
	if err == nil || status.Code(err) == codes.OK {
		t.Errorf("Cluster/Join over plain text: %v, want a failure", err)
	}
	secureCLIJSON(t, p, addr, mgmt.SecretID, &peers, "operator", "raft", "list-peers")
	if len(peers.Peers) != 3 {
		t.Fatalf("raft peers after the refused joins: %+v", peers)
	}

	// The rest of the ACL CLI: self, list, info, and a deleted token that
	// stops working at once.
	var self tokenDoc
	secureCLIJSON(t, p, addr, reader, &self, "acl", "token", "self")
	if self.AccessorID != tokens["reader"].AccessorID || self.SecretID != "" {
		t.Errorf("token self with the read token: %+v", self)
	}
	var tokenList struct {
		Tokens []tokenDoc `json:"tokens"`
	}
	secureCLIJSON(t, p, addr, mgmt.SecretID, &tokenList, "acl", "token", "list")
	if len(tokenList.Tokens) != 4 {
		t.Errorf("token list: %d tokens, want 4 (bootstrap, agent, reader, writer): %+v", len(tokenList.Tokens), tokenList)
	}
	for _, tok := range tokenList.Tokens {
		if tok.SecretID != "" {
			t.Errorf("token list shows the secret of %s", tok.AccessorID)
		}
	}
	var policyList struct {
		Policies []struct {
			Name string `json:"name"`
		} `json:"policies"`
	}
	secureCLIJSON(t, p, addr, mgmt.SecretID, &policyList, "acl", "policy", "list")
	if len(policyList.Policies) != 3 {
		t.Errorf("policy list: %+v", policyList)
	}
	if res := secureCLI(t, p, addr, reader, "acl", "policy", "list"); res.code != 1 || !strings.Contains(res.stderr, "needs a management token") {
		t.Errorf("policy list with the read token: exit %d: %s", res.code, res.stderr)
	}
	if res := secureCLI(t, p, addr, mgmt.SecretID, "acl", "policy", "info", "writer"); res.code != 0 || !strings.Contains(res.stdout, `volume { policy = "write" }`) {
		t.Errorf("policy info writer: exit %d: %s%s", res.code, res.stdout, res.stderr)
	}
	if res := secureCLI(t, p, addr, mgmt.SecretID, "acl", "token", "delete", tokens["writer"].AccessorID); res.code != 0 {
		t.Fatalf("token delete: exit %d: %s", res.code, res.stderr)
	}
	// Every server resolves tokens from its replicated state: the deletion
	// reaches each within the replication lag.
	for _, s := range servers {
		testutil.WaitFor(t, 10*time.Second, "the deleted token refused by "+s.name, func() bool {
			res := secureCLI(t, p, s.rpc, writer, "volume", "list")
			return res.code == 1 && strings.Contains(res.stderr, "the token given is unknown")
		})
	}
	deleted := tokens["writer"]
	delete(tokens, "writer")

	// No secret id in any log, metric, status output or snapshot.
	tokens["management"] = mgmt
	statusOf := func(addr string) string {
		res := secureCLI(t, p, addr, mgmt.SecretID, "status", "--json")
		if res.code != 0 {
			t.Fatalf("status of %s: exit %d: %s", addr, res.code, res.stderr)
		}
		return res.stdout
	}
	var outputs []string
	for _, s := range servers {
		outputs = append(outputs, s.name+" log:"+s.logs.String(), s.name+" metrics:"+httpGet(t, s.httpPort, "/metrics"),
			s.name+" status:"+statusOf(s.rpc))
	}
	outputs = append(outputs, "agent log:"+agent.logs.String(), "agent metrics:"+httpGet(t, agentPorts[2], "/metrics"),
		"agent status:"+statusOf(fmt.Sprintf("127.0.0.1:%d", agentPorts[0])))
	snap := filepath.Join(testutil.TempDir(t), "state.snap")
	if res := secureCLI(t, p, addr, mgmt.SecretID, "operator", "snapshot", "save", snap); res.code != 0 {
		t.Fatalf("snapshot save: exit %d: %s", res.code, res.stderr)
	}
	data, err := os.ReadFile(snap)
	if err != nil {
		t.Fatal(err)
	}
	outputs = append(outputs, "snapshot:"+string(data))
	tokens["deleted writer"] = deleted
	for name, tok := range tokens {
		for _, out := range outputs {
			if strings.Contains(out, tok.SecretID) {
				what, _, _ := strings.Cut(out, ":")
				t.Errorf("the %s token's secret id is in the %s", name, what)
			}
		}
		if name != "deleted writer" && !strings.Contains(outputs[len(outputs)-1], tok.AccessorID) {
			t.Errorf("the snapshot does not hold the %s token (accessor %s): the check above proves nothing", name, tok.AccessorID)
		}
	}
}

// httpGet returns the body of path on the HTTP port of an agent.
func httpGet(t *testing.T, port int, path string) string {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", path, resp.StatusCode, err)
	}
	return string(body)
}

func withServerName(c *tls.Config, name string) *tls.Config {
	c = c.Clone()
	c.ServerName = name
	return c
}

// assertClosedWithoutReply opens a connection with open and checks that
// the other end closes it without sending a byte.
func assertClosedWithoutReply(t *testing.T, what string, open func() (net.Conn, error)) {
	t.Helper()
	c, err := open()
	if err != nil {
		// A TLS client may see the refusal as a failed handshake.
		return
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
	n, err := c.Read(make([]byte, 64))
	if n > 0 || err == nil {
		t.Fatalf("%s: read %d bytes, err %v: want the connection closed without a reply", what, n, err)
	}
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("%s: the connection stayed open", what)
	}
	if err != io.EOF && !strings.Contains(err.Error(), "reset") && !strings.Contains(err.Error(), "closed") &&
		!strings.Contains(err.Error(), "certificate") && !strings.Contains(err.Error(), "tls") {
		t.Logf("%s: %v", what, err)
	}
}

// TestCertificateRotationBySIGHUP replaces a server's certificate files
// and sends SIGHUP while clients keep calling: no call fails, and new
// connections get the new certificate.
func TestCertificateRotationBySIGHUP(t *testing.T) {
	p := newPKI(t, 2)
	live := testutil.TempDir(t)
	certFile, keyFile := filepath.Join(live, "server.pem"), filepath.Join(live, "server-key.pem")
	install := func(n int) {
		c, k := p.cert("server", n)
		for src, dst := range map[string]string{c: certFile, k: keyFile} {
			data, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			// Written aside and renamed, as deployment tools do, so that a
			// reload never reads half a file.
			if err := os.WriteFile(dst+".new", data, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(dst+".new", dst); err != nil {
				t.Fatal(err)
			}
		}
	}
	install(0)
	ports := testutil.FreePorts(t, 3)
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	cfg := agentHCL(t, "rot", ports[0], ports[1], ports[2], fmt.Sprintf(`client { plugin_dir = %q }
server {
  enabled          = true
  bootstrap_expect = 1
}
tls {
  ca_file   = %q
  cert_file = %q
  key_file  = %q
}
`, testutil.TempDir(t), p.ca(), certFile, keyFile))
	proc := startAgentProcess(t, "server rot", ports[2], "--config", cfg)
	clientTLS := withServerName(p.clientTLS(t, "cli"), "localhost")

	// servedSerial makes one call on a new connection and returns the
	// serial number of the certificate the server presented.
	servedSerial := func(ctx context.Context) (string, error) {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS)))
		if err != nil {
			return "", err
		}
		defer conn.Close()
		var pr peer.Peer
		if _, err := csisupdv1.NewAgentClient(conn).Status(ctx, &csisupdv1.StatusRequest{}, grpc.Peer(&pr)); err != nil {
			return "", err
		}
		info, ok := pr.AuthInfo.(credentials.TLSInfo)
		if !ok || len(info.State.PeerCertificates) == 0 {
			return "", fmt.Errorf("no TLS peer certificate")
		}
		return info.State.PeerCertificates[0].SerialNumber.Text(16), nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	oldSerial, err := servedSerial(ctx)
	cancel()
	if err != nil {
		t.Fatal(err)
	}

	// Two callers: one on a connection kept open, one on a new
	// connection per call. Every failure is kept.
	var (
		mu       sync.Mutex
		failures []error
		calls    int
		latest   string
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	record := func(serial string, err error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if err != nil {
			failures = append(failures, err)
		}
		if serial != "" {
			latest = serial
		}
	}
	kept, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS)))
	if err != nil {
		t.Fatal(err)
	}
	defer kept.Close()
	loop := func(call func(ctx context.Context) (string, error)) {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			serial, err := call(ctx)
			cancel()
			record(serial, err)
		}
	}
	wg.Add(2)
	go loop(func(ctx context.Context) (string, error) {
		_, err := csisupdv1.NewAgentClient(kept).Status(ctx, &csisupdv1.StatusRequest{})
		return "", err
	})
	go loop(servedSerial)
	callsNow := func() int {
		mu.Lock()
		defer mu.Unlock()
		return calls
	}
	testutil.WaitFor(t, 30*time.Second, "20 calls before the rotation", func() bool { return callsNow() >= 20 })

	install(1)
	if err := proc.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "the new certificate served on new connections", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return latest != "" && latest != oldSerial
	})
	after := callsNow()
	testutil.WaitFor(t, 30*time.Second, "20 calls after the rotation", func() bool { return callsNow() >= after+20 })
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	if len(failures) > 0 {
		t.Fatalf("%d of %d calls failed during the rotation; first: %v", len(failures), calls, failures[0])
	}
	if !strings.Contains(proc.logs.String(), "certificates reloaded") {
		t.Errorf("the agent did not log the reload:\n%s", proc.logs.String())
	}
}
