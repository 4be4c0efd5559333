package volreq

import (
	"strings"
	"testing"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// Every free-form string a request passes on is refused with a control
// character or invalid UTF-8, naming the field; Unicode letters pass.
func TestRequestText(t *testing.T) {
	const bell = "a\x07"
	segs := func(m map[string]string) []*csisupdv1.TopologySegment {
		return []*csisupdv1.TopologySegment{{Segments: map[string]string{"zone": "a"}}, {Segments: m}}
	}
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"create unicode", CreateVolume(&csisupdv1.VolumeCreateRequest{Id: "v", PluginId: "p", Name: "données-ü-日本",
			Parameters: map[string]string{"größe": "ß"}, Secrets: map[string]string{"schlüssel": "x"},
			AccessibilityRequirements: &csisupdv1.TopologyRequirement{Requisite: segs(map[string]string{"zone": "zürich"})}}), ""},
		{"create id", CreateVolume(&csisupdv1.VolumeCreateRequest{Id: bell}), `id: "a\a" contains the control character U+0007 (at byte 1)`},
		{"create plugin id", CreateVolume(&csisupdv1.VolumeCreateRequest{PluginId: "p\n"}), `plugin_id: "p\n" contains the control character U+000A`},
		{"create name escape", CreateVolume(&csisupdv1.VolumeCreateRequest{Name: "\x1b[2J"}), `name: "\x1b[2J" contains the control character U+001B`},
		{"create name C1", CreateVolume(&csisupdv1.VolumeCreateRequest{Name: "a\u009bb"}), `name: "a\u009bb" contains the control character U+009B`},
		{"create parameters key", CreateVolume(&csisupdv1.VolumeCreateRequest{Parameters: map[string]string{"ok": "1", bell: "b"}}),
			`parameters: key "a\a" contains the control character U+0007 (at byte 1)`},
		{"create parameters key not utf-8", CreateVolume(&csisupdv1.VolumeCreateRequest{Parameters: map[string]string{"k\xff": "b"}}),
			`parameters: key "k\xff" is not valid UTF-8 (at byte 1)`},
		{"create parameters first bad key", CreateVolume(&csisupdv1.VolumeCreateRequest{Parameters: map[string]string{"z\x01": "", "b\x02": "", "m\x03": ""}}),
			`parameters: key "b\x02"`},
		{"create parameter value may span lines", CreateVolume(&csisupdv1.VolumeCreateRequest{
			Parameters: map[string]string{"cert": "-----BEGIN\nAAAA\n-----END\n", "json": "{\t\"a\": 1}"}}), ""},
		{"create mutable parameters key", CreateVolume(&csisupdv1.VolumeCreateRequest{MutableParameters: map[string]string{"\r": "b"}}),
			`mutable_parameters: key "\r" contains`},
		{"create secrets key", CreateVolume(&csisupdv1.VolumeCreateRequest{Secrets: map[string]string{"tok\ten": "x"}}),
			`secrets: key "tok\ten" contains the control character U+0009`},
		{"create requisite key", CreateVolume(&csisupdv1.VolumeCreateRequest{AccessibilityRequirements: &csisupdv1.TopologyRequirement{
			Requisite: segs(map[string]string{bell: "r1"})}}), `accessibility_requirements.requisite[1].segments: key "a\a"`},
		{"create preferred value", CreateVolume(&csisupdv1.VolumeCreateRequest{AccessibilityRequirements: &csisupdv1.TopologyRequirement{
			Preferred: segs(map[string]string{"rack": "r1\x1b"})}}), `accessibility_requirements.preferred[1].segments: value of "rack": "r1\x1b" contains the control character U+001B`},
		{"create snapshot source", CreateVolume(&csisupdv1.VolumeCreateRequest{ContentSource: &csisupdv1.VolumeContentSource{
			Source: &csisupdv1.VolumeContentSource_SnapshotId{SnapshotId: bell}}}), `content_source.snapshot_id: "a\a"`},
		{"create volume source", CreateVolume(&csisupdv1.VolumeCreateRequest{ContentSource: &csisupdv1.VolumeContentSource{
			Source: &csisupdv1.VolumeContentSource_VolumeId{VolumeId: bell}}}), `content_source.volume_id: "a\a"`},
		{"register unicode", RegisterVolume(&csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{Id: "v", PluginId: "p",
			ExternalId: "vol-ü/日本", Context: map[string]string{"ключ": "line 1\nline 2"}}}), ""},
		{"register id", RegisterVolume(&csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{Id: bell}}), `volume.id: "a\a"`},
		{"register plugin id", RegisterVolume(&csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{PluginId: bell}}), `volume.plugin_id: "a\a"`},
		{"register external id", RegisterVolume(&csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{ExternalId: "x\x00"}}),
			`volume.external_id: "x\x00" contains the control character U+0000`},
		{"register controller", RegisterVolume(&csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{ControllerNodeId: bell}}),
			`volume.controller_node_id: "a\a"`},
		{"register parameters key", RegisterVolume(&csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{Parameters: map[string]string{bell: ""}}}),
			`volume.parameters: key "a\a"`},
		{"register mutable parameters key", RegisterVolume(&csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{MutableParameters: map[string]string{bell: ""}}}),
			`volume.mutable_parameters: key "a\a"`},
		{"register mutable parameters size", RegisterVolume(&csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{MutableParameters: entries(513)}}),
			`volume.mutable_parameters has 513 entries`},
		{"register context key", RegisterVolume(&csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{Context: map[string]string{bell: ""}}}),
			`volume.context: key "a\a"`},
		{"register topology value", RegisterVolume(&csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{
			AccessibleTopology: segs(map[string]string{"zone": bell})}}), `volume.accessible_topology[1].segments: value of "zone": "a\a"`},
		{"register content source", RegisterVolume(&csisupdv1.VolumeRegisterRequest{Volume: &csisupdv1.Volume{ContentSource: &csisupdv1.VolumeContentSource{
			Source: &csisupdv1.VolumeContentSource_SnapshotId{SnapshotId: bell}}}}), `volume.content_source.snapshot_id: "a\a"`},
		{"claim ok", ClaimVolume(&csisupdv1.VolumeClaimRequest{Id: "v", NodeId: "node-ä", WorkloadId: "w", Owner: "nomad"}), ""},
		{"claim id", ClaimVolume(&csisupdv1.VolumeClaimRequest{Id: bell}), `id: "a\a"`},
		{"claim node", ClaimVolume(&csisupdv1.VolumeClaimRequest{NodeId: bell}), `node_id: "a\a"`},
		{"claim workload", ClaimVolume(&csisupdv1.VolumeClaimRequest{WorkloadId: bell}), `workload_id: "a\a"`},
		{"claim owner", ClaimVolume(&csisupdv1.VolumeClaimRequest{Owner: bell}), `owner: "a\a"`},
		{"claim secrets key", ClaimVolume(&csisupdv1.VolumeClaimRequest{Secrets: map[string]string{bell: "x"}}), `secrets: key "a\a"`},
		{"claim create name", ClaimVolume(&csisupdv1.VolumeClaimRequest{Create: &csisupdv1.VolumeCreateRequest{Name: bell}}), `create: name: "a\a"`},
		{"check claim volume", CheckClaim(&csisupdv1.CheckClaimRequest{VolumeId: bell}), `volume_id: "a\a"`},
		{"check claim node", CheckClaim(&csisupdv1.CheckClaimRequest{NodeIds: []string{"n1", bell}}), `node_ids[1]: "a\a"`},
		{"check claim usage", CheckClaim(&csisupdv1.CheckClaimRequest{Usage: &csisupdv1.VolumeUsage{MountFlags: []string{"bind"}}}), `usage.mount_flags[0] "bind" is not allowed`},
		{"check claim ok", CheckClaim(&csisupdv1.CheckClaimRequest{VolumeId: "v", NodeIds: []string{"n1"}}), ""},
		{"release id", ReleaseVolume(&csisupdv1.VolumeReleaseRequest{Id: bell}), `id: "a\a"`},
		{"release node", ReleaseVolume(&csisupdv1.VolumeReleaseRequest{NodeId: bell}), `node_id: "a\a"`},
		{"release workload", ReleaseVolume(&csisupdv1.VolumeReleaseRequest{WorkloadId: bell}), `workload_id: "a\a"`},
		{"release secrets key", ReleaseVolume(&csisupdv1.VolumeReleaseRequest{Secrets: map[string]string{bell: "x"}}), `secrets: key "a\a"`},
		{"delete id", DeleteVolume(&csisupdv1.VolumeDeleteRequest{Id: bell}), `id: "a\a"`},
		{"delete secrets key", DeleteVolume(&csisupdv1.VolumeDeleteRequest{Secrets: map[string]string{bell: "x"}}), `secrets: key "a\a"`},
		{"expand id", ExpandClusterVolume(&csisupdv1.VolumeExpandRequest{Id: bell}), `id: "a\a"`},
		{"expand secrets key", ExpandClusterVolume(&csisupdv1.VolumeExpandRequest{Secrets: map[string]string{bell: "x"}}), `secrets: key "a\a"`},
		{"modify id", ModifyVolume(&csisupdv1.VolumeModifyRequest{Id: bell}), `id: "a\a"`},
		{"modify mutable parameters key", ModifyVolume(&csisupdv1.VolumeModifyRequest{MutableParameters: map[string]string{bell: ""}}),
			`mutable_parameters: key "a\a"`},
		{"modify secrets key", ModifyVolume(&csisupdv1.VolumeModifyRequest{Secrets: map[string]string{bell: "x"}}), `secrets: key "a\a"`},
		{"snapshot volume", CreateSnapshot(&csisupdv1.VolumeSnapshotCreateRequest{VolumeId: bell}), `volume_id: "a\a"`},
		{"snapshot id", CreateSnapshot(&csisupdv1.VolumeSnapshotCreateRequest{Id: bell}), `id: "a\a"`},
		{"snapshot parameters key", CreateSnapshot(&csisupdv1.VolumeSnapshotCreateRequest{Parameters: map[string]string{bell: ""}}), `parameters: key "a\a"`},
		{"snapshot secrets key", CreateSnapshot(&csisupdv1.VolumeSnapshotCreateRequest{Secrets: map[string]string{bell: "x"}}), `secrets: key "a\a"`},
		{"snapshot ok", CreateSnapshot(&csisupdv1.VolumeSnapshotCreateRequest{VolumeId: "v", Id: "снимок"}), ""},
		{"delete snapshot id", DeleteSnapshot(&csisupdv1.VolumeSnapshotDeleteRequest{Id: bell}), `id: "a\a"`},
		{"delete snapshot secrets key", DeleteSnapshot(&csisupdv1.VolumeSnapshotDeleteRequest{Secrets: map[string]string{bell: "x"}}), `secrets: key "a\a"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { wantErr(t, tt.err, tt.want) })
	}
}

// A secret's value is neither checked nor quoted: one that holds control
// characters passes, and a refused key's error does not hold its value.
func TestSecretValuesUnchecked(t *testing.T) {
	const value = "SECRET\x1b[2J\n-----BEGIN KEY-----"
	if err := CreateVolume(&csisupdv1.VolumeCreateRequest{Secrets: map[string]string{"key": value}}); err != nil {
		t.Fatalf("secret value with control characters: %v, want it passed", err)
	}
	err := ClaimVolume(&csisupdv1.VolumeClaimRequest{Secrets: map[string]string{"key\x07": value}})
	wantErr(t, err, `secrets: key "key\a"`)
	if strings.Contains(err.Error(), "SECRET") {
		t.Fatalf("error %q holds the secret's value", err)
	}
}
