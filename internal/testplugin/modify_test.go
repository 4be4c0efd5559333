package testplugin

import (
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"

	csi "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
)

func TestModifyVolume(t *testing.T) {
	p := startPlugin(t, Config{ControllerCapabilities: SupportedControllerCapabilities})
	c := dial(t, p.Socket())
	resp, err := c.ctrl.CreateVolume(ctx(t), &csi.CreateVolumeRequest{
		Name: "mutable", VolumeCapabilities: []*csi.VolumeCapability{snw},
		MutableParameters: map[string]string{"iops": "100", "tier": "slow"},
	})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetVolume().GetVolumeId()
	params := func() map[string]string {
		v, ok := p.Volume(id)
		if !ok {
			t.Fatalf("Volume(%s) is missing", id)
		}
		return v.MutableParameters
	}
	if got, want := params(), map[string]string{"iops": "100", "tier": "slow"}; !maps.Equal(got, want) {
		t.Fatalf("mutable parameters after CreateVolume = %v, want %v", got, want)
	}

	tests := []struct {
		name   string
		id     string
		params map[string]string
		code   codes.Code
		want   string            // in the error
		after  map[string]string // the volume's parameters afterwards
	}{
		{"change one key, keep the others", id, map[string]string{"iops": "3000"}, codes.OK, "",
			map[string]string{"iops": "3000", "tier": "slow"}},
		{"add a key", id, map[string]string{"throughput": "125"}, codes.OK, "",
			map[string]string{"iops": "3000", "tier": "slow", "throughput": "125"}},
		{"repeat is idempotent", id, map[string]string{"throughput": "125"}, codes.OK, "",
			map[string]string{"iops": "3000", "tier": "slow", "throughput": "125"}},
		{"unknown key changes nothing", id, map[string]string{"iops": "1", "colour": "red"}, codes.InvalidArgument, `"colour"`,
			map[string]string{"iops": "3000", "tier": "slow", "throughput": "125"}},
		{"value too long", id, map[string]string{"tier": strings.Repeat("x", 129)}, codes.InvalidArgument, `"tier"`,
			map[string]string{"iops": "3000", "tier": "slow", "throughput": "125"}},
		{"no parameters", id, nil, codes.InvalidArgument, "mutable_parameters", nil},
		{"no volume id", "", map[string]string{"iops": "1"}, codes.InvalidArgument, "volume_id", nil},
		{"unknown volume", "vol-none", map[string]string{"iops": "1"}, codes.NotFound, "vol-none", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.ctrl.ControllerModifyVolume(ctx(t), &csi.ControllerModifyVolumeRequest{VolumeId: tt.id, MutableParameters: tt.params})
			wantCode(t, err, tt.code)
			if err != nil && !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q does not name %s", err, tt.want)
			}
			if tt.after != nil && !maps.Equal(params(), tt.after) {
				t.Fatalf("mutable parameters = %v, want %v", params(), tt.after)
			}
		})
	}

	// ValidateVolumeCapabilities confirms the current values only.
	validate := func(mutable map[string]string) *csi.ValidateVolumeCapabilitiesResponse {
		r, err := c.ctrl.ValidateVolumeCapabilities(ctx(t), &csi.ValidateVolumeCapabilitiesRequest{
			VolumeId: id, VolumeCapabilities: []*csi.VolumeCapability{snw}, MutableParameters: mutable})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := validate(map[string]string{"iops": "3000"}); !maps.Equal(r.GetConfirmed().GetMutableParameters(), map[string]string{"iops": "3000"}) {
		t.Fatalf("validate current value = %v, want it confirmed", r)
	}
	if r := validate(map[string]string{"iops": "100"}); r.GetConfirmed() != nil || !strings.Contains(r.GetMessage(), "iops") {
		t.Fatalf("validate old value = %v, want a message naming iops", r)
	}

	// CreateVolume: the same check, and idempotency by the creation values.
	creates := []struct {
		name    string
		mutable map[string]string
		code    codes.Code
	}{
		{"repeat with the creation values", map[string]string{"iops": "100", "tier": "slow"}, codes.OK},
		{"repeat with other values", map[string]string{"iops": "3000", "tier": "slow"}, codes.AlreadyExists},
		{"unknown key", map[string]string{"XXX": "1"}, codes.InvalidArgument},
	}
	for _, tt := range creates {
		t.Run("CreateVolume "+tt.name, func(t *testing.T) {
			r, err := c.ctrl.CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "mutable", VolumeCapabilities: []*csi.VolumeCapability{snw}, MutableParameters: tt.mutable})
			wantCode(t, err, tt.code)
			if err == nil && r.GetVolume().GetVolumeId() != id {
				t.Fatalf("repeated CreateVolume made %s, want %s", r.GetVolume().GetVolumeId(), id)
			}
		})
	}
}

