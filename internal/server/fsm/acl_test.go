package fsm

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/csisupd/csisupd/internal/acl"
	"github.com/csisupd/csisupd/internal/server/state"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

func policyUpsert(name, rules string) *statepb.LogEntry {
	return &statepb.LogEntry{Command: &statepb.LogEntry_AclPolicyUpsert{AclPolicyUpsert: &statepb.ACLPolicy{
		Name: name, Description: "d-" + name, Rules: rules,
	}}}
}

func policyDelete(name string) *statepb.LogEntry {
	return &statepb.LogEntry{Command: &statepb.LogEntry_AclPolicyDelete{AclPolicyDelete: name}}
}

// newToken returns a token record and its secret.
func newToken(t *testing.T, typ string, policies ...string) (*statepb.ACLTokenRecord, string) {
	t.Helper()
	accessor, err := acl.NewAccessorID()
	if err != nil {
		t.Fatal(err)
	}
	secret, err := acl.NewSecretID()
	if err != nil {
		t.Fatal(err)
	}
	return &statepb.ACLTokenRecord{AccessorId: accessor, SecretHash: acl.HashSecret(secret), Name: "n-" + accessor[:8],
		Type: typ, Policies: policies}, secret
}

func tokenUpsert(r *statepb.ACLTokenRecord) *statepb.LogEntry {
	return &statepb.LogEntry{Command: &statepb.LogEntry_AclTokenUpsert{AclTokenUpsert: proto.Clone(r).(*statepb.ACLTokenRecord)}}
}

func tokenDelete(accessor string) *statepb.LogEntry {
	return &statepb.LogEntry{Command: &statepb.LogEntry_AclTokenDelete{AclTokenDelete: accessor}}
}

func bootstrapEntry(r *statepb.ACLTokenRecord, reset uint64) *statepb.LogEntry {
	return &statepb.LogEntry{Command: &statepb.LogEntry_AclBootstrap{AclBootstrap: &statepb.ACLBootstrapCommand{
		Token: proto.Clone(r).(*statepb.ACLTokenRecord), ResetIndex: reset,
	}}}
}

// at sets the time of e to sec seconds after the epoch.
func at(sec int64, e *statepb.LogEntry) *statepb.LogEntry {
	e.Time = &timestamppb.Timestamp{Seconds: sec}
	return e
}

// checkErrors fails t unless each result has the error wanted of it: none
// for "", else one containing the text.
func checkErrors(t *testing.T, res []Result, wantErr []string) {
	t.Helper()
	for i, w := range wantErr {
		switch {
		case w == "" && res[i].Err != nil:
			t.Errorf("entry %d: %v", i, res[i].Err)
		case w != "" && (res[i].Err == nil || !strings.Contains(res[i].Err.Error(), w)):
			t.Errorf("entry %d: error %v, want it to contain %q", i, res[i].Err, w)
		}
	}
}

func TestFSMACLPolicies(t *testing.T) {
	events := testEvents(t, 16, 8)
	f, err := newFSM(events)
	if err != nil {
		t.Fatal(err)
	}
	res := applyAll(t, f,
		at(100, policyUpsert("ops", `volume { policy = "write" }`)),
		at(200, policyUpsert("ops", `volume { policy = "read" }`)),
		policyUpsert("bad name", `volume { policy = "read" }`),
		policyUpsert("broken", "volume {\n  policy = \"admin\"\n}\n"),
		policyUpsert("big", `plugin { policy = "read" }`+strings.Repeat(" ", acl.MaxPolicyBytes)),
		policyDelete("nope"),
		policyUpsert("gone", ""),
		policyDelete("gone"),
		policyUpsert("anonymous", `plugin { policy = "read" }`),
	)
	wantErr := []string{"", "", `policy name "bad name"`, `policy broken:2: volume.policy: unknown level "admin"`, "at most 65536", "not found", "", "", ""}
	checkErrors(t, res, wantErr)
	if !errors.Is(res[5].Err, state.ErrNotFound) {
		t.Errorf("delete of a missing policy: %v, want state.ErrNotFound", res[5].Err)
	}
	st := f.State()
	p := st.ACLPolicy("ops")
	if p.GetRules() != `volume { policy = "read" }` || p.GetDescription() != "d-ops" {
		t.Fatalf("policy ops: %v", p)
	}
	if p.GetCreateTime().GetSeconds() != 100 || p.GetModifyTime().GetSeconds() != 200 {
		t.Fatalf("create %v modify %v, want 100 and 200: the update must keep the create time", p.GetCreateTime(), p.GetModifyTime())
	}
	var names []string
	for _, p := range st.ACLPolicies() {
		names = append(names, p.GetName())
	}
	if got := strings.Join(names, ","); got != "anonymous,ops" {
		t.Fatalf("policies %s, want anonymous,ops (refused and deleted ones absent, sorted)", got)
	}
	if evs := readAll(t, events, 0); len(evs) != 0 {
		t.Fatalf("ACL commands caused events: %s", describe(evs))
	}
}

