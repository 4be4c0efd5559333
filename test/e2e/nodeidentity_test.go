package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// secureAgent is one client agent of a TLS + ACL cluster.
type secureAgent struct {
	*agentProcess
	name, dataDir, rpc string
	httpPort           int
	plugin             *testplugin.Plugin
}

// startSecureAgent starts agent name with the shared client certificate and
// token, a data dir of its own (dataDir, made when empty) and a monolith
// test plugin tp.
func startSecureAgent(t *testing.T, p pki, servers []*secureServer, name, dataDir, token string) *secureAgent {
	t.Helper()
	return startSecureAgentTLS(t, p, servers, name, dataDir, token, p.tlsBlock("client", 0))
}

// startSecureAgentTLS is startSecureAgent with the tls block given.
func startSecureAgentTLS(t *testing.T, p pki, servers []*secureServer, name, dataDir, token, tlsBlock string) *secureAgent {
	t.Helper()
	if dataDir == "" {
		dataDir = testutil.TempDir(t)
	}
	pluginDir := testutil.TempDir(t)
	plugin := startTestPlugin(t, testplugin.Config{
		Socket: filepath.Join(pluginDir, "tp", "csi.sock"), StateDir: testutil.TempDir(t),
		Type: testplugin.TypeMonolith, NodeID: "csi-" + name, KnownNodeIDs: []string{testplugin.AnyNode}, ForeignVolumes: true,
	})
	var rpcs []string
	for _, s := range servers {
		rpcs = append(rpcs, s.rpc)
	}
	ports := testutil.FreePorts(t, 3)
	cfg := agentHCLIn(t, name, dataDir, ports[0], ports[1], ports[2], fmt.Sprintf(`log_level = "trace"
client {
  plugin_dir = %q
  servers    = %s
}
acl {
  enabled = true
  tokens { agent = %q }
}
%s`, pluginDir, hclList(rpcs), token, tlsBlock))
	a := startAgentProcess(t, "agent "+name, ports[2], "--config", cfg)
	return &secureAgent{agentProcess: a, name: name, dataDir: dataDir, rpc: fmt.Sprintf("127.0.0.1:%d", ports[0]), httpPort: ports[2], plugin: plugin}
}

// bootstrapACL bootstraps the ACLs of a secure cluster through addr once
// it has a leader, and returns the management token once addr's own state
// knows it.
func bootstrapACL(t *testing.T, p pki, addr string) tokenDoc {
	t.Helper()
	var mgmt tokenDoc
	testutil.WaitFor(t, 60*time.Second, "acl bootstrap", func() bool {
		res := secureCLI(t, p, addr, "", "acl", "bootstrap", "--json")
		return res.code == 0 && json.Unmarshal([]byte(res.stdout), &mgmt) == nil
	})
	testutil.WaitFor(t, 30*time.Second, "the management token known to "+addr, func() bool {
		return secureCLI(t, p, addr, mgmt.SecretID, "acl", "token", "self").code == 0
	})
	return mgmt
}