func TestModifyVolumeConfig(t *testing.T) {
	// An own list of keys replaces the default one.
	p := startPlugin(t, Config{ControllerCapabilities: SupportedControllerCapabilities, MutableParameters: []string{"qos"}})
	c := dial(t, p.Socket())
	id := createVolume(t, c, "qos", 1<<20).GetVolumeId()
	if _, err := c.ctrl.ControllerModifyVolume(ctx(t), &csi.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: map[string]string{"qos": "gold"}}); err != nil {
		t.Fatal(err)
	}
	_, err := c.ctrl.ControllerModifyVolume(ctx(t), &csi.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: map[string]string{"iops": "1"}})
	wantCode(t, err, codes.InvalidArgument)

	// Without MODIFY_VOLUME the call is unimplemented and CreateVolume
	// refuses mutable parameters.
	plain := startPlugin(t, Config{})
	pc := dial(t, plain.Socket())
	id = createVolume(t, pc, "plain", 1<<20).GetVolumeId()
	_, err = pc.ctrl.ControllerModifyVolume(ctx(t), &csi.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: map[string]string{"iops": "1"}})
	wantCode(t, err, codes.Unimplemented)
	_, err = pc.ctrl.CreateVolume(ctx(t), &csi.CreateVolumeRequest{Name: "m", VolumeCapabilities: []*csi.VolumeCapability{snw}, MutableParameters: map[string]string{"iops": "1"}})
	wantCode(t, err, codes.InvalidArgument)
}