func TestFSMACLTokens(t *testing.T) {
	f, err := newFSM(testEvents(t, 16, 8))
	if err != nil {
		t.Fatal(err)
	}
	client, clientSecret := newToken(t, acl.TypeClient, "ops")
	mgmt, mgmtSecret := newToken(t, acl.TypeManagement)
	badHash, _ := newToken(t, acl.TypeClient, "ops")
	badHash.SecretHash = []byte("short")
	badType, _ := newToken(t, "root")
	mgmtWithPolicy, _ := newToken(t, acl.TypeManagement, "ops")
	clientNoPolicy, _ := newToken(t, acl.TypeClient)
	sameSecret, _ := newToken(t, acl.TypeClient, "ops")
	sameSecret.SecretHash = client.SecretHash
	noAccessor, _ := newToken(t, acl.TypeManagement)
	noAccessor.AccessorId = ""
	renamed := proto.Clone(client).(*statepb.ACLTokenRecord)
	renamed.Name = "renamed"

	res := applyAll(t, f,
		at(100, tokenUpsert(client)),
		tokenUpsert(mgmt),
		tokenUpsert(badHash),
		tokenUpsert(badType),
		tokenUpsert(mgmtWithPolicy),
		tokenUpsert(clientNoPolicy),
		tokenUpsert(sameSecret),
		tokenUpsert(noAccessor),
		tokenDelete("nope"),
		at(300, tokenUpsert(renamed)),
	)
	wantErr := []string{"", "", "secret hash is 5 bytes", `type "root"`, "takes no policies", "at least one policy",
		"its secret belongs to another token", "accessor id", "not found", ""}
	checkErrors(t, res, wantErr)
	st := f.State()
	if got := st.ACLTokenBySecret(clientSecret); got.GetAccessorId() != client.AccessorId || got.GetName() != "renamed" {
		t.Fatalf("by secret: %v", got)
	}
	if got := st.ACLToken(client.AccessorId); got.GetCreateTime().GetSeconds() != 100 {
		t.Fatalf("the update changed the create time to %v", got.GetCreateTime())
	}
	if st.ACLTokenBySecret(mgmtSecret).GetType() != acl.TypeManagement {
		t.Fatal("management token not found by its secret")
	}
	for _, s := range []string{"", "wrong", client.AccessorId, string(client.SecretHash)} {
		if got := st.ACLTokenBySecret(s); got != nil {
			t.Errorf("ACLTokenBySecret(%q) found %s", s, got.GetAccessorId())
		}
	}
	if n := len(st.ACLTokens()); n != 2 {
		t.Fatalf("%d tokens, want 2", n)
	}
	toks := st.ACLTokens()
	if toks[0].GetAccessorId() > toks[1].GetAccessorId() {
		t.Fatal("tokens not sorted by accessor id")
	}
	res = applyAll(t, f, tokenDelete(client.AccessorId))
	if res[0].Err != nil {
		t.Fatal(res[0].Err)
	}
	if st := f.State(); st.ACLTokenBySecret(clientSecret) != nil || st.ACLToken(client.AccessorId) != nil {
		t.Fatal("deleted token still found")
	}
}

