package dockerplugin_test

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// defaultCap is the capability of a Create without access options.
func defaultCap() *csisupdv1.VolumeCapability {
	return &csisupdv1.VolumeCapability{AccessType: "mount", AccessMode: "SINGLE_NODE_WRITER"}
}

// TestCreateOptions checks every Create option: what reaches
// CreateVolume, or the Err of a refused one (and then no CreateVolume).
func TestCreateOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts map[string]string
		// want is the request sent; its id is v1 and plugin testplugin
		// unless set.
		want *csisupdv1.VolumeCreateRequest
		// errs are what the Err must contain, when refused.
		errs []string
	}{
		{name: "none", want: &csisupdv1.VolumeCreateRequest{Capabilities: []*csisupdv1.VolumeCapability{defaultCap()}}},
		{name: "plugin", opts: map[string]string{"plugin": "ebs"},
			want: &csisupdv1.VolumeCreateRequest{PluginId: "ebs", Capabilities: []*csisupdv1.VolumeCapability{defaultCap()}}},
		{name: "bad plugin", opts: map[string]string{"plugin": "../x"}, errs: []string{`plugin "../x" is not a plugin id`}},
		{name: "size binary", opts: map[string]string{"size": "16MiB"},
			want: &csisupdv1.VolumeCreateRequest{CapacityMinBytes: 16 << 20, Capabilities: []*csisupdv1.VolumeCapability{defaultCap()}}},
		{name: "size decimal", opts: map[string]string{"size": "10G"},
			want: &csisupdv1.VolumeCreateRequest{CapacityMinBytes: 10e9, Capabilities: []*csisupdv1.VolumeCapability{defaultCap()}}},
		{name: "size bare bytes", opts: map[string]string{"size": "1048576"},
			want: &csisupdv1.VolumeCreateRequest{CapacityMinBytes: 1 << 20, Capabilities: []*csisupdv1.VolumeCapability{defaultCap()}}},
		{name: "podman's timeout, ignored", opts: map[string]string{"timeout": "120", "size": "16MiB"},
			want: &csisupdv1.VolumeCreateRequest{CapacityMinBytes: 16 << 20, Capabilities: []*csisupdv1.VolumeCapability{defaultCap()}}},
		{name: "size without unit", opts: map[string]string{"size": "10"}, errs: []string{"less than 1 MiB", "give a unit"}},
		{name: "size not a size", opts: map[string]string{"size": "big"}, errs: []string{"size:", "is not a size"}},
		{name: "access mode", opts: map[string]string{"access_mode": "Multi_Node-Multi_Writer"},
			want: &csisupdv1.VolumeCreateRequest{Capabilities: []*csisupdv1.VolumeCapability{{AccessType: "mount", AccessMode: "MULTI_NODE_MULTI_WRITER"}}}},
		{name: "access mode CSI name", opts: map[string]string{"access_mode": "SINGLE_NODE_READER_ONLY"},
			want: &csisupdv1.VolumeCreateRequest{Capabilities: []*csisupdv1.VolumeCapability{{AccessType: "mount", AccessMode: "SINGLE_NODE_READER_ONLY"}}}},
		{name: "bad access mode", opts: map[string]string{"access_mode": "everyone"}, errs: []string{`access_mode "everyone"`, "single-node-writer"}},
		{name: "block", opts: map[string]string{"access_type": "block"},
			want: &csisupdv1.VolumeCreateRequest{Capabilities: []*csisupdv1.VolumeCapability{{AccessType: "block", AccessMode: "SINGLE_NODE_WRITER"}}}},
		{name: "Nomad's block-device", opts: map[string]string{"access_type": "block-device"},
			want: &csisupdv1.VolumeCreateRequest{Capabilities: []*csisupdv1.VolumeCapability{{AccessType: "block", AccessMode: "SINGLE_NODE_WRITER"}}}},
		{name: "bad access type", opts: map[string]string{"access_type": "file"}, errs: []string{`access_type "file": must be mount or block`}},
		{name: "fs type and mount flags", opts: map[string]string{"fs_type": "ext4", "mount_flags": "noatime, nodiratime,"},
			want: &csisupdv1.VolumeCreateRequest{Capabilities: []*csisupdv1.VolumeCapability{{
				AccessType: "mount", AccessMode: "SINGLE_NODE_WRITER", FsType: "ext4", MountFlags: []string{"noatime", "nodiratime"}}}}},
		{name: "mount options on block", opts: map[string]string{"access_type": "block", "fs_type": "ext4"}, errs: []string{"fs_type: apply to access_type mount only"}},
		{name: "refused mount flag", opts: map[string]string{"mount_flags": "bind"}, errs: []string{"bind"}},
		{name: "topology", opts: map[string]string{"topology": "zone=a,rack=r1; zone=b"},
			want: &csisupdv1.VolumeCreateRequest{Capabilities: []*csisupdv1.VolumeCapability{defaultCap()},
				AccessibilityRequirements: &csisupdv1.TopologyRequirement{Requisite: []*csisupdv1.TopologySegment{
					{Segments: map[string]string{"zone": "a", "rack": "r1"}}, {Segments: map[string]string{"zone": "b"}}}}}},
		{name: "bad topology", opts: map[string]string{"topology": "zone"}, errs: []string{`"zone" is not K=V`}},
		{name: "topology key twice", opts: map[string]string{"topology": "zone=a,zone=b"}, errs: []string{`key "zone" given twice`}},
		{name: "snapshot", opts: map[string]string{"snapshot": "snap1"},
			want: &csisupdv1.VolumeCreateRequest{Capabilities: []*csisupdv1.VolumeCapability{defaultCap()},
				ContentSource: &csisupdv1.VolumeContentSource{Source: &csisupdv1.VolumeContentSource_SnapshotId{SnapshotId: "snap1"}}}},
		{name: "clone", opts: map[string]string{"clone": "v0"},
			want: &csisupdv1.VolumeCreateRequest{Capabilities: []*csisupdv1.VolumeCapability{defaultCap()},
				ContentSource: &csisupdv1.VolumeContentSource{Source: &csisupdv1.VolumeContentSource_VolumeId{VolumeId: "v0"}}}},
		{name: "snapshot and clone", opts: map[string]string{"snapshot": "s", "clone": "v0"}, errs: []string{"not both"}},
		{name: "parameters", opts: map[string]string{"parameter.type": "gp3", "parameter.iops": "3000"},
			want: &csisupdv1.VolumeCreateRequest{Capabilities: []*csisupdv1.VolumeCapability{defaultCap()},
				Parameters: map[string]string{"type": "gp3", "iops": "3000"}}},
		{name: "parameter without key", opts: map[string]string{"parameter.": "x"}, errs: []string{"key is missing"}},
		{name: "secret", opts: map[string]string{"secret.password": "hunter2"}, errs: []string{"secret.password", "secrets file", "secrets_file"}},
		{name: "unknown", opts: map[string]string{"sise": "1G"}, errs: []string{`unknown option "sise"`, "plugin, size", "parameter.<key>"}},
		{name: "every problem", opts: map[string]string{"sise": "1G", "access_type": "disk"}, errs: []string{`"sise"`, `"disk"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc := newFakeCluster(nodeID)
			c := startServer(t, testConfig(t, fc))
			req := createReq{Name: "v1", Opts: tc.opts}
			if tc.want == nil {
				e := c.fails("/VolumeDriver.Create", req)
				for _, s := range tc.errs {
					if !strings.Contains(e, s) {
						t.Errorf("Err %q does not contain %q", e, s)
					}
				}
				if strings.Contains(e, "hunter2") {
					t.Errorf("Err %q carries a secret's value", e)
				}
				if got := fc.created(); len(got) != 0 {
					t.Fatalf("refused options reached CreateVolume: %v", got)
				}
				return
			}
			c.ok("/VolumeDriver.Create", req, nil)
			want := proto.Clone(tc.want).(*csisupdv1.VolumeCreateRequest)
			want.Id = "v1"
			if want.PluginId == "" {
				want.PluginId = "testplugin"
			}
			got := fc.created()
			if len(got) != 1 {
				t.Fatalf("CreateVolume requests: %v, want one", got)
			}
			if !proto.Equal(want, got[0]) {
				t.Fatalf("CreateVolume request:\n%s\nwant:\n%s", prototext.Format(got[0]), prototext.Format(want))
			}
		})
	}
}
