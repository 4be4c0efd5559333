package rpc

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/reflection"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/config"
	"github.com/csisupd/csisupd/internal/testutil"
)

// TestClientCSIReflection does what grpcurl does: it learns ClientCSI from
// server reflection alone, builds a request from JSON with the learnt
// descriptors, and calls the service with it.
func TestClientCSIReflection(t *testing.T) {
	dir := testutil.TempDir(t)
	svc, err := NewClientCSI(ClientCSIConfig{Plugins: newFixedPlugins(), NodeName: "n1", Retry: shortRetry,
		RPCTimeout: config.DefaultRPCTimeout, MaxDestructiveInFlight: config.DefaultMaxDestructiveInFlight})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "agent.sock")
	srv := grpc.NewServer()
	svc.Register(srv)
	reflection.Register(srv)
	testutil.ServeGRPC(t, testutil.ListenUnix(t, sock), srv)
	conn := testutil.DialGRPC(t, "unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ask := func(req *reflectionpb.ServerReflectionRequest) *reflectionpb.ServerReflectionResponse {
		t.Helper()
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	var services []string
	for _, s := range ask(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{},
	}).GetListServicesResponse().GetService() {
		services = append(services, s.GetName())
	}
	if !slices.Contains(services, "csisupd.v1.ClientCSI") {
		t.Fatalf("reflection lists %v, without csisupd.v1.ClientCSI", services)
	}

	// Collect the file with the service and, as grpcurl does, ask for every
	// dependency the answer did not include.
	fds := &descriptorpb.FileDescriptorSet{}
	have := map[string]bool{}
	add := func(resp *reflectionpb.ServerReflectionResponse) {
		for _, raw := range resp.GetFileDescriptorResponse().GetFileDescriptorProto() {
			fd := &descriptorpb.FileDescriptorProto{}
			if err := proto.Unmarshal(raw, fd); err != nil {
				t.Fatal(err)
			}
			if !have[fd.GetName()] {
				have[fd.GetName()] = true
				fds.File = append(fds.File, fd)
			}
		}
	}
	add(ask(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: "csisupd.v1.ClientCSI"},
	}))
	for i := 0; i < len(fds.File); i++ {
		for _, dep := range fds.File[i].GetDependency() {
			if !have[dep] {
				add(ask(&reflectionpb.ServerReflectionRequest{
					MessageRequest: &reflectionpb.ServerReflectionRequest_FileByFilename{FileByFilename: dep},
				}))
			}
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	files, err := protodesc.NewFiles(fds)
	if err != nil {
		t.Fatalf("the reflected descriptors do not resolve: %v", err)
	}
	d, err := files.FindDescriptorByName("csisupd.v1.ClientCSI")
	if err != nil {
		t.Fatal(err)
	}
	// Every method is described with its CSI request and response, the
	// CSI 1.13 additions included, so grpcurl can build their requests.
	svcDesc := d.(protoreflect.ServiceDescriptor)
	for _, tt := range []struct{ method, request, response string }{
		{"ControllerCreateVolume", "csi.v1.CreateVolumeRequest", "csi.v1.CreateVolumeResponse"},
		{"ControllerGetSnapshot", "csi.v1.GetSnapshotRequest", "csi.v1.GetSnapshotResponse"},
		{"ControllerModifyVolume", "csi.v1.ControllerModifyVolumeRequest", "csi.v1.ControllerModifyVolumeResponse"},
		{"ControllerGetVolumeHealth", "csi.v1.ControllerGetVolumeHealthRequest", "csi.v1.ControllerGetVolumeHealthResponse"},
		{"ControllerListVolumeHealth", "csi.v1.ControllerListVolumeHealthRequest", "csi.v1.ControllerListVolumeHealthResponse"},
	} {
		m := svcDesc.Methods().ByName(protoreflect.Name(tt.method))
		if m == nil {
			t.Errorf("reflected ClientCSI has no %s", tt.method)
			continue
		}
		req := m.Input().Fields().ByName("request")
		resp := m.Output().Fields().ByName("response")
		if m.Input().Fields().ByName("plugin_id") == nil || req == nil || string(req.Message().FullName()) != tt.request {
			t.Errorf("%s takes %s, want plugin_id and request %s", tt.method, m.Input().FullName(), tt.request)
		}
		if resp == nil || string(resp.Message().FullName()) != tt.response {
			t.Errorf("%s returns %s, want response %s", tt.method, m.Output().FullName(), tt.response)
		}
	}
	if got, want := svcDesc.Methods().Len(), len(methodNames()); got != want {
		t.Errorf("reflection describes %d ClientCSI methods, the service has %d", got, want)
	}

	method := svcDesc.Methods().ByName("ControllerCreateVolume")
	if method == nil {
		t.Fatal("reflected ClientCSI has no ControllerCreateVolume")
	}

	in := dynamicpb.NewMessage(method.Input())
	const body = `{"plugin_id":"p1","request":{"name":"v1","volume_capabilities":[{"mount":{},"access_mode":{"mode":"SINGLE_NODE_WRITER"}}],"secrets":{"k":"v"}}}`
	if err := protojson.Unmarshal([]byte(body), in); err != nil {
		t.Fatalf("JSON request: %v", err)
	}
	// The dynamic message is the same request as the generated one.
	raw, err := proto.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var typed csisupdv1.ControllerCreateVolumeRequest
	if err := proto.Unmarshal(raw, &typed); err != nil {
		t.Fatal(err)
	}
	want := &csisupdv1.ControllerCreateVolumeRequest{PluginId: "p1", Request: &csi.CreateVolumeRequest{
		Name: "v1",
		VolumeCapabilities: []*csi.VolumeCapability{{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
		}},
		Secrets: map[string]string{"k": "v"},
	}}
	if !proto.Equal(&typed, want) {
		t.Errorf("JSON request decoded to %v, want %v", &typed, want)
	}

	out := dynamicpb.NewMessage(method.Output())
	err = conn.Invoke(ctx, "/csisupd.v1.ClientCSI/ControllerCreateVolume", in, out)
	if !csisupdv1.IsPluginNotFound(err) {
		t.Errorf("call with the reflected request: error = %v, want PluginNotFound for p1", err)
	}
}