func TestVolumeHealth(t *testing.T) {
	p := startPlugin(t, Config{ControllerCapabilities: SupportedControllerCapabilities, VolumeHealth: true})
	c := dial(t, p.Socket())
	ids := []string{
		createVolume(t, c, "h1", 1<<20).GetVolumeId(),
		createVolume(t, c, "h2", 1<<20).GetVolumeId(),
		createVolume(t, c, "h3", 1<<20).GetVolumeId(),
	}
	ctrlHealth := func(id string) []*csi.VolumeHealth_VolumeHealthEntry {
		t.Helper()
		r, err := c.ctrl.ControllerGetVolumeHealth(ctx(t), &csi.ControllerGetVolumeHealthRequest{VolumeId: id})
		if err != nil || r.GetVolumeHealth().GetVolumeId() != id {
			t.Fatalf("ControllerGetVolumeHealth(%s) = %v, %v", id, r, err)
		}
		return r.GetVolumeHealth().GetHealthStatuses()
	}
	nodeHealth := func(id string) []*csi.VolumeHealth_VolumeHealthEntry {
		t.Helper()
		r, err := c.node.NodeGetVolumeHealth(ctx(t), &csi.NodeGetVolumeHealthRequest{VolumeId: id})
		if err != nil || r.GetVolumeHealth().GetVolumeId() != id {
			t.Fatalf("NodeGetVolumeHealth(%s) = %v, %v", id, r, err)
		}
		return r.GetVolumeHealth().GetHealthStatuses()
	}
	listed := func(maxEntries int32) []string {
		t.Helper()
		var out []string
		token := ""
		for range 10 {
			r, err := c.ctrl.ControllerListVolumeHealth(ctx(t), &csi.ControllerListVolumeHealthRequest{MaxEntries: maxEntries, StartingToken: token})
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range r.GetEntries() {
				if len(e.GetHealthStatuses()) == 0 {
					t.Fatalf("healthy volume %s listed", e.GetVolumeId())
				}
				out = append(out, e.GetVolumeId())
			}
			if token = r.GetNextToken(); token == "" {
				return out
			}
		}
		t.Fatal("ControllerListVolumeHealth did not end after 10 pages")
		return nil
	}
	if h := ctrlHealth(ids[0]); len(h) != 0 {
		t.Fatalf("health of a new volume = %v, want none", h)
	}
	if got := listed(0); len(got) != 0 {
		t.Fatalf("listed %v, want no volume", got)
	}

	p.SetVolumeCondition(ids[0], true, "disk is slow")
	p.SetVolumeHealth(ids[2],
		VolumeHealthStatus{Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: "PathDown"},
		VolumeHealthStatus{Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: "PathDown", Message: "repeated"},
		VolumeHealthStatus{Status: csi.VolumeHealthErrorType_DATA_LOSS, Reason: "Corrupt", Message: "bad blocks"},
	)
	want0 := []*csi.VolumeHealth_VolumeHealthEntry{{Status: csi.VolumeHealthErrorType_DEGRADED, Reason: ReasonAbnormal, Message: "disk is slow"}}
	want2 := []*csi.VolumeHealth_VolumeHealthEntry{
		{Status: csi.VolumeHealthErrorType_INACCESSIBLE, Reason: "PathDown"},
		{Status: csi.VolumeHealthErrorType_DATA_LOSS, Reason: "Corrupt", Message: "bad blocks"},
	}
	for _, tt := range []struct {
		id   string
		want []*csi.VolumeHealth_VolumeHealthEntry
	}{{ids[0], want0}, {ids[1], nil}, {ids[2], want2}} {
		for name, get := range map[string]func(string) []*csi.VolumeHealth_VolumeHealthEntry{"controller": ctrlHealth, "node": nodeHealth} {
			if got := get(tt.id); !healthEqual(got, tt.want) {
				t.Fatalf("%s health of %s = %v, want %v", name, tt.id, got, tt.want)
			}
		}
	}
	wantListed := []string{ids[0], ids[2]}
	slices.Sort(wantListed)
	for _, maxEntries := range []int32{0, 1} {
		if got := listed(maxEntries); !reflect.DeepEqual(got, wantListed) {
			t.Fatalf("listed with max_entries %d: %v, want %v", maxEntries, got, wantListed)
		}
	}

	// Healthy again; a deleted volume takes its conditions along.
	p.SetVolumeCondition(ids[0], false, "")
	if h := ctrlHealth(ids[0]); len(h) != 0 {
		t.Fatalf("health after clearing = %v, want none", h)
	}
	if _, err := c.ctrl.DeleteVolume(ctx(t), &csi.DeleteVolumeRequest{VolumeId: ids[2]}); err != nil {
		t.Fatal(err)
	}
	if got := listed(0); len(got) != 0 {
		t.Fatalf("listed after delete: %v, want none", got)
	}

	p.SetStorageHealth(StorageHealthStatus{Status: csi.StorageHealthErrorType_STORAGE_UNREACHABLE, Reason: "Offline", Message: "pool gone"})
	sh, err := c.node.NodeGetStorageHealth(ctx(t), &csi.NodeGetStorageHealthRequest{})
	if err != nil || len(sh.GetBackendHealth()) != 1 || sh.GetBackendHealth()[0].GetStatus() != csi.StorageHealthErrorType_STORAGE_UNREACHABLE ||
		sh.GetBackendHealth()[0].GetReason() != "Offline" {
		t.Fatalf("NodeGetStorageHealth = %v, %v", sh, err)
	}

	errs := []struct {
		name string
		call func() error
		code codes.Code
	}{
		{"controller, unknown volume", func() error {
			_, err := c.ctrl.ControllerGetVolumeHealth(ctx(t), &csi.ControllerGetVolumeHealthRequest{VolumeId: ids[2]})
			return err
		}, codes.NotFound},
		{"controller, no volume id", func() error {
			_, err := c.ctrl.ControllerGetVolumeHealth(ctx(t), &csi.ControllerGetVolumeHealthRequest{})
			return err
		}, codes.InvalidArgument},
		{"list, bad token", func() error {
			_, err := c.ctrl.ControllerListVolumeHealth(ctx(t), &csi.ControllerListVolumeHealthRequest{StartingToken: "x"})
			return err
		}, codes.Aborted},
		{"node, unknown volume", func() error {
			_, err := c.node.NodeGetVolumeHealth(ctx(t), &csi.NodeGetVolumeHealthRequest{VolumeId: ids[2]})
			return err
		}, codes.NotFound},
		{"node, relative path", func() error {
			_, err := c.node.NodeGetVolumeHealth(ctx(t), &csi.NodeGetVolumeHealthRequest{VolumeId: ids[0], StagingTargetPath: "rel"})
			return err
		}, codes.InvalidArgument},
	}
	for _, tt := range errs {
		t.Run(tt.name, func(t *testing.T) { wantCode(t, tt.call(), tt.code) })
	}

	// Without the capabilities the calls are unimplemented.
	plain := startPlugin(t, Config{})
	pc := dial(t, plain.Socket())
	id := createVolume(t, pc, "plain", 1<<20).GetVolumeId()
	_, err = pc.ctrl.ControllerGetVolumeHealth(ctx(t), &csi.ControllerGetVolumeHealthRequest{VolumeId: id})
	wantCode(t, err, codes.Unimplemented)
	_, err = pc.ctrl.ControllerListVolumeHealth(ctx(t), &csi.ControllerListVolumeHealthRequest{})
	wantCode(t, err, codes.Unimplemented)
	_, err = pc.node.NodeGetVolumeHealth(ctx(t), &csi.NodeGetVolumeHealthRequest{VolumeId: id})
	wantCode(t, err, codes.Unimplemented)
	_, err = pc.node.NodeGetStorageHealth(ctx(t), &csi.NodeGetStorageHealthRequest{})
	wantCode(t, err, codes.Unimplemented)
}

