package rules_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csisupd/csisupd/internal/server/rules"
	"github.com/csisupd/csisupd/internal/server/statepb"
)

func TestCheckNodeSecret(t *testing.T) {
	good, other := rules.SecretHash("secret-a"), rules.SecretHash("secret-b")
	for _, tt := range []struct {
		name string
		node *statepb.ClusterNode
		hash []byte
		code codes.Code
		msg  string
	}{
		{"match", &statepb.ClusterNode{Id: "n1", SecretHash: good}, good, codes.OK, ""},
		{"another secret", &statepb.ClusterNode{Id: "n1", SecretHash: good}, other, codes.PermissionDenied, `node "n1": node secret does not match`},
		{"no secret presented", &statepb.ClusterNode{Id: "n1", SecretHash: good}, nil, codes.PermissionDenied, "node secret does not match"},
		{"unknown node", nil, good, codes.NotFound, `node "n1" is not registered`},
		{"no stored hash: register again", &statepb.ClusterNode{Id: "n1"}, good, codes.NotFound, "must register again"},
		{"rekeyed: register again", &statepb.ClusterNode{Id: "n1", Rekeyed: true}, good, codes.NotFound, "must register again"},
		{"replaced", &statepb.ClusterNode{Id: "n1", SecretHash: good, ReplacedBy: "n2"}, good, codes.PermissionDenied, `replaced by node "n2"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := rules.CheckNodeSecret("n1", tt.node, tt.hash)
			checkStatus(t, err, tt.code, tt.msg)
		})
	}
}

func TestCheckNodeRegister(t *testing.T) {
	a, b := rules.SecretHash("secret-a"), rules.SecretHash("secret-b")
	holder := func(id string, hash []byte, rekeyed bool) *statepb.ClusterNode {
		return &statepb.ClusterNode{Id: id, Name: "web-1", SecretHash: hash, Rekeyed: rekeyed, Status: "ready"}
	}
	for _, tt := range []struct {
		name     string
		existing *statepb.ClusterNode
		holders  []*statepb.ClusterNode
		hash     []byte
		replaced string
		code     codes.Code
		msg      string
	}{
		{name: "a new node", hash: a},
		{name: "no secret", hash: nil, code: codes.Unauthenticated, msg: "no node secret was presented"},
		{name: "its own secret again", existing: holder("n1", a, false), holders: []*statepb.ClusterNode{holder("n1", a, false)}, hash: a},
		{name: "another secret for an existing id", existing: holder("n1", a, false), hash: b, code: codes.PermissionDenied, msg: `node "n1": node secret does not match`},
		{name: "first secret of a node of an earlier release", existing: holder("n1", nil, false), hash: b},
		{name: "first secret after a rekey", existing: holder("n1", nil, true), hash: b},
		{name: "a replaced node", existing: &statepb.ClusterNode{Id: "n1", ReplacedBy: "n9"}, hash: a, code: codes.PermissionDenied, msg: `replaced by node "n9"`},
		{name: "the name of a live node", holders: []*statepb.ClusterNode{holder("n2", b, false)}, hash: a, code: codes.AlreadyExists, msg: `node name "web-1" is held by node "n2"`},
		{name: "the name of a rekeyed node", holders: []*statepb.ClusterNode{holder("n2", nil, true)}, hash: a, replaced: "n2"},
		{name: "the name of a node of an earlier release", holders: []*statepb.ClusterNode{holder("n2", nil, false)}, hash: a},
		{name: "the name of a replaced node", holders: []*statepb.ClusterNode{{Id: "n2", Name: "web-1", ReplacedBy: "n3"}}, hash: a},
	} {
		t.Run(tt.name, func(t *testing.T) {
			replaced, err := rules.CheckNodeRegister("n1", "web-1", tt.hash, tt.existing, tt.holders)
			checkStatus(t, err, tt.code, tt.msg)
			if got := replaced.GetId(); got != tt.replaced {
				t.Errorf("replaced %q, want %q", got, tt.replaced)
			}
		})
	}
}

// checkStatus requires err to be a status of code whose message contains
// msg (nil for codes.OK).
func checkStatus(t *testing.T, err error, code codes.Code, msg string) {
	t.Helper()
	if code == codes.OK {
		if err != nil {
			t.Fatalf("got %v, want nil", err)
		}
		return
	}
	s := status.Convert(err)
	if err == nil || s.Code() != code || !strings.Contains(s.Message(), msg) {
		t.Fatalf("got %v, want %s containing %q", err, code, msg)
	}
}
