package server_test

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/acl"
	"github.com/csisupd/csisupd/internal/rpc"
	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/server/statepb"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testutil"
)

// wantCode fails t unless err is a gRPC status with code, and returns its
// message.
func wantCode(t testing.TB, what string, err error, code codes.Code) string {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("%s: %v, want %s", what, err, code)
	}
	return status.Convert(err).Message()
}

// bootstrapRefusal matches the message of a refused bootstrap.
var bootstrapRefusal = regexp.MustCompile(`^ACL bootstrap already done at index (\d+); (?:.*; )?to reset, write (\d+) into (\S+) on the leader and bootstrap again$`)

func TestACLBootstrapOnceAndReset(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 3})
	leader := checkFormed(t, c, 3)
	follower := (leader.Index + 1) % 3
	ctx := context.Background()
	viaFollower := csisupdv1.NewACLClient(c.Conn(follower))
	viaLeader := csisupdv1.NewACLClient(c.Conn(leader.Index))

	// The first bootstrap, sent to a follower, runs on the leader.
	first, err := viaFollower.Bootstrap(ctx, &csisupdv1.ACLBootstrapRequest{})
	if err != nil {
		t.Fatal(err)
	}
	tok := first.GetToken()
	if tok.GetSecretId() == "" || tok.GetAccessorId() == "" || tok.GetType() != acl.TypeManagement || len(tok.GetPolicies()) != 0 {
		t.Fatalf("bootstrap token: %v", tok)
	}
	index := leader.Server().State().ACLBootstrapIndex()
	if index == 0 {
		t.Fatal("no bootstrap index on the leader")
	}
	for _, m := range c.Members() {
		testutil.WaitFor(t, 10*time.Second, m.ID+" to resolve the bootstrap token", func() bool {
			a, got, err := m.Server().ResolveToken(tok.GetSecretId())
			return err == nil && a.IsManagement() && got.GetAccessorId() == tok.GetAccessorId() && got.GetSecretId() == ""
		})
	}

	// A second bootstrap is refused and says how to reset.
	resetPath := filepath.Join(leader.DataDir, server.ACLBootstrapResetFile)
	_, err = viaFollower.Bootstrap(ctx, &csisupdv1.ACLBootstrapRequest{})
	msg := wantCode(t, "second bootstrap", err, codes.FailedPrecondition)
	want := "ACL bootstrap already done at index " + strconv.FormatUint(index, 10) + "; to reset, write " +
		strconv.FormatUint(index, 10) + " into " + resetPath + " on the leader and bootstrap again"
	if msg != want {
		t.Fatalf("refusal:\n%s\nwant:\n%s", msg, want)
	}

	// A reset file naming another index allows nothing, and says so.
	if err := os.WriteFile(resetPath, []byte("1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = viaLeader.Bootstrap(ctx, &csisupdv1.ACLBootstrapRequest{})
	msg = wantCode(t, "bootstrap with a wrong reset index", err, codes.FailedPrecondition)
	if !strings.Contains(msg, "the reset file "+resetPath+" names index 1") || !bootstrapRefusal.MatchString(msg) {
		t.Fatalf("refusal with a wrong reset index: %s", msg)
	}
	if err := os.WriteFile(resetPath, []byte("soon"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = viaLeader.Bootstrap(ctx, &csisupdv1.ACLBootstrapRequest{})
	if msg = wantCode(t, "bootstrap with a garbled reset file", err, codes.FailedPrecondition); !strings.Contains(msg, `holds "soon"`) {
		t.Fatalf("refusal with a garbled reset file: %s", msg)
	}

	// The operator writes the index it named: one more bootstrap.
	if err := os.WriteFile(resetPath, []byte(strconv.FormatUint(index, 10)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	again, err := viaFollower.Bootstrap(ctx, &csisupdv1.ACLBootstrapRequest{})
	if err != nil {
		t.Fatalf("bootstrap after reset: %v", err)
	}
	if again.GetToken().GetSecretId() == tok.GetSecretId() || again.GetToken().GetAccessorId() == tok.GetAccessorId() {
		t.Fatal("the reset bootstrap returned the first token")
	}
	if _, err := os.Stat(resetPath); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the reset file is still there after the reset: %v", err)
	}
	newIndex := leader.Server().State().ACLBootstrapIndex()
	if newIndex <= index {
		t.Fatalf("bootstrap index %d after reset, want past %d", newIndex, index)
	}
	for _, s := range []string{tok.GetSecretId(), again.GetToken().GetSecretId()} {
		if a, _, err := leader.Server().ResolveToken(s); err != nil || !a.IsManagement() {
			t.Fatalf("a bootstrap token does not resolve after the reset: %v", err)
		}
	}
	// And the reset was good for one bootstrap only.
	_, err = viaLeader.Bootstrap(ctx, &csisupdv1.ACLBootstrapRequest{})
	msg = wantCode(t, "bootstrap after the reset was used", err, codes.FailedPrecondition)
	if m := bootstrapRefusal.FindStringSubmatch(msg); m == nil || m[1] != strconv.FormatUint(newIndex, 10) || m[2] != m[1] || m[3] != resetPath {
		t.Fatalf("refusal after the reset: %s (want index %d)", msg, newIndex)
	}
}

// forwardLog counts the requests servers receive forwarded from another
// server, and those of them that carry a token.
type forwardLog struct {
	mu                   sync.Mutex
	forwarded, withToken int
}

func (f *forwardLog) interceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if md, ok := metadata.FromIncomingContext(ctx); ok && len(md.Get("csisupd-forwarded")) > 0 {
		f.mu.Lock()
		f.forwarded++
		if acl.TokenFromContext(ctx) != "" {
			f.withToken++
		}
		f.mu.Unlock()
	}
	return h(ctx, req)
}

func (f *forwardLog) counts() (forwarded, withToken int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.forwarded, f.withToken
}

func TestACLPoliciesAndTokens(t *testing.T) {
	fwd := &forwardLog{}
	c := testcluster.New(t, testcluster.Config{Servers: 3, ServerOptions: func(int) []grpc.ServerOption {
		return []grpc.ServerOption{grpc.ChainUnaryInterceptor(fwd.interceptor)}
	}})
	leader := checkFormed(t, c, 3)
	fi := (leader.Index + 1) % 3
	follower := c.Member(fi)
	// The caller's token reaches the follower; the follower forwards with
	// its own identity and never passes the token on.
	ctx := acl.WithToken(context.Background(), "the-callers-secret")
	cl := csisupdv1.NewACLClient(c.Conn(fi)) // every write is forwarded
	onLeader := csisupdv1.NewACLClient(c.Conn(leader.Index))

	// Policies.
	up, err := cl.UpsertPolicy(ctx, &csisupdv1.ACLUpsertPolicyRequest{Policy: &csisupdv1.ACLPolicy{
		Name: "vols", Description: "volume admins", Rules: `volume { policy = "write" }`,
	}})
	if err != nil {
		t.Fatal(err)
	}
	created := up.GetPolicy()
	if created.GetCreateTime() == nil || created.GetModifyTime() == nil || created.GetRules() != `volume { policy = "write" }` {
		t.Fatalf("upserted policy %v", created)
	}
	if got := statepb.ACLPolicyToAPI(leader.Server().State().ACLPolicy("vols")); !proto.Equal(got, created) {
		t.Fatalf("the leader holds %v, want %v", got, created)
	}
	if _, err := cl.UpsertPolicy(ctx, &csisupdv1.ACLUpsertPolicyRequest{Policy: &csisupdv1.ACLPolicy{
		Name: "readers", Rules: "plugin { policy = \"read\" }\nnode { policy = \"read\" }\n",
	}}); err != nil {
		t.Fatal(err)
	}
	up, err = cl.UpsertPolicy(ctx, &csisupdv1.ACLUpsertPolicyRequest{Policy: &csisupdv1.ACLPolicy{
		Name: "vols", Description: "volume readers", Rules: `volume { policy = "read" }`,
	}})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(up.GetPolicy().GetCreateTime(), created.GetCreateTime()) || up.GetPolicy().GetDescription() != "volume readers" ||
		up.GetPolicy().GetModifyTime().AsTime().Before(created.GetModifyTime().AsTime()) {
		t.Fatalf("updated policy %v: want the create time kept and a later modify time", up.GetPolicy())
	}
	_, err = cl.UpsertPolicy(ctx, &csisupdv1.ACLUpsertPolicyRequest{Policy: &csisupdv1.ACLPolicy{
		Name: "broken", Rules: "volume {\n  policy = \"all\"\n}\n",
	}})
	if msg := wantCode(t, "policy with bad rules", err, codes.InvalidArgument); !strings.Contains(msg, `policy broken:2: volume.policy: unknown level "all"`) {
		t.Fatalf("bad rules: %s", msg)
	}
	_, err = cl.UpsertPolicy(ctx, &csisupdv1.ACLUpsertPolicyRequest{Policy: &csisupdv1.ACLPolicy{Name: "no/slash"}})
	wantCode(t, "policy with a bad name", err, codes.InvalidArgument)
	_, err = cl.UpsertPolicy(ctx, &csisupdv1.ACLUpsertPolicyRequest{})
	wantCode(t, "upsert without a policy", err, codes.InvalidArgument)

	list, err := cl.ListPolicies(ctx, &csisupdv1.ACLListPoliciesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.GetPolicies()) != 2 || list.GetPolicies()[0].GetName() != "readers" || list.GetPolicies()[1].GetName() != "vols" {
		t.Fatalf("policies %v, want readers and vols", list.GetPolicies())
	}
	_, err = cl.GetPolicy(ctx, &csisupdv1.ACLGetPolicyRequest{Name: "broken"})
	wantCode(t, "get of a refused policy", err, codes.NotFound)

	// Tokens.
	refusals := []struct {
		req  *csisupdv1.ACLCreateTokenRequest
		want string
	}{
		{&csisupdv1.ACLCreateTokenRequest{Policies: []string{"vols", "nope"}}, `policy "nope" does not exist`},
		{&csisupdv1.ACLCreateTokenRequest{}, "needs at least one policy"},
		{&csisupdv1.ACLCreateTokenRequest{Type: acl.TypeManagement, Policies: []string{"vols"}}, "takes no policies"},
		{&csisupdv1.ACLCreateTokenRequest{Type: "root"}, `type "root"`},
		{&csisupdv1.ACLCreateTokenRequest{Policies: []string{"a b"}}, `policy name "a b"`},
	}
	for _, r := range refusals {
		_, err := cl.CreateToken(ctx, r.req)
		if msg := wantCode(t, "create token "+r.want, err, codes.InvalidArgument); !strings.Contains(msg, r.want) {
			t.Errorf("create token: %s, want it to contain %s", msg, r.want)
		}
	}
	ct, err := cl.CreateToken(ctx, &csisupdv1.ACLCreateTokenRequest{Name: "ci", Policies: []string{"vols", "readers", "vols"}})
	if err != nil {
		t.Fatal(err)
	}
	client := ct.GetToken()
	if client.GetSecretId() == "" || client.GetType() != acl.TypeClient || strings.Join(client.GetPolicies(), ",") != "vols,readers" {
		t.Fatalf("client token %v", client)
	}
	mt, err := cl.CreateToken(ctx, &csisupdv1.ACLCreateTokenRequest{Name: "admin", Type: acl.TypeManagement})
	if err != nil {
		t.Fatal(err)
	}
	toks, err := cl.ListTokens(ctx, &csisupdv1.ACLListTokensRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(toks.GetTokens()) != 2 || toks.GetTokens()[0].GetAccessorId() > toks.GetTokens()[1].GetAccessorId() {
		t.Fatalf("tokens %v, want two sorted by accessor id", toks.GetTokens())
	}
	for _, tk := range toks.GetTokens() {
		if tk.GetSecretId() != "" {
			t.Fatal("ListTokens returned a secret")
		}
	}
	got, err := onLeader.GetToken(ctx, &csisupdv1.ACLGetTokenRequest{AccessorId: client.GetAccessorId()})
	if err != nil {
		t.Fatal(err)
	}
	if got.GetToken().GetSecretId() != "" || got.GetToken().GetName() != "ci" {
		t.Fatalf("GetToken: %v", got.GetToken())
	}
	_, err = cl.GetToken(ctx, &csisupdv1.ACLGetTokenRequest{AccessorId: "nope"})
	wantCode(t, "get of an unknown token", err, codes.NotFound)

	// The follower resolves the token once the write reached it.
	testutil.WaitFor(t, 10*time.Second, "the follower to resolve the client token", func() bool {
		a, _, err := follower.Server().ResolveToken(client.GetSecretId())
		return err == nil && a.Allows(acl.Capability{Resource: acl.ResourceVolume, Level: acl.LevelRead}) &&
			a.Allows(acl.Capability{Resource: acl.ResourceNode, Level: acl.LevelRead}) &&
			!a.Allows(acl.Capability{Resource: acl.ResourceVolume, Level: acl.LevelWrite})
	})
	if _, err := cl.DeleteToken(ctx, &csisupdv1.ACLDeleteTokenRequest{AccessorId: client.GetAccessorId()}); err != nil {
		t.Fatal(err)
	}
	for _, m := range c.Members() {
		testutil.WaitFor(t, 10*time.Second, m.ID+" to forget the deleted token", func() bool {
			_, _, err := m.Server().ResolveToken(client.GetSecretId())
			return errors.Is(err, acl.ErrTokenNotFound)
		})
	}
	_, err = cl.DeleteToken(ctx, &csisupdv1.ACLDeleteTokenRequest{AccessorId: client.GetAccessorId()})
	wantCode(t, "second delete of a token", err, codes.NotFound)
	if a, _, err := follower.Server().ResolveToken(mt.GetToken().GetSecretId()); err != nil || !a.IsManagement() {
		t.Fatalf("the management token: %v", err)
	}

	if _, err := cl.DeletePolicy(ctx, &csisupdv1.ACLDeletePolicyRequest{Name: "vols"}); err != nil {
		t.Fatal(err)
	}
	_, err = onLeader.GetPolicy(ctx, &csisupdv1.ACLGetPolicyRequest{Name: "vols"})
	wantCode(t, "get of a deleted policy", err, codes.NotFound)
	_, err = cl.DeletePolicy(ctx, &csisupdv1.ACLDeletePolicyRequest{Name: "vols"})
	wantCode(t, "second delete of a policy", err, codes.NotFound)

	forwarded, withToken := fwd.counts()
	if forwarded < 10 || withToken != 0 {
		t.Fatalf("%d requests forwarded to the leader, %d of them with the caller's token; want at least 10, none with it", forwarded, withToken)
	}
}

func TestResolveTokenAndTokenSelf(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 1})
	checkFormed(t, c, 1)
	srv := c.Member(0).Server()
	ctx := context.Background()
	cl := csisupdv1.NewACLClient(c.Conn(0))
	cluster := csisupdv1.NewClusterClient(c.Conn(0))
	pluginRead := acl.Capability{Resource: acl.ResourcePlugin, Level: acl.LevelRead}
	volumeWrite := acl.Capability{Resource: acl.ResourceVolume, Level: acl.LevelWrite}

	// Without a token and without an anonymous policy: nothing.
	a, tok, err := srv.ResolveToken("")
	if err != nil || tok != nil || a.Allows(pluginRead) {
		t.Fatalf("anonymous without a policy: allows plugin:read %v, token %v, %v", a.Allows(pluginRead), tok, err)
	}
	res, err := cluster.ResolveToken(ctx, &csisupdv1.ResolveTokenRequest{})
	if err != nil || res.GetToken() != nil || len(res.GetPolicies()) != 0 {
		t.Fatalf("Cluster.ResolveToken without a secret or policy: %v %v", res, err)
	}
	upsert := func(name, rules string) {
		t.Helper()
		if _, err := cl.UpsertPolicy(ctx, &csisupdv1.ACLUpsertPolicyRequest{Policy: &csisupdv1.ACLPolicy{Name: name, Rules: rules}}); err != nil {
			t.Fatal(err)
		}
	}
	upsert(acl.AnonymousPolicy, `plugin { policy = "read" }`)
	upsert("vols", `volume { policy = "write" }`)
	upsert("temp", `operator { policy = "read" }`)
	a, tok, err = srv.ResolveToken("")
	if err != nil || tok != nil || !a.Allows(pluginRead) || a.Allows(volumeWrite) {
		t.Fatalf("anonymous with its policy: %v %v", tok, err)
	}
	res, err = cluster.ResolveToken(ctx, &csisupdv1.ResolveTokenRequest{})
	if err != nil || res.GetToken() != nil || len(res.GetPolicies()) != 1 || res.GetPolicies()[0].GetName() != acl.AnonymousPolicy {
		t.Fatalf("Cluster.ResolveToken without a secret: %v %v", res, err)
	}

	// Unknown secrets.
	if _, _, err := srv.ResolveToken("00000000-0000-4000-8000-000000000000"); !errors.Is(err, acl.ErrTokenNotFound) {
		t.Fatalf("unknown secret: %v", err)
	}
	_, err = cluster.ResolveToken(ctx, &csisupdv1.ResolveTokenRequest{SecretId: "nope"})
	wantCode(t, "Cluster.ResolveToken of an unknown secret", err, codes.NotFound)

	// Management.
	mt, err := cl.CreateToken(ctx, &csisupdv1.ACLCreateTokenRequest{Type: acl.TypeManagement})
	if err != nil {
		t.Fatal(err)
	}
	mgmt := mt.GetToken()
	if a, tok, err := srv.ResolveToken(mgmt.GetSecretId()); err != nil || !a.IsManagement() || tok.GetSecretId() != "" ||
		tok.GetAccessorId() != mgmt.GetAccessorId() {
		t.Fatalf("management token: %v %v", tok, err)
	}

	// A client token whose policy was deleted keeps the others.
	ct, err := cl.CreateToken(ctx, &csisupdv1.ACLCreateTokenRequest{Name: "ci", Policies: []string{"temp", "vols"}})
	if err != nil {
		t.Fatal(err)
	}
	client := ct.GetToken()
	if _, err := cl.DeletePolicy(ctx, &csisupdv1.ACLDeletePolicyRequest{Name: "temp"}); err != nil {
		t.Fatal(err)
	}
	a, tok, err = srv.ResolveToken(client.GetSecretId())
	if err != nil || a.IsManagement() || !a.Allows(volumeWrite) || a.Allows(acl.Capability{Resource: acl.ResourceOperator, Level: acl.LevelRead}) ||
		a.Allows(pluginRead) {
		t.Fatalf("client token with a deleted policy: %v %v", tok, err)
	}
	if strings.Join(tok.GetPolicies(), ",") != "temp,vols" || tok.GetSecretId() != "" {
		t.Fatalf("client token view %v: it keeps the names it was given", tok)
	}
	res, err = cluster.ResolveToken(ctx, &csisupdv1.ResolveTokenRequest{SecretId: client.GetSecretId()})
	if err != nil {
		t.Fatal(err)
	}
	if res.GetToken().GetAccessorId() != client.GetAccessorId() || res.GetToken().GetSecretId() != "" ||
		len(res.GetPolicies()) != 1 || res.GetPolicies()[0].GetName() != "vols" {
		t.Fatalf("Cluster.ResolveToken of the client token: %v", res)
	}

	// TokenSelf.
	self, err := cl.TokenSelf(acl.WithToken(ctx, client.GetSecretId()), &csisupdv1.ACLTokenSelfRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if self.GetToken().GetAccessorId() != client.GetAccessorId() || self.GetToken().GetSecretId() != "" {
		t.Fatalf("TokenSelf: %v", self.GetToken())
	}
	_, err = cl.TokenSelf(ctx, &csisupdv1.ACLTokenSelfRequest{})
	wantCode(t, "TokenSelf without a token", err, codes.Unauthenticated)
	_, err = cl.TokenSelf(acl.WithToken(ctx, "nope"), &csisupdv1.ACLTokenSelfRequest{})
	wantCode(t, "TokenSelf with an unknown token", err, codes.Unauthenticated)
}

// TestACLSecretsNeverStored writes tokens and then searches every place a
// secret could end up: the snapshot Control.SnapshotSave returns, every
// file of the server's data dir (raft log, stable store, raft snapshots),
// each raft log entry, and the server's log output. After a restart, a
// restore of the saved snapshot brings back deleted ACL state.
func TestACLSecretsNeverStored(t *testing.T) {
	logs := &logBuffer{}
	c := testcluster.New(t, testcluster.Config{Servers: 1,
		Logger: hclog.New(&hclog.LoggerOptions{Level: hclog.Trace, Output: logs})})
	checkFormed(t, c, 1)
	m := c.Member(0)
	ctx := context.Background()
	cl := csisupdv1.NewACLClient(c.Conn(0))
	control := c.Control(0)

	boot, err := cl.Bootstrap(ctx, &csisupdv1.ACLBootstrapRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.UpsertPolicy(ctx, &csisupdv1.ACLUpsertPolicyRequest{Policy: &csisupdv1.ACLPolicy{Name: "vols", Rules: `volume { policy = "write" }`}}); err != nil {
		t.Fatal(err)
	}
	ct, err := cl.CreateToken(ctx, &csisupdv1.ACLCreateTokenRequest{Name: "ci", Policies: []string{"vols"}})
	if err != nil {
		t.Fatal(err)
	}
	client := ct.GetToken()
	secrets := []string{boot.GetToken().GetSecretId(), client.GetSecretId()}

	snap := saveSnapshot(t, control)
	for _, s := range secrets {
		if bytes.Contains(snap, []byte(s)) {
			t.Fatal("a secret is in the saved snapshot")
		}
	}
	if !bytes.Contains(snap, []byte(client.GetAccessorId())) || !bytes.Contains(snap, acl.HashSecret(client.GetSecretId())) {
		t.Fatal("the snapshot lacks the token's accessor id or hash: the search proves nothing")
	}

	// A raft snapshot on disk too, then stop the server and read its files.
	if err := m.Server().Raft().Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	c.Stop(0)
	files := 0
	err = filepath.WalkDir(m.DataDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files++
		for _, s := range secrets {
			if bytes.Contains(data, []byte(s)) {
				t.Errorf("a secret is in %s", path)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 3 {
		t.Fatalf("only %d files in the data dir: the search proves nothing", files)
	}

	store, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(m.DataDir, "raft", "raft.db")})
	if err != nil {
		t.Fatal(err)
	}
	first, _ := store.FirstIndex()
	last, _ := store.LastIndex()
	hashes := 0
	for i := first; i <= last && last > 0; i++ {
		var l raft.Log
		if err := store.GetLog(i, &l); err != nil {
			t.Fatalf("raft log %d: %v", i, err)
		}
		for _, s := range secrets {
			if bytes.Contains(l.Data, []byte(s)) {
				t.Errorf("a secret is in raft log %d", i)
			}
		}
		var e statepb.LogEntry
		if l.Type == raft.LogCommand && proto.Unmarshal(l.Data, &e) == nil {
			if bytes.Equal(e.GetAclTokenUpsert().GetSecretHash(), acl.HashSecret(client.GetSecretId())) ||
				bytes.Equal(e.GetAclBootstrap().GetToken().GetSecretHash(), acl.HashSecret(boot.GetToken().GetSecretId())) {
				hashes++
			}
		}
	}
	if hashes != 2 {
		t.Fatalf("found %d raft entries with the tokens' hashes in logs %d..%d, want 2: the search proves nothing", hashes, first, last)
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	c.Restart(0)
	checkFormed(t, c, 1)
	control = c.Control(0)
	cl = csisupdv1.NewACLClient(c.Conn(0))
	testutil.WaitFor(t, 10*time.Second, "the restarted server to resolve the client token", func() bool {
		_, _, err := m.Server().ResolveToken(client.GetSecretId())
		return err == nil
	})

	// Round trip: delete, restore, and the state is back.
	if _, err := cl.DeleteToken(ctx, &csisupdv1.ACLDeleteTokenRequest{AccessorId: client.GetAccessorId()}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.DeletePolicy(ctx, &csisupdv1.ACLDeletePolicyRequest{Name: "vols"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.Server().ResolveToken(client.GetSecretId()); !errors.Is(err, acl.ErrTokenNotFound) {
		t.Fatalf("deleted token before the restore: %v", err)
	}
	bootIndex := m.Server().State().ACLBootstrapIndex()
	restoreSnapshot(t, control, snap)
	a, tok, err := m.Server().ResolveToken(client.GetSecretId())
	if err != nil || tok.GetAccessorId() != client.GetAccessorId() || !a.Allows(acl.Capability{Resource: acl.ResourceVolume, Level: acl.LevelWrite}) {
		t.Fatalf("the restored client token: %v %v", tok, err)
	}
	if got := m.Server().State().ACLBootstrapIndex(); got != bootIndex {
		t.Fatalf("restored bootstrap index %d, want %d", got, bootIndex)
	}
	_, err = cl.Bootstrap(ctx, &csisupdv1.ACLBootstrapRequest{})
	wantCode(t, "bootstrap after the restore", err, codes.FailedPrecondition)

	out := logs.String()
	for _, s := range secrets {
		if strings.Contains(out, s) {
			t.Fatal("a secret is in the server's log output")
		}
	}
	if !strings.Contains(out, client.GetAccessorId()) {
		t.Fatalf("the log does not name the token by its accessor id:\n%s", out)
	}
}

// TestACLNodeIdentityTokens creates tokens with a node identity on a real
// server: the identity is stored, shown by every read of the token and by
// Cluster.ResolveToken, and resolves to node:write bound to its node, both
// on the server and as an agent compiles the answer.
func TestACLNodeIdentityTokens(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 1})
	checkFormed(t, c, 1)
	srv := c.Member(0).Server()
	ctx := context.Background()
	cl := csisupdv1.NewACLClient(c.Conn(0))
	nodeWrite := acl.Capability{Resource: acl.ResourceNode, Level: acl.LevelWrite}
	volumeRead := acl.Capability{Resource: acl.ResourceVolume, Level: acl.LevelRead}
	if _, err := cl.UpsertPolicy(ctx, &csisupdv1.ACLUpsertPolicyRequest{Policy: &csisupdv1.ACLPolicy{
		Name: "vols", Rules: `volume { policy = "read" }`}}); err != nil {
		t.Fatal(err)
	}

	refusals := []struct {
		req  *csisupdv1.ACLCreateTokenRequest
		want string
	}{
		{&csisupdv1.ACLCreateTokenRequest{Type: acl.TypeManagement, NodeIdentity: "node-1"},
			`node identity "node-1": a management token takes no node identity`},
		{&csisupdv1.ACLCreateTokenRequest{NodeIdentity: "-node"}, `node identity "-node" must start with a letter or digit`},
		{&csisupdv1.ACLCreateTokenRequest{NodeIdentity: "node/1"}, `node identity "node/1"`},
		{&csisupdv1.ACLCreateTokenRequest{NodeIdentity: strings.Repeat("n", 254)}, "at most 253"},
	}
	for _, r := range refusals {
		_, err := cl.CreateToken(ctx, r.req)
		if msg := wantCode(t, "create token "+r.want, err, codes.InvalidArgument); !strings.Contains(msg, r.want) {
			t.Errorf("create token: %s, want it to contain %s", msg, r.want)
		}
	}

	alone, err := cl.CreateToken(ctx, &csisupdv1.ACLCreateTokenRequest{Name: "node-1 agent", NodeIdentity: "node-1"})
	if err != nil {
		t.Fatal(err)
	}
	both, err := cl.CreateToken(ctx, &csisupdv1.ACLCreateTokenRequest{NodeIdentity: "node-2", Policies: []string{"vols"}})
	if err != nil {
		t.Fatal(err)
	}
	if tok := alone.GetToken(); tok.GetNodeIdentity() != "node-1" || tok.GetType() != acl.TypeClient || len(tok.GetPolicies()) != 0 {
		t.Fatalf("created token %v: want a client token with node identity node-1 and no policy", tok)
	}
	got, err := cl.GetToken(ctx, &csisupdv1.ACLGetTokenRequest{AccessorId: alone.GetToken().GetAccessorId()})
	if err != nil || got.GetToken().GetNodeIdentity() != "node-1" {
		t.Fatalf("GetToken: %v, %v", got.GetToken(), err)
	}
	list, err := cl.ListTokens(ctx, &csisupdv1.ACLListTokensRequest{})
	if err != nil {
		t.Fatal(err)
	}
	identities := map[string]string{}
	for _, tk := range list.GetTokens() {
		identities[tk.GetAccessorId()] = tk.GetNodeIdentity()
	}
	if identities[alone.GetToken().GetAccessorId()] != "node-1" || identities[both.GetToken().GetAccessorId()] != "node-2" {
		t.Fatalf("ListTokens shows identities %v", identities)
	}
	self, err := cl.TokenSelf(acl.WithToken(ctx, alone.GetToken().GetSecretId()), &csisupdv1.ACLTokenSelfRequest{})
	if err != nil || self.GetToken().GetNodeIdentity() != "node-1" {
		t.Fatalf("TokenSelf: %v, %v", self.GetToken(), err)
	}

	cluster := csisupdv1.NewClusterClient(c.Conn(0))
	for _, tt := range []struct {
		tok       *csisupdv1.ACLToken
		node      string
		allowsVol bool
	}{
		{alone.GetToken(), "node-1", false},
		{both.GetToken(), "node-2", true},
	} {
		a, view, err := srv.ResolveToken(tt.tok.GetSecretId())
		if err != nil || a.NodeIdentity() != tt.node || !a.Allows(nodeWrite) || a.Allows(volumeRead) != tt.allowsVol ||
			view.GetNodeIdentity() != tt.node {
			t.Fatalf("server resolves %s: identity %q, node:write %v, volume:read %v, %v", tt.node, a.NodeIdentity(),
				a.Allows(nodeWrite), a.Allows(volumeRead), err)
		}
		// An agent without the server role compiles the servers' answer.
		res, err := cluster.ResolveToken(ctx, &csisupdv1.ResolveTokenRequest{SecretId: tt.tok.GetSecretId()})
		if err != nil {
			t.Fatal(err)
		}
		onAgent, err := rpc.ACLFromResolved(res)
		if err != nil || onAgent.NodeIdentity() != tt.node || !onAgent.Allows(nodeWrite) || onAgent.Allows(volumeRead) != tt.allowsVol {
			t.Fatalf("agent resolves %s: identity %q, node:write %v, volume:read %v, %v", tt.node, onAgent.NodeIdentity(),
				onAgent.Allows(nodeWrite), onAgent.Allows(volumeRead), err)
		}
	}
}
