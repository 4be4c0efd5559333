package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testutil"
)

// Each condition of a server gets its own message.
func TestAgentErrorNamesTheCondition(t *testing.T) {
	const addr = "10.0.0.1:4780"
	tests := []struct {
		name    string
		err     error
		want    string
		notWant string
	}{
		{"no leader", csisupdv1.NewNoLeaderError("s1", "no leader elected"), "the cluster has no leader", "cannot reach"},
		{"plugin not known", csisupdv1.NewPluginNotKnownError("ebs"), `plugin ebs is not known to the cluster yet`, "cannot reach"},
		{"permission denied", status.Error(codes.PermissionDenied, "token lacks volume:write"), "permission denied by agent 10.0.0.1:4780: token lacks volume:write", ""},
		{"unauthenticated", status.Error(codes.Unauthenticated, "token not found"), "does not accept the credentials", ""},
		{"unreachable", notReachedError(t), "cannot reach the agent at 10.0.0.1:4780", "leader"},
		{"answered unavailable", status.Error(codes.Unavailable, "every controller candidate failed"),
			"agent 10.0.0.1:4780 is unavailable: every controller candidate failed", "cannot reach"},
		{"leadership lost during the call", csisupdv1.NewNoLeaderError("", "leadership lost while committing log"),
			"the cluster has no leader (no cluster leader (leadership lost while committing log)): the servers may be electing one; the call is safe to retry", "cannot reach"},
		{"not the leader", csisupdv1.NewNoLeaderError("", "node is not the leader"), "node is not the leader", "cannot reach"},
		{"forwarded call whose leader died", csisupdv1.NewNoLeaderError("s2", "the leader at 10.0.0.3:4780 did not answer: error reading from server: EOF"),
			"server s2: no cluster leader (the leader at 10.0.0.3:4780 did not answer", "cannot reach"},
		{"node agent down", csisupdv1.NewNodeUnreachableError("node-2", "10.0.0.2:4780", status.Error(codes.Unavailable, "connection refused")),
			"node node-2 is unreachable: the servers cannot reach its agent at 10.0.0.2:4780", "cannot reach the agent at 10.0.0.1"},
		{"retryable", csisupdv1.MarkRetryable(status.Error(codes.Unavailable, "node n1 has not heartbeated to the current leader yet"), "node-not-ready"),
			"agent 10.0.0.1:4780: node n1 has not heartbeated to the current leader yet (temporary; try again)", "cannot reach"},
		{"other", status.Error(codes.Internal, "boom"), "agent 10.0.0.1:4780: boom", ""},
		{"plugin not on node", csisupdv1.NewPluginNotFoundError("ebs", "n1"), `plugin "ebs" is not registered on node "n1"`, "cluster"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := agentError(addr, tt.err).Error()
			if !strings.Contains(got, tt.want) {
				t.Errorf("agentError = %q, want it to contain %q", got, tt.want)
			}
			if tt.notWant != "" && strings.Contains(got, tt.notWant) {
				t.Errorf("agentError = %q, must not contain %q", got, tt.notWant)
			}
		})
	}
	if err := agentError(addr, errors.New("plain")); !strings.Contains(err.Error(), "plain") {
		t.Errorf("agentError of a plain error = %q", err)
	}
}

// Errors of the Control API name the server as the side that answered;
// those of the Agent service name the agent.
func TestErrorsNameTheSideThatAnswered(t *testing.T) {
	const addr = "10.0.0.1:4780"
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"agent", agentError(addr, status.Error(codes.Internal, "boom")), "agent 10.0.0.1:4780: boom"},
		{"server", controlError(addr, status.Error(codes.NotFound, `volume "v" not found`)), `server 10.0.0.1:4780: volume "v" not found`},
		{"server denies", controlError(addr, status.Error(codes.PermissionDenied, "token lacks volume:write")),
			"permission denied by server 10.0.0.1:4780: token lacks volume:write (pass a token that allows it: --token, CSISUPD_TOKEN or CSISUPD_TOKEN_FILE)"},
		{"server unavailable", controlError(addr, status.Error(codes.Unavailable, "every controller candidate failed")),
			"server 10.0.0.1:4780 is unavailable: every controller candidate failed"},
		{"server refuses credentials", controlError(addr, status.Error(codes.Unauthenticated, "token not found")),
			"server 10.0.0.1:4780 does not accept the credentials: token not found"},
		{"agent without the server role", controlError(addr, status.Error(codes.Unimplemented, "unknown service csisupd.v1.Control")),
			"the agent at 10.0.0.1:4780 is not a server; point --address at a server"},
		{"nothing answered", controlError(addr, notReachedError(t)), "cannot reach the agent at 10.0.0.1:4780"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); !strings.HasPrefix(got, tt.want) {
			t.Errorf("%s: %q, want it to start with %q", tt.name, got, tt.want)
		}
	}
}

// notReachedError returns the error of a real call to an address where
// nothing listens, on a connection dialled as the CLI dials.
func notReachedError(t *testing.T) error {
	t.Helper()
	o := &clientOptions{address: testutil.FreeAddr(t)}
	conn, err := o.dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = csisupdv1.NewAgentClient(conn).Status(ctx, &csisupdv1.StatusRequest{})
	if !csisupdv1.NotReached(err) {
		t.Fatalf("call to nobody = %v, want it marked not reached", err)
	}
	return err
}

// unavailableAgent answers every Status with a plain Unavailable, as an
// agent whose server behind it fails may.
type unavailableAgent struct {
	csisupdv1.UnimplementedAgentServer
}

func (unavailableAgent) Status(context.Context, *csisupdv1.StatusRequest) (*csisupdv1.StatusResponse, error) {
	return nil, status.Error(codes.Unavailable, "server is shutting down")
}

// "Cannot reach the agent" is said only when the connection fails, not
// when an agent answers Unavailable.
func TestCannotReachOnlyWhenTheConnectionFails(t *testing.T) {
	run := func(addr string) error {
		root := newRootCommand()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs([]string{"--address", addr, "status"})
		return root.Execute()
	}
	nobody := testutil.FreeAddr(t)
	if err := run(nobody); err == nil || !strings.Contains(err.Error(), "cannot reach the agent at "+nobody) {
		t.Fatalf("status with no agent = %v, want cannot reach naming %s", err, nobody)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	csisupdv1.RegisterAgentServer(g, unavailableAgent{})
	testutil.ServeGRPC(t, ln, g)
	addr := ln.Addr().String()
	err = run(addr)
	if err == nil || strings.Contains(err.Error(), "cannot reach") ||
		!strings.Contains(err.Error(), "agent "+addr+" is unavailable: server is shutting down") {
		t.Fatalf("status of an agent that answers Unavailable = %v, want it named as unavailable, not unreachable", err)
	}
}
