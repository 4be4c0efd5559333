package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/testcluster"
)

// TestListNodesPagingOverGRPC pages through nodes registered over the
// Cluster API, from the leader and (forwarded) from a follower.
func TestListNodesPagingOverGRPC(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 3})
	leader := c.WaitForLeader(t, 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cl := csisupdv1.NewClusterClient(c.Conn(leader.Index))
	const nodes = 45
	for i := range nodes {
		plugins := []*csisupdv1.Plugin{{Id: "p-all", Type: "node", Healthy: true}}
		if i%3 == 0 {
			plugins = append(plugins, &csisupdv1.Plugin{Id: "p-third", Type: "node", Healthy: true})
		}
		if _, err := cl.NodeRegister(asNode(ctx, fmt.Sprintf("node-%03d", i)), &csisupdv1.NodeRegisterRequest{
			NodeId: fmt.Sprintf("node-%03d", i), Address: "127.0.0.1:1", Plugins: plugins,
		}); err != nil {
			t.Fatal(err)
		}
	}
	follower := (leader.Index + 1) % 3
	for _, tt := range []struct {
		name      string
		server    int
		req       *csisupdv1.NodeListRequest
		wantNodes int
		wantPages int
	}{
		{name: "all at once", server: leader.Index, req: &csisupdv1.NodeListRequest{}, wantNodes: nodes, wantPages: 1},
		{name: "pages of 10 from the follower", server: follower, req: &csisupdv1.NodeListRequest{PageSize: 10}, wantNodes: nodes, wantPages: 5},
		{name: "plugin filter", server: leader.Index, req: &csisupdv1.NodeListRequest{PageSize: 5, PluginId: "p-third"}, wantNodes: 15, wantPages: 3},
		{name: "ready and plugin", server: leader.Index, req: &csisupdv1.NodeListRequest{PageSize: 7, PluginId: "p-third", Status: "ready"}, wantNodes: 15, wantPages: 3},
		{name: "none down", server: leader.Index, req: &csisupdv1.NodeListRequest{PageSize: 7, Status: "down"}, wantNodes: 0, wantPages: 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctl := c.Control(tt.server)
			seen := map[string]bool{}
			last, pages := "", 0
			for req := tt.req; ; pages++ {
				resp, err := ctl.ListNodes(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				for _, n := range resp.GetNodes() {
					if n.GetId() <= last || seen[n.GetId()] {
						t.Fatalf("node %s out of order after %s", n.GetId(), last)
					}
					seen[n.GetId()], last = true, n.GetId()
				}
				if resp.GetNextToken() == "" {
					pages++
					break
				}
				req = &csisupdv1.NodeListRequest{PageSize: tt.req.PageSize, PluginId: tt.req.PluginId, Status: tt.req.Status, NextToken: resp.GetNextToken()}
			}
			if len(seen) != tt.wantNodes || pages != tt.wantPages {
				t.Fatalf("%d nodes in %d pages, want %d in %d", len(seen), pages, tt.wantNodes, tt.wantPages)
			}
		})
	}
	ctl := c.Control(leader.Index)
	for _, tt := range []struct {
		name string
		call func() error
	}{
		{name: "bad node token", call: func() error {
			_, err := ctl.ListNodes(ctx, &csisupdv1.NodeListRequest{NextToken: "not a token!"})
			return err
		}},
		{name: "node page too big", call: func() error {
			_, err := ctl.ListNodes(ctx, &csisupdv1.NodeListRequest{PageSize: 1001})
			return err
		}},
		{name: "bad status", call: func() error {
			_, err := ctl.ListNodes(ctx, &csisupdv1.NodeListRequest{Status: "sleepy"})
			return err
		}},
		{name: "bad plugin token", call: func() error {
			_, err := ctl.ListPlugins(ctx, &csisupdv1.PluginListRequest{NextToken: "%%"})
			return err
		}},
		{name: "bad volume token", call: func() error {
			_, err := ctl.ListVolumes(ctx, &csisupdv1.VolumeListRequest{NextToken: "%%"})
			return err
		}},
	} {
		if err := tt.call(); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: error %v, want InvalidArgument", tt.name, err)
		}
	}
	resp, err := ctl.ListPlugins(ctx, &csisupdv1.PluginListRequest{PageSize: 1})
	if err != nil || len(resp.GetPlugins()) != 1 || resp.GetPlugins()[0].GetId() != "p-all" || resp.GetNextToken() == "" {
		t.Fatalf("first plugin page %v, %v", resp, err)
	}
	resp, err = ctl.ListPlugins(ctx, &csisupdv1.PluginListRequest{PageSize: 1, NextToken: resp.GetNextToken()})
	if err != nil || len(resp.GetPlugins()) != 1 || resp.GetPlugins()[0].GetId() != "p-third" || resp.GetNextToken() != "" {
		t.Fatalf("second plugin page %v, %v", resp, err)
	}
}
