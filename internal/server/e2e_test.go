package server_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/fingerprint"
	"github.com/csisupd/csisupd/internal/heartbeat"
	"github.com/csisupd/csisupd/internal/registry"
	"github.com/csisupd/csisupd/internal/rpc"
	"github.com/csisupd/csisupd/internal/server"
	"github.com/csisupd/csisupd/internal/testcluster"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
)

// onePlugin serves one fingerprinted plugin to the ClientCSI service.
type onePlugin struct {
	rec    registry.Plugin
	client *csiclient.Client
}

func (o *onePlugin) Lookup(id string) (*csisupdv1.Plugin, *csiclient.Client, bool) {
	if id != o.rec.ID {
		return nil, nil, false
	}
	return o.rec.Proto(), o.client, true
}

// TestVolumeThroughClientCSI drives volume operations from the Control API
// through the leader's routing, a node's real ClientCSI service and the
// test plugin over its unix socket. The node side of claims is the fake
// NodeVolumes client given to every server.
func TestVolumeThroughClientCSI(t *testing.T) {
	nv := newFakeNodeVolumes()
	c := testcluster.New(t, testcluster.Config{Servers: 3, Configure: func(_ int, cfg *server.Config) {
		cfg.NodeVolumes = nv
	}})
	leader := checkFormed(t, c, 3)
	ctx := context.Background()

	dir, err := os.MkdirTemp("", "csi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	plugin, err := testplugin.New(testplugin.Config{
		Socket: filepath.Join(dir, "p.sock"), StateDir: filepath.Join(dir, "state"), NodeID: "csi-node-a",
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := plugin.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(plugin.Stop)
	cc, err := csiclient.New(csiclient.Config{Socket: plugin.Socket(), Redial: config.DefaultRetry().PluginRedial})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	fp, err := fingerprint.Take(fctx, fingerprint.Clients{Identity: cc.Identity, Controller: cc.Controller, Node: cc.Node})
	if err != nil {
		t.Fatal(err)
	}
	lookup := &onePlugin{client: cc, rec: registry.Plugin{
		ID: "tp", Fingerprint: fp, Fingerprinted: true, Health: heartbeat.Health{State: heartbeat.Healthy},
	}}
	ccsi, err := rpc.NewClientCSI(rpc.ClientCSIConfig{Plugins: lookup, NodeName: "node-a", Retry: config.DefaultRetry().ClientCSI,
		RPCTimeout: config.DefaultRPCTimeout, MaxDestructiveInFlight: config.DefaultMaxDestructiveInFlight})
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	ccsi.Register(g)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		g.Serve(ln)
	}()
	t.Cleanup(func() {
		g.Stop()
		<-served
	})

	startNode(t, "node-a", ln.Addr().String(), c.RPCAddrs(), &csisupdv1.Plugin{
		Id: "tp", Type: string(fp.Type), Healthy: true, HealthState: "healthy",
		VendorName: fp.VendorName, VendorVersion: fp.VendorVersion, NodeId: fp.NodeID,
		PluginCapabilities: fp.PluginCapabilities, ControllerCapabilities: fp.ControllerCapabilities,
		NodeCapabilities: fp.NodeCapabilities,
	})
	cl := c.Control((leader.Index + 1) % 3)
	testutil.WaitFor(t, 10*time.Second, "healthy controller", func() bool {
		p := pluginOf(t, cl, "tp")
		return p != nil && p.GetControllersHealthy() == 1
	})

	vol, err := cl.CreateVolume(ctx, &csisupdv1.VolumeCreateRequest{Id: "data", PluginId: "tp", CapacityMinBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if vol.GetVolume().GetExternalId() == "" || vol.GetVolume().GetCapacityBytes() < 1<<20 {
		t.Fatalf("created volume: %v", vol.GetVolume())
	}
	claimed, err := cl.ClaimVolume(ctx, &csisupdv1.VolumeClaimRequest{Id: "data", NodeId: "node-a", WorkloadId: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	if cl := claimed.GetClaim(); cl.GetCsiNodeId() != "csi-node-a" || !cl.GetMounted() || cl.GetHostPath() == "" {
		t.Fatalf("claim %v: want the plugin's CSI node id csi-node-a, mounted", cl)
	}
	if got := nv.journal.get(); len(got) != 1 || got[0] != "mount data w1 "+ln.Addr().String() {
		t.Fatalf("node volume calls %q, want one mount on node-a", got)
	}
	if _, err := cl.ReleaseVolume(ctx, &csisupdv1.VolumeReleaseRequest{Id: "data", NodeId: "node-a", WorkloadId: "w1"}); err != nil {
		t.Fatal(err)
	}
	if nv.mounted() != 0 {
		t.Fatalf("%d mounts left after the release", nv.mounted())
	}
	if _, err := cl.DeleteVolume(ctx, &csisupdv1.VolumeDeleteRequest{Id: "data"}); err != nil {
		t.Fatal(err)
	}
	calls := plugin.Stats().Calls
	for _, m := range []string{"CreateVolume", "ControllerPublishVolume", "ControllerUnpublishVolume", "DeleteVolume"} {
		if calls[m] != 1 {
			t.Errorf("plugin saw %d %s calls, want 1 (all calls: %v)", calls[m], m, calls)
		}
	}
}
