package acl

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"
)

func TestCallerNodeCheck(t *testing.T) {
	tests := []struct {
		name    string
		c       CallerNode
		node    string
		wantErr string // "" means allowed
		bound   bool
	}{
		{name: "unbound acts as any node", c: CallerNode{}, node: "node-2"},
		{name: "token allows its node", c: CallerNode{}.BindToken("node-1"), node: "node-1", bound: true},
		{name: "token refuses another node", c: CallerNode{}.BindToken("node-1"), node: "node-2", bound: true,
			wantErr: `the token is bound to node "node-1", not "node-2"`},
		{name: "certificate refuses another node", c: CallerNode{}.BindCertificate("node-1"), node: "node-2", bound: true,
			wantErr: `the certificate is bound to node "node-1", not "node-2"`},
		{name: "both agree", c: CallerNode{}.BindToken("node-1").BindCertificate("node-1"), node: "node-1", bound: true},
		{name: "both agree, another node refused", c: CallerNode{}.BindToken("node-1").BindCertificate("node-1"), node: "node-2", bound: true,
			wantErr: `the token is bound to node "node-1", not "node-2"`},
		{name: "two bindings that disagree allow no node: the token's", c: CallerNode{}.BindToken("node-1").BindCertificate("node-2"),
			node: "node-1", bound: true, wantErr: `the certificate is bound to node "node-2", not "node-1"`},
		{name: "two bindings that disagree allow no node: the certificate's", c: CallerNode{}.BindToken("node-1").BindCertificate("node-2"),
			node: "node-2", bound: true, wantErr: `the token is bound to node "node-1", not "node-2"`},
		{name: "names compare exactly", c: CallerNode{}.BindToken("node-1"), node: "Node-1", bound: true,
			wantErr: `the token is bound to node "node-1", not "Node-1"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.c.Bound(); got != tt.bound {
				t.Errorf("Bound() = %v, want %v", got, tt.bound)
			}
			err := tt.c.Check(tt.node)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("Check(%q) = %v, want nil", tt.node, err)
			case tt.wantErr != "" && (err == nil || err.Error() != tt.wantErr):
				t.Errorf("Check(%q) = %v, want %q", tt.node, err, tt.wantErr)
			}
		})
	}
}

func TestCallerNodeMergeNarrows(t *testing.T) {
	token := CallerNode{}.BindToken("node-1")
	cert := CallerNode{}.BindCertificate("node-2")
	tests := []struct {
		name    string
		a, b    CallerNode
		allowed []string // of node-1, node-2, node-3
	}{
		{"nothing with nothing", CallerNode{}, CallerNode{}, []string{"node-1", "node-2", "node-3"}},
		{"nothing with a token", CallerNode{}, token, []string{"node-1"}},
		{"a token with nothing", token, CallerNode{}, []string{"node-1"}},
		{"a token with itself", token, token, []string{"node-1"}},
		{"disagreeing bindings", token, cert, nil},
		{"disagreeing bindings, the other way", cert, token, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := tt.a.Merge(tt.b)
			var allowed []string
			for _, n := range []string{"node-1", "node-2", "node-3"} {
				if m.Check(n) == nil {
					allowed = append(allowed, n)
				}
				// A merge never allows what either side refused.
				if m.Check(n) == nil && (tt.a.Check(n) != nil || tt.b.Check(n) != nil) {
					t.Errorf("the merge allows %s, which one side refused", n)
				}
			}
			if fmt.Sprint(allowed) != fmt.Sprint(tt.allowed) {
				t.Errorf("the merge %s allows %v, want %v", m, allowed, tt.allowed)
			}
		})
	}
	// Merging leaves both sides as they were.
	_ = token.Merge(cert)
	if token.String() != "token=node-1" || cert.String() != "certificate=node-2" {
		t.Errorf("Merge changed its operands: %s, %s", token, cert)
	}
	// Binding to a value that shares a backing array leaves the first as it
	// was.
	base := CallerNode{}.BindToken("node-1").BindToken("node-1")
	x, y := base.BindCertificate("node-1"), base.BindCertificate("node-9")
	if x.String() != "token=node-1,certificate=node-1" || y.String() != "token=node-1,certificate=node-9" {
		t.Errorf("bindings share state: %s, %s", x, y)
	}
}

func TestCallerNodeContext(t *testing.T) {
	ctx := context.Background()
	if CallerNodeFromContext(ctx).Bound() {
		t.Fatal("a context without a CallerNode is bound")
	}
	c := CallerNode{}.BindToken("node-1")
	got := CallerNodeFromContext(WithCallerNode(ctx, c))
	if got.String() != c.String() || got.Check("node-2") == nil {
		t.Fatalf("CallerNodeFromContext = %s, want %s", got, c)
	}
}

// incoming turns the outgoing metadata of ctx into the incoming metadata of
// a server's handler, as gRPC sends it.
func incoming(ctx context.Context) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx)
	return metadata.NewIncomingContext(context.Background(), md)
}

func TestCallerNodeMetadataRoundTrip(t *testing.T) {
	for _, c := range []CallerNode{
		{},
		CallerNode{}.BindToken("node-1"),
		CallerNode{}.BindCertificate("node-1"),
		CallerNode{}.BindToken("node-1").BindCertificate("node-2"),
	} {
		ctx := AppendCallerNode(metadata.AppendToOutgoingContext(context.Background(), "other", "kept"), c)
		got := CallerNodeFromIncoming(incoming(ctx))
		if got.String() != c.String() {
			t.Errorf("round trip of %s gave %s", c, got)
		}
		md, _ := metadata.FromOutgoingContext(ctx)
		if v := md.Get("other"); len(v) != 1 || v[0] != "kept" {
			t.Errorf("AppendCallerNode lost other metadata: %v", md)
		}
	}
	if CallerNodeFromIncoming(context.Background()).Bound() {
		t.Error("a context without metadata is bound")
	}
}

func TestCallerNodeFromIncomingFailsClosed(t *testing.T) {
	many := make([]string, 0, 2*(maxForwardedBindings+1))
	for i := 0; i <= maxForwardedBindings; i++ {
		many = append(many, CallerNodeMetadataKey, "token=node-1")
	}
	tests := []struct {
		name string
		kv   []string
	}{
		{"no equals sign", []string{CallerNodeMetadataKey, "node-1"}},
		{"unknown source", []string{CallerNodeMetadataKey, "policy=node-1"}},
		{"empty name", []string{CallerNodeMetadataKey, "token="}},
		{"too long", []string{CallerNodeMetadataKey, "token=" + strings.Repeat("n", maxForwardedValue)}},
		{"too many", many},
		{"a good value and a bad one", []string{CallerNodeMetadataKey, "token=node-1", CallerNodeMetadataKey, "token"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(tt.kv...))
			c := CallerNodeFromIncoming(ctx)
			if !c.Bound() {
				t.Fatal("unreadable metadata left the caller unbound")
			}
			for _, n := range []string{"node-1", "node", ""} {
				if err := c.Check(n); err == nil || !strings.Contains(err.Error(), "cannot be read") {
					t.Errorf("Check(%q) = %v, want a refusal saying the binding cannot be read", n, err)
				}
			}
		})
	}
}

func TestACLWithNodeIdentity(t *testing.T) {
	volumeRead := rules(ResourceVolume, LevelRead)
	nodeDeny := rules(ResourceNode, LevelDeny)
	tests := []struct {
		name     string
		base     *ACL
		identity string
		want     map[Capability]bool
		wantID   string
	}{
		{name: "no policy: node:write and nothing else", base: DenyAll(), identity: "node-1", wantID: "node-1",
			want: map[Capability]bool{{ResourceNode, LevelWrite}: true, {ResourceNode, LevelRead}: true,
				{ResourceVolume, LevelRead}: false, {ResourcePlugin, LevelRead}: false, {ResourceOperator, LevelRead}: false,
				{ResourceAgent, LevelRead}: false}},
		{name: "nil ACL: as no policy", base: nil, identity: "node-1", wantID: "node-1",
			want: map[Capability]bool{{ResourceNode, LevelWrite}: true, {ResourceVolume, LevelRead}: false}},
		{name: "with a policy: both", base: Compile(volumeRead), identity: "node-1", wantID: "node-1",
			want: map[Capability]bool{{ResourceNode, LevelWrite}: true, {ResourceVolume, LevelRead}: true,
				{ResourceVolume, LevelWrite}: false}},
		{name: "an explicit deny wins", base: Compile(nodeDeny), identity: "node-1", wantID: "node-1",
			want: map[Capability]bool{{ResourceNode, LevelWrite}: false, {ResourceNode, LevelRead}: false}},
		{name: "no identity: unchanged", base: Compile(volumeRead), identity: "", wantID: "",
			want: map[Capability]bool{{ResourceNode, LevelWrite}: false, {ResourceVolume, LevelRead}: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.base.WithNodeIdentity(tt.identity)
			if got.NodeIdentity() != tt.wantID {
				t.Errorf("NodeIdentity() = %q, want %q", got.NodeIdentity(), tt.wantID)
			}
			for c, want := range tt.want {
				if got.Allows(c) != want {
					t.Errorf("Allows(%s) = %v, want %v", c, !want, want)
				}
			}
		})
	}
	// The ACL it was made from is unchanged.
	base := Compile(volumeRead)
	_ = base.WithNodeIdentity("node-1")
	if base.Allows(Capability{ResourceNode, LevelWrite}) || base.NodeIdentity() != "" {
		t.Error("WithNodeIdentity changed its receiver")
	}
	if (*ACL)(nil).NodeIdentity() != "" || Management().NodeIdentity() != "" {
		t.Error("an ACL without a node identity has one")
	}
}
