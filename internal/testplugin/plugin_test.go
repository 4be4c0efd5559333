package testplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csisupd/csisupd/internal/testutil"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// Ginkgo's RunSpecs (TestSanity) starts a signal watcher it never stops.
		goleak.IgnoreTopFunction("github.com/onsi/ginkgo/v2/internal/interrupt_handler.(*InterruptHandler).registerForInterrupts.func2"),
	)
}

// client is a gRPC connection to a plugin with its three CSI clients.
type client struct {
	conn *grpc.ClientConn
	id   csi.IdentityClient
	ctrl csi.ControllerClient
	node csi.NodeClient
}

// socketPath returns a short socket path in a fresh directory.
func socketPath(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "csi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "csi.sock")
}

// startPlugin creates and starts a plugin; empty Socket and StateDir are
// filled in. The plugin stops when the test ends.
func startPlugin(t *testing.T, cfg Config) *Plugin {
	t.Helper()
	if cfg.Socket == "" {
		cfg.Socket = socketPath(t)
	}
	if cfg.StateDir == "" {
		cfg.StateDir = t.TempDir()
	}
	if cfg.NodeID == "" {
		cfg.NodeID = "node-a"
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

// dial connects to socket; the connection closes when the test ends.
func dial(t *testing.T, socket string) *client {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &client{
		conn: conn,
		id:   csi.NewIdentityClient(conn),
		ctrl: csi.NewControllerClient(conn),
		node: csi.NewNodeClient(conn),
	}
}

// ctx returns a context that ends with the test or after a generous bound.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// wantCode fails the test unless err has code want.
func wantCode(t *testing.T, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("got code %s (%v), want %s", got, err, want)
	}
}

func mountCap(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
	}
}

var snw = mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)

func createVolume(t *testing.T, c *client, name string, size int64) *csi.Volume {
	t.Helper()
	resp, err := c.ctrl.CreateVolume(ctx(t), &csi.CreateVolumeRequest{
		Name:               name,
		CapacityRange:      &csi.CapacityRange{RequiredBytes: size},
		VolumeCapabilities: []*csi.VolumeCapability{snw},
	})
	if err != nil {
		t.Fatalf("CreateVolume %q: %v", name, err)
	}
	return resp.GetVolume()
}

