package fingerprint

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-test/v5/driver"
	"go.uber.org/goleak"
	"go.uber.org/mock/gomock"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/csiclient"
	"github.com/csisupd/csisupd/internal/plugin"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// mocks are the gomock CSI services of one test plugin. A nil service is
// not registered, so calls to it fail with Unimplemented like on a plugin
// that does not offer it. The generated mocks cannot satisfy the CSI
// interfaces' unexported guard method, so startPlugin pairs each with the
// matching csi.Unsafe*Server interface, as the csi-test driver does itself.
type mocks struct {
	identity   *driver.MockIdentityServer
	controller *driver.MockControllerServer
	node       *driver.MockNodeServer
}

// services says which CSI services a test plugin registers.
type services struct {
	identity, controller, node bool
}

// anyArg matches any context or request.
var anyArg = gomock.Any()

// startPlugin serves the chosen mock services on a fresh unix socket and
// returns the mocks and a real client for it. Everything is torn down at
// the end of the test.
func startPlugin(t *testing.T, svc services) (mocks, Clients) {
	t.Helper()
	ctrl := gomock.NewController(t)
	var m mocks
	var servers driver.CSIDriverServers
	if svc.identity {
		m.identity = driver.NewMockIdentityServer(ctrl)
		servers.Identity = struct {
			csi.UnsafeIdentityServer
			*driver.MockIdentityServer
		}{MockIdentityServer: m.identity}
	}
	if svc.controller {
		m.controller = driver.NewMockControllerServer(ctrl)
		servers.Controller = struct {
			csi.UnsafeControllerServer
			*driver.MockControllerServer
		}{MockControllerServer: m.controller}
	}
	if svc.node {
		m.node = driver.NewMockNodeServer(ctrl)
		servers.Node = struct {
			csi.UnsafeNodeServer
			*driver.MockNodeServer
		}{MockNodeServer: m.node}
	}

	dir, err := os.MkdirTemp("", "csi")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	socket := filepath.Join(dir, "csi.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatalf("listen on %s: %v", socket, err)
	}
	drv := driver.NewCSIDriver(&servers)
	if err := drv.Start(l); err != nil {
		t.Fatalf("start mock driver on %s: %v", socket, err)
	}
	t.Cleanup(drv.Stop)

	c, err := csiclient.New(csiclient.Config{Socket: socket, Redial: config.DefaultRetry().PluginRedial})
	if err != nil {
		t.Fatalf("csiclient.New(%s): %v", socket, err)
	}
	t.Cleanup(func() { c.Close() })
	return m, Clients{Identity: c.Identity, Controller: c.Controller, Node: c.Node}
}

func pluginInfo(name string) *csi.GetPluginInfoResponse {
	return &csi.GetPluginInfoResponse{Name: name, VendorVersion: "1.2.3"}
}

func pluginCaps(types ...csi.PluginCapability_Service_Type) *csi.GetPluginCapabilitiesResponse {
	resp := &csi.GetPluginCapabilitiesResponse{}
	for _, typ := range types {
		resp.Capabilities = append(resp.Capabilities, &csi.PluginCapability{
			Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: typ}},
		})
	}
	return resp
}

func controllerCaps(types ...csi.ControllerServiceCapability_RPC_Type) *csi.ControllerGetCapabilitiesResponse {
	resp := &csi.ControllerGetCapabilitiesResponse{}
	for _, typ := range types {
		resp.Capabilities = append(resp.Capabilities, &csi.ControllerServiceCapability{
			Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: typ}},
		})
	}
	return resp
}

func nodeCaps(types ...csi.NodeServiceCapability_RPC_Type) *csi.NodeGetCapabilitiesResponse {
	resp := &csi.NodeGetCapabilitiesResponse{}
	for _, typ := range types {
		resp.Capabilities = append(resp.Capabilities, &csi.NodeServiceCapability{
			Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: typ}},
		})
	}
	return resp
}

func nodeInfo(id string, max int64, topology map[string]string) *csi.NodeGetInfoResponse {
	resp := &csi.NodeGetInfoResponse{NodeId: id, MaxVolumesPerNode: max}
	if topology != nil {
		resp.AccessibleTopology = &csi.Topology{Segments: topology}
	}
	return resp
}

const (
	ctrlSvc = csi.PluginCapability_Service_CONTROLLER_SERVICE
	topoSvc = csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS
)

