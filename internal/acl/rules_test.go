package acl

import (
	"strings"
	"testing"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// servedMethods returns the full method name of every method of every
// service csisupd serves: each service of each file of the API package,
// plus gRPC's health and reflection services.
func servedMethods(t *testing.T) []string {
	t.Helper()
	var files []protoreflect.FileDescriptor
	protoregistry.GlobalFiles.RangeFilesByPackage(protoreflect.FullName("csisupd.v1"), func(fd protoreflect.FileDescriptor) bool {
		files = append(files, fd)
		return true
	})
	// The generated descriptors of the API: RangeFilesByPackage must have
	// found each, or the package scan misses services.
	for _, fd := range []protoreflect.FileDescriptor{csisupdv1.File_csisupd_v1_acl_proto, csisupdv1.File_csisupd_v1_agent_proto,
		csisupdv1.File_csisupd_v1_clientcsi_proto, csisupdv1.File_csisupd_v1_cluster_proto, csisupdv1.File_csisupd_v1_control_proto} {
		found := false
		for _, f := range files {
			found = found || f.Path() == fd.Path()
		}
		if !found {
			t.Fatalf("%s is not among the registered files of csisupd.v1", fd.Path())
		}
	}
	files = append(files, healthpb.File_grpc_health_v1_health_proto,
		reflectionv1.File_grpc_reflection_v1_reflection_proto, reflectionv1alpha.File_grpc_reflection_v1alpha_reflection_proto)
	var out []string
	for _, fd := range files {
		svcs := fd.Services()
		for i := 0; i < svcs.Len(); i++ {
			svc := svcs.Get(i)
			for j := 0; j < svc.Methods().Len(); j++ {
				out = append(out, "/"+string(svc.FullName())+"/"+string(svc.Methods().Get(j).Name()))
			}
		}
	}
	if len(out) < 40 {
		t.Fatalf("found only %d methods: the scan is broken", len(out))
	}
	return out
}

func TestEveryMethodHasARule(t *testing.T) {
	served := map[string]bool{}
	for _, m := range servedMethods(t) {
		served[m] = true
		r, ok := RuleFor(m)
		if !ok {
			t.Errorf("method %s has no rule", m)
			continue
		}
		if err := r.Validate(); err != nil {
			t.Errorf("rule of %s: %v", m, err)
		}
	}
	for m := range Rules() {
		if !served[m] {
			t.Errorf("rule for %s, which is no method of any served service", m)
		}
	}
}

func TestRulesIsACopy(t *testing.T) {
	r := Rules()
	delete(r, csisupdv1.Control_DeleteVolume_FullMethodName)
	if _, ok := RuleFor(csisupdv1.Control_DeleteVolume_FullMethodName); !ok {
		t.Fatal("deleting from Rules() changed the table")
	}
	if _, ok := RuleFor("/csisupd.v1.Control/Nope"); ok {
		t.Fatal("rule for a method that does not exist")
	}
}

// TestRuleTable spells out the policy of the table, one row per kind of
// method, so that a change of it is a deliberate change of this test.
func TestRuleTable(t *testing.T) {
	cap := func(r Resource, l Level) Capability { return Capability{r, l} }
	tests := []struct {
		method string
		want   Rule
	}{
		{HealthCheckMethod, Rule{Peers: PeersAny, Token: TokenNone}},
		{HealthWatchMethod, Rule{Peers: PeersAny, Token: TokenNone}},
		{csisupdv1.Agent_Status_FullMethodName, Rule{PeersAny, cap(ResourceAgent, LevelRead), TokenCapability, true, false}},
		{csisupdv1.Agent_WatchEvents_FullMethodName, Rule{PeersAny, cap(ResourcePlugin, LevelRead), TokenCapability, true, false}},
		{csisupdv1.Agent_Monitor_FullMethodName, Rule{PeersAny, cap(ResourceAgent, LevelRead), TokenCapability, true, false}},
		{csisupdv1.Agent_Metrics_FullMethodName, Rule{PeersAny, cap(ResourceAgent, LevelRead), TokenCapability, true, false}},
		{csisupdv1.Agent_Config_FullMethodName, Rule{PeersAny, cap(ResourceAgent, LevelRead), TokenCapability, true, false}},
		{csisupdv1.Agent_Profile_FullMethodName, Rule{PeersAny, cap(ResourceAgent, LevelWrite), TokenCapability, true, false}},
		{csisupdv1.ClientCSI_ControllerGetCapacity_FullMethodName, Rule{PeerServer | PeerCLI, cap(ResourceVolume, LevelRead), TokenCapability, true, false}},
		{csisupdv1.ClientCSI_ControllerDeleteSnapshot_FullMethodName, Rule{PeerServer | PeerCLI, cap(ResourceVolume, LevelWrite), TokenCapability, true, false}},
		{csisupdv1.Cluster_Join_FullMethodName, Rule{Peers: PeerServer, Token: TokenNone}},
		{csisupdv1.Cluster_NodeHeartbeat_FullMethodName, Rule{PeerServer | PeerClient, cap(ResourceNode, LevelWrite), TokenCapability, true, true}},
		{csisupdv1.Cluster_ResolveToken_FullMethodName, Rule{PeerServer | PeerClient, cap(ResourceNode, LevelWrite), TokenCapability, true, true}},
		{csisupdv1.Control_WatchEvents_FullMethodName, Rule{PeerServer | PeerCLI, cap(ResourceNode, LevelRead), TokenCapability, true, false}},
		{csisupdv1.Control_SnapshotSave_FullMethodName, Rule{PeerServer | PeerCLI, cap(ResourceOperator, LevelWrite), TokenCapability, true, false}},
		{csisupdv1.Control_SnapshotRestore_FullMethodName, Rule{Peers: PeerServer | PeerCLI, Token: TokenManagement, ServerIdentity: true}},
		{csisupdv1.Control_RaftPeers_FullMethodName, Rule{PeerServer | PeerCLI, cap(ResourceOperator, LevelRead), TokenCapability, true, false}},
		{csisupdv1.Control_ClaimVolume_FullMethodName, Rule{PeersAny, cap(ResourceVolume, LevelWrite), TokenCapability, true, true}},
		{csisupdv1.Control_GetVolume_FullMethodName, Rule{PeersAny, cap(ResourceVolume, LevelRead), TokenCapability, true, false}},
		{csisupdv1.Control_ExpandVolume_FullMethodName, Rule{PeerServer | PeerCLI, cap(ResourceVolume, LevelWrite), TokenCapability, true, false}},
		{csisupdv1.NodeVolumes_MountVolume_FullMethodName, Rule{PeerServer | PeerCLI, cap(ResourceVolume, LevelWrite), TokenCapability, true, false}},
		{csisupdv1.NodeVolumes_ListMounts_FullMethodName, Rule{PeerServer | PeerCLI, cap(ResourceVolume, LevelRead), TokenCapability, true, false}},
		{csisupdv1.Cluster_NodeClaims_FullMethodName, Rule{PeerServer | PeerClient, cap(ResourceNode, LevelWrite), TokenCapability, true, true}},
		{csisupdv1.ACL_Bootstrap_FullMethodName, Rule{Peers: PeerServer | PeerCLI, Token: TokenNone, ServerIdentity: true}},
		{csisupdv1.ACL_TokenSelf_FullMethodName, Rule{Peers: PeerServer | PeerCLI, Token: TokenAny, ServerIdentity: true}},
		{csisupdv1.ACL_CreateToken_FullMethodName, Rule{Peers: PeerServer | PeerCLI, Token: TokenManagement, ServerIdentity: true}},
		{ReflectionInfoMethod, Rule{Peers: PeersAny, Token: TokenAny}},
		{ReflectionInfoAlphaMethod, Rule{Peers: PeersAny, Token: TokenAny}},
	}
	for _, tt := range tests {
		got, ok := RuleFor(tt.method)
		if !ok || got != tt.want {
			t.Errorf("%s: %+v (found %v), want %+v", tt.method, got, ok, tt.want)
		}
	}
	// Every ACL method but Bootstrap and TokenSelf needs management. No
	// client certificate may call ClientCSI or ACL, nor Control but for the
	// calls of an agent's local claims, which need volume capabilities. The
	// node methods are exactly the Cluster methods client certificates
	// call, and the local claims' calls that name a node.
	localClaims := map[string]bool{ // method -> names a node
		csisupdv1.Control_ListVolumes_FullMethodName:    false,
		csisupdv1.Control_GetVolume_FullMethodName:      false,
		csisupdv1.Control_CreateVolume_FullMethodName:   false,
		csisupdv1.Control_DeleteVolume_FullMethodName:   false,
		csisupdv1.Control_ClaimVolume_FullMethodName:    true,
		csisupdv1.Control_ReleaseVolume_FullMethodName:  true,
		csisupdv1.Control_SyncNodeClaims_FullMethodName: true,
	}
	for m, r := range Rules() {
		names, local := localClaims[m]
		if want := strings.HasPrefix(m, "/csisupd.v1.Cluster/") && r.Peers&PeerClient != 0 || names; r.Node != want {
			t.Errorf("%s: Node is %v, want %v", m, r.Node, want)
		}
		if strings.HasPrefix(m, "/csisupd.v1.ACL/") && m != csisupdv1.ACL_Bootstrap_FullMethodName &&
			m != csisupdv1.ACL_TokenSelf_FullMethodName && r.Token != TokenManagement {
			t.Errorf("%s needs %s, want management", m, r.Token)
		}
		for _, svc := range []string{"/csisupd.v1.ClientCSI/", "/csisupd.v1.Control/", "/csisupd.v1.ACL/"} {
			if strings.HasPrefix(m, svc) && r.Peers&PeerClient != 0 && !local {
				t.Errorf("%s may be called with a client certificate", m)
			}
		}
		if local && (r.Peers&PeerClient == 0 || r.Capability.Resource != ResourceVolume || r.Token != TokenCapability) {
			t.Errorf("%s: %+v; an agent's local claims call it with a client certificate and a token that allows volumes", m, r)
		}
	}
}

func TestRuleValidate(t *testing.T) {
	tests := []struct {
		rule Rule
		want string // "" means valid
	}{
		{Rule{Peers: PeerCLI, Capability: Capability{ResourceVolume, LevelRead}}, ""},
		{Rule{Peers: PeerCLI}, `token need capability with capability ":none"`},
		{Rule{Peers: PeerCLI, Capability: Capability{ResourceVolume, LevelDeny}}, "want read or write"},
		{Rule{Capability: Capability{ResourceVolume, LevelRead}}, "peers none"},
		{Rule{Peers: 1 << 5, Token: TokenNone}, "peers Peers(0x20)"},
		{Rule{Peers: PeerServer, Token: TokenNone, Capability: Capability{ResourceNode, LevelRead}}, "does not use"},
		{Rule{Peers: PeerServer, Token: TokenNeed(9)}, "unknown token need TokenNeed(9)"},
	}
	for _, tt := range tests {
		err := tt.rule.Validate()
		if tt.want == "" {
			if err != nil {
				t.Errorf("%+v: %v", tt.rule, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: error %v, want it to contain %q", tt.rule, err, tt.want)
		}
	}
}

func TestPeers(t *testing.T) {
	if got := (PeerServer | PeerCLI).String(); got != "server|cli" {
		t.Errorf("String = %q", got)
	}
	if got := PeersAny.String(); got != "server|client|cli" {
		t.Errorf("String = %q", got)
	}
	if !PeersAny.Has(PeerClient) || (PeerServer | PeerCLI).Has(PeerClient) || PeersAny.Has(0) {
		t.Error("Has is wrong")
	}
}

func TestRaisedRuleFor(t *testing.T) {
	release, remove := csisupdv1.Control_ReleaseVolume_FullMethodName, csisupdv1.Control_DeleteVolume_FullMethodName
	tests := []struct {
		method string
		req    any
		raised bool
	}{
		{release, &csisupdv1.VolumeReleaseRequest{}, false},
		{release, &csisupdv1.VolumeReleaseRequest{Force: 1}, false},
		{release, &csisupdv1.VolumeReleaseRequest{Force: 2}, true},
		{release, &csisupdv1.VolumeReleaseRequest{Force: 3}, true}, // refused later, never let through cheaper
		{remove, &csisupdv1.VolumeDeleteRequest{DeregisterOnly: true}, false},
		{remove, &csisupdv1.VolumeDeleteRequest{DeregisterOnly: true, Force: true}, true},
		{remove, &csisupdv1.VolumeDeleteRequest{Force: true}, true},
		{csisupdv1.Control_ClaimVolume_FullMethodName, &csisupdv1.VolumeReleaseRequest{Force: 2}, false},
		{release, nil, false},
	}
	for _, tt := range tests {
		got, ok := RaisedRuleFor(tt.method, tt.req)
		if ok != tt.raised {
			t.Errorf("%s %v: raised %v, want %v", tt.method, tt.req, ok, tt.raised)
			continue
		}
		if want := (Rule{PeerServer | PeerCLI, Capability{ResourceOperator, LevelWrite}, TokenCapability, true, false}); ok && got != want {
			t.Errorf("%s %v: %+v, want %+v", tt.method, tt.req, got, want)
		}
		if ok {
			if err := got.Validate(); err != nil {
				t.Errorf("raised rule: %v", err)
			}
		}
	}
}
