package server_test

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/hashicorp/go-hclog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
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
// and inject failures. With a fakeNodeVolumes it serves NodeVolumes too,
// and writes its controller calls into the fake's journal.
type fakeAgent struct {
	csisupdv1.UnimplementedClientCSIServer
	csisupdv1.UnimplementedNodeVolumesServer
	name string
	addr string
	g    *grpc.Server
	nv   *fakeNodeVolumes

	mu        sync.Mutex
	volumes   map[string]int64
	published map[string]string // volume id + "/" + node id -> node id
	calls     []string
	failWith  error // returned by every call while set
	secrets   []string
}

func startFakeAgent(t testing.TB, name string) *fakeAgent {
	t.Helper()
	return startFakeAgentNV(t, name, nil)
}

// startFakeAgentNV starts a fake agent whose NodeVolumes service is nv's
// (none when nv is nil).
func startFakeAgentNV(t testing.TB, name string, nv *fakeNodeVolumes) *fakeAgent {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &fakeAgent{name: name, addr: ln.Addr().String(), g: grpc.NewServer(), nv: nv,
		volumes: map[string]int64{}, published: map[string]string{}}
	csisupdv1.RegisterClientCSIServer(a.g, a)
	if nv != nil {
		csisupdv1.RegisterNodeVolumesServer(a.g, a)
	}
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
	if a.nv != nil {
		a.nv.journal.add(call)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls = append(a.calls, call)
	for _, v := range secrets {
		a.secrets = append(a.secrets, v)
	}
	return a.failWith
}

func (a *fakeAgent) MountVolume(ctx context.Context, in *csisupdv1.MountVolumeRequest) (*csisupdv1.MountVolumeResponse, error) {
	m, err := a.nv.MountVolume(ctx, a.addr, in)
	if err != nil {
		return nil, err
	}
	return &csisupdv1.MountVolumeResponse{Mount: m}, nil
}

func (a *fakeAgent) UnmountVolume(ctx context.Context, in *csisupdv1.UnmountVolumeRequest) (*csisupdv1.UnmountVolumeResponse, error) {
	if err := a.nv.UnmountVolume(ctx, a.addr, in); err != nil {
		return nil, err
	}
	return &csisupdv1.UnmountVolumeResponse{}, nil
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
		VolumeId:           "ext-" + in.GetRequest().GetName(),
		CapacityBytes:      size,
		VolumeContext:      map[string]string{"created-by": a.name},
		AccessibleTopology: topologyOf(in.GetRequest().GetParameters()),
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
	if err := a.record("publish "+r.GetVolumeId()+" "+r.GetNodeId(), r.GetSecrets()); err != nil {
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
	if err := a.record("unpublish "+r.GetVolumeId()+" "+r.GetNodeId(), r.GetSecrets()); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.published, r.GetVolumeId()+"/"+r.GetNodeId())
	return &csisupdv1.ControllerDetachVolumeResponse{Response: &csi.ControllerUnpublishVolumeResponse{}}, nil
}

// topologyOf is the accessible topology the fake controller gives a
// volume created with a "zone" parameter: that zone.
func topologyOf(params map[string]string) []*csi.Topology {
	if z := params["zone"]; z != "" {
		return []*csi.Topology{{Segments: map[string]string{"zone": z}}}
	}
	return nil
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
		Node:       nodeclient.Node{ID: id, Name: "name-" + id, Address: addr, Secret: testNodeSecret(id)},
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

// journal is the ordered record of the calls the fakes of one test saw,
// across agents: "publish <external id> <csi node id>", "unpublish ...",
// "mount <volume> <workload> <node address>", "unmount ...".
type journal struct {
	mu    sync.Mutex
	calls []string
}

func (j *journal) add(call string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.calls = append(j.calls, call)
}

// get returns the calls so far.
func (j *journal) get() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]string(nil), j.calls...)
}

// claimCalls returns the calls so far that claims and releases make.
func (j *journal) claimCalls() []string {
	return j.matching("publish ", "unpublish ", "mount ", "unmount ")
}

// matching returns the calls so far that start with one of prefixes.
func (j *journal) matching(prefixes ...string) []string {
	var out []string
	for _, c := range j.get() {
		for _, p := range prefixes {
			if strings.HasPrefix(c, p) {
				out = append(out, c)
				break
			}
		}
	}
	return out
}