func TestTake(t *testing.T) {
	all := services{identity: true, controller: true, node: true}
	cases := []struct {
		name     string
		services services
		expect   func(m mocks)
		want     Fingerprint
		wantErr  string     // substring of the error; "" means success
		wantCode codes.Code // gRPC code the error must wrap, when set
	}{
		{
			name:     "controller: node service not registered",
			services: services{identity: true, controller: true},
			expect: func(m mocks) {
				m.identity.EXPECT().GetPluginInfo(anyArg, anyArg).Return(&csi.GetPluginInfoResponse{
					Name: "ctrl.example.com", VendorVersion: "0.9", Manifest: map[string]string{"commit": "abc"},
				}, nil)
				m.identity.EXPECT().GetPluginCapabilities(anyArg, anyArg).Return(pluginCaps(topoSvc, ctrlSvc), nil)
				m.controller.EXPECT().ControllerGetCapabilities(anyArg, anyArg).Return(controllerCaps(
					csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
					csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
					csi.ControllerServiceCapability_RPC_UNKNOWN,
					csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
				), nil)
			},
			want: Fingerprint{
				VendorName:             "ctrl.example.com",
				VendorVersion:          "0.9",
				Manifest:               map[string]string{"commit": "abc"},
				Type:                   plugin.TypeController,
				PluginCapabilities:     []string{"CONTROLLER_SERVICE", "VOLUME_ACCESSIBILITY_CONSTRAINTS"},
				ControllerCapabilities: []string{"CREATE_DELETE_VOLUME", "PUBLISH_UNPUBLISH_VOLUME"},
			},
		},
		{
			name:     "controller: NodeGetInfo answers Unimplemented",
			services: all,
			expect: func(m mocks) {
				m.identity.EXPECT().GetPluginInfo(anyArg, anyArg).Return(pluginInfo("ctrl.example.com"), nil)
				m.identity.EXPECT().GetPluginCapabilities(anyArg, anyArg).Return(pluginCaps(ctrlSvc), nil)
				m.controller.EXPECT().ControllerGetCapabilities(anyArg, anyArg).Return(controllerCaps(
					csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
				), nil)
				m.node.EXPECT().NodeGetInfo(anyArg, anyArg).Return(nil, status.Error(codes.Unimplemented, "no node here"))
			},
			want: Fingerprint{
				VendorName:             "ctrl.example.com",
				VendorVersion:          "1.2.3",
				Type:                   plugin.TypeController,
				PluginCapabilities:     []string{"CONTROLLER_SERVICE"},
				ControllerCapabilities: []string{"LIST_VOLUMES"},
			},
		},
		{
			name:     "node: controller service registered but not advertised is not asked",
			services: all,
			expect: func(m mocks) {
				m.identity.EXPECT().GetPluginInfo(anyArg, anyArg).Return(pluginInfo("node.example.com"), nil)
				m.identity.EXPECT().GetPluginCapabilities(anyArg, anyArg).Return(pluginCaps(topoSvc), nil)
				m.node.EXPECT().NodeGetInfo(anyArg, anyArg).Return(nodeInfo("node-1", 16, map[string]string{"zone": "a", "rack": "r1"}), nil)
				m.node.EXPECT().NodeGetCapabilities(anyArg, anyArg).Return(nodeCaps(
					csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
					csi.NodeServiceCapability_RPC_EXPAND_VOLUME,
					csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
				), nil)
			},
			want: Fingerprint{
				VendorName:         "node.example.com",
				VendorVersion:      "1.2.3",
				Type:               plugin.TypeNode,
				PluginCapabilities: []string{"VOLUME_ACCESSIBILITY_CONSTRAINTS"},
				NodeCapabilities:   []string{"EXPAND_VOLUME", "GET_VOLUME_STATS", "STAGE_UNSTAGE_VOLUME"},
				NodeID:             "node-1",
				MaxVolumes:         16,
				AccessibleTopology: map[string]string{"rack": "r1", "zone": "a"},
			},
		},
		{
			name:     "node: empty topology stays nil",
			services: services{identity: true, node: true},
			expect: func(m mocks) {
				m.identity.EXPECT().GetPluginInfo(anyArg, anyArg).Return(pluginInfo("node.example.com"), nil)
				m.identity.EXPECT().GetPluginCapabilities(anyArg, anyArg).Return(pluginCaps(), nil)
				m.node.EXPECT().NodeGetInfo(anyArg, anyArg).Return(nodeInfo("node-2", 0, map[string]string{}), nil)
				m.node.EXPECT().NodeGetCapabilities(anyArg, anyArg).Return(nodeCaps(), nil)
			},
			want: Fingerprint{
				VendorName:    "node.example.com",
				VendorVersion: "1.2.3",
				Type:          plugin.TypeNode,
				NodeID:        "node-2",
			},
		},
		{
			name:     "monolith",
			services: all,
			expect: func(m mocks) {
				m.identity.EXPECT().GetPluginInfo(anyArg, anyArg).Return(pluginInfo("mono.example.com"), nil)
				m.identity.EXPECT().GetPluginCapabilities(anyArg, anyArg).Return(&csi.GetPluginCapabilitiesResponse{
					Capabilities: []*csi.PluginCapability{
						{Type: &csi.PluginCapability_VolumeExpansion_{VolumeExpansion: &csi.PluginCapability_VolumeExpansion{
							Type: csi.PluginCapability_VolumeExpansion_ONLINE,
						}}},
						{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: ctrlSvc}}},
						{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{
							Type: csi.PluginCapability_Service_UNKNOWN,
						}}},
						{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: topoSvc}}},
					},
				}, nil)
				m.controller.EXPECT().ControllerGetCapabilities(anyArg, anyArg).Return(controllerCaps(
					csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
					csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
				), nil)
				m.node.EXPECT().NodeGetInfo(anyArg, anyArg).Return(nodeInfo("node-3", 4, map[string]string{"zone": "b"}), nil)
				m.node.EXPECT().NodeGetCapabilities(anyArg, anyArg).Return(nodeCaps(
					csi.NodeServiceCapability_RPC_UNKNOWN,
					csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
				), nil)
			},
			want: Fingerprint{
				VendorName:             "mono.example.com",
				VendorVersion:          "1.2.3",
				Type:                   plugin.TypeMonolith,
				PluginCapabilities:     []string{"CONTROLLER_SERVICE", "VOLUME_ACCESSIBILITY_CONSTRAINTS", "VOLUME_EXPANSION_ONLINE"},
				ControllerCapabilities: []string{"CREATE_DELETE_VOLUME", "EXPAND_VOLUME"},
				NodeCapabilities:       []string{"STAGE_UNSTAGE_VOLUME"},
				NodeID:                 "node-3",
				MaxVolumes:             4,
				AccessibleTopology:     map[string]string{"zone": "b"},
			},
		},
		{
			name:     "unknown: identity only",
			services: services{identity: true},
			expect: func(m mocks) {
				m.identity.EXPECT().GetPluginInfo(anyArg, anyArg).Return(pluginInfo("bare.example.com"), nil)
				m.identity.EXPECT().GetPluginCapabilities(anyArg, anyArg).Return(pluginCaps(), nil)
			},
			want: Fingerprint{
				VendorName:    "bare.example.com",
				VendorVersion: "1.2.3",
				Type:          plugin.TypeUnknown,
			},
		},
		{
			name:     "empty name rejected",
			services: services{identity: true},
			expect: func(m mocks) {
				m.identity.EXPECT().GetPluginInfo(anyArg, anyArg).Return(&csi.GetPluginInfoResponse{VendorVersion: "1"}, nil)
			},
			wantErr: "GetPluginInfo: plugin returned an empty name",
		},
		{
			name:     "empty node_id rejected",
			services: services{identity: true, node: true},
			expect: func(m mocks) {
				m.identity.EXPECT().GetPluginInfo(anyArg, anyArg).Return(pluginInfo("x.example.com"), nil)
				m.identity.EXPECT().GetPluginCapabilities(anyArg, anyArg).Return(pluginCaps(), nil)
				m.node.EXPECT().NodeGetInfo(anyArg, anyArg).Return(nodeInfo("", 3, nil), nil)
			},
			wantErr: "NodeGetInfo: plugin returned an empty node_id",
		},
		{
			name:     "no identity service",
			services: services{node: true},
			expect:   func(mocks) {},
			wantErr:  "GetPluginInfo: socket does not serve the CSI Identity service",
			wantCode: codes.Unimplemented,
		},
		{
			name:     "GetPluginInfo fails",
			services: services{identity: true},
			expect: func(m mocks) {
				m.identity.EXPECT().GetPluginInfo(anyArg, anyArg).Return(nil, status.Error(codes.Internal, "boom"))
			},
			wantErr:  "GetPluginInfo: ",
			wantCode: codes.Internal,
		},
		{
			name:     "GetPluginCapabilities fails",
			services: services{identity: true},
			expect: func(m mocks) {
				m.identity.EXPECT().GetPluginInfo(anyArg, anyArg).Return(pluginInfo("x.example.com"), nil)
				m.identity.EXPECT().GetPluginCapabilities(anyArg, anyArg).Return(nil, status.Error(codes.Internal, "boom"))
			},
			wantErr:  "GetPluginCapabilities: ",
			wantCode: codes.Internal,
		},
		{
			name:     "ControllerGetCapabilities fails",
			services: services{identity: true, controller: true},
			expect: func(m mocks) {
				m.identity.EXPECT().GetPluginInfo(anyArg, anyArg).Return(pluginInfo("x.example.com"), nil)
				m.identity.EXPECT().GetPluginCapabilities(anyArg, anyArg).Return(pluginCaps(ctrlSvc), nil)
				m.controller.EXPECT().ControllerGetCapabilities(anyArg, anyArg).Return(nil, status.Error(codes.Internal, "boom"))
			},
			wantErr:  "ControllerGetCapabilities: ",
			wantCode: codes.Internal,
		},
		{
			name:     "controller advertised but controller service missing",
			services: services{identity: true},
			expect: func(m mocks) {
				m.identity.EXPECT().GetPluginInfo(anyArg, anyArg).Return(pluginInfo("x.example.com"), nil)
				m.identity.EXPECT().GetPluginCapabilities(anyArg, anyArg).Return(pluginCaps(ctrlSvc), nil)
			},
			wantErr:  "ControllerGetCapabilities: ",
			wantCode: codes.Unimplemented,
		},
		{
			name:     "NodeGetInfo fails with another code",
			services: services{identity: true, node: true},
			expect: func(m mocks) {
				m.identity.EXPECT().GetPluginInfo(anyArg, anyArg).Return(pluginInfo("x.example.com"), nil)
				m.identity.EXPECT().GetPluginCapabilities(anyArg, anyArg).Return(pluginCaps(), nil)
				m.node.EXPECT().NodeGetInfo(anyArg, anyArg).Return(nil, status.Error(codes.FailedPrecondition, "not yet"))
			},
			wantErr:  "NodeGetInfo: ",
			wantCode: codes.FailedPrecondition,
		},
		{
			name:     "NodeGetCapabilities fails",
			services: services{identity: true, node: true},
			expect: func(m mocks) {
				m.identity.EXPECT().GetPluginInfo(anyArg, anyArg).Return(pluginInfo("x.example.com"), nil)
				m.identity.EXPECT().GetPluginCapabilities(anyArg, anyArg).Return(pluginCaps(), nil)
				m.node.EXPECT().NodeGetInfo(anyArg, anyArg).Return(nodeInfo("n", 0, nil), nil)
				m.node.EXPECT().NodeGetCapabilities(anyArg, anyArg).Return(nil, status.Error(codes.Unimplemented, "nope"))
			},
			wantErr:  "NodeGetCapabilities: ",
			wantCode: codes.Unimplemented,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, clients := startPlugin(t, tc.services)
			tc.expect(m)

			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			got, err := Take(ctx, clients)

			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("Take succeeded with %+v, want error containing %q", got, tc.wantErr)
				}
				if !strings.HasPrefix(err.Error(), tc.wantErr) {
					t.Fatalf("Take error = %q, want it to start with %q", err, tc.wantErr)
				}
				if tc.wantCode != codes.OK {
					if code := status.Code(err); code != tc.wantCode {
						t.Fatalf("Take error %q wraps code %s, want %s", err, code, tc.wantCode)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Take: %v", err)
			}
			if !got.Equal(tc.want) {
				t.Fatalf("Take differs in %v\n got: %+v\nwant: %+v", got.Diff(tc.want), got, tc.want)
			}
		})
	}
}

