package server_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/nodeclient"
	"github.com/csisupd/csisupd/internal/plugin/plugintest"
	"github.com/csisupd/csisupd/internal/retry"
	"github.com/csisupd/csisupd/internal/testutil"
)

// fakeAgent is a node agent's ClientCSI service over real gRPC with an
// in-memory controller, so tests can see which node the servers route to
// and inject failures.
type fakeAgent struct {
	csisupdv1.UnimplementedClientCSIServer
	name string
	addr string
	g    *grpc.Server

	mu        sync.Mutex
	volumes   map[string]int64
	published map[string]string // volume id + "/" + node id -> node id
	calls     []string
	failWith  error // returned by every call while set
	secrets   []string
}

func startFakeAgent(t testing.TB, name string) *fakeAgent {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &fakeAgent{name: name, addr: ln.Addr().String(), g: grpc.NewServer(),
		volumes: map[string]int64{}, published: map[string]string{}}
	csisupdv1.RegisterClientCSIServer(a.g, a)
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.g.Serve(ln)
	}()
	t.Cleanup(func() {
		a.g.Stop()
		<-done
	})
	return a
}

func (a *fakeAgent) record(call string, secrets map[string]string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls = append(a.calls, call)
	for _, v := range secrets {
		a.secrets = append(a.secrets, v)
	}
	return a.failWith
}

func (a *fakeAgent) setFail(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.failWith = err
}

func (a *fakeAgent) seenSecrets() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.secrets...)
}

func (a *fakeAgent) callCount(prefix string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, c := range a.calls {
		if strings.HasPrefix(c, prefix) {
			n++
		}
	}
	return n
}

func (a *fakeAgent) ControllerCreateVolume(_ context.Context, in *csisupdv1.ControllerCreateVolumeRequest) (*csisupdv1.ControllerCreateVolumeResponse, error) {
	if err := a.record("create "+in.GetRequest().GetName(), in.GetRequest().GetSecrets()); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	size := in.GetRequest().GetCapacityRange().GetRequiredBytes()
	if size == 0 {
		size = 1 << 20
	}
	a.volumes[in.GetRequest().GetName()] = size
	return &csisupdv1.ControllerCreateVolumeResponse{Response: &csi.CreateVolumeResponse{Volume: &csi.Volume{
		VolumeId:      "ext-" + in.GetRequest().GetName(),
		CapacityBytes: size,
		VolumeContext: map[string]string{"created-by": a.name},
	}}}, nil
}

func (a *fakeAgent) ControllerDeleteVolume(_ context.Context, in *csisupdv1.ControllerDeleteVolumeRequest) (*csisupdv1.ControllerDeleteVolumeResponse, error) {
	if err := a.record("delete "+in.GetRequest().GetVolumeId(), in.GetRequest().GetSecrets()); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.volumes, strings.TrimPrefix(in.GetRequest().GetVolumeId(), "ext-"))
	return &csisupdv1.ControllerDeleteVolumeResponse{Response: &csi.DeleteVolumeResponse{}}, nil
}

func (a *fakeAgent) ControllerAttachVolume(_ context.Context, in *csisupdv1.ControllerAttachVolumeRequest) (*csisupdv1.ControllerAttachVolumeResponse, error) {
	r := in.GetRequest()
	if err := a.record("attach "+r.GetVolumeId()+" "+r.GetNodeId(), r.GetSecrets()); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.published[r.GetVolumeId()+"/"+r.GetNodeId()] = r.GetNodeId()
	return &csisupdv1.ControllerAttachVolumeResponse{Response: &csi.ControllerPublishVolumeResponse{
		PublishContext: map[string]string{"device": "/dev/fake-" + r.GetNodeId()},
	}}, nil
}

func (a *fakeAgent) ControllerDetachVolume(_ context.Context, in *csisupdv1.ControllerDetachVolumeRequest) (*csisupdv1.ControllerDetachVolumeResponse, error) {
	r := in.GetRequest()
	if err := a.record("detach "+r.GetVolumeId()+" "+r.GetNodeId(), r.GetSecrets()); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.published, r.GetVolumeId()+"/"+r.GetNodeId())
	return &csisupdv1.ControllerDetachVolumeResponse{Response: &csi.ControllerUnpublishVolumeResponse{}}, nil
}

// monolith returns a healthy monolith plugin as a node reports it.
func monolith(id, nodeID string) *csisupdv1.Plugin {
	return &csisupdv1.Plugin{
		Id: id, Type: "monolith", Healthy: true, HealthState: "healthy", HealthDescription: "probe ok",
		VendorName: "csi.example", VendorVersion: "1.2.3", NodeId: "csi-" + nodeID,
		PluginCapabilities:     []string{"CONTROLLER_SERVICE"},
		ControllerCapabilities: []string{"CREATE_DELETE_VOLUME", "PUBLISH_UNPUBLISH_VOLUME"},
	}
}

// agentNode runs a NodeClient for one node until the test ends or stop is
// called.
type agentNode struct {
	id      string
	client  *nodeclient.Client
	plugins *plugintest.Source
	cancel  context.CancelFunc
	done    chan struct{}
}

func startNode(t testing.TB, id, addr string, servers []string, plugins ...*csisupdv1.Plugin) *agentNode {
	t.Helper()
	n := &agentNode{id: id, plugins: plugintest.NewSource(plugins...)}
	nc, err := nodeclient.New(nodeclient.Config{
		Servers:    servers,
		Node:       nodeclient.Node{ID: id, Name: "name-" + id, Address: addr},
		Plugins:    n.plugins,
		RPCTimeout: 2 * time.Second,
		Retry:      retry.Policy{Base: 50 * time.Millisecond, Cap: 500 * time.Millisecond, Multiplier: 2, Jitter: 0.5},
		Connect:    config.DefaultRetry().ServerConnect,
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	n.client = nc
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel, n.done = cancel, make(chan struct{})
	go func() {
		defer close(n.done)
		nc.Run(ctx)
	}()
	t.Cleanup(n.stop)
	return n
}

func (n *agentNode) setPlugins(p ...*csisupdv1.Plugin) { n.plugins.Set(p...) }

func (n *agentNode) stop() {
	n.cancel()
	<-n.done
}

// logBuffer collects log output for assertions.
type logBuffer struct{ testutil.SyncBuffer }

func (b *logBuffer) count(s string) int { return strings.Count(b.String(), s) }

// lines counts log lines containing every one of parts.
func (b *logBuffer) lines(parts ...string) int {
	n := 0
	for _, line := range strings.Split(b.String(), "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			n++
		}
	}
	return n
}

func (b *logBuffer) logger() hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Level: hclog.Info, Output: b})
}

func pluginOf(t testing.TB, cl csisupdv1.ControlClient, id string) *csisupdv1.ClusterPlugin {
	t.Helper()
	resp, err := cl.GetPlugin(context.Background(), &csisupdv1.PluginGetRequest{Id: id})
	if err != nil {
		if status.Code(err) == codes.NotFound {
			return nil
		}
		t.Logf("GetPlugin(%s): %v", id, err)
		return nil
	}
	return resp.GetPlugin()
}

func retryable(reason string) error {
	return status.Error(codes.Unavailable, fmt.Sprintf("fake agent: %s", reason))
}
