package main

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
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
		{"permission denied", status.Error(codes.PermissionDenied, "token lacks volume:write"), "permission denied by the agent at 10.0.0.1:4780: token lacks volume:write", ""},
		{"unauthenticated", status.Error(codes.Unauthenticated, "token not found"), "does not accept the credentials", ""},
		{"unreachable", status.Error(codes.Unavailable, "connection refused"), "cannot reach the agent at 10.0.0.1:4780", "leader"},
		{"retryable", csisupdv1.MarkRetryable(status.Error(codes.Unavailable, "node n1 has not heartbeated to the current leader yet"), "node-not-ready"),
			"agent at 10.0.0.1:4780: node n1 has not heartbeated to the current leader yet (temporary; try again)", "cannot reach"},
		{"other", status.Error(codes.Internal, "boom"), "agent at 10.0.0.1:4780: boom", ""},
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
