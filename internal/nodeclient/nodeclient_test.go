package nodeclient_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/nodeclient"
	"github.com/csisupd/csisupd/internal/plugin/plugintest"
	"github.com/csisupd/csisupd/internal/retry"
	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testutil"
)

func validConfig() nodeclient.Config {
	return nodeclient.Config{
		Servers:    []string{"127.0.0.1:4780"},
		Node:       nodeclient.Node{ID: "node-a", Address: "127.0.0.1:4790", Secret: "secret-of-node-a-0123456789abcdef0123"},
		Plugins:    plugintest.NewSource(),
		RPCTimeout: time.Second,
		Retry:      config.DefaultRetry().NodeClient,
		Connect:    config.DefaultRetry().ServerConnect,
	}
}

func TestConfigIsValidatedNotDefaulted(t *testing.T) {
	discover := func(context.Context) ([]string, error) { return nil, nil }
	tests := []struct {
		name   string
		change func(c *nodeclient.Config)
		want   string // substring of the error; "" means valid
	}{
		{"valid", func(*nodeclient.Config) {}, ""},
		{"no servers and no discovery", func(c *nodeclient.Config) { c.Servers = nil }, "client.servers is empty"},
		{"discovery without an interval", func(c *nodeclient.Config) { c.Servers, c.DiscoverServers = nil, discover }, "DiscoverInterval"},
		{"discovery with an interval", func(c *nodeclient.Config) {
			c.Servers, c.DiscoverServers, c.DiscoverInterval = nil, discover, time.Second
		}, ""},
		{"no node id", func(c *nodeclient.Config) { c.Node.ID = "" }, "node id"},
		{"no node address", func(c *nodeclient.Config) { c.Node.Address = "" }, "node address"},
		{"no plugin source", func(c *nodeclient.Config) { c.Plugins = nil }, "plugins source"},
		{"no RPC timeout", func(c *nodeclient.Config) { c.RPCTimeout = 0 }, "RPCTimeout"},
		{"no retry policy", func(c *nodeclient.Config) { c.Retry = retry.Policy{} }, "Retry"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			tt.change(&c)
			_, err := nodeclient.New(c, nil)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("New: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("New: err = %v, want one naming %q", err, tt.want)
			}
		})
	}
}

// run runs c until the test ends.
func run(t *testing.T, c *nodeclient.Client) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// TestServersGetTheReadModel registers a node with a real server and
// checks that the servers hold the plugins' read model as the source has
// it, field for field, but for the time of the last probe, and that a
// change of the source reaches them by subscription.
func TestServersGetTheReadModel(t *testing.T) {
	c := testcluster.New(t, testcluster.Config{Servers: 1})
	c.WaitForLeader(t, 20*time.Second)
	at := timestamppb.New(time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC))
	p := &csisupdv1.Plugin{
		Id: "ebs", Type: "monolith", Healthy: true, HealthState: "healthy", HealthDescription: "SERVING",
		Socket: "/var/lib/csisupd/plugins/ebs/csi.sock", VendorName: "ebs.csi.example", VendorVersion: "1.2.3",
		Manifest: map[string]string{"commit": "abc"}, NodeId: "i-0123", MaxVolumes: 25,
		AccessibleTopology: map[string]string{"zone": "a"}, PluginCapabilities: []string{"CONTROLLER_SERVICE"},
		ControllerCapabilities: []string{"CREATE_DELETE_VOLUME"}, NodeCapabilities: []string{"STAGE_UNSTAGE_VOLUME"},
		LastProbe: at, RegisteredAt: at, HealthSince: at,
	}
	src := plugintest.NewSource(p)
	cfg := validConfig()
	cfg.Servers, cfg.Plugins = c.RPCAddrs(), src
	cfg.Node.Address = testutil.FreeAddr(t)
	cl, err := nodeclient.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	run(t, cl)

	want := proto.CloneOf(p)
	want.LastProbe = nil // the servers keep no probe times
	replicated := func() *csisupdv1.Plugin {
		resp, err := c.Control(0).GetPlugin(context.Background(), &csisupdv1.PluginGetRequest{Id: "ebs"})
		if err != nil || len(resp.GetPlugin().GetInstances()) != 1 {
			return nil
		}
		return resp.GetPlugin().GetInstances()[0].GetPlugin()
	}
	testutil.WaitFor(t, 20*time.Second, "the servers to hold plugin ebs as the source has it", func() bool {
		return proto.Equal(replicated(), want)
	})

	p.Healthy, p.HealthState, p.HealthDescription = false, "unhealthy", "probe failed: connection refused"
	src.Set(p)
	want = proto.CloneOf(p)
	want.LastProbe = nil
	testutil.WaitFor(t, 20*time.Second, "the servers to follow the source's change", func() bool {
		return proto.Equal(replicated(), want)
	})
	if !cl.Registered() {
		t.Error("Registered() = false after the servers took the node's plugins")
	}
}

// heartbeats counts the node heartbeats the servers answered.
type heartbeats struct{ n atomic.Int64 }

func (h *heartbeats) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	if _, ok := req.(*csisupdv1.NodeHeartbeatRequest); ok && err == nil {
		h.n.Add(1)
	}
	return resp, err
}

// TestHeartbeatSoonAfterLosingTheServer restarts the node's server, whose
// new leadership has heard from no node: the node heartbeats to it well
// before the TTL it was given runs out (within half of it here), so the
// leader stops showing it initializing.
func TestHeartbeatSoonAfterLosingTheServer(t *testing.T) {
	beats := &heartbeats{}
	c := testcluster.New(t, testcluster.Config{
		Servers: 1,
		Configure: func(_ int, cfg *server.Config) {
			// Far longer than the early heartbeat's window, a tenth of it.
			cfg.MinHeartbeatTTL, cfg.FailoverHeartbeatTTL = 40*time.Second, time.Minute
		},
		ServerOptions: func(int) []grpc.ServerOption {
			return []grpc.ServerOption{grpc.ChainUnaryInterceptor(beats.intercept)}
		},
	})
	c.WaitForLeader(t, 20*time.Second)
	cfg := validConfig()
	cfg.Servers = c.RPCAddrs()
	cfg.Node.Address = testutil.FreeAddr(t)
	cl, err := nodeclient.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	run(t, cl)
	testutil.WaitFor(t, 20*time.Second, "the node to register", cl.Registered)
	// The next heartbeat on the TTL is due a TTL after the registration;
	// the early one comes within a tenth of it after the server is back.
	due := time.Now().Add(cl.TTL() / 2)
	if n := beats.n.Load(); n != 0 {
		t.Fatalf("%d heartbeats before the server restarted", n)
	}

	c.Stop(0)
	c.Restart(0)
	c.WaitForLeader(t, 20*time.Second)
	back := time.Now()
	status := func() string {
		resp, err := c.Control(0).GetNode(context.Background(), &csisupdv1.NodeGetRequest{Id: cfg.Node.ID})
		if err != nil {
			return err.Error()
		}
		return resp.GetNode().GetStatus()
	}
	testutil.WaitFor(t, time.Until(due), "a heartbeat to the restarted server within half the TTL", func() bool {
		return beats.n.Load() > 0 && status() == "ready"
	})
	t.Logf("TTL %v: the node was ready on the new leader %v after it was known", cl.TTL(), time.Since(back).Round(time.Millisecond))
}
