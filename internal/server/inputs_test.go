package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// manyEntries returns a map of n entries.
func manyEntries(n int) map[string]string {
	m := make(map[string]string, n)
	for i := range n {
		m[fmt.Sprintf("key-%d", i)] = "value"
	}
	return m
}

// wantInvalid fails t unless err is InvalidArgument with a message that
// holds want.
func wantInvalid(t *testing.T, what string, err error, want string) {
	t.Helper()
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), want) {
		t.Fatalf("%s = %v, want InvalidArgument holding %q", what, err, want)
	}
}

// Bad inputs are refused by the follower that got them, with
// InvalidArgument naming the field and the value, before anything is
// stored or sent to a plugin or a node.
func TestBadVolumeInputsAreRefusedAndNothingStored(t *testing.T) {
	e := newClaimEnv(t, 3, nil, map[string][]*csisupdv1.Plugin{"node-a": {monolith("p1", "node-a")}})
	ctx := context.Background()
	agent := e.agents["node-a"]
	notStored := func(t *testing.T, id string) {
		t.Helper()
		if _, err := e.cl.GetVolume(ctx, &csisupdv1.VolumeGetRequest{Id: id}); status.Code(err) != codes.NotFound {
			t.Fatalf("volume %q after a refused request: %v, want NotFound", id, err)
		}
	}

	creates := []struct {
		name string
		req  *csisupdv1.VolumeCreateRequest
		want string
	}{
		{"negative capacity", &csisupdv1.VolumeCreateRequest{CapacityMinBytes: -5}, `capacity_min_bytes -5 is negative`},
		{"limit below minimum", &csisupdv1.VolumeCreateRequest{CapacityMinBytes: 2 << 30, CapacityMaxBytes: 1 << 30}, `capacity_max_bytes 1073741824 is below`},
		{"10000 parameters", &csisupdv1.VolumeCreateRequest{Parameters: manyEntries(10000)}, `parameters has 10000 entries, more than the 512 allowed`},
		{"remount capability", &csisupdv1.VolumeCreateRequest{Capabilities: []*csisupdv1.VolumeCapability{{MountFlags: []string{"remount"}}}},
			`capabilities[0].mount_flags[0] "remount" is not allowed`},
		{"too many secrets", &csisupdv1.VolumeCreateRequest{Secrets: manyEntries(600)}, `secrets has 600 entries`},
		{"control character in the name", &csisupdv1.VolumeCreateRequest{Name: "db\n"}, `name: "db\n" contains the control character U+000A`},
		{"escape sequence in the name", &csisupdv1.VolumeCreateRequest{Name: "\x1b[2J"}, `name: "\x1b[2J" contains the control character U+001B`},
		{"control character in a parameter key", &csisupdv1.VolumeCreateRequest{Parameters: map[string]string{"a\x07": "b"}},
			`parameters: key "a\a" contains the control character U+0007`},
		{"control character in a topology value", &csisupdv1.VolumeCreateRequest{AccessibilityRequirements: &csisupdv1.TopologyRequirement{
			Requisite: []*csisupdv1.TopologySegment{{Segments: map[string]string{"zone": "z\r"}}}}},
			`accessibility_requirements.requisite[0].segments: value of "zone": "z\r" contains the control character U+000D`},
	}
	for _, tt := range creates {
		t.Run("create "+tt.name, func(t *testing.T) {
			tt.req.Id, tt.req.PluginId = "bad-create", "p1"
			_, err := e.cl.CreateVolume(ctx, tt.req)
			wantInvalid(t, "CreateVolume", err, tt.want)
			notStored(t, "bad-create")
		})
	}
	if n := agent.callCount("create"); n != 0 {
		t.Fatalf("the controller got %d CreateVolume calls for refused requests, want 0", n)
	}

	registers := []struct {
		name string
		v    *csisupdv1.Volume
		want string
	}{
		{"fs type path", &csisupdv1.Volume{Capabilities: []*csisupdv1.VolumeCapability{{FsType: "../../x"}}}, `volume.capabilities[0].fs_type "../../x"`},
		{"comma flag", &csisupdv1.Volume{Capabilities: []*csisupdv1.VolumeCapability{{MountFlags: []string{"a,b"}}}}, `"a,b" holds a comma`},
		{"10000 parameters", &csisupdv1.Volume{Parameters: manyEntries(10000)}, `volume.parameters has 10000 entries`},
		{"negative capacity", &csisupdv1.Volume{CapacityBytes: -5}, `volume.capacity_bytes -5 is negative`},
		{"control character in the external id", &csisupdv1.Volume{ExternalId: "x\x1b]0;title\x07"}, `volume.external_id: "x\x1b]0;title\a" contains`},
		{"control character in a context key", &csisupdv1.Volume{Context: map[string]string{"k\n": "v"}}, `volume.context: key "k\n" contains`},
	}
	for _, tt := range registers {
		t.Run("register "+tt.name, func(t *testing.T) {
			tt.v.Id, tt.v.PluginId = "bad-register", "p1"
			if tt.v.ExternalId == "" {
				tt.v.ExternalId = "x-bad"
			}
			_, err := e.cl.RegisterVolume(ctx, &csisupdv1.VolumeRegisterRequest{Volume: tt.v})
			wantInvalid(t, "RegisterVolume", err, tt.want)
			notStored(t, "bad-register")
		})
	}

	// A volume whose capability names no flags: a claim's own flags are
	// checked all the same.
	e.register(t, &csisupdv1.Volume{Id: "vol", PluginId: "p1", ExternalId: "x-vol"})
	claims := []struct {
		name  string
		usage *csisupdv1.VolumeUsage
		want  string
	}{
		{"comma suid", &csisupdv1.VolumeUsage{MountFlags: []string{",suid"}}, `usage.mount_flags[0] ",suid" holds a comma`},
		{"remount", &csisupdv1.VolumeUsage{MountFlags: []string{"noatime", "remount"}}, `usage.mount_flags[1] "remount" is not allowed`},
		{"bind", &csisupdv1.VolumeUsage{MountFlags: []string{"bind"}}, `usage.mount_flags[0] "bind" is not allowed`},
		{"two in one", &csisupdv1.VolumeUsage{MountFlags: []string{"a,b"}}, `usage.mount_flags[0] "a,b" holds a comma`},
		{"fs type path", &csisupdv1.VolumeUsage{FsType: "../../x"}, `usage.fs_type "../../x"`},
	}
	for _, tt := range claims {
		t.Run("claim "+tt.name, func(t *testing.T) {
			_, err := e.claim("vol", "node-a", "w1", tt.usage)
			wantInvalid(t, "ClaimVolume", err, tt.want)
		})
	}
	_, err := e.cl.ClaimVolume(ctx, &csisupdv1.VolumeClaimRequest{Id: "vol", NodeId: "node-a", WorkloadId: "w1", Secrets: manyEntries(600)})
	wantInvalid(t, "ClaimVolume with 600 secrets", err, `secrets has 600 entries`)
	_, err = e.cl.ClaimVolume(ctx, &csisupdv1.VolumeClaimRequest{Id: "vol", NodeId: "node-a", WorkloadId: "w1", Owner: "nomad\x1b[2J"})
	wantInvalid(t, "ClaimVolume with an escape in the owner", err, `owner: "nomad\x1b[2J" contains the control character U+001B`)
	_, err = e.cl.ClaimVolume(ctx, &csisupdv1.VolumeClaimRequest{Id: "vol", NodeId: "node-a", WorkloadId: "w1", Secrets: map[string]string{"key\x07": "value\x07"}})
	wantInvalid(t, "ClaimVolume with a control character in a secret's key", err, `secrets: key "key\a" contains`)
	if strings.Contains(status.Convert(err).Message(), "value") {
		t.Fatalf("refusal %v holds the secret's value", err)
	}
	if v := e.volume(t, "vol"); len(v.GetClaims()) != 0 {
		t.Fatalf("claims after refused requests: %v", v.GetClaims())
	}
	if e.nv.mounted() != 0 || e.nv.lastMount() != nil {
		t.Fatalf("a refused claim reached the node: %d mounts, last %v", e.nv.mounted(), e.nv.lastMount())
	}

	// suid and dev pass the servers: only the node knows whether its
	// operator allows them.
	if _, err := e.claim("vol", "node-a", "w1", &csisupdv1.VolumeUsage{MountFlags: []string{"suid", "uid=1000"}}); err != nil {
		t.Fatalf("claim with suid: %v", err)
	}
	if got := e.nv.lastMount().GetUsage().GetMountFlags(); len(got) != 2 || got[0] != "suid" {
		t.Fatalf("mount flags that reached the node: %q, want [suid uid=1000]", got)
	}

	// Release and delete cap their secrets too, and change nothing.
	_, err = e.cl.ReleaseVolume(ctx, &csisupdv1.VolumeReleaseRequest{Id: "vol", NodeId: "node-a", WorkloadId: "w1", Secrets: manyEntries(600)})
	wantInvalid(t, "ReleaseVolume with 600 secrets", err, `secrets has 600 entries`)
	if c := claimOf(e.volume(t, "vol"), "node-a", "w1"); c == nil || c.GetState() != "taken" {
		t.Fatalf("claim after a refused release: %v, want it taken", c)
	}
	_, err = e.cl.DeleteVolume(ctx, &csisupdv1.VolumeDeleteRequest{Id: "vol", DeregisterOnly: true, Secrets: manyEntries(600)})
	wantInvalid(t, "DeleteVolume with 600 secrets", err, `secrets has 600 entries`)
	e.volume(t, "vol")
}
