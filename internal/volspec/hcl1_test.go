package volspec

import (
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// Volume files in each form Nomad's volume specification documentation
// uses, which HCL 1 reads and HCL 2 refuses, parse to the request they
// mean.
func TestParseHCL1Forms(t *testing.T) {
	mount := func(mode, fs string, flags ...string) *csisupdv1.VolumeCapability {
		return &csisupdv1.VolumeCapability{AccessType: "mount", AccessMode: mode, FsType: fs, MountFlags: flags}
	}
	seg := func(kv ...string) *csisupdv1.TopologySegment {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return &csisupdv1.TopologySegment{Segments: m}
	}
	tests := []struct {
		name string
		src  string
		want *csisupdv1.VolumeCreateRequest
	}{
		{
			name: "one-line topology blocks with quoted keys and commas",
			src: `id           = "pg_main"
namespace    = "default"
name         = "database"
type         = "csi"
plugin_id    = "disks"
snapshot_id  = "snap-0042" # or clone_id
capacity_min = "10GiB"
capacity_max = "40G"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}

capability {
  access_mode     = "multi-node-reader-only"
  attachment_mode = "block-device"
}

mount_options {
  fs_type     = "xfs"
  mount_flags = ["noatime", "discard"]
}

topology_request {
  required {
    topology { segments { "row" = "B7" } }
    topology { segments { "row" = "B8", "dc" = "west-2"} }
  }
  preferred {
    topology { segments { "row" = "B8", "dc" = "west-2"} }
  }
}

secrets {
  vault_token = "hunter2"
}

parameters {
  tier = "gold"
}
`,
			want: &csisupdv1.VolumeCreateRequest{
				Id: "pg_main", Name: "database", PluginId: "disks", CapacityMinBytes: 10 << 30, CapacityMaxBytes: 40e9,
				Capabilities: []*csisupdv1.VolumeCapability{
					mount("SINGLE_NODE_WRITER", "xfs", "noatime", "discard"),
					{AccessType: "block", AccessMode: "MULTI_NODE_READER_ONLY"},
				},
				Parameters: map[string]string{"tier": "gold"},
				Secrets:    map[string]string{"vault_token": "hunter2"},
				AccessibilityRequirements: &csisupdv1.TopologyRequirement{
					Requisite: []*csisupdv1.TopologySegment{seg("row", "B7"), seg("row", "B8", "dc", "west-2")},
					Preferred: []*csisupdv1.TopologySegment{seg("row", "B8", "dc", "west-2")},
				},
				ContentSource: &csisupdv1.VolumeContentSource{Source: &csisupdv1.VolumeContentSource_SnapshotId{SnapshotId: "snap-0042"}},
			},
		},
		{
			name: "one-line topology blocks with bare keys",
			src: `id = "scratch"
plugin_id = "disks"
clone_id = "golden"
topology_request {
  required {
    topology { segments { shelf = "3" } }
    topology { segments { shelf = "4", site = "lab"} }
  }
}
`,
			want: &csisupdv1.VolumeCreateRequest{
				Id: "scratch", PluginId: "disks",
				Capabilities: []*csisupdv1.VolumeCapability{mount("SINGLE_NODE_WRITER", "")},
				AccessibilityRequirements: &csisupdv1.TopologyRequirement{
					Requisite: []*csisupdv1.TopologySegment{seg("shelf", "3"), seg("shelf", "4", "site", "lab")},
				},
				ContentSource: &csisupdv1.VolumeContentSource{Source: &csisupdv1.VolumeContentSource_VolumeId{VolumeId: "golden"}},
			},
		},
		{
			name: "every block on one line, attributes with and without commas",
			src: `id = "logs"
plugin_id = "nfs"
capability { access_mode = "multi-node-multi-writer", attachment_mode = "file-system" }
mount_options { fs_type = "ext4" mount_flags = ["noatime"] }
parameters { "csi.storage.k8s.io/fstype" = "ext4", replicas = 3, thin = true }
secrets { "api-key" = "k3y" }
topology_request { required { topology { segments { zone = "a" } } } }
`,
			want: &csisupdv1.VolumeCreateRequest{
				Id: "logs", PluginId: "nfs",
				Capabilities: []*csisupdv1.VolumeCapability{mount("MULTI_NODE_MULTI_WRITER", "ext4", "noatime")},
				Parameters:   map[string]string{"csi.storage.k8s.io/fstype": "ext4", "replicas": "3", "thin": "true"},
				Secrets:      map[string]string{"api-key": "k3y"},
				AccessibilityRequirements: &csisupdv1.TopologyRequirement{
					Requisite: []*csisupdv1.TopologySegment{seg("zone", "a")},
				},
			},
		},
		{
			name: "arguments ended by commas over several lines",
			src: `id = "web"
plugin_id = "nfs"
parameters {
  server = "10.0.0.9",
  share  = "/web",
}
topology_request {
  required {
    topology {
      segments {
        zone = "a",
        rack = "R3"
      }
    }
  }
}
`,
			want: &csisupdv1.VolumeCreateRequest{
				Id: "web", PluginId: "nfs",
				Capabilities: []*csisupdv1.VolumeCapability{mount("SINGLE_NODE_WRITER", "")},
				Parameters:   map[string]string{"server": "10.0.0.9", "share": "/web"},
				AccessibilityRequirements: &csisupdv1.TopologyRequirement{
					Requisite: []*csisupdv1.TopologySegment{seg("zone", "a", "rack", "R3")},
				},
			},
		},
		{
			name: "quoted keys over several lines, object arguments, heredoc",
			src: `"id" = "cache"
plugin_id = "disks"
mutable_parameters = { "qos.example.com/iops" = "3000" }
parameters {
  "csi.storage.k8s.io/fstype" = "xfs"
  note = <<EOT
made by hand
EOT
}
capability { access_mode = "single-node-single-writer", attachment_mode = "block-device" }
`,
			want: &csisupdv1.VolumeCreateRequest{
				Id: "cache", PluginId: "disks",
				Capabilities:      []*csisupdv1.VolumeCapability{{AccessType: "block", AccessMode: "SINGLE_NODE_SINGLE_WRITER"}},
				Parameters:        map[string]string{"csi.storage.k8s.io/fstype": "xfs", "note": "made by hand\n"},
				MutableParameters: map[string]string{"qos.example.com/iops": "3000"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, diags := hclsyntax.ParseConfig([]byte(tt.src), "volume.hcl", hcl.InitialPos); !diags.HasErrors() {
				t.Fatal("HCL 2 reads the file: it does not test HCL 1's forms")
			}
			s, err := Parse("volume.hcl", []byte(tt.src))
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.CreateRequest()
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(tt.want, got) {
				t.Errorf("CreateRequest\n%s\nwant\n%s", prototext.Format(got), prototext.Format(tt.want))
			}
		})
	}
}

// A register file in Nomad's forms, with a one-line context block and an
// empty one, parses to the volume it records.
func TestParseHCL1Register(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want *csisupdv1.Volume
	}{
		{
			name: "one-line context",
			src: `id = "share"
name = "Team share"
plugin_id = "nfs"
external_id = "srv1:/export/share"
capacity_min = "1GiB"
capability { access_mode = "multi-node-multi-writer", attachment_mode = "file-system" }
topology_request { required { topology { segments { "zone" = "a" } } } }
context { server = "10.1.2.3", share = "/export/share" }
`,
			want: &csisupdv1.Volume{
				Id: "share", PluginId: "nfs", ExternalId: "srv1:/export/share", CapacityBytes: 1 << 30,
				Capabilities:       []*csisupdv1.VolumeCapability{{AccessType: "mount", AccessMode: "MULTI_NODE_MULTI_WRITER"}},
				AccessibleTopology: []*csisupdv1.TopologySegment{{Segments: map[string]string{"zone": "a"}}},
				Context:            map[string]string{"server": "10.1.2.3", "share": "/export/share"},
			},
		},
		{
			name: "empty context",
			src: `id = "old"
plugin_id = "nfs"
external_id = "vol-9"
context {}
parameters { "a.b/c" = "d", e = "f" }
`,
			want: &csisupdv1.Volume{
				Id: "old", PluginId: "nfs", ExternalId: "vol-9",
				Capabilities: []*csisupdv1.VolumeCapability{{AccessType: "mount", AccessMode: "SINGLE_NODE_WRITER"}},
				Parameters:   map[string]string{"a.b/c": "d", "e": "f"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse("register.hcl", []byte(tt.src))
			if err != nil {
				t.Fatal(err)
			}
			got, err := s.Volume()
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(tt.want, got) {
				t.Errorf("Volume\n%s\nwant\n%s", prototext.Format(got), prototext.Format(tt.want))
			}
		})
	}
}

// A file HCL 1 reads keeps the checks of an HCL 2 file: the same
// problems, each with its file:line and "did you mean"; a file that
// neither reads gets the syntax error of the syntax it is written in.
func TestParseHCL1Errors(t *testing.T) {
	// oneLine makes a file HCL 2 refuses, so that the rest is read as
	// HCL 1.
	const oneLine = "topology_request { required { topology { segments { rack = \"R1\", zone = \"a\" } } } }\n"
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{
			name: "unknown keys with suggestions",
			src:  oneLine + "plugin_ids = \"p\"\ncapability { access_mode = \"single-node-writer\", attachment_mod = \"file-system\" }\n",
			want: []string{
				`v.hcl:2: unsupported argument "plugin_ids"; did you mean "plugin_id"?`,
				`v.hcl:3: capability: attachment_mode is not set (file-system or block-device)`,
				`v.hcl:3: unsupported argument "attachment_mod" in block capability; did you mean "attachment_mode"?`,
			},
		},
		{
			name: "misspelt segments",
			src:  "topology_request {\n  required {\n    topology { segmnets { rack = \"R1\", zone = \"a\" } }\n  }\n}\n",
			want: []string{
				`v.hcl:3: topology_request.required.topology: segments is not set (write segments = { zone = "z1" })`,
				`v.hcl:3: unsupported block "segmnets" in block topology_request.required.topology; did you mean "segments"?`,
			},
		},
		{
			name: "bad values",
			src:  oneLine + "capacity_min = \"10 gigs\"\ntype = \"host\"\nid = \"a\"\nid = \"b\"\nmount_options { mount_flags = \"noatime\" }\n",
			want: []string{
				`v.hcl:2: capacity_min: "10 gigs" is not a size (examples: 1GiB, 500MB, 4096)`,
				`v.hcl:3: type "host": csisupd manages CSI volumes only; type must be "csi"`,
				`v.hcl:5: duplicate id (first at line 4): set it once`,
				`v.hcl:6: mount_options.mount_flags: expected a list of strings, got string "noatime"`,
			},
		},
		{
			name: "duplicate blocks and keys",
			src:  oneLine + "parameters { a = \"1\", a = \"2\" }\nsecrets { k = \"v\" }\nsecrets = { k = \"v\", k = \"w\" }\n",
			want: []string{
				`v.hcl:2: duplicate a (first at line 2): set it once`,
				`v.hcl:4: secrets: duplicate key "k" (first at line 4)`,
			},
		},
		{
			name: "syntax error in an HCL 1 file",
			src:  oneLine + "parameters {\n  tier = \"gold\"\n",
			want: []string{`v.hcl:4: object expected closing RBRACE got: EOF`},
		},
		{
			name: "bare word in an HCL 1 file",
			src:  oneLine + "plugin_id = disks\n",
			want: []string{`v.hcl:2: Unknown token: IDENT disks`},
		},
		{
			name: "syntax error in an HCL 2 file",
			src:  "id = \"v\"\nplugin_id = \n",
			want: []string{`v.hcl:2: Invalid expression: Expected the start of an expression, but found an invalid expression token`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse("v.hcl", []byte(tt.src))
			if err == nil {
				t.Fatalf("Parse accepted it: %+v", s)
			}
			got := strings.Split(err.Error(), "\n")
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("errors\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
			}
		})
	}
}

// A file's name is the CSI name of the create when it differs from the id,
// and the id when there is no id.
func TestNameAndID(t *testing.T) {
	tests := []struct {
		name, src        string
		wantID, wantName string
	}{
		{"id only", `id = "db1"`, "db1", ""},
		{"name only", `name = "db1"`, "db1", ""},
		{"name equal to id", "id = \"db1\"\nname = \"db1\"", "db1", ""},
		{"name apart from id", "id = \"db1\"\nname = \"Orders database\"", "db1", "Orders database"},
		{"name apart from id, HCL 1", "name = \"orders\"\nid = \"db1\"\nparameters { \"a.b/c\" = \"d\" }", "db1", "orders"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse("v.hcl", []byte(tt.src+"\nplugin_id = \"p\"\n"))
			if err != nil {
				t.Fatal(err)
			}
			req, err := s.CreateRequest()
			if err != nil {
				t.Fatal(err)
			}
			if s.ID != tt.wantID || req.GetId() != tt.wantID || req.GetName() != tt.wantName {
				t.Errorf("spec id %q, request id %q and name %q; want id %q, name %q", s.ID, req.GetId(), req.GetName(), tt.wantID, tt.wantName)
			}
		})
	}
}
