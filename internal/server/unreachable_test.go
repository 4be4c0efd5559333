package server_test

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// A release or a claim whose node agent is down fails Unavailable with the
// NodeUnreachable detail naming the node and its agent's address, through
// a follower too.
func TestNodeAgentDownIsNamed(t *testing.T) {
	e := newClaimEnv(t, 3, nil, map[string][]*csisupdv1.Plugin{"node-a": {monolith("p1", "node-a")}})
	e.register(t, &csisupdv1.Volume{Id: "vol", PluginId: "p1", ExternalId: "x-vol",
		Capabilities: []*csisupdv1.VolumeCapability{{AccessType: "mount", AccessMode: "MULTI_NODE_MULTI_WRITER"}}})
	if _, err := e.claim("vol", "node-a", "w1", nil); err != nil {
		t.Fatal(err)
	}
	agent := e.agents["node-a"]
	agent.g.Stop() // the agent is down; the node's heartbeats go on

	wantUnreachable := func(what string, err error) {
		t.Helper()
		d, ok := csisupdv1.ErrorDetail[*csisupdv1.NodeUnreachable](err)
		if !ok || status.Code(err) != codes.Unavailable || d.GetNodeId() != "node-a" || d.GetAddress() != agent.addr {
			t.Fatalf("%s = %v (NodeUnreachable %v), want Unavailable naming node-a at %s", what, err, d, agent.addr)
		}
	}
	_, err := e.release("vol", "node-a", "w1")
	wantUnreachable("release", err)
	_, err = e.claim("vol", "node-a", "w2", nil)
	wantUnreachable("claim", err)
}