func TestFSMACLBootstrap(t *testing.T) {
	f, err := newFSM(testEvents(t, 16, 8))
	if err != nil {
		t.Fatal(err)
	}
	first, firstSecret := newToken(t, acl.TypeManagement)
	second, _ := newToken(t, acl.TypeManagement)
	third, thirdSecret := newToken(t, acl.TypeManagement)
	client, _ := newToken(t, acl.TypeClient, "ops")

	applyAll(t, f, policyUpsert("ops", "")) // index 1
	if got := f.State().ACLBootstrapIndex(); got != 0 {
		t.Fatalf("bootstrap index %d before any bootstrap", got)
	}
	res := applyAll(t, f, bootstrapEntry(client, 0), bootstrapEntry(first, 0), bootstrapEntry(second, 0), bootstrapEntry(second, 2))
	if res[0].Err == nil || !strings.Contains(res[0].Err.Error(), "want management") {
		t.Fatalf("bootstrap with a client token: %v", res[0].Err)
	}
	if res[1].Err != nil {
		t.Fatal(res[1].Err)
	}
	idx := res[1].Index
	if got := f.State().ACLBootstrapIndex(); got != idx || idx != 3 {
		t.Fatalf("bootstrap index %d, want the entry's index %d (3)", got, idx)
	}
	for i, r := range res[2:] {
		var done *BootstrappedError
		if !errors.As(r.Err, &done) || done.Index != idx {
			t.Fatalf("repeated bootstrap %d: %v, want refusal naming index %d", i, r.Err, idx)
		}
	}
	if !strings.Contains(res[3].Err.Error(), "reset index 2 is not the current one") {
		t.Fatalf("wrong reset: %v", res[3].Err)
	}
	if f.State().ACLToken(second.AccessorId) != nil || f.State().ACLToken(client.AccessorId) != nil {
		t.Fatal("a refused bootstrap stored its token")
	}
	res = applyAll(t, f, bootstrapEntry(third, idx))
	if res[0].Err != nil {
		t.Fatalf("reset bootstrap: %v", res[0].Err)
	}
	if got := f.State().ACLBootstrapIndex(); got != res[0].Index || got == idx {
		t.Fatalf("bootstrap index after reset %d, want %d", got, res[0].Index)
	}
	for _, s := range []string{firstSecret, thirdSecret} {
		if f.State().ACLTokenBySecret(s).GetType() != acl.TypeManagement {
			t.Fatal("a bootstrap token does not resolve")
		}
	}
}

func TestStateResolveToken(t *testing.T) {
	f, err := newFSM(testEvents(t, 16, 8))
	if err != nil {
		t.Fatal(err)
	}
	st := func() *state.Store { return f.State() }
	read := func(r acl.Resource) acl.Capability { return acl.Capability{Resource: r, Level: acl.LevelRead} }
	write := func(r acl.Resource) acl.Capability { return acl.Capability{Resource: r, Level: acl.LevelWrite} }

	a, tok, _, err := st().ResolveToken("")
	if err != nil || tok != nil || a.Allows(read(acl.ResourcePlugin)) || a.IsManagement() {
		t.Fatalf("anonymous without a policy: %v %v %v", a, tok, err)
	}
	client, clientSecret := newToken(t, acl.TypeClient, "vols", "missing", "deny-ops")
	mgmt, mgmtSecret := newToken(t, acl.TypeManagement)
	for i, r := range applyAll(t, f,
		policyUpsert(acl.AnonymousPolicy, `plugin { policy = "read" }`),
		policyUpsert("vols", "volume { policy = \"write\" }\noperator { policy = \"write\" }"),
		policyUpsert("deny-ops", `operator { policy = "deny" }`),
		tokenUpsert(client), tokenUpsert(mgmt),
	) {
		if r.Err != nil {
			t.Fatalf("entry %d: %v", i, r.Err)
		}
	}
	a, tok, rows, err := st().ResolveToken("")
	if err != nil || tok != nil || !a.Allows(read(acl.ResourcePlugin)) || a.Allows(write(acl.ResourcePlugin)) || len(rows) != 1 {
		t.Fatalf("anonymous with its policy: allows plugin:read %v, token %v, %d policies, %v", a.Allows(read(acl.ResourcePlugin)), tok, len(rows), err)
	}
	if _, _, _, err := st().ResolveToken("not-a-secret"); !errors.Is(err, acl.ErrTokenNotFound) {
		t.Fatalf("unknown secret: %v", err)
	}
	a, tok, _, err = st().ResolveToken(mgmtSecret)
	if err != nil || !a.IsManagement() || tok.GetAccessorId() != mgmt.AccessorId || !bytes.Equal(tok.GetSecretHash(), acl.HashSecret(mgmtSecret)) {
		t.Fatalf("management: %v %v %v", a, tok, err)
	}
	a, tok, rows, err = st().ResolveToken(clientSecret)
	if err != nil {
		t.Fatal(err)
	}
	if !a.Allows(write(acl.ResourceVolume)) || a.Allows(read(acl.ResourceOperator)) || a.Allows(read(acl.ResourcePlugin)) {
		t.Fatal("client token: want volume:write, operator denied by deny-ops, nothing from the anonymous policy")
	}
	if len(rows) != 2 || rows[0].GetName() != "vols" || rows[1].GetName() != "deny-ops" {
		t.Fatalf("client token policies %v, want the existing ones in the token's order", rows)
	}
	if !bytes.Equal(tok.GetSecretHash(), acl.HashSecret(clientSecret)) || strings.Join(tok.GetPolicies(), ",") != "vols,missing,deny-ops" {
		t.Fatalf("client token: %v", tok)
	}
	applyAll(t, f, policyDelete("deny-ops"))
	if a, _, _, _ := st().ResolveToken(clientSecret); !a.Allows(write(acl.ResourceOperator)) {
		t.Fatal("a deleted policy still applies")
	}
}

