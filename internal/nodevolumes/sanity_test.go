package nodevolumes

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/ids"
	"github.com/csisupd/csisupd/internal/plugin"
	"github.com/csisupd/csisupd/internal/testplugin"
	"github.com/csisupd/csisupd/internal/testutil"
	"github.com/csisupd/csisupd/internal/testutil/sanitytest"
)

// nodeAdapter is a CSI Node service that makes every volume call through
// a NodeVolumes client, so that csi-sanity tests the node path of the
// agent: the manager, its records and its gRPC service.
//
// NodeVolumes stages and publishes in one call (MountVolume) and unpublishes
// and unstages in one call (UnmountVolume), at paths the agent chooses. So
// the adapter remembers a NodeStageVolume (after checking its arguments as a
// plugin must) and stages for real at NodePublishVolume; it publishes for
// the workload "hash of target_path" and makes target_path a symbolic link
// to the mount's host path. NodeUnstageVolume only forgets what the stage
// call brought: the agent unstages by itself when the last workload of a
// staging unmounts.
//
// NodeGetCapabilities and NodeGetInfo go to the plugin directly: the agent
// has no API for them (it reads them into the plugin's read model when it
// fingerprints the plugin).
type nodeAdapter struct {
	csi.UnimplementedNodeServer
	nv     csisupdv1.NodeVolumesClient
	plugin csi.NodeClient
	id     string // the plugin id

	mu     sync.Mutex
	staged map[string]stageCall // by CSI volume id
}

// stageCall is what a NodeStageVolume call brought, for the publish that
// stages for real. Secrets stay in memory only.
type stageCall struct {
	path           string
	capability     *csi.VolumeCapability
	publishContext map[string]string
	volumeContext  map[string]string
	secrets        map[string]string
}

// workloadOf is the workload id of a CSI target path: a short hash, so
// that any path gives a valid id.
func workloadOf(targetPath string) string {
	h := sha256.Sum256([]byte(filepath.Clean(targetPath)))
	return hex.EncodeToString(h[:8])
}

// volumeOf is the NodeVolumes volume id of a CSI volume id: the id itself
// when it is a valid id, else a hash of it (the CSI id travels as
// external_id).
func volumeOf(csiID string) string {
	if ids.ValidPathID(csiID) {
		return csiID
	}
	h := sha256.Sum256([]byte(csiID))
	return "csi-" + hex.EncodeToString(h[:8])
}

// checkCapabilityArg returns InvalidArgument unless c names an access mode
// and an access type.
func checkCapabilityArg(c *csi.VolumeCapability) error {
	switch {
	case c == nil:
		return status.Error(codes.InvalidArgument, "volume_capability is required")
	case c.GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_UNKNOWN:
		return status.Error(codes.InvalidArgument, "volume_capability.access_mode is required")
	case c.GetMount() == nil && c.GetBlock() == nil:
		return status.Error(codes.InvalidArgument, "volume_capability.access_type is required")
	}
	return nil
}

// usageOf is the NodeVolumes usage of a CSI capability.
func usageOf(c *csi.VolumeCapability, readOnly bool) *csisupdv1.VolumeUsage {
	u := &csisupdv1.VolumeUsage{AccessMode: c.GetAccessMode().GetMode().String(), ReadOnly: readOnly}
	if c.GetBlock() != nil {
		u.AccessType = AccessTypeBlock
	} else {
		u.AccessType = AccessTypeMount
		u.FsType = c.GetMount().GetFsType()
		u.MountFlags = c.GetMount().GetMountFlags()
		u.VolumeMountGroup = c.GetMount().GetVolumeMountGroup()
	}
	return u
}

// required returns InvalidArgument naming the first empty field.
func required(fields ...string) error {
	for i := 0; i+1 < len(fields); i += 2 {
		if fields[i+1] == "" {
			return status.Errorf(codes.InvalidArgument, "%s is required", fields[i])
		}
	}
	return nil
}

// absolute returns InvalidArgument unless path is absolute.
func absolute(field, path string) error {
	if !filepath.IsAbs(path) {
		return status.Errorf(codes.InvalidArgument, "%s %q is not absolute", field, path)
	}
	return nil
}

