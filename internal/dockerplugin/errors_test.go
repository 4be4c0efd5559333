package dockerplugin_test

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// TestClusterErrors checks that the servers' errors reach the engine as
// an Err that says what to do, by their gRPC code.
func TestClusterErrors(t *testing.T) {
	fc := newFakeCluster(nodeID)
	fc.addVolume(&csisupdv1.Volume{Id: "v1", PluginId: "testplugin"})
	c := startServer(t, testConfig(t, fc))
	mount := mountReq{Name: "v1", ID: idA}
	for _, tc := range []struct {
		name, method string
		err          error
		path         string
		req          any
		want         []string
	}{
		{"unreachable", "Claim", status.Error(codes.Unavailable, "connection refused"), "/VolumeDriver.Mount", mount,
			[]string{`mount volume "v1"`, "cannot be reached", "connection refused", "csisupd node status"}},
		{"no leader", "Claim", csisupdv1.NewNoLeaderError("s1", "no leader elected"), "/VolumeDriver.Mount", mount,
			[]string{"failed for now", "no leader elected", "retry"}},
		{"claim deferred", "Claim", csisupdv1.NewClaimDeferredError(csisupdv1.ClaimRuleReleasing, "a claim is being released", "when it is released"), "/VolumeDriver.Mount", mount,
			[]string{"failed for now", "claim refused (releasing)"}},
		{"claim refused", "Claim", csisupdv1.NewClaimRefusedError(csisupdv1.ClaimRuleAccessMode, "single-node-writer claimed on node-2"), "/VolumeDriver.Mount", mount,
			[]string{"refused", "claim refused (access-mode)", "node-2"}},
		{"permission denied", "Claim", status.Error(codes.PermissionDenied, "token lacks volume:write"), "/VolumeDriver.Mount", mount,
			[]string{"permission denied", "the agent's ACL token lacks volume:write"}},
		{"plugin not found", "Claim", csisupdv1.NewPluginNotFoundError("testplugin", nodeID), "/VolumeDriver.Mount", mount,
			[]string{`plugin "testplugin" is not registered`}},
		{"volume gone", "Claim", status.Error(codes.NotFound, `volume "v1" not found`), "/VolumeDriver.Mount", mount,
			[]string{`mount volume "v1"`, "not found"}},
		{"invalid", "CreateVolume", status.Error(codes.InvalidArgument, "capacity too large"), "/VolumeDriver.Create", createReq{Name: "v2"},
			[]string{`create volume "v2" with plugin "testplugin"`, "capacity too large", "fix the volume's options"}},
		{"release unreachable", "Release", status.Error(codes.Unavailable, "connection refused"), "/VolumeDriver.Unmount", mount,
			[]string{`unmount volume "v1"`, "cannot be reached"}},
		{"list unreachable", "ListVolumes", status.Error(codes.Unavailable, "connection refused"), "/VolumeDriver.List", nil,
			[]string{"list volumes", "cannot be reached"}},
		{"get unreachable", "GetVolume", status.Error(codes.Unavailable, "connection refused"), "/VolumeDriver.Get", nameReq{Name: "v1"},
			[]string{`volume "v1"`, "cannot be reached"}},
		{"remove unreachable", "DeleteVolume", status.Error(codes.Unavailable, "connection refused"), "/VolumeDriver.Remove", nameReq{Name: "v1"},
			[]string{`remove volume "v1"`, "cannot be reached"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc.failWith(tc.method, tc.err)
			defer fc.failWith(tc.method, nil)
			e := c.fails(tc.path, tc.req)
			for _, s := range tc.want {
				if !strings.Contains(e, s) {
					t.Errorf("Err %q does not contain %q", e, s)
				}
			}
			if strings.Contains(e, "rpc error") {
				t.Errorf("Err %q carries gRPC's wrapping", e)
			}
		})
	}
	if fc.workloads("v1") == nil || len(fc.workloads("v1")) != 0 {
		t.Fatalf("failed calls changed v1's claims: %v", fc.workloads("v1"))
	}
}
