package volreq

import (
	"fmt"
	"strings"
	"testing"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// entries returns a map of n entries.
func entries(n int) map[string]string {
	m := make(map[string]string, n)
	for i := range n {
		m[fmt.Sprintf("k%d", i)] = "v"
	}
	return m
}

func TestMapsAndSecrets(t *testing.T) {
	const secret = "s3cr3t-value"
	bigSecret := map[string]string{"cert": secret + strings.Repeat("x", MaxSecretsBytes)}
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"empty", Map("parameters", nil), ""},
		{"most entries", Map("parameters", entries(MaxMapEntries)), ""},
		{"10000 entries", Map("parameters", entries(10000)), `parameters has 10000 entries, more than the 512 allowed`},
		{"too many bytes", Map("context", map[string]string{"k": strings.Repeat("v", MaxMapBytes)}), `context holds 262145 bytes of keys and values, more than the 262144 allowed`},
		{"most bytes", Map("context", map[string]string{"k": strings.Repeat("v", MaxMapBytes-1)}), ""},
		{"secrets may be larger", Secrets("secrets", map[string]string{"k": strings.Repeat("v", MaxMapBytes)}), ""},
		{"secrets too large", Secrets("secrets", bigSecret), `secrets holds`},
		{"secrets too many", Secrets("secrets", entries(MaxMapEntries+1)), `secrets has 513 entries`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantErr(t, tt.err, tt.want)
			if tt.err != nil && strings.Contains(tt.err.Error(), secret) {
				t.Errorf("error %q holds a secret value", tt.err)
			}
		})
	}
}

func TestCapacity(t *testing.T) {
	tests := []struct {
		name     string
		min, max int64
		want     string
	}{
		{"unset", 0, 0, ""},
		{"min only", 1 << 30, 0, ""},
		{"max only", 0, 1 << 30, ""},
		{"equal", 1 << 30, 1 << 30, ""},
		{"negative min", -5, 0, `capacity_min_bytes -5 is negative`},
		{"negative max", 0, -1, `capacity_max_bytes -1 is negative`},
		{"max below min", 2 << 30, 1 << 30, `capacity_max_bytes 1073741824 is below capacity_min_bytes 2147483648`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantErr(t, Capacity("capacity_min_bytes", tt.min, "capacity_max_bytes", tt.max), tt.want)
		})
	}
}

