package nodeclient_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/nodeclient"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testutil"
)

// ResolveToken asks a server about a secret: an unknown one is NotFound,
// no secret gets the anonymous policy, and a server that cannot be reached
// is failed over from within the call.
func TestResolveToken(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 1})
	c.WaitForLeader(t, 20*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	anonymous := &csisupdv1.ACLPolicy{Name: "anonymous", Rules: `plugin { policy = "read" }`}
	testutil.WaitFor(t, 20*time.Second, "the anonymous policy written", func() bool {
		_, err := csisupdv1.NewACLClient(c.Conn(0)).UpsertPolicy(ctx, &csisupdv1.ACLUpsertPolicyRequest{Policy: anonymous})
		return err == nil
	})

	cfg := validConfig()
	// The first server is down: the call moves on to the live one.
	cfg.Servers = append([]string{testutil.FreeAddr(t)}, c.RPCAddrs()...)
	cfg.Node.Address = testutil.FreeAddr(t)
	cl, err := nodeclient.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	run(t, cl) // its connection is closed when Run ends
	resp, err := cl.ResolveToken(ctx, "")
	if err != nil {
		t.Fatalf("ResolveToken without a secret: %v", err)
	}
	if resp.GetToken() != nil || len(resp.GetPolicies()) != 1 || resp.GetPolicies()[0].GetName() != "anonymous" {
		t.Fatalf("no secret: %v, want no token and the anonymous policy", resp)
	}
	if _, err := cl.ResolveToken(ctx, "no-such-secret"); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown secret: %v, want NotFound", err)
	}
}