// healthEqual compares health entries by value.
func healthEqual(a, b []*csi.VolumeHealth_VolumeHealthEntry) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].GetStatus() != b[i].GetStatus() || a[i].GetReason() != b[i].GetReason() || a[i].GetMessage() != b[i].GetMessage() {
			return false
		}
	}
	return true
}

func TestVolumeMountGroup(t *testing.T) { inModes(t, testVolumeMountGroup) }

func testVolumeMountGroup(t *testing.T, mounts string) {
	staging, targetPath := nodePaths(t)
	p := startNodePlugin(t, mounts, Config{VolumeMountGroup: true})
	c := dial(t, p.Socket())
	caps, err := c.node.NodeGetCapabilities(ctx(t), &csi.NodeGetCapabilitiesRequest{})
	if err != nil || !hasNodeCap(caps, csi.NodeServiceCapability_RPC_VOLUME_MOUNT_GROUP) {
		t.Fatalf("node capabilities = %v, %v; want VOLUME_MOUNT_GROUP", caps, err)
	}
	id := createVolume(t, c, "grouped", 1<<20).GetVolumeId()
	withGroup := func(g string) *csi.VolumeCapability {
		return &csi.VolumeCapability{AccessMode: snw.GetAccessMode(),
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{VolumeMountGroup: g}}}
	}
	_, err = c.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: withGroup("staff")})
	wantCode(t, err, codes.InvalidArgument)

	for range 2 {
		if _, err := c.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: withGroup("4321")}); err != nil {
			t.Fatalf("stage with a mount group: %v", err)
		}
	}
	_, err = c.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: withGroup("4322")})
	wantCode(t, err, codes.AlreadyExists)
	if _, err := c.node.NodePublishVolume(ctx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: targetPath, VolumeCapability: withGroup("4321")}); err != nil {
		t.Fatalf("publish with a mount group: %v", err)
	}
	want := NodeVolume{StagingPath: staging, Targets: []string{targetPath}, MountGroup: "4321",
		TargetMountGroups: map[string]string{targetPath: "4321"}, CapacityBytes: 1 << 20}
	if got := p.NodeVolumes()[id]; !reflect.DeepEqual(got, want) {
		t.Fatalf("NodeVolumes = %+v, want %+v", got, want)
	}
	// Two stages (the repeat succeeds too) and a publish, each with its group.
	log := p.NodeLog()
	if len(log) != 3 || log[2].Method != "NodePublishVolume" ||
		slices.ContainsFunc(log, func(c NodeCall) bool { return c.MountGroup != "4321" }) {
		t.Fatalf("NodeLog = %+v, want stage, stage and publish with mount group 4321", log)
	}

	fi, err := os.Stat(p.st.dataPath(id))
	if err != nil {
		t.Fatal(err)
	}
	gid := fi.Sys().(*syscall.Stat_t).Gid
	if mounts == MountsBind {
		// The group owns the volume, may write it, and new files join it.
		if gid != 4321 || fi.Mode()&0o070 != 0o070 || fi.Mode()&os.ModeSetgid == 0 {
			t.Fatalf("volume directory: gid %d, mode %s; want gid 4321, group rwx and set-group-id", gid, fi.Mode())
		}
		if err := os.Mkdir(filepath.Join(targetPath, "new"), 0o755); err != nil {
			t.Fatal(err)
		}
		sub, err := os.Stat(filepath.Join(targetPath, "new"))
		if err != nil || sub.Sys().(*syscall.Stat_t).Gid != 4321 {
			t.Fatalf("directory made through the target: %v, %v; want group 4321", sub, err)
		}
	} else if gid == 4321 {
		t.Fatal("with markers the volume directory changed group; the group is only recorded")
	}

	// Without the capability a mount group is refused, naming the field.
	plain := startPlugin(t, Config{})
	pc := dial(t, plain.Socket())
	pid := createVolume(t, pc, "plain", 1<<20).GetVolumeId()
	ps, _ := nodePaths(t)
	_, err = pc.node.NodeStageVolume(ctx(t), &csi.NodeStageVolumeRequest{VolumeId: pid, StagingTargetPath: ps, VolumeCapability: withGroup("4321")})
	wantCode(t, err, codes.InvalidArgument)
	if !strings.Contains(err.Error(), "volume_mount_group") {
		t.Fatalf("error %q does not name volume_mount_group", err)
	}
}