func TestFSMSnapshotCarriesACL(t *testing.T) {
	f, err := newFSM(testEvents(t, 16, 8))
	if err != nil {
		t.Fatal(err)
	}
	boot, bootSecret := newToken(t, acl.TypeManagement)
	client, clientSecret := newToken(t, acl.TypeClient, "ops")
	applyAll(t, f,
		register("a", plug("p", "monolith", true)),
		at(100, policyUpsert("ops", `volume { policy = "write" }`)),
		bootstrapEntry(boot, 0),
		tokenUpsert(client),
	)
	snap := snapshotOf(t, f)
	for _, secret := range []string{bootSecret, clientSecret} {
		if strings.Contains(snap, secret) {
			t.Fatal("a secret is in the snapshot")
		}
	}
	if !strings.Contains(snap, client.AccessorId) || !strings.Contains(snap, string(client.SecretHash)) {
		t.Fatal("the snapshot lacks the token's accessor id or hash: the search above proves nothing")
	}
	g, err := newFSM(testEvents(t, 16, 8))
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Restore(io.NopCloser(strings.NewReader(snap))); err != nil {
		t.Fatal(err)
	}
	st := g.State()
	if st.ACLBootstrapIndex() != f.State().ACLBootstrapIndex() || st.ACLBootstrapIndex() == 0 {
		t.Fatalf("restored bootstrap index %d, want %d", st.ACLBootstrapIndex(), f.State().ACLBootstrapIndex())
	}
	if p := st.ACLPolicy("ops"); p.GetCreateTime().GetSeconds() != 100 || p.GetRules() != `volume { policy = "write" }` {
		t.Fatalf("restored policy %v", p)
	}
	a, tok, _, err := st.ResolveToken(clientSecret)
	if err != nil || tok.GetAccessorId() != client.AccessorId || !a.Allows(acl.Capability{Resource: acl.ResourceVolume, Level: acl.LevelWrite}) {
		t.Fatalf("restored client token: %v %v", tok, err)
	}
	if a, _, _, err := st.ResolveToken(bootSecret); err != nil || !a.IsManagement() {
		t.Fatalf("restored bootstrap token: %v", err)
	}
	// A second bootstrap is still refused after the restore.
	again, _ := newToken(t, acl.TypeManagement)
	if r := applyAll(t, g, bootstrapEntry(again, 0)); r[0].Err == nil {
		t.Fatal("bootstrap after restore accepted")
	}
}