func TestNewValidation(t *testing.T) {
	sock := filepath.Join(os.TempDir(), "csi.sock")
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"no socket", Config{StateDir: "x"}, "Config.Socket is required"},
		{"long socket", Config{Socket: "/" + strings.Repeat("s", 120), StateDir: "x"}, "107-byte"},
		{"no state dir", Config{Socket: sock}, "Config.StateDir is required"},
		{"bad name", Config{Socket: sock, StateDir: "x", Name: "9bad name"}, "Config.Name"},
		{"bad type", Config{Socket: sock, StateDir: "x", Type: "both"}, "Config.Type"},
		{"negative max volumes", Config{Socket: sock, StateDir: "x", MaxVolumes: -1}, "Config.MaxVolumes"},
		{"bad mounts", Config{Socket: sock, StateDir: "x", Mounts: "overlay"}, "Config.Mounts"},
		{"unsupported capability", Config{Socket: sock, StateDir: "x",
			ControllerCapabilities: []csi.ControllerServiceCapability_RPC_Type{csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER}},
			"SINGLE_NODE_MULTI_WRITER is not supported"},
		{"node-local with topology", Config{Socket: sock, StateDir: "x", NodeLocal: true, Topology: map[string]string{"z": "1"}},
			"Config.NodeLocal and Config.Topology"},
		{"node-local with foreign volumes", Config{Socket: sock, StateDir: "x", NodeLocal: true, ForeignVolumes: true},
			"Config.NodeLocal and Config.ForeignVolumes"},
		{"node-local node plugin", Config{Socket: sock, StateDir: "x", NodeLocal: true, Type: TypeNode}, "Config.NodeLocal needs a controller"},
		{"topology key without node-local", Config{Socket: sock, StateDir: "x", TopologyKey: "k"}, "Config.TopologyKey"},
		{"bad expansion", Config{Socket: sock, StateDir: "x", Expansion: "sometimes"}, "Config.Expansion"},
		{"offline expansion without controller expansion", Config{Socket: sock, StateDir: "x", Expansion: ExpansionOffline,
			ControllerCapabilities: []csi.ControllerServiceCapability_RPC_Type{csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME}},
			"offline needs the EXPAND_VOLUME"},
		{"no expansion with controller expansion", Config{Socket: sock, StateDir: "x", Expansion: ExpansionNone,
			ControllerCapabilities: []csi.ControllerServiceCapability_RPC_Type{csi.ControllerServiceCapability_RPC_EXPAND_VOLUME}},
			"Config.Expansion none excludes EXPAND_VOLUME"},
		{"list health without get health", Config{Socket: sock, StateDir: "x",
			ControllerCapabilities: []csi.ControllerServiceCapability_RPC_Type{csi.ControllerServiceCapability_RPC_LIST_VOLUME_HEALTH}},
			"LIST_VOLUME_HEALTH without GET_VOLUME_HEALTH"},
		{"empty mutable parameter", Config{Socket: sock, StateDir: "x", MutableParameters: []string{"iops", ""}}, "Config.MutableParameters"},
		{"negative ready after", Config{Socket: sock, StateDir: "x", SnapshotReadyAfter: -1}, "Config.SnapshotReadyAfter"},
		{"negative content bytes", Config{Socket: sock, StateDir: "x", MaxContentBytes: -1}, "Config.MaxContentBytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New: got %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestNewDefaults(t *testing.T) {
	p, err := New(Config{Socket: socketPath(t), StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	cfg := p.Config()
	if cfg.Name != DefaultName || cfg.VendorVersion != DefaultVendorVersion || cfg.Type != TypeMonolith ||
		cfg.NodeID == "" || cfg.Capacity != DefaultCapacity || cfg.Mounts != MountsMarker ||
		cfg.Expansion != ExpansionOnline || !slices.Equal(cfg.MutableParameters, DefaultMutableParameters) ||
		cfg.MaxContentBytes != DefaultMaxContentBytes || cfg.TopologyKey != "" {
		t.Fatalf("defaults not applied: %+v", cfg)
	}
}

func TestTypes(t *testing.T) {
	topo := map[string]string{"zone": "z1"}
	tests := []struct {
		typ        string
		controller bool
		node       bool
	}{
		{TypeController, true, false},
		{TypeNode, false, true},
		{TypeMonolith, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.typ, func(t *testing.T) {
			p := startPlugin(t, Config{Type: tt.typ, Topology: topo, MaxVolumes: 7})
			c := dial(t, p.Socket())

			info, err := c.id.GetPluginInfo(ctx(t), &csi.GetPluginInfoRequest{})
			if err != nil || info.GetName() != DefaultName || info.GetVendorVersion() != DefaultVendorVersion {
				t.Fatalf("GetPluginInfo = %v, %v", info, err)
			}
			caps, err := c.id.GetPluginCapabilities(ctx(t), &csi.GetPluginCapabilitiesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			var ctrlSvc, topoSvc, online bool
			for _, c := range caps.GetCapabilities() {
				switch c.GetService().GetType() {
				case csi.PluginCapability_Service_CONTROLLER_SERVICE:
					ctrlSvc = true
				case csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS:
					topoSvc = true
				}
				if c.GetVolumeExpansion().GetType() == csi.PluginCapability_VolumeExpansion_ONLINE {
					online = true
				}
			}
			if ctrlSvc != tt.controller || !topoSvc || !online {
				t.Fatalf("capabilities: controller=%v topology=%v online=%v, want controller=%v and both others", ctrlSvc, topoSvc, online, tt.controller)
			}

			_, err = c.ctrl.ControllerGetCapabilities(ctx(t), &csi.ControllerGetCapabilitiesRequest{})
			if tt.controller {
				wantCode(t, err, codes.OK)
			} else {
				wantCode(t, err, codes.Unimplemented)
			}
			ni, err := c.node.NodeGetInfo(ctx(t), &csi.NodeGetInfoRequest{})
			if !tt.node {
				wantCode(t, err, codes.Unimplemented)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ni.GetNodeId() != "node-a" || ni.GetMaxVolumesPerNode() != 7 || ni.GetAccessibleTopology().GetSegments()["zone"] != "z1" {
				t.Fatalf("NodeGetInfo = %v", ni)
			}
		})
	}
}

func TestNoTopologyCapability(t *testing.T) {
	p := startPlugin(t, Config{})
	c := dial(t, p.Socket())
	caps, err := c.id.GetPluginCapabilities(ctx(t), &csi.GetPluginCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range caps.GetCapabilities() {
		if c.GetService().GetType() == csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS {
			t.Fatal("VOLUME_ACCESSIBILITY_CONSTRAINTS advertised without a topology")
		}
	}
}

func TestFaults(t *testing.T) {
	p := startPlugin(t, Config{})
	c := dial(t, p.Socket())

	resp, err := c.id.Probe(ctx(t), &csi.ProbeRequest{})
	if err != nil || !resp.GetReady().GetValue() {
		t.Fatalf("healthy Probe = %v, %v", resp, err)
	}

	p.SetFaults(Faults{ProbeNotReady: true})
	resp, err = c.id.Probe(ctx(t), &csi.ProbeRequest{})
	if err != nil || resp.GetReady().GetValue() {
		t.Fatalf("not-ready Probe = %v, %v", resp, err)
	}

	p.SetFaults(Faults{ProbeError: codes.FailedPrecondition})
	_, err = c.id.Probe(ctx(t), &csi.ProbeRequest{})
	wantCode(t, err, codes.FailedPrecondition)

	p.SetFaults(Faults{ProbeHang: true})
	short, cancel := context.WithTimeout(ctx(t), 50*time.Millisecond)
	_, err = c.id.Probe(short, &csi.ProbeRequest{})
	cancel()
	wantCode(t, err, codes.DeadlineExceeded)

	p.SetFaults(Faults{ProbeDelay: time.Hour})
	short, cancel = context.WithTimeout(ctx(t), 50*time.Millisecond)
	_, err = c.id.Probe(short, &csi.ProbeRequest{})
	cancel()
	wantCode(t, err, codes.DeadlineExceeded)

	p.SetFaults(Faults{Errors: map[string]codes.Code{"CreateVolume": codes.Unavailable}})
	_, err = c.ctrl.CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "v", VolumeCapabilities: []*csi.VolumeCapability{snw}})
	wantCode(t, err, codes.Unavailable)
	if _, err := c.id.Probe(ctx(t), &csi.ProbeRequest{}); err != nil {
		t.Fatalf("Probe with only a CreateVolume fault: %v", err)
	}

	p.SetFaults(Faults{})
	createVolume(t, c, "v", 1<<20)
	if _, err := c.ctrl.DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: "unknown", Secrets: map[string]string{"token": "t1"}}); err != nil {
		t.Fatal(err)
	}
	if got := p.Secrets("DeleteVolume"); len(got) != 1 || got[0]["token"] != "t1" {
		t.Errorf("Secrets(DeleteVolume) = %v, want the one call's token", got)
	}

	// An answer delayed after the work: the caller gives up, and the
	// snapshot exists all the same.
	p.SetFaults(Faults{AnswerDelays: map[string]time.Duration{"CreateSnapshot": time.Hour}})
	short, cancel = context.WithTimeout(ctx(t), 50*time.Millisecond)
	_, err = c.ctrl.CreateSnapshot(short, &csi.CreateSnapshotRequest{Name: "lost-answer", SourceVolumeId: p.Volumes()[0].ID})
	cancel()
	wantCode(t, err, codes.DeadlineExceeded)
	if snaps := p.Snapshots(); len(snaps) != 1 || snaps[0].Name != "lost-answer" {
		t.Fatalf("snapshots after a lost answer = %v, want lost-answer", snaps)
	}
}

// A hanging call must not block Stop, and must end when the plugin stops.
func TestStopEndsHangingProbe(t *testing.T) {
	p := startPlugin(t, Config{})
	c := dial(t, p.Socket())
	p.SetFaults(Faults{ProbeHang: true})
	errc := make(chan error, 1)
	go func() {
		_, err := c.id.Probe(context.Background(), &csi.ProbeRequest{})
		errc <- err
	}()
	testutil.WaitFor(t, 10*time.Second, "the probe to hang", func() bool { return p.Stats().InFlight["Probe"] == 1 })
	p.Stop()
	if err := <-errc; err == nil {
		t.Fatal("hanging Probe succeeded after Stop")
	}
	if _, err := os.Lstat(p.Socket()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket after Stop: %v, want it removed", err)
	}
}

func TestKillThenStart(t *testing.T) {
	p := startPlugin(t, Config{})
	c := dial(t, p.Socket())
	createVolume(t, c, "survivor", 1<<20)

	p.Kill()
	fi, err := os.Lstat(p.Socket())
	if err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("socket after Kill: %v, %v; want the socket file left in place", fi, err)
	}
	conn, err := net.Dial("unix", p.Socket())
	if err == nil {
		conn.Close()
		t.Fatal("dial after Kill succeeded, want connection refused")
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial after Kill: %v, want ECONNREFUSED", err)
	}
	_, err = c.id.Probe(ctx(t), &csi.ProbeRequest{})
	wantCode(t, err, codes.Unavailable)

	if err := p.Start(); err != nil {
		t.Fatalf("Start after Kill: %v", err)
	}
	c2 := dial(t, p.Socket())
	resp, err := c2.ctrl.ListVolumes(ctx(t), &csi.ListVolumesRequest{})
	if err != nil || len(resp.GetEntries()) != 1 {
		t.Fatalf("ListVolumes after restart = %v, %v; want the one volume", resp, err)
	}
	if err := p.Start(); err == nil {
		t.Fatal("second Start succeeded, want already serving")
	}
}

