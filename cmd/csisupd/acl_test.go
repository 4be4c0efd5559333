package main

import (
	"strings"
	"testing"
	"time"

	"github.com/csisupd/csisupd/internal/testcluster"
)

// TestACLTokenNodeIdentity creates a token with --node-identity on a real
// server and finds the identity in the JSON of create, and in the output
// of token info and token list; a refused identity is named.
func TestACLTokenNodeIdentity(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 1})
	c.WaitForLeader(t, 30*time.Second)
	addr := c.Member(0).RPCAddr

	tok := mustJSON(t, "--address", addr, "acl", "token", "create", "--name", "node-1 agent", "--node-identity", "node-1")
	accessor, _ := tok["accessor_id"].(string)
	if tok["node_identity"] != "node-1" || tok["type"] != "client" || accessor == "" || tok["secret_id"] == "" {
		t.Fatalf("created token %v: want a client token with node identity node-1", tok)
	}
	out, err := execute(t, "--address", addr, "acl", "token", "info", accessor)
	if err != nil || !strings.Contains(out, "Node identity = node-1\n") || !strings.Contains(out, "Policies      = -\n") {
		t.Fatalf("token info: %v\n%s", err, out)
	}
	out, err = execute(t, "--address", addr, "acl", "token", "list")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "NODE IDENTITY") || !strings.Contains(lines[1], accessor) ||
		!strings.Contains(lines[1], " node-1 ") {
		t.Fatalf("token list:\n%s", out)
	}

	_, err = execute(t, "--address", addr, "acl", "token", "create", "--node-identity", "node 1")
	if err == nil || !strings.Contains(err.Error(), `node identity "node 1" must start with a letter or digit`) {
		t.Fatalf("a bad node identity: %v", err)
	}
}