// Each request checks every field it carries, naming it.
func TestRequests(t *testing.T) {
	flags := func(f ...string) *csisupdv1.VolumeUsage { return &csisupdv1.VolumeUsage{MountFlags: f} }
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"create ok", CreateVolume(&csisupdv1.VolumeCreateRequest{Id: "v", CapacityMinBytes: 1 << 30,
			Capabilities: []*csisupdv1.VolumeCapability{{FsType: "ext4", MountFlags: []string{"noatime", "suid"}}}}), ""},
		{"create name", CreateVolume(&csisupdv1.VolumeCreateRequest{Id: "v", Name: "database"}), ""},
		{"create name control", CreateVolume(&csisupdv1.VolumeCreateRequest{Id: "v", Name: "data\x1b[2Jbase"}), `name: "data\x1b[2Jbase" contains the control character U+001B (at byte 4)`},
		{"create name long", CreateVolume(&csisupdv1.VolumeCreateRequest{Id: "v", Name: strings.Repeat("n", MaxNameBytes+1)}), `name is 129 bytes, more than the 128 allowed`},
		{"create name most", CreateVolume(&csisupdv1.VolumeCreateRequest{Id: "v", Name: strings.Repeat("n", MaxNameBytes)}), ""},
		{"create name not utf-8", CreateVolume(&csisupdv1.VolumeCreateRequest{Id: "v", Name: "db\xff"}), `name: "db\xff" is not valid UTF-8 (at byte 2)`},
		{"create capacity", CreateVolume(&csisupdv1.VolumeCreateRequest{CapacityMinBytes: -5}), `capacity_min_bytes -5 is negative`},
		{"create capability flag", CreateVolume(&csisupdv1.VolumeCreateRequest{
			Capabilities: []*csisupdv1.VolumeCapability{{MountFlags: []string{"bind"}}}}), `capabilities[0].mount_flags[0] "bind"`},
		{"create parameters", CreateVolume(&csisupdv1.VolumeCreateRequest{Parameters: entries(10000)}), `parameters has 10000 entries`},
		{"create secrets", CreateVolume(&csisupdv1.VolumeCreateRequest{Secrets: entries(600)}), `secrets has 600 entries`},
		{"register capacity", RegisterVolume(&csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{CapacityBytes: -1}}), `volume.capacity_bytes -1 is negative`},
		{"register fs type", RegisterVolume(&csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{
			Capabilities: []*csisupdv1.VolumeCapability{{FsType: "../../x"}}}}), `volume.capabilities[0].fs_type "../../x"`},
		{"register parameters", RegisterVolume(&csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{Parameters: entries(10000)}}), `volume.parameters has 10000 entries`},
		{"register context", RegisterVolume(&csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{Context: entries(513)}}), `volume.context has 513 entries`},
		{"register topology", RegisterVolume(&csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{
			AccessibleTopology: []*csisupdv1.TopologySegment{{Segments: map[string]string{"zone": "a"}}, {Segments: entries(513)}}}}),
			`volume.accessible_topology[1].segments has 513 entries`},
		{"register topology count", RegisterVolume(&csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{
			AccessibleTopology: make([]*csisupdv1.TopologySegment, MaxTopologySegments+1)}}), `has 513 segments`},
		{"register nil", RegisterVolume(&csisupdv1.VolumeRegisterRequest{}), ""},
		{"claim suid passes", ClaimVolume(&csisupdv1.VolumeClaimRequest{Usage: flags("suid", "dev", "uid=1000")}), ""},
		{"claim comma", ClaimVolume(&csisupdv1.VolumeClaimRequest{Usage: flags(",suid")}), `usage.mount_flags[0] ",suid" holds a comma`},
		{"claim remount", ClaimVolume(&csisupdv1.VolumeClaimRequest{Usage: flags("remount")}), `usage.mount_flags[0] "remount" is not allowed`},
		{"claim fs type", ClaimVolume(&csisupdv1.VolumeClaimRequest{Usage: &csisupdv1.VolumeUsage{FsType: "../../x"}}), `usage.fs_type "../../x"`},
		{"claim secrets", ClaimVolume(&csisupdv1.VolumeClaimRequest{Secrets: entries(513)}), `secrets has 513 entries`},
		{"release secrets", ReleaseVolume(&csisupdv1.VolumeReleaseRequest{Secrets: entries(513)}), `secrets has 513 entries`},
		{"delete secrets", DeleteVolume(&csisupdv1.VolumeDeleteRequest{Secrets: entries(513)}), `secrets has 513 entries`},
		{"mount suid refused", MountVolume(&csisupdv1.MountVolumeRequest{Usage: flags("suid")}, nil), `"suid" is not allowed on this node`},
		{"mount suid allowed", MountVolume(&csisupdv1.MountVolumeRequest{Usage: flags("suid")}, []string{FlagSuid}), ""},
		{"mount bind", MountVolume(&csisupdv1.MountVolumeRequest{Usage: flags("bind")}, []string{FlagSuid, FlagDev}), `"bind" is not allowed`},
		{"mount volume context", MountVolume(&csisupdv1.MountVolumeRequest{VolumeContext: entries(513)}, nil), `volume_context has 513 entries`},
		{"mount publish context", MountVolume(&csisupdv1.MountVolumeRequest{PublishContext: entries(513)}, nil), `publish_context has 513 entries`},
		{"mount secrets", MountVolume(&csisupdv1.MountVolumeRequest{Secrets: entries(513)}, nil), `secrets has 513 entries`},
		{"expand negative", ExpandVolume(&csisupdv1.ExpandVolumeRequest{RequiredBytes: -5}), `required_bytes -5 is negative`},
		{"expand limit below", ExpandVolume(&csisupdv1.ExpandVolumeRequest{RequiredBytes: 10, LimitBytes: 5}), `limit_bytes 5 is below required_bytes 10`},
		{"expand secrets", ExpandVolume(&csisupdv1.ExpandVolumeRequest{Secrets: entries(513)}), `secrets has 513 entries`},
		{"expand ok", ExpandVolume(&csisupdv1.ExpandVolumeRequest{RequiredBytes: 10}), ""},
		{"claim mount group", ClaimVolume(&csisupdv1.VolumeClaimRequest{Usage: &csisupdv1.VolumeUsage{VolumeMountGroup: "2000"}}), ""},
		{"claim create checked as a create", ClaimVolume(&csisupdv1.VolumeClaimRequest{Create: &csisupdv1.VolumeCreateRequest{
			CapacityMinBytes: 10, CapacityMaxBytes: 5}}), `create: capacity_max_bytes 5 is below capacity_min_bytes 10`},
		{"claim create parameters", ClaimVolume(&csisupdv1.VolumeClaimRequest{Create: &csisupdv1.VolumeCreateRequest{Parameters: entries(10000)}}),
			`create: parameters has 10000 entries`},
		{"claim create ok", ClaimVolume(&csisupdv1.VolumeClaimRequest{Create: &csisupdv1.VolumeCreateRequest{PluginId: "p"}}), ""},
		{"claim bad mount group", ClaimVolume(&csisupdv1.VolumeClaimRequest{Usage: &csisupdv1.VolumeUsage{VolumeMountGroup: "-1"}}), `usage.volume_mount_group "-1" is not a group id`},
		{"mount bad mount group", MountVolume(&csisupdv1.MountVolumeRequest{Usage: &csisupdv1.VolumeUsage{VolumeMountGroup: "99999999999"}}, nil), `usage.volume_mount_group "99999999999"`},
		{"mount block mount group", MountVolume(&csisupdv1.MountVolumeRequest{Usage: &csisupdv1.VolumeUsage{AccessType: "block", VolumeMountGroup: "5"}}, nil), `applies to access_type mount only`},
		{"storage health secrets", StorageHealth(&csisupdv1.StorageHealthRequest{Secrets: entries(513)}), `secrets has 513 entries`},
		{"storage health ok", StorageHealth(&csisupdv1.StorageHealthRequest{PluginId: "p"}), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { wantErr(t, tt.err, tt.want) })
	}
}