func TestSocketOwnership(t *testing.T) {
	sock := socketPath(t)
	old := startPlugin(t, Config{Socket: sock})

	// A second instance must not steal a socket someone listens on.
	rival, err := New(Config{Socket: sock, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := rival.Start(); err == nil || !strings.Contains(err.Error(), "listening") {
		rival.Stop()
		t.Fatalf("Start on a live socket: %v, want an in-use error", err)
	}

	// After a crash a new instance takes over; stopping the crashed one
	// later must leave the new socket alone.
	old.Kill()
	if err := rival.Start(); err != nil {
		t.Fatalf("Start over a stale socket: %v", err)
	}
	old.Stop()
	c := dial(t, sock)
	if _, err := c.id.Probe(ctx(t), &csi.ProbeRequest{}); err != nil {
		t.Fatalf("new instance after the old one's Stop: %v", err)
	}
	rival.Stop()
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket after Stop: %v, want it removed", err)
	}
}

func TestStartRefusesNonSocket(t *testing.T) {
	sock := socketPath(t)
	if err := os.WriteFile(sock, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{Socket: sock, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err == nil || !strings.Contains(err.Error(), "not a socket") {
		p.Stop()
		t.Fatalf("Start over a regular file: %v, want a not-a-socket error", err)
	}
}

func TestStatsMaxInFlight(t *testing.T) {
	p := startPlugin(t, Config{KnownNodeIDs: []string{AnyNode}})
	c := dial(t, p.Socket())
	const n = 4
	var vols []string
	for i := range n {
		vols = append(vols, createVolume(t, c, fmt.Sprintf("v%d", i), 1<<20).GetVolumeId())
	}

	// Sequential calls never overlap.
	for _, id := range vols {
		if _, err := c.ctrl.ControllerPublishVolume(ctx(t), &csi.ControllerPublishVolumeRequest{
			VolumeId: id, NodeId: "node-a", VolumeCapability: snw,
		}); err != nil {
			t.Fatal(err)
		}
	}
	if s := p.Stats(); s.Calls["ControllerPublishVolume"] != n || s.MaxInFlight["ControllerPublishVolume"] != 1 {
		t.Fatalf("sequential stats: calls=%d max=%d, want %d and 1", s.Calls["ControllerPublishVolume"], s.MaxInFlight["ControllerPublishVolume"], n)
	}

	// Concurrent calls held by PublishDelay all count as in flight.
	p.ResetStats()
	p.SetFaults(Faults{PublishDelay: time.Hour})
	callCtx, cancel := context.WithCancel(ctx(t))
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for _, id := range vols {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := c.ctrl.ControllerPublishVolume(callCtx, &csi.ControllerPublishVolumeRequest{
				VolumeId: id, NodeId: "node-b", VolumeCapability: mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER),
			})
			errs <- err
		}()
	}
	testutil.WaitFor(t, 10*time.Second, "all publishes in flight", func() bool {
		return p.Stats().InFlight["ControllerPublishVolume"] == n
	})
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		wantCode(t, err, codes.Canceled)
	}
	testutil.WaitFor(t, 10*time.Second, "publishes to return", func() bool {
		return p.Stats().InFlight["ControllerPublishVolume"] == 0
	})
	if s := p.Stats(); s.MaxInFlight["ControllerPublishVolume"] != n || s.Calls["ControllerPublishVolume"] != n {
		t.Fatalf("concurrent stats: calls=%d max=%d, want %d and %d", s.Calls["ControllerPublishVolume"], s.MaxInFlight["ControllerPublishVolume"], n, n)
	}
}

