package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/testcluster"
)

// TestNodeStatusInitializingAfterRestore restores a snapshot that records
// a node ready: node status shows it initializing, with why, until it
// heartbeats.
func TestNodeStatusInitializingAfterRestore(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 1, Configure: func(_ int, cfg *server.Config) {
		// The node heartbeats by hand: no TTL expires during the test.
		cfg.MinHeartbeatTTL, cfg.FailoverHeartbeatTTL = 30*time.Second, 30*time.Second
	}})
	c.WaitForLeader(t, 30*time.Second)
	addr := c.Member(0).RPCAddr
	cluster := csisupdv1.NewClusterClient(c.Conn(0))
	ctx := context.Background()
	if _, err := cluster.NodeRegister(asNode(ctx, "node-a"), &csisupdv1.NodeRegisterRequest{NodeId: "node-a", Name: "a", Address: "127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	status := func() map[string]any {
		t.Helper()
		ns, _ := mustJSON(t, "--address", addr, "node", "status")["nodes"].([]any)
		if len(ns) != 1 {
			t.Fatalf("nodes: %v", ns)
		}
		n, _ := ns[0].(map[string]any)
		return n
	}
	if n := status(); n["status"] != "ready" {
		t.Fatalf("registered node: %v", n)
	}
	file := filepath.Join(t.TempDir(), "state.snap")
	if _, err := execute(t, "--address", addr, "operator", "snapshot", "save", file); err != nil {
		t.Fatal(err)
	}
	if _, err := execute(t, "--address", addr, "operator", "snapshot", "restore", file); err != nil {
		t.Fatal(err)
	}

	if n := status(); n["status"] != "initializing" ||
		!strings.Contains(n["status_description"].(string), "no heartbeat to the current leader since the snapshot restore") {
		t.Fatalf("node after the restore: %v", n)
	}
	out, err := execute(t, "--address", addr, "node", "status")
	if err != nil || !strings.Contains(out, "initializing") {
		t.Fatalf("node status table after the restore: %v\n%s", err, out)
	}
	out, err = execute(t, "--address", addr, "node", "status", "node-a")
	if err != nil || !strings.Contains(out, "Status:     initializing\n") || !strings.Contains(out, "no heartbeat to the current leader") {
		t.Fatalf("node status node-a after the restore: %v\n%s", err, out)
	}

	if _, err := cluster.NodeHeartbeat(asNode(ctx, "node-a"), &csisupdv1.NodeHeartbeatRequest{NodeId: "node-a"}); err != nil {
		t.Fatal(err)
	}
	if n := status(); n["status"] != "ready" {
		t.Fatalf("node after its heartbeat: %v", n)
	}
}

// testNodeSecret is the node secret a test gives node id.
func testNodeSecret(id string) string { return "test-node-secret-of-" + id }

// asNode returns ctx with the outgoing metadata of a call node id makes:
// its node secret, as its agent presents it.
func asNode(ctx context.Context, id string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, csisupdv1.NodeSecretMetadataKey, testNodeSecret(id))
}

// TestNodeNamesAreNotGuessed registers a node whose id is another node's
// name: a command that takes --node with that word refuses it as
// ambiguous and lists both, and a release on a node without claims says
// there was nothing to release.
func TestNodeNamesAreNotGuessed(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 1})
	c.WaitForLeader(t, 30*time.Second)
	addr := c.Member(0).RPCAddr
	cluster := csisupdv1.NewClusterClient(c.Conn(0))
	ctx := context.Background()
	for _, n := range []struct{ id, name string }{{"node-a", "web"}, {"web", "other"}} {
		if _, err := cluster.NodeRegister(asNode(ctx, n.id), &csisupdv1.NodeRegisterRequest{NodeId: n.id, Name: n.name, Address: "127.0.0.1:1"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Control(0).RegisterVolume(ctx, &csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{Id: "v1", PluginId: "p", ExternalId: "e1"}}); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"volume", "release", "v1", "--node", "web", "--workload", "w1"},
		{"node", "status", "web"},
		{"node", "rekey", "web"},
	} {
		out, err := execute(t, append([]string{"--address", addr}, args...)...)
		if err == nil || !strings.Contains(err.Error(), `node "web" is ambiguous`) ||
			!strings.Contains(err.Error(), "node-a (name web, ready)") || !strings.Contains(err.Error(), "web (name other, ready)") {
			t.Errorf("%s: %v\n%s; want the ambiguity with both candidates", strings.Join(args, " "), err, out)
		}
	}
	out, err := execute(t, "--address", addr, "volume", "release", "v1", "--node", "other", "--workload", "w1")
	if err != nil || !strings.Contains(out, "Nothing to release: volume v1 has no claim of workload w1 on node other (web)\n") {
		t.Errorf("release on a node without claims: %v\n%s", err, out)
	}
	out, err = execute(t, "--address", addr, "node", "rekey", "node-a")
	if err != nil || !strings.Contains(out, "Rekeyed node node-a (web)") {
		t.Errorf("node rekey node-a: %v\n%s", err, out)
	}
	out, err = execute(t, "--address", addr, "node", "status", "node-a")
	if err != nil || !strings.Contains(out, "Rekeyed:") {
		t.Errorf("node status of a rekeyed node: %v\n%s", err, out)
	}
}