func TestTakeHonoursDeadline(t *testing.T) {
	m, clients := startPlugin(t, services{identity: true})
	m.identity.EXPECT().GetPluginInfo(anyArg, anyArg).DoAndReturn(
		func(ctx context.Context, _ *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		})

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := Take(ctx, clients)
	if err == nil || !strings.HasPrefix(err.Error(), "GetPluginInfo: ") {
		t.Fatalf("Take with a hanging plugin: %v, want a GetPluginInfo error", err)
	}
	if code := status.Code(err); code != codes.DeadlineExceeded {
		t.Fatalf("Take with a hanging plugin: code %s, want DeadlineExceeded", code)
	}
}

func full() Fingerprint {
	return Fingerprint{
		VendorName:             "v.example.com",
		VendorVersion:          "1.0.0",
		Manifest:               map[string]string{"commit": "abc"},
		Type:                   plugin.TypeMonolith,
		PluginCapabilities:     []string{"CONTROLLER_SERVICE"},
		ControllerCapabilities: []string{"CREATE_DELETE_VOLUME", "PUBLISH_UNPUBLISH_VOLUME"},
		NodeCapabilities:       []string{"STAGE_UNSTAGE_VOLUME"},
		NodeID:                 "node-1",
		MaxVolumes:             8,
		AccessibleTopology:     map[string]string{"zone": "a"},
	}
}