func TestPersistence(t *testing.T) {
	stateDir := t.TempDir()
	p := startPlugin(t, Config{StateDir: stateDir})
	c := dial(t, p.Socket())
	vol := createVolume(t, c, "keep", 1<<20)
	snap, err := c.ctrl.CreateSnapshot(ctx(t), &csi.CreateSnapshotRequest{Name: "keep-snap", SourceVolumeId: vol.GetVolumeId()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ctrl.ControllerPublishVolume(ctx(t), &csi.ControllerPublishVolumeRequest{
		VolumeId: vol.GetVolumeId(), NodeId: "node-a", VolumeCapability: snw,
	}); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "csi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	staging, targetPath := filepath.Join(dir, "staging"), filepath.Join(dir, "target")
	if _, err := c.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{
		VolumeId: vol.GetVolumeId(), StagingTargetPath: staging, VolumeCapability: snw,
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.node.NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{
		VolumeId: vol.GetVolumeId(), StagingTargetPath: staging, TargetPath: targetPath, VolumeCapability: snw,
	}); err != nil {
		t.Fatal(err)
	}
	p.Stop()

	p2 := startPlugin(t, Config{StateDir: stateDir})
	c2 := dial(t, p2.Socket())
	again := createVolume(t, c2, "keep", 1<<20)
	if again.GetVolumeId() != vol.GetVolumeId() {
		t.Fatalf("CreateVolume after restart made %s, want the existing %s", again.GetVolumeId(), vol.GetVolumeId())
	}
	got, err := c2.ctrl.ControllerGetVolume(ctx(t), &csi.ControllerGetVolumeRequest{VolumeId: vol.GetVolumeId()})
	if err != nil || len(got.GetStatus().GetPublishedNodeIds()) != 1 {
		t.Fatalf("ControllerGetVolume after restart = %v, %v; want it published to node-a", got, err)
	}
	snaps, err := c2.ctrl.ListSnapshots(ctx(t), &csi.ListSnapshotsRequest{SnapshotId: snap.GetSnapshot().GetSnapshotId()})
	if err != nil || len(snaps.GetEntries()) != 1 {
		t.Fatalf("ListSnapshots after restart = %v, %v", snaps, err)
	}
	if _, err := c2.node.NodeGetVolumeStats(ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: vol.GetVolumeId(), VolumePath: targetPath}); err != nil {
		t.Fatalf("NodeGetVolumeStats after restart: %v", err)
	}
	_, err = c2.node.NodeUnstageVolume(ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: vol.GetVolumeId(), StagingTargetPath: staging})
	wantCode(t, err, codes.FailedPrecondition)
}

func TestCorruptRecord(t *testing.T) {
	stateDir := t.TempDir()
	if _, err := openState(stateDir); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(stateDir, volumesDir, "vol-x.json")
	if err := os.WriteFile(bad, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := New(Config{Socket: socketPath(t), StateDir: stateDir})
	if err == nil || !strings.Contains(err.Error(), bad) {
		t.Fatalf("New with a corrupt record: %v, want an error naming %s", err, bad)
	}
}
