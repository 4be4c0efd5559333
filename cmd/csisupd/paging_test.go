package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testcluster"
)

func TestListsFollowEveryPage(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 1})
	leader := c.WaitForLeader(t, 30*time.Second)
	addr := leader.RPCAddr
	cl := csisupdv1.NewClusterClient(c.Conn(leader.Index))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := range 7 {
		plugins := []*csisupdv1.Plugin{{Id: "p-all", Type: "node", Healthy: true}}
		if i%2 == 0 {
			plugins = append(plugins, &csisupdv1.Plugin{Id: "p-even", Type: "node", Healthy: true})
		}
		if _, err := cl.NodeRegister(asNode(ctx, fmt.Sprintf("node-%d", i)), &csisupdv1.NodeRegisterRequest{
			NodeId: fmt.Sprintf("node-%d", i), Address: "127.0.0.1:1", Plugins: plugins,
		}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		args  []string
		nodes int
	}{
		{args: []string{"node", "status"}, nodes: 7},
		{args: []string{"node", "status", "--page-size", "2"}, nodes: 7},
		{args: []string{"node", "status", "--page-size", "3", "--plugin", "p-even"}, nodes: 4},
		{args: []string{"node", "status", "--status", "ready", "--plugin", "p-even"}, nodes: 4},
		{args: []string{"node", "status", "--status", "down"}, nodes: 0},
	} {
		doc := mustJSON(t, append([]string{"--address", addr}, tt.args...)...)
		// The JSON of a paged list is that of one complete list.
		if keys(doc) != "index,nodes" {
			t.Fatalf("%v: keys %s", tt.args, keys(doc))
		}
		got, _ := doc["nodes"].([]any)
		if len(got) != tt.nodes {
			t.Fatalf("%v: %d nodes, want %d", tt.args, len(got), tt.nodes)
		}
	}
	plugins := mustJSON(t, "--address", addr, "plugin", "status", "--page-size", "1")
	if got, _ := plugins["plugins"].([]any); keys(plugins) != "index,plugins" || len(got) != 2 {
		t.Fatalf("plugin status --page-size 1: %v", plugins)
	}
	out, err := execute(t, "--address", addr, "node", "status", "--page-size", "1", "--plugin", "p-even")
	if err != nil || strings.Count(out, "node-") != 4 {
		t.Fatalf("node status table: %v\n%s", err, out)
	}
	if _, err := execute(t, "--address", addr, "node", "status", "--page-size", "1001"); err == nil || !strings.Contains(err.Error(), "maximum of 1000") {
		t.Fatalf("page size above the maximum: %v", err)
	}
	if _, err := execute(t, "--address", addr, "node", "status", "--status", "sleepy"); err == nil || !strings.Contains(err.Error(), "sleepy") {
		t.Fatalf("unknown status: %v", err)
	}
}