// fakeNodeVolumes implements volumeops.NodeVolumesClient, and the NodeVolumes
// service of fake agents, with in-memory mounts. It answers as the
// NodeVolumes service documented in api/csisupd/v1/volumes.proto of this
// API version does: ids are checked (no "/", no ".."), a mount is keyed by
// volume, workload and usage key, MountVolume of a published mount
// returns it unchanged, UnmountVolume of a mount that does not exist
// succeeds and, with a usage, removes only that usage. It records every
// call in its journal, in order, and the secrets it was given.
type fakeNodeVolumes struct {
	journal journal

	mu          sync.Mutex
	mounts      map[string]*csisupdv1.Mount // addr + "|" + volume + "|" + workload + "|" + usage key
	mountReqs   []*csisupdv1.MountVolumeRequest
	secrets     []string
	failMount   error
	failUnmount error
	// mountGate and unmountGate, while set, make MountVolume and
	// UnmountVolume wait, as an agent that hangs does.
	mountGate, unmountGate *callGate
}

// callGate makes calls wait until it is opened or the call's context ends;
// calls receives a value as each call starts waiting.
type callGate struct {
	open  chan struct{}
	calls chan struct{}
}

// wait waits for the gate (nil: open) or ctx.
func (g *callGate) wait(ctx context.Context) error {
	if g == nil {
		return nil
	}
	select {
	case g.calls <- struct{}{}:
	default:
	}
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

// hold clears the failures and installs a new gate with set; release
// opens it and removes it.
func (f *fakeNodeVolumes) hold(set func(g *callGate)) (entered <-chan struct{}, release func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	g := &callGate{open: make(chan struct{}), calls: make(chan struct{}, 100)}
	f.failMount, f.failUnmount = nil, nil
	set(g)
	var once sync.Once
	return g.calls, func() {
		once.Do(func() {
			f.mu.Lock()
			f.mountGate, f.unmountGate = nil, nil
			f.mu.Unlock()
			close(g.open)
		})
	}
}

func newFakeNodeVolumes() *fakeNodeVolumes {
	return &fakeNodeVolumes{mounts: map[string]*csisupdv1.Mount{}}
}

// usageKey names a usage as the agent does, e.g.
// "rw-file-system-single-node-writer".
func usageKey(u *csisupdv1.VolumeUsage) string {
	access := "rw"
	if u.GetReadOnly() {
		access = "ro"
	}
	typ := "file-system"
	if u.GetAccessType() == "block" {
		typ = "block"
	}
	mode := u.GetAccessMode()
	if mode == "" {
		mode = "SINGLE_NODE_WRITER"
	}
	return access + "-" + typ + "-" + strings.ToLower(strings.ReplaceAll(mode, "_", "-"))
}

func checkID(what, id string) error {
	if id == "" || strings.Contains(id, "/") || strings.Contains(id, "..") {
		return status.Errorf(codes.InvalidArgument, "%s %q is not a valid id", what, id)
	}
	return nil
}

func (f *fakeNodeVolumes) setFail(mount, unmount error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failMount, f.failUnmount = mount, unmount
}

// holdUnmounts clears the failures and makes every UnmountVolume wait, as
// an agent that hangs does, until release is called. entered receives a
// value as each call starts waiting.
func (f *fakeNodeVolumes) holdUnmounts() (entered <-chan struct{}, release func()) {
	return f.hold(func(g *callGate) { f.unmountGate = g })
}

// holdMounts is holdUnmounts for MountVolume: a node that is slow to
// mount. A held call that ends with its context mounts nothing.
func (f *fakeNodeVolumes) holdMounts() (entered <-chan struct{}, release func()) {
	return f.hold(func(g *callGate) { f.mountGate = g })
}

func (f *fakeNodeVolumes) MountVolume(ctx context.Context, addr string, req *csisupdv1.MountVolumeRequest) (*csisupdv1.Mount, error) {
	f.journal.add(fmt.Sprintf("mount %s %s %s", req.GetVolumeId(), req.GetWorkloadId(), addr))
	f.mu.Lock()
	gate := f.mountGate
	f.mu.Unlock()
	if err := gate.wait(ctx); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mountReqs = append(f.mountReqs, req)
	for _, v := range req.GetSecrets() {
		f.secrets = append(f.secrets, v)
	}
	if f.failMount != nil {
		return nil, f.failMount
	}
	for what, id := range map[string]string{"plugin_id": req.GetPluginId(), "volume_id": req.GetVolumeId(), "workload_id": req.GetWorkloadId()} {
		if err := checkID(what, id); err != nil {
			return nil, err
		}
	}
	uk := usageKey(req.GetUsage())
	key := addr + "|" + req.GetVolumeId() + "|" + req.GetWorkloadId() + "|" + uk
	if m, ok := f.mounts[key]; ok {
		return m, nil
	}
	ext := req.GetExternalId()
	if ext == "" {
		ext = req.GetVolumeId()
	}
	m := &csisupdv1.Mount{
		PluginId: req.GetPluginId(), VolumeId: req.GetVolumeId(), ExternalId: ext, WorkloadId: req.GetWorkloadId(),
		Usage: req.GetUsage(), UsageKey: uk, State: "published", Cluster: req.GetCluster(), ClaimIndex: req.GetClaimIndex(),
		HostPath:    fmt.Sprintf("/var/lib/csisupd/volumes/%s/per-workload/%s/%s/%s", req.GetPluginId(), req.GetWorkloadId(), req.GetVolumeId(), uk),
		StagingPath: fmt.Sprintf("/var/lib/csisupd/volumes/%s/staging/%s/%s", req.GetPluginId(), req.GetVolumeId(), uk),
	}
	f.mounts[key] = m
	return m, nil
}

func (f *fakeNodeVolumes) UnmountVolume(ctx context.Context, addr string, req *csisupdv1.UnmountVolumeRequest) error {
	f.journal.add(fmt.Sprintf("unmount %s %s %s", req.GetVolumeId(), req.GetWorkloadId(), addr))
	f.mu.Lock()
	gate := f.unmountGate
	f.mu.Unlock()
	if err := gate.wait(ctx); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failUnmount != nil {
		return f.failUnmount
	}
	prefix := addr + "|" + req.GetVolumeId() + "|" + req.GetWorkloadId() + "|"
	for key := range f.mounts {
		if strings.HasPrefix(key, prefix) && (req.GetUsage() == nil || strings.TrimPrefix(key, prefix) == usageKey(req.GetUsage())) {
			delete(f.mounts, key)
		}
	}
	return nil
}

// VolumeHealth answers NodeGetVolumeHealth for a mount held at addr, as
// the NodeVolumes service does: NotFound when the volume is not mounted
// there, else healthy (no statuses).
func (f *fakeNodeVolumes) VolumeHealth(_ context.Context, addr string, req *csisupdv1.VolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	f.journal.add(fmt.Sprintf("volume-health %s %s", req.GetVolumeId(), addr))
	f.mu.Lock()
	defer f.mu.Unlock()
	for key := range f.mounts {
		if strings.HasPrefix(key, addr+"|"+req.GetVolumeId()+"|") {
			return &csi.NodeGetVolumeHealthResponse{VolumeHealth: &csi.VolumeHealth{VolumeId: req.GetVolumeId()}}, nil
		}
	}
	return nil, status.Errorf(codes.NotFound, "volume %q is not mounted", req.GetVolumeId())
}

// ListMounts returns the mounts held at addr, of req's plugin and volume
// when set, sorted by volume, workload and usage key, as the NodeVolumes
// service sorts them.
func (f *fakeNodeVolumes) ListMounts(_ context.Context, addr string, req *csisupdv1.ListMountsRequest) ([]*csisupdv1.Mount, error) {
	f.journal.add("list-mounts " + addr)
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*csisupdv1.Mount
	for _, key := range slices.Sorted(maps.Keys(f.mounts)) {
		m := f.mounts[key]
		if strings.HasPrefix(key, addr+"|") && (req.GetPluginId() == "" || m.GetPluginId() == req.GetPluginId()) &&
			(req.GetVolumeId() == "" || m.GetVolumeId() == req.GetVolumeId()) {
			out = append(out, m)
		}
	}
	return out, nil
}

// mounted returns how many mounts the fake holds.
func (f *fakeNodeVolumes) mounted() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.mounts)
}