func TestEqualAndDiff(t *testing.T) {
	cases := []struct {
		name   string
		change func(f *Fingerprint)
		want   []string
	}{
		{name: "identical", change: func(*Fingerprint) {}},
		{name: "vendor name", change: func(f *Fingerprint) { f.VendorName = "other" }, want: []string{"vendor_name"}},
		{name: "vendor version", change: func(f *Fingerprint) { f.VendorVersion = "2.0.0" }, want: []string{"vendor_version"}},
		{name: "manifest value", change: func(f *Fingerprint) { f.Manifest = map[string]string{"commit": "def"} }, want: []string{"manifest"}},
		{name: "type", change: func(f *Fingerprint) { f.Type = plugin.TypeNode }, want: []string{"type"}},
		{name: "plugin capabilities", change: func(f *Fingerprint) { f.PluginCapabilities = nil }, want: []string{"plugin_capabilities"}},
		{name: "controller capability added", change: func(f *Fingerprint) {
			f.ControllerCapabilities = append(slices.Clone(f.ControllerCapabilities), "LIST_VOLUMES")
		}, want: []string{"controller_capabilities"}},
		{name: "node capabilities", change: func(f *Fingerprint) { f.NodeCapabilities = []string{"EXPAND_VOLUME"} }, want: []string{"node_capabilities"}},
		{name: "node id", change: func(f *Fingerprint) { f.NodeID = "node-2" }, want: []string{"node_id"}},
		{name: "max volumes", change: func(f *Fingerprint) { f.MaxVolumes = 9 }, want: []string{"max_volumes"}},
		{name: "topology", change: func(f *Fingerprint) { f.AccessibleTopology = map[string]string{"zone": "b"} }, want: []string{"accessible_topology"}},
		{name: "several", change: func(f *Fingerprint) {
			f.VendorVersion = "2"
			f.NodeID = "n"
			f.AccessibleTopology = nil
		}, want: []string{"vendor_version", "node_id", "accessible_topology"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, b := full(), full()
			tc.change(&b)
			wantEqual := len(tc.want) == 0
			if got := a.Equal(b); got != wantEqual {
				t.Errorf("a.Equal(b) = %v, want %v", got, wantEqual)
			}
			if got := b.Equal(a); got != wantEqual {
				t.Errorf("b.Equal(a) = %v, want %v", got, wantEqual)
			}
			if got := a.Diff(b); !slices.Equal(got, tc.want) {
				t.Errorf("a.Diff(b) = %v, want %v", got, tc.want)
			}
			if got := b.Diff(a); !slices.Equal(got, tc.want) {
				t.Errorf("b.Diff(a) = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestEqualNilAndEmpty(t *testing.T) {
	// A fingerprint read back from JSON has empty slices where a fresh one
	// has nil; that is not a change.
	a := Fingerprint{Type: plugin.TypeNode}
	b := Fingerprint{
		Type:                   plugin.TypeNode,
		Manifest:               map[string]string{},
		PluginCapabilities:     []string{},
		ControllerCapabilities: []string{},
		NodeCapabilities:       []string{},
		AccessibleTopology:     map[string]string{},
	}
	if !a.Equal(b) {
		t.Fatalf("nil and empty collections compare unequal: diff %v", a.Diff(b))
	}
	if d := a.Diff(b); len(d) != 0 {
		t.Fatalf("Diff of nil and empty collections = %v, want none", d)
	}
}

func TestHasControllerCapability(t *testing.T) {
	f := full()
	cases := []struct {
		name string
		want bool
	}{
		{"PUBLISH_UNPUBLISH_VOLUME", true},
		{"CREATE_DELETE_VOLUME", true},
		{"LIST_VOLUMES", false},
		{"STAGE_UNSTAGE_VOLUME", false}, // a node capability
		{"", false},
	}
	for _, tc := range cases {
		if got := f.HasControllerCapability(tc.name); got != tc.want {
			t.Errorf("HasControllerCapability(%q) = %v, want %v", tc.name, got, tc.want)
		}
	}
}