// hasNodeCap reports whether caps hold node capability want.
func hasNodeCap(caps *csi.NodeGetCapabilitiesResponse, want csi.NodeServiceCapability_RPC_Type) bool {
	for _, c := range caps.GetCapabilities() {
		if c.GetRpc().GetType() == want {
			return true
		}
	}
	return false
}

// TestVolumeConditionsFile turns volumes abnormal and back through the
// conditions file, as a test or an operator does with a plugin process:
// every health call reads it again.
func TestVolumeConditionsFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "conditions")
	p := startPlugin(t, Config{ControllerCapabilities: SupportedControllerCapabilities, VolumeHealth: true, VolumeConditionsFile: file})
	c := dial(t, p.Socket())
	a, b := createVolume(t, c, "a", 1<<20).GetVolumeId(), createVolume(t, c, "b", 1<<20).GetVolumeId()
	health := func(id string) (ctrl, node []*csi.VolumeHealth_VolumeHealthEntry) {
		t.Helper()
		cr, err := c.ctrl.ControllerGetVolumeHealth(ctx(t), &csi.ControllerGetVolumeHealthRequest{VolumeId: id})
		if err != nil {
			t.Fatal(err)
		}
		nr, err := c.node.NodeGetVolumeHealth(ctx(t), &csi.NodeGetVolumeHealthRequest{VolumeId: id})
		if err != nil {
			t.Fatal(err)
		}
		return cr.GetVolumeHealth().GetHealthStatuses(), nr.GetVolumeHealth().GetHealthStatuses()
	}
	listed := func() []string {
		t.Helper()
		r, err := c.ctrl.ControllerListVolumeHealth(ctx(t), &csi.ControllerListVolumeHealthRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range r.GetEntries() {
			out = append(out, e.GetVolumeId())
		}
		return out
	}
	write := func(text string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	// No file: every volume is healthy.
	if ctrl, node := health(a); len(ctrl)+len(node) != 0 || len(listed()) != 0 {
		t.Fatalf("without a file: controller %v, node %v, listed %v", ctrl, node, listed())
	}
	write("# volumes in trouble\n\n" + a + "  disk is slow \nno-such-volume gone\n")
	want := []*csi.VolumeHealth_VolumeHealthEntry{{Status: csi.VolumeHealthErrorType_DEGRADED, Reason: ReasonAbnormal, Message: "disk is slow"}}
	if ctrl, node := health(a); !healthEqual(ctrl, want) || !healthEqual(node, want) {
		t.Fatalf("listed in the file: controller %v, node %v, want %v", ctrl, node, want)
	}
	if ctrl, node := health(b); len(ctrl)+len(node) != 0 {
		t.Fatalf("not in the file: controller %v, node %v", ctrl, node)
	}
	// Only existing volumes are listed, the unknown line is not.
	if got := listed(); !slices.Equal(got, []string{a}) {
		t.Fatalf("listed %v, want [%s]", got, a)
	}
	// A condition set in the plugin comes first, the file's after it.
	p.SetVolumeCondition(a, true, "set by the test")
	if ctrl, _ := health(a); len(ctrl) != 2 || ctrl[0].GetMessage() != "set by the test" || ctrl[1].GetMessage() != "disk is slow" {
		t.Fatalf("both conditions: %v", ctrl)
	}
	p.SetVolumeCondition(a, false, "")

	// A line without a message still marks the volume; removing the file
	// makes everything healthy again.
	write(b + "\n")
	if ctrl, _ := health(b); len(ctrl) != 1 || ctrl[0].GetMessage() != "" {
		t.Fatalf("a line without a message: %v", ctrl)
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if got := listed(); len(got) != 0 {
		t.Fatalf("listed after the file is gone: %v", got)
	}
}