// lastMount returns the last MountVolume request.
func (f *fakeNodeVolumes) lastMount() *csisupdv1.MountVolumeRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.mountReqs) == 0 {
		return nil
	}
	return f.mountReqs[len(f.mountReqs)-1]
}

func (f *fakeNodeVolumes) seenSecrets() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.secrets...)
}

// ExpandVolume answers as NodeVolumes.ExpandVolume does: NotFound when the
// node has no mount of the volume, else the size asked for.
func (f *fakeNodeVolumes) ExpandVolume(_ context.Context, addr string, req *csisupdv1.ExpandVolumeRequest) (int64, error) {
	f.journal.add(fmt.Sprintf("expand %s %s", req.GetVolumeId(), addr))
	f.mu.Lock()
	defer f.mu.Unlock()
	for key := range f.mounts {
		if strings.HasPrefix(key, addr+"|"+req.GetVolumeId()+"|") {
			return req.GetRequiredBytes(), nil
		}
	}
	return 0, status.Errorf(codes.NotFound, "volume %q of plugin %q is not mounted", req.GetVolumeId(), req.GetPluginId())
}

// testNodeSecret is the node secret a test gives node id.
func testNodeSecret(id string) string { return "test-node-secret-of-" + id }

// asNode returns ctx with the outgoing metadata of a call node id makes:
// its node secret, as its agent presents it.
func asNode(ctx context.Context, id string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, csisupdv1.NodeSecretMetadataKey, testNodeSecret(id))
}