// readFile returns the trimmed content of a file of an agent's data dir.
func (a *secureAgent) readFile(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(a.dataDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}

// TestANodeSpeaksOnlyForItself attacks a TLS + ACL cluster as a hostile
// node would: two agents share one client certificate and one node:write
// token, as an operator may set them up, and node-2's credentials are used
// against node-1. Every call that names node-1 without node-1's secret is
// refused and changes nothing, a new node cannot take node-1's name, and
// node-1 keeps working. A reinstalled agent is refused until `node rekey`,
// and the node secrets are nowhere but in the agents' data dirs.
func TestANodeSpeaksOnlyForItself(t *testing.T) {
	p := newPKI(t, 3)
	servers := startSecureClusterWith(t, p, `log_level = "trace"`)
	addr := servers[0].rpc

	mgmt := bootstrapACL(t, p, addr)
	rules := filepath.Join(p.dir, "agent.hcl")
	if err := os.WriteFile(rules, []byte(`node { policy = "write" }`), 0o600); err != nil {
		t.Fatal(err)
	}
	if res := secureCLI(t, p, addr, mgmt.SecretID, "acl", "policy", "apply", "agent", rules); res.code != 0 {
		t.Fatalf("policy apply: exit %d: %s", res.code, res.stderr)
	}
	var shared tokenDoc
	secureCLIJSON(t, p, addr, mgmt.SecretID, &shared, "acl", "token", "create", "--name", "agents", "--policy", "agent")

	node1 := startSecureAgent(t, p, servers, "node-1", "", shared.SecretID)
	node2 := startSecureAgent(t, p, servers, "node-2", "", shared.SecretID)
	id1, id2 := node1.readFile(t, "node-id"), node2.readFile(t, "node-id")
	secret2 := node2.readFile(t, "node-secret")
	if info, err := os.Stat(filepath.Join(node1.dataDir, "node-secret")); err != nil || info.Mode().Perm() != 0o600 {
		t.Fatalf("node-1's node-secret: %v, %v; want mode 0600", info, err)
	}
	nodeStatus := func(node string) nodeDoc {
		t.Helper()
		var doc nodeDoc
		secureCLIJSON(t, p, addr, mgmt.SecretID, &doc, "node", "status", node)
		return doc
	}
	for _, n := range []string{id1, id2} {
		testutil.WaitFor(t, 60*time.Second, "node "+n+" ready with plugin tp", func() bool {
			var doc nodeDoc
			res := secureCLI(t, p, addr, mgmt.SecretID, "node", "status", n, "--json")
			return res.code == 0 && json.Unmarshal([]byte(res.stdout), &doc) == nil && doc.Status == "ready" &&
				len(doc.Plugins) == 1 && doc.Plugins[0].Healthy
		})
	}
	before := nodeStatus(id1)

	// A volume that only node-1 mounts.
	var vol volumeDoc
	secureCLIJSON(t, p, addr, mgmt.SecretID, &vol, "volume", "create", "v1", "--plugin", "tp", "--capacity", "1MiB")
	var claim claimDoc
	secureCLIJSON(t, p, addr, mgmt.SecretID, &claim, "volume", "claim", "v1", "--node", "node-1", "--workload", "w1")

	// node-2's credentials: the shared certificate and token, and node-2's
	// own secret.
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(withServerName(p.clientTLS(t, "client"), "localhost"))),
		grpc.WithPerRPCCredentials(csisupdv1.TokenCredentials{Secret: shared.SecretID}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	cluster := csisupdv1.NewClusterClient(conn)
	call := func(secret string, f func(ctx context.Context) error) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if secret != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, csisupdv1.NodeSecretMetadataKey, secret)
		}
		return f(ctx)
	}
	refused := func(what string, err error, code codes.Code, msg string) {
		t.Helper()
		if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), msg) {
			t.Errorf("%s: %v; want %s naming %q", what, err, code, msg)
		}
	}
	err = call(secret2, func(ctx context.Context) error {
		_, err := cluster.NodeRegister(ctx, &csisupdv1.NodeRegisterRequest{NodeId: id1, Name: "node-1", Address: "127.0.0.1:1"})
		return err
	})
	refused("NodeRegister of node-1 at another address with node-2's secret", err, codes.PermissionDenied, fmt.Sprintf("node %q: node secret does not match", id1))
	err = call("", func(ctx context.Context) error {
		_, err := cluster.NodeRegister(ctx, &csisupdv1.NodeRegisterRequest{NodeId: id1, Name: "node-1", Address: "127.0.0.1:1"})
		return err
	})
	refused("NodeRegister of node-1 without a secret", err, codes.Unauthenticated, "no node secret")
	err = call(secret2, func(ctx context.Context) error {
		_, err := cluster.NodeHeartbeat(ctx, &csisupdv1.NodeHeartbeatRequest{NodeId: id1})
		return err
	})
	refused("NodeHeartbeat of node-1", err, codes.PermissionDenied, "node secret does not match")
	err = call(secret2, func(ctx context.Context) error {
		_, err := cluster.NodeUpdatePlugins(ctx, &csisupdv1.NodeUpdatePluginsRequest{NodeId: id1})
		return err
	})
	refused("NodeUpdatePlugins of node-1", err, codes.PermissionDenied, "node secret does not match")
	for _, as := range []string{id1, id2} {
		err = call(secret2, func(ctx context.Context) error {
			_, err := cluster.NodeVolumeHealth(ctx, &csisupdv1.NodeVolumeHealthRequest{NodeId: as, VolumeId: "v1", Abnormal: true, Message: "forged"})
			return err
		})
		want := "node secret does not match"
		if as == id2 {
			want = "has no claim on volume \"v1\""
		}
		refused("NodeVolumeHealth of v1 as "+as, err, codes.PermissionDenied, want)
	}
	err = call(secret2, func(ctx context.Context) error {
		_, err := cluster.NodeClaims(ctx, &csisupdv1.NodeClaimsRequest{NodeId: id1})
		return err
	})
	refused("NodeClaims of node-1", err, codes.PermissionDenied, "node secret does not match")
	err = call("another-secret-of-a-new-node-0123456789", func(ctx context.Context) error {
		_, err := cluster.NodeRegister(ctx, &csisupdv1.NodeRegisterRequest{NodeId: "shadow", Name: "node-1", Address: "127.0.0.1:1"})
		return err
	})
	refused("NodeRegister of a new id named node-1", err, codes.AlreadyExists, fmt.Sprintf("node name \"node-1\" is held by node %q", id1))

	// Nothing changed: node-1's record, the volume's conditions, the nodes.
	after := nodeStatus(id1)
	if after.Address != before.Address || len(after.Plugins) != 1 || after.Plugins[0].ID != "tp" || after.Status != "ready" {
		t.Errorf("node-1 after the attack: %+v; before: %+v", after, before)
	}
	var status1 struct {
		Conditions []json.RawMessage `json:"conditions"`
	}
	secureCLIJSON(t, p, addr, mgmt.SecretID, &status1, "volume", "status", "v1")
	if len(status1.Conditions) != 0 {
		t.Errorf("v1 has conditions after the forged reports: %s", status1.Conditions)
	}
	var nodes nodeListDoc
	secureCLIJSON(t, p, addr, mgmt.SecretID, &nodes, "node", "status")
	if len(nodes.Nodes) != 2 {
		t.Errorf("nodes after the attack: %+v, want node-1 and node-2 only", nodes.Nodes)
	}

	// node-1 keeps working: a claim and a release on it succeed.
	res := secureCLIRetried(t, p, addr, mgmt.SecretID, "volume", "release", "v1", "--node", "node-1", "--workload", "w1")
	if res.code != 0 || !strings.Contains(res.stdout, "Released 1 claim(s) of volume v1") {
		t.Errorf("release w1 on node-1: exit %d: %s%s", res.code, res.stdout, res.stderr)
	}
	res = secureCLIRetried(t, p, addr, mgmt.SecretID, "volume", "release", "v1", "--node", "node-1", "--workload", "w1")
	if res.code != 0 || !strings.Contains(res.stdout, "Nothing to release") {
		t.Errorf("second release of w1 on node-1: exit %d: %s%s", res.code, res.stdout, res.stderr)
	}
	secureCLIJSON(t, p, addr, mgmt.SecretID, &claim, "volume", "claim", "v1", "--node", "node-1", "--workload", "w2")
	if claim.State != "taken" || claim.HostPath == "" {
		t.Errorf("claim w2 on node-1: %+v", claim)
	}

	// node-2 reinstalled: an empty data_dir, the same name. Refused until
	// node rekey, then registered under its new id, holding the name.
	if err := node2.stop(30 * time.Second); err != nil {
		t.Fatalf("stop node-2: %v", err)
	}
	reinstalled := startSecureAgent(t, p, servers, "node-2", "", shared.SecretID)
	newID := reinstalled.readFile(t, "node-id")
	testutil.WaitFor(t, 30*time.Second, "the reinstalled agent's refusal in its log", func() bool {
		return strings.Contains(reinstalled.logs.String(), fmt.Sprintf("node name \\\"node-2\\\" is held by node \\\"%s\\\"", id2)) ||
			strings.Contains(reinstalled.logs.String(), fmt.Sprintf(`node name "node-2" is held by node "%s"`, id2))
	})
	if res := secureCLI(t, p, addr, mgmt.SecretID, "node", "status", newID); res.code == 0 {
		t.Fatalf("the reinstalled agent registered before the rekey: %s", res.stdout)
	}
	if res := secureCLI(t, p, addr, mgmt.SecretID, "node", "rekey", "node-2"); res.code != 0 || !strings.Contains(res.stdout, "Rekeyed node "+id2) {
		t.Fatalf("node rekey node-2: exit %d: %s%s", res.code, res.stdout, res.stderr)
	}
	testutil.WaitFor(t, 60*time.Second, "the reinstalled agent registered", func() bool {
		var doc nodeDoc
		res := secureCLI(t, p, addr, mgmt.SecretID, "node", "status", "node-2", "--json")
		return res.code == 0 && json.Unmarshal([]byte(res.stdout), &doc) == nil && doc.ID == newID && doc.Status == "ready"
	})
	var old struct {
		Status     string `json:"status"`
		ReplacedBy string `json:"replaced_by"`
	}
	secureCLIJSON(t, p, addr, mgmt.SecretID, &old, "node", "status", id2)
	if old.Status != "down" || old.ReplacedBy != newID {
		t.Errorf("the old node-2 after the rekey: %+v, want down and replaced by %s", old, newID)
	}

	// The secrets are in the agents' data dirs only: not in any server's
	// data dir, an operator snapshot, a debug bundle, a log at trace level
	// or an event.
	secrets := map[string]string{
		"node-1": node1.readFile(t, "node-secret"), "node-2": secret2, "reinstalled node-2": reinstalled.readFile(t, "node-secret"),
	}
	places := map[string]string{}
	for _, s := range servers {
		err := filepath.WalkDir(s.dataDir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			places[path] = string(data)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		places[s.name+"'s log"] = s.logs.String()
	}
	snap := filepath.Join(testutil.TempDir(t), "state.snap")
	if res := secureCLI(t, p, addr, mgmt.SecretID, "operator", "snapshot", "save", snap); res.code != 0 {
		t.Fatalf("snapshot save: exit %d: %s", res.code, res.stderr)
	}
	data, err := os.ReadFile(snap)
	if err != nil {
		t.Fatal(err)
	}
	places["the operator snapshot"] = string(data)
	outDir := testutil.TempDir(t)
	res = secureCLI(t, p, node1.rpc, mgmt.SecretID, "operator", "debug", "--duration", "1s", "--interval", "500ms", "--output", outDir)
	if res.code != 0 {
		t.Fatalf("operator debug of node-1: exit %d: %s%s", res.code, res.stdout, res.stderr)
	}
	bundle := extract(t, strings.TrimSpace(res.stdout), testutil.TempDir(t))
	err = filepath.WalkDir(bundle, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		places["debug bundle "+filepath.Base(path)] = string(data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []*secureAgent{node1, node2, reinstalled} {
		places[a.name+"'s log"] = a.logs.String()
	}
	places["the cluster's events"] = clusterEventsUntil(t, p, addr, mgmt.SecretID, "node-replaced")
	// The agents log their calls at trace level; the servers have no
	// trace lines of their own, and log below info only when set lower.
	if !strings.Contains(places["node-1's log"], "[TRACE]") || !strings.Contains(places[servers[0].name+"'s log"], "[DEBUG]") {
		t.Errorf("node-1 logged no trace line, or %s no debug line: the check below would prove little", servers[0].name)
	}
	for who, secret := range secrets {
		for where, text := range places {
			if strings.Contains(text, secret) {
				t.Errorf("%s's node secret is in %s", who, where)
			}
		}
	}
}

// clusterEventsUntil replays the cluster's buffered events from a server
// and returns them as text, up to and including the first of type last.
func clusterEventsUntil(t *testing.T, p pki, addr, token, last string) string {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(withServerName(p.clientTLS(t, "cli"), "localhost"))),
		grpc.WithPerRPCCredentials(csisupdv1.TokenCredentials{Secret: token}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := csisupdv1.NewControlClient(conn).WatchEvents(ctx, &csisupdv1.ClusterEventWatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	for {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatalf("cluster events: no %s event before %v; got:\n%s", last, err, text.String())
		}
		fmt.Fprintln(&text, ev.String())
		if ev.GetType() == last {
			return text.String()
		}
	}
}

// secureCLIRetried is secureCLI for a call that is safe to repeat: it
// tries again, for up to a minute, while the CLI says the cluster had no
// leader (an election on a loaded machine), and returns the first other
// answer.
func secureCLIRetried(t *testing.T, p pki, addr, token string, args ...string) cliResult {
	t.Helper()
	var res cliResult
	testutil.WaitFor(t, time.Minute, "an answer with a leader to "+strings.Join(args, " "), func() bool {
		res = secureCLI(t, p, addr, token, args...)
		return res.code == 0 || !strings.Contains(res.stderr, "the call is safe to retry")
	})
	return res
}

// TestNodeIdentitiesBindCalls gives each agent a token made with
// --node-identity and a certificate made with --node, with
// verify_node_name on: node-2's own calls work, and node-1's token or
// node-1's certificate cannot heartbeat or register as node-2 even with
// node-2's secret; a client certificate that names no node is refused.
func TestNodeIdentitiesBindCalls(t *testing.T) {
	p := pki{dir: testutil.TempDir(t)}
	p.tls(t, "ca", "create")
	for range 3 {
		p.tls(t, "cert", "create", "--server")
	}
	p.tls(t, "cert", "create", "--client", "--node", "node-1") // client 0
	p.tls(t, "cert", "create", "--client", "--node", "node-2") // client 1
	p.tls(t, "cert", "create", "--client")                     // client 2: no node
	p.tls(t, "cert", "create", "--cli")
	const verify = "  verify_node_name = true\n"
	servers := startSecureClusterTLS(t, p, "", verify)
	addr := servers[0].rpc
	mgmt := bootstrapACL(t, p, addr)
	tokens := map[string]tokenDoc{}
	for _, n := range []string{"node-1", "node-2"} {
		var tok tokenDoc
		secureCLIJSON(t, p, addr, mgmt.SecretID, &tok, "acl", "token", "create", "--name", n, "--node-identity", n)
		tokens[n] = tok
	}
	node1 := startSecureAgentTLS(t, p, servers, "node-1", "", tokens["node-1"].SecretID, p.tlsBlockWith("client", 0, verify))
	node2 := startSecureAgentTLS(t, p, servers, "node-2", "", tokens["node-2"].SecretID, p.tlsBlockWith("client", 1, verify))
	id2, secret2 := node2.readFile(t, "node-id"), node2.readFile(t, "node-secret")
	for _, a := range []*secureAgent{node1, node2} {
		id := a.readFile(t, "node-id")
		testutil.WaitFor(t, 60*time.Second, a.name+" registered by its own credentials", func() bool {
			var doc nodeDoc
			res := secureCLI(t, p, addr, mgmt.SecretID, "node", "status", id, "--json")
			return res.code == 0 && json.Unmarshal([]byte(res.stdout), &doc) == nil && doc.Status == "ready" && len(doc.Plugins) == 1
		})
	}

	// Calls as node-2, with node-2's secret, through a follower and the
	// leader alike, with the certificate of client n and the token of tok.
	asNode2 := func(client int, tok, server string) error {
		t.Helper()
		cfg := p.clientTLS(t, "client")
		certFile, keyFile := p.cert("client", client)
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{pair}
		conn, err := grpc.NewClient(server, grpc.WithTransportCredentials(credentials.NewTLS(withServerName(cfg, "localhost"))),
			grpc.WithPerRPCCredentials(csisupdv1.TokenCredentials{Secret: tok}))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ctx = metadata.AppendToOutgoingContext(ctx, csisupdv1.NodeSecretMetadataKey, secret2)
		cl := csisupdv1.NewClusterClient(conn)
		if _, err := cl.NodeHeartbeat(ctx, &csisupdv1.NodeHeartbeatRequest{NodeId: id2}); err != nil {
			return err
		}
		_, err = cl.NodeRegister(ctx, &csisupdv1.NodeRegisterRequest{NodeId: id2, Name: "node-2", Address: node2.rpc})
		return err
	}
	for _, s := range servers {
		if err := asNode2(1, tokens["node-2"].SecretID, s.rpc); err != nil {
			t.Errorf("node-2's own credentials through %s: %v", s.name, err)
		}
		err := asNode2(1, tokens["node-1"].SecretID, s.rpc)
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `the token is bound to node "node-1", not "node-2"`) {
			t.Errorf("node-1's token as node-2 through %s: %v; want PermissionDenied naming the token's node", s.name, err)
		}
		err = asNode2(0, tokens["node-2"].SecretID, s.rpc)
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `the certificate is bound to node "node-1", not "node-2"`) {
			t.Errorf("node-1's certificate as node-2 through %s: %v; want PermissionDenied naming the certificate's node", s.name, err)
		}
		err = asNode2(2, tokens["node-2"].SecretID, s.rpc)
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "tls cert create --client --node") {
			t.Errorf("a certificate without a node through %s: %v; want PermissionDenied saying how to make one", s.name, err)
		}
	}
	var doc nodeDoc
	secureCLIJSON(t, p, addr, mgmt.SecretID, &doc, "node", "status", id2)
	if doc.Address != node2.rpc || doc.Status != "ready" {
		t.Errorf("node-2 after the refused calls: %+v", doc)
	}
}