// TestFSMRestoreSnapshotWithoutACL restores a snapshot written before
// the ACL fields existed.
func TestFSMRestoreSnapshotWithoutACL(t *testing.T) {
	old := &statepb.StateSnapshot{Version: 1, Index: 7,
		Nodes:   []*statepb.ClusterNode{{Id: "a", Name: "a", Status: state.NodeStatusReady}},
		Servers: []*statepb.ServerRecord{{Id: "s1", RpcAddress: "h:1"}}}
	data, err := proto.Marshal(old)
	if err != nil {
		t.Fatal(err)
	}
	f, err := newFSM(testEvents(t, 16, 8))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Restore(io.NopCloser(strings.NewReader(string(data)))); err != nil {
		t.Fatal(err)
	}
	st := f.State()
	if st.Node("a") == nil || len(st.ACLPolicies()) != 0 || len(st.ACLTokens()) != 0 || st.ACLBootstrapIndex() != 0 {
		t.Fatal("restored state of an old snapshot is wrong")
	}
	boot, _ := newToken(t, acl.TypeManagement)
	if r := applyAll(t, f, bootstrapEntry(boot, 0)); r[0].Err != nil {
		t.Fatalf("bootstrap after restoring a snapshot without ACL state: %v", r[0].Err)
	}
}

// TestRestoreKeepsPolicyItNoLongerParses checks that a stored policy whose
// rules do not parse is restored and grants nothing.
func TestRestoreKeepsPolicyItNoLongerParses(t *testing.T) {
	client, secret := newToken(t, acl.TypeClient, "odd")
	snap := &statepb.StateSnapshot{Version: 1, Index: 3,
		AclPolicies: []*statepb.ACLPolicy{{Name: "odd", Rules: `secrets { policy = "write" }`}},
		AclTokens:   []*statepb.ACLTokenRecord{client}}
	st, err := state.FromSnapshot(snap, 3)
	if err != nil {
		t.Fatal(err)
	}
	if st.ACLPolicy("odd") == nil {
		t.Fatal("policy dropped")
	}
	a, _, _, err := st.ResolveToken(secret)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range acl.Resources() {
		if a.Allows(acl.Capability{Resource: r, Level: acl.LevelRead}) {
			t.Fatalf("unparsable policy grants %s:read", r)
		}
	}
}

// TestFSMNodeIdentityTokens stores tokens with a node identity: a client
// token needs no policy with one, a management token takes none, and the
// identity resolves to node:write bound to its node.
func TestFSMNodeIdentityTokens(t *testing.T) {
	f, err := newFSM(testEvents(t, 16, 8))
	if err != nil {
		t.Fatal(err)
	}
	node, nodeSecret := newToken(t, acl.TypeClient)
	node.NodeIdentity = "node-1"
	both, bothSecret := newToken(t, acl.TypeClient, "vols")
	both.NodeIdentity = "node-2"
	mgmt, _ := newToken(t, acl.TypeManagement)
	mgmt.NodeIdentity = "node-1"
	long, _ := newToken(t, acl.TypeClient)
	long.NodeIdentity = strings.Repeat("n", state.MaxACLNodeIdentity+1)

	res := applyAll(t, f, policyUpsert("vols", `volume { policy = "read" }`),
		tokenUpsert(node), tokenUpsert(both), tokenUpsert(mgmt), tokenUpsert(long))
	wantErr := []string{"", "", "", "takes no node identity", "node identity is 254 bytes"}
	checkErrors(t, res, wantErr)
	nodeWrite := acl.Capability{Resource: acl.ResourceNode, Level: acl.LevelWrite}
	volRead := acl.Capability{Resource: acl.ResourceVolume, Level: acl.LevelRead}
	a, tok, _, err := f.State().ResolveToken(nodeSecret)
	if err != nil || tok.GetNodeIdentity() != "node-1" || a.NodeIdentity() != "node-1" || !a.Allows(nodeWrite) || a.Allows(volRead) {
		t.Fatalf("node identity alone: identity %q/%q, node:write %v, volume:read %v, %v",
			tok.GetNodeIdentity(), a.NodeIdentity(), a.Allows(nodeWrite), a.Allows(volRead), err)
	}
	a, _, _, err = f.State().ResolveToken(bothSecret)
	if err != nil || a.NodeIdentity() != "node-2" || !a.Allows(nodeWrite) || !a.Allows(volRead) {
		t.Fatalf("node identity with a policy: identity %q, node:write %v, volume:read %v, %v",
			a.NodeIdentity(), a.Allows(nodeWrite), a.Allows(volRead), err)
	}
}