// NodeStageVolume checks its arguments and remembers the call; the stage
// happens at NodePublishVolume.
func (a *nodeAdapter) NodeStageVolume(_ context.Context, r *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	if err := required("volume_id", r.GetVolumeId(), "staging_target_path", r.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	if err := checkCapabilityArg(r.GetVolumeCapability()); err != nil {
		return nil, err
	}
	if err := absolute("staging_target_path", r.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	path := filepath.Clean(r.GetStagingTargetPath())
	a.mu.Lock()
	defer a.mu.Unlock()
	if old, ok := a.staged[r.GetVolumeId()]; ok {
		switch {
		case old.path != path:
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is staged at %q", r.GetVolumeId(), old.path)
		case !proto.Equal(old.capability, r.GetVolumeCapability()):
			return nil, status.Errorf(codes.AlreadyExists, "volume %s is staged at %q with another capability", r.GetVolumeId(), path)
		}
		return &csi.NodeStageVolumeResponse{}, nil
	}
	a.staged[r.GetVolumeId()] = stageCall{
		path:           path,
		capability:     proto.Clone(r.GetVolumeCapability()).(*csi.VolumeCapability),
		publishContext: maps.Clone(r.GetPublishContext()),
		volumeContext:  maps.Clone(r.GetVolumeContext()),
		secrets:        maps.Clone(r.GetSecrets()),
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

// NodeUnstageVolume checks its arguments and forgets the stage call. The
// agent unstages by itself: UnmountVolume of the last workload using a
// staging unstages it, so there is nothing left to do here.
func (a *nodeAdapter) NodeUnstageVolume(_ context.Context, r *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	if err := required("volume_id", r.GetVolumeId(), "staging_target_path", r.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if old, ok := a.staged[r.GetVolumeId()]; ok && old.path == filepath.Clean(r.GetStagingTargetPath()) {
		delete(a.staged, r.GetVolumeId())
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// NodePublishVolume mounts the volume for the workload of target_path
// (staging it when needed) and links target_path to the mount.
func (a *nodeAdapter) NodePublishVolume(ctx context.Context, r *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	if err := required("volume_id", r.GetVolumeId(), "target_path", r.GetTargetPath()); err != nil {
		return nil, err
	}
	if err := checkCapabilityArg(r.GetVolumeCapability()); err != nil {
		return nil, err
	}
	// The plugin has STAGE_UNSTAGE_VOLUME, and so does this service (its
	// NodeGetCapabilities is the plugin's).
	if err := required("staging_target_path", r.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	if err := absolute("target_path", r.GetTargetPath()); err != nil {
		return nil, err
	}
	target := filepath.Clean(r.GetTargetPath())
	a.mu.Lock()
	st, ok := a.staged[r.GetVolumeId()]
	a.mu.Unlock()
	if !ok || st.path != filepath.Clean(r.GetStagingTargetPath()) {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged at %q", r.GetVolumeId(), r.GetStagingTargetPath())
	}

	// What is at the target already: nothing, an empty directory (some
	// orchestrators make it) or the link of an earlier publish.
	linked := ""
	fi, err := os.Lstat(target)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, status.Errorf(codes.Internal, "target_path: %v", err)
	case fi.Mode()&os.ModeSymlink != 0:
		if linked, err = os.Readlink(target); err != nil {
			return nil, status.Errorf(codes.Internal, "target_path: %v", err)
		}
	case fi.IsDir():
		if err := os.Remove(target); err != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "target_path %q is a directory that cannot be replaced: %v", target, err)
		}
	default:
		return nil, status.Errorf(codes.FailedPrecondition, "target_path %q exists and is not a directory", target)
	}

	usage := usageOf(r.GetVolumeCapability(), r.GetReadonly())
	resp, err := a.nv.MountVolume(ctx, &csisupdv1.MountVolumeRequest{
		PluginId:       a.id,
		VolumeId:       volumeOf(r.GetVolumeId()),
		ExternalId:     r.GetVolumeId(),
		WorkloadId:     workloadOf(target),
		Usage:          usage,
		VolumeContext:  cmpMap(r.GetVolumeContext(), st.volumeContext),
		PublishContext: cmpMap(r.GetPublishContext(), st.publishContext),
		Secrets:        cmpMap(r.GetSecrets(), st.secrets),
	})
	if err != nil {
		return nil, err
	}
	host := resp.GetMount().GetHostPath()
	switch {
	case linked == host:
		return &csi.NodePublishVolumeResponse{}, nil
	case linked != "":
		// The target links to another usage's mount of this workload, so
		// this usage's mount is new (the adapter replaces a link only after
		// its mount is gone): undo it.
		if _, uerr := a.nv.UnmountVolume(ctx, &csisupdv1.UnmountVolumeRequest{PluginId: a.id, VolumeId: volumeOf(r.GetVolumeId()),
			WorkloadId: workloadOf(target), Usage: usage}); uerr != nil {
			return nil, uerr
		}
		return nil, status.Errorf(codes.AlreadyExists, "volume %s is published at %q with another capability or read-only flag", r.GetVolumeId(), target)
	}
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return nil, status.Errorf(codes.Internal, "create parent of target_path: %v", err)
	}
	if err := os.Symlink(host, target); err != nil {
		return nil, status.Errorf(codes.Internal, "link target_path: %v", err)
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// cmpMap returns a when it is not empty, else b.
func cmpMap(a, b map[string]string) map[string]string {
	if len(a) > 0 {
		return a
	}
	return b
}

// NodeUnpublishVolume unmounts the volume for the workload of target_path
// (the agent unstages it when no other workload uses the staging) and
// removes the link.
func (a *nodeAdapter) NodeUnpublishVolume(ctx context.Context, r *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	if err := required("volume_id", r.GetVolumeId(), "target_path", r.GetTargetPath()); err != nil {
		return nil, err
	}
	target := filepath.Clean(r.GetTargetPath())
	if _, err := a.nv.UnmountVolume(ctx, &csisupdv1.UnmountVolumeRequest{
		PluginId: a.id, VolumeId: volumeOf(r.GetVolumeId()), WorkloadId: workloadOf(target),
	}); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(target); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		if err := os.Remove(target); err != nil {
			return nil, status.Errorf(codes.Internal, "remove target_path: %v", err)
		}
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// workloadAt maps a volume path of a CSI call to the workload of the
// mount: the staging path means any mount of the volume (""), any other
// path the workload of that target path.
func (a *nodeAdapter) workloadAt(volumeID, path string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if st, ok := a.staged[volumeID]; ok && st.path == filepath.Clean(path) {
		return ""
	}
	return workloadOf(path)
}

// NodeGetVolumeStats calls VolumeStats for the mount at volume_path.
func (a *nodeAdapter) NodeGetVolumeStats(ctx context.Context, r *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	if err := required("volume_id", r.GetVolumeId(), "volume_path", r.GetVolumePath()); err != nil {
		return nil, err
	}
	resp, err := a.nv.VolumeStats(ctx, &csisupdv1.VolumeStatsRequest{
		PluginId: a.id, VolumeId: volumeOf(r.GetVolumeId()), WorkloadId: a.workloadAt(r.GetVolumeId(), r.GetVolumePath()),
	})
	if err != nil {
		return nil, err
	}
	return resp.GetResponse(), nil
}

// NodeGetVolumeHealth calls VolumeHealth for the mount at
// volume_publish_path, or any mount of the volume when the call names no
// path.
func (a *nodeAdapter) NodeGetVolumeHealth(ctx context.Context, r *csi.NodeGetVolumeHealthRequest) (*csi.NodeGetVolumeHealthResponse, error) {
	if err := required("volume_id", r.GetVolumeId()); err != nil {
		return nil, err
	}
	workload := ""
	if path := cmp.Or(r.GetVolumePublishPath(), r.GetStagingTargetPath()); path != "" {
		workload = a.workloadAt(r.GetVolumeId(), path)
	}
	resp, err := a.nv.VolumeHealth(ctx, &csisupdv1.VolumeHealthRequest{PluginId: a.id, VolumeId: volumeOf(r.GetVolumeId()), WorkloadId: workload})
	if err != nil {
		return nil, err
	}
	return resp.GetResponse(), nil
}

// NodeGetStorageHealth calls StorageHealth.
func (a *nodeAdapter) NodeGetStorageHealth(ctx context.Context, r *csi.NodeGetStorageHealthRequest) (*csi.NodeGetStorageHealthResponse, error) {
	resp, err := a.nv.StorageHealth(ctx, &csisupdv1.StorageHealthRequest{PluginId: a.id, Secrets: r.GetSecrets()})
	if err != nil {
		return nil, err
	}
	return resp.GetResponse(), nil
}

// NodeExpandVolume calls ExpandVolume for the mount at volume_path.
func (a *nodeAdapter) NodeExpandVolume(ctx context.Context, r *csi.NodeExpandVolumeRequest) (*csi.NodeExpandVolumeResponse, error) {
	if err := required("volume_id", r.GetVolumeId(), "volume_path", r.GetVolumePath()); err != nil {
		return nil, err
	}
	if c := r.GetVolumeCapability(); c != nil {
		if err := checkCapabilityArg(c); err != nil {
			return nil, err
		}
	}
	if r.GetCapacityRange().GetRequiredBytes() < 0 || r.GetCapacityRange().GetLimitBytes() < 0 {
		return nil, status.Error(codes.InvalidArgument, "capacity_range must not be negative")
	}
	resp, err := a.nv.ExpandVolume(ctx, &csisupdv1.ExpandVolumeRequest{
		PluginId: a.id, VolumeId: volumeOf(r.GetVolumeId()), WorkloadId: a.workloadAt(r.GetVolumeId(), r.GetVolumePath()),
		RequiredBytes: r.GetCapacityRange().GetRequiredBytes(), LimitBytes: r.GetCapacityRange().GetLimitBytes(),
		Secrets: r.GetSecrets(),
	})
	if err != nil {
		return nil, err
	}
	return &csi.NodeExpandVolumeResponse{CapacityBytes: resp.GetCapacityBytes()}, nil
}

// NodeGetCapabilities is the plugin's: NodeVolumes has no such method.
func (a *nodeAdapter) NodeGetCapabilities(ctx context.Context, r *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return a.plugin.NodeGetCapabilities(ctx, r)
}

// NodeGetInfo is the plugin's: NodeVolumes has no such method.
func (a *nodeAdapter) NodeGetInfo(ctx context.Context, r *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return a.plugin.NodeGetInfo(ctx, r)
}

// serveNodeAdapter serves the node adapter of plugin id over nv on a unix
// socket in dir and returns the socket.
func serveNodeAdapter(t *testing.T, dir string, nv csisupdv1.NodeVolumesClient, id, pluginSocket string) string {
	t.Helper()
	return sanitytest.ServeAdapter(t, dir, pluginSocket, nil, func(srv *grpc.Server, plugin *grpc.ClientConn) {
		csi.RegisterNodeServer(srv, &nodeAdapter{nv: nv, plugin: csi.NewNodeClient(plugin), id: id, staged: make(map[string]stageCall)})
	})
}

// sanityOutcome records a Ginkgo failure without failing the Go test, so

// sanityExceptions are the csi-sanity specs (text below the run's
// container) that pass against the plugin directly but cannot pass through
// NodeVolumes, each with the reason. The test fails when one of them
// passes, or names no spec, so that the list stays true.
//
// It is empty: every spec that passes directly passes through NodeVolumes.
// The adapter's one visible difference, a NodeStageVolume that succeeds
// for a volume the plugin does not know (the stage waits for the publish,
// which then fails NotFound), is tested by no spec of this csi-sanity
// version; a spec that expects NodeStageVolume alone to fail belongs here.
var sanityExceptions = map[string]string{}

// nodeGroup is the container of csi-sanity's Node specs.
const nodeGroup = "Node Service"

// TestNodeVolumesSanity runs csi-sanity twice in one Ginkgo suite (Ginkgo
// runs one suite per process): against the test plugin directly, and with
// every node volume call going through NodeVolumes on a manager over the
// same plugin (controller calls go to the plugin directly both times). The
// specs that pass directly must pass through NodeVolumes, but for
// sanityExceptions. Ginkgo refuses go test -count > 1; repeat the other
// tests with -short.
func TestNodeVolumesSanity(t *testing.T) {
	if testing.Short() {
		t.Skip("csi-sanity takes a while; skipped with -short")
	}
	dir := testutil.TempDir(t)
	sock := filepath.Join(dir, "tp.sock")
	p, err := testplugin.New(testplugin.Config{
		Socket: sock, StateDir: filepath.Join(dir, "tp-state"), Type: testplugin.TypeMonolith,
		NodeID: "sanity-node", MaxVolumes: 4,
		Topology: map[string]string{"topology.testplugin/zone": "z1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	client, err := csiclient.New(csiclient.Config{Socket: sock, Redial: config.DefaultRetry().PluginRedial})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })

	// The read model the registry would make of this plugin, with the
	// node capabilities the plugin advertises, so that every node spec it
	// runs directly can run through NodeVolumes too.
	plugins := newFixedPlugins()
	plugins.set(&csisupdv1.Plugin{
		Id: "tp", Type: string(plugin.TypeMonolith), Healthy: true, HealthState: "healthy", NodeId: "sanity-node", MaxVolumes: 4,
		NodeCapabilities: nodeCapabilities(t, client),
	}, client)
	e := &env{dir: dir, dataDir: filepath.Join(dir, "data"), plugins: plugins, events: &events{}, logs: &testutil.SyncBuffer{}}
	m := e.manager(t, Config{}, true)

	// The calls NodeVolumes served, by method, and how many succeeded.
	var callsMu sync.Mutex
	calls, succeeded := map[string]int{}, map[string]int{}
	nv := serve(t, dir, m, grpc.ChainUnaryInterceptor(
		func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			resp, err := h(ctx, req)
			method := strings.TrimPrefix(info.FullMethod, "/csisupd.v1.NodeVolumes/")
			callsMu.Lock()
			calls[method]++
			if err == nil {
				succeeded[method]++
			}
			callsMu.Unlock()
			return resp, err
		}))
	adapter := serveNodeAdapter(t, dir, nv, "tp", sock)

	newConfig := func(name, address, controller string) *sanity.TestConfig {
		cfg := sanity.NewTestConfig()
		cfg.Address = address
		cfg.ControllerAddress = controller
		cfg.TargetPath = filepath.Join(dir, name+"-target")
		cfg.StagingPath = filepath.Join(dir, name+"-staging")
		cfg.TestNodeVolumeAttachLimit = true
		cfg.IdempotentCount = 2
		return &cfg
	}
	const direct, mediated = "direct", "through NodeVolumes"
	outcome := sanitytest.Run("csi-sanity: direct and through NodeVolumes",
		sanitytest.Target{Name: direct, Config: newConfig("d", sock, "")},
		sanitytest.Target{Name: mediated, Config: newConfig("m", adapter, sock)})
	passed := outcome.Passed
	nodeRan := 0
	for text, o := range outcome[mediated] {
		if strings.HasPrefix(text, nodeGroup+" ") && o != sanitytest.Skipped {
			nodeRan++
		}
	}
	pd, pm := passed(direct), passed(mediated)
	callsMu.Lock()
	defer callsMu.Unlock()
	t.Logf("csi-sanity: %d specs pass directly, %d through NodeVolumes (of %d; %d Node specs ran); NodeVolumes calls %v, of which succeeded %v",
		len(pd), len(pm), len(outcome[direct]), nodeRan, calls, succeeded)
	if nodeRan < 20 {
		t.Errorf("only %d csi-sanity Node specs ran through NodeVolumes; the comparison proves little", nodeRan)
	}
	// Lower bounds of the calls csi-sanity's Node specs make through the
	// adapter: each spec that publishes mounts once (twice when
	// idempotent) and unmounts in its cleanup, which also unmounts every
	// volume the Controller specs made.
	for method, least := range map[string]int{"MountVolume": 6, "UnmountVolume": 40, "VolumeStats": 2, "ExpandVolume": 1} {
		if succeeded[method] < least {
			t.Errorf("%d %s calls succeeded through NodeVolumes, want at least %d", succeeded[method], method, least)
		}
	}
	for _, text := range pd {
		if outcome[mediated][text] == sanitytest.Passed {
			continue
		}
		if reason, ok := sanityExceptions[text]; ok {
			t.Logf("passes directly, not through NodeVolumes, as expected (%s): %s", reason, text)
			continue
		}
		t.Errorf("passes directly but not through NodeVolumes: %s\n  %s", text, outcome[mediated][text])
	}
	for _, text := range pm {
		if _, ok := sanityExceptions[text]; ok {
			t.Errorf("listed as an exception but passes through NodeVolumes: %s", text)
		}
		if outcome[direct][text] != sanitytest.Passed {
			t.Errorf("passes through NodeVolumes but not directly: %s\n  %s", text, outcome[direct][text])
		}
	}
	for text := range sanityExceptions {
		if _, ok := outcome[mediated][text]; !ok {
			t.Errorf("listed as an exception but csi-sanity has no such spec: %s", text)
		}
	}
	for text, o := range outcome[direct] {
		if o != sanitytest.Passed && o != sanitytest.Skipped {
			t.Logf("fails directly too (a testplugin matter): %s\n  %s", text, o)
		}
	}
	// Every mount was undone: csi-sanity cleans up after each spec.
	if left := m.List("", ""); len(left) != 0 {
		t.Errorf("mounts left after csi-sanity: %v", left)
	}
}

// nodeCapabilities returns the node capabilities the plugin behind c
// advertises, named as fingerprints name them.
func nodeCapabilities(t *testing.T, c *csiclient.Client) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTime)
	defer cancel()
	var caps []string
	resp, err := c.Node.NodeGetCapabilities(ctx, &csi.NodeGetCapabilitiesRequest{})
	for _, nc := range resp.GetCapabilities() {
		caps = append(caps, nc.GetRpc().GetType().String())
	}
	if err != nil || !slices.Contains(caps, plugin.CapStageUnstageVolume) {
		t.Fatalf("node capabilities of the test plugin: %v, %v", caps, err)
	}
	return caps
}
