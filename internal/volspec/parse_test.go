package volspec

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
)

// nomadSpec is a create specification as a Nomad operator writes it, with
// every create key, in HCL 2.
const nomadSpec = `id        = "ebs_prod_db1"
namespace = "default"
name      = "ebs_prod_db1"
type      = "csi"
plugin_id = "ebs-prod"
snapshot_id = "snap-12345"
capacity_max = "200G"
capacity_min = "100G"

capability {
  access_mode     = "single-node-reader-only"
  attachment_mode = "file-system"
}

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}

capability {
  access_mode     = "multi-node-multi-writer"
  attachment_mode = "block-device"
}

mount_options {
  fs_type     = "ext4"
  mount_flags = ["noatime", "nodiratime"]
}

topology_request {
  required {
    topology {
      segments {
        rack = "R2"
      }
    }
    topology {
      segments {
        rack = "R1"
        zone = "us-east-1a"
      }
    }
  }
  preferred {
    topology { segments = { "rack" = "R1", zone = "us-east-1a" } }
  }
}

secrets {
  example_secret = "xyzzy"
}

parameters {
  skuname = "Premium_LRS"
}
parameters_extra_is_not_here = null
`

// The full spec maps field by field onto the CreateVolume request.
func TestParseNomadSpec(t *testing.T) {
	src := strings.Replace(nomadSpec, "parameters_extra_is_not_here = null\n", "", 1)
	s, err := Parse("volume.hcl", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.CreateRequest()
	if err != nil {
		t.Fatal(err)
	}
	mount := func(mode string) *csisupdv1.VolumeCapability {
		return &csisupdv1.VolumeCapability{AccessType: "mount", AccessMode: mode, FsType: "ext4", MountFlags: []string{"noatime", "nodiratime"}}
	}
	want := &csisupdv1.VolumeCreateRequest{
		Id:               "ebs_prod_db1",
		PluginId:         "ebs-prod",
		CapacityMinBytes: 100e9,
		CapacityMaxBytes: 200e9,
		Capabilities: []*csisupdv1.VolumeCapability{
			mount("SINGLE_NODE_READER_ONLY"),
			mount("SINGLE_NODE_WRITER"),
			// A block capability carries no mount options.
			{AccessType: "block", AccessMode: "MULTI_NODE_MULTI_WRITER"},
		},
		Parameters: map[string]string{"skuname": "Premium_LRS"},
		Secrets:    map[string]string{"example_secret": "xyzzy"},
		AccessibilityRequirements: &csisupdv1.TopologyRequirement{
			Requisite: []*csisupdv1.TopologySegment{
				{Segments: map[string]string{"rack": "R2"}},
				{Segments: map[string]string{"rack": "R1", "zone": "us-east-1a"}},
			},
			Preferred: []*csisupdv1.TopologySegment{
				{Segments: map[string]string{"rack": "R1", "zone": "us-east-1a"}},
			},
		},
		ContentSource: &csisupdv1.VolumeContentSource{Source: &csisupdv1.VolumeContentSource_SnapshotId{SnapshotId: "snap-12345"}},
	}
	if !proto.Equal(want, got) {
		t.Errorf("CreateRequest\n%s\nwant\n%s", prototext.Format(got), prototext.Format(want))
	}
	// The request owns its maps: changing the spec afterwards leaves it.
	s.Parameters["skuname"] = "changed"
	s.Secrets["example_secret"] = "changed"
	if got.GetParameters()["skuname"] != "Premium_LRS" || got.GetSecrets()["example_secret"] != "xyzzy" {
		t.Errorf("the request shares the spec's maps: %v", got)
	}
}

// A register spec maps onto the Volume RegisterVolume records.
func TestVolume(t *testing.T) {
	src := `name = "web"
plugin_id = "nfs"
external_id = "srv:/export/web"
capacity_min = "1GiB"
capacity_max = "2GiB"
capability {
  access_mode     = "multi-node-multi-writer"
  attachment_mode = "file-system"
}
mount_options { mount_flags = ["vers=4.1"] }
topology_request {
  required {
    topology { segments = { zone = "a" } }
  }
}
context = { "server" = "10.0.0.1", "share" = "/export/web" }
parameters { tier = 3 }
mutable_parameters { qos = "gold" }
`
	s, err := Parse("register.hcl", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Volume()
	if err != nil {
		t.Fatal(err)
	}
	want := &csisupdv1.Volume{
		Id: "web", PluginId: "nfs", ExternalId: "srv:/export/web",
		CapacityBytes: 1 << 30, CapacityLimitBytes: 2 << 30,
		Capabilities: []*csisupdv1.VolumeCapability{
			{AccessType: "mount", AccessMode: "MULTI_NODE_MULTI_WRITER", MountFlags: []string{"vers=4.1"}},
		},
		AccessibleTopology: []*csisupdv1.TopologySegment{{Segments: map[string]string{"zone": "a"}}},
		Context:            map[string]string{"server": "10.0.0.1", "share": "/export/web"},
		Parameters:         map[string]string{"tier": "3"},
		MutableParameters:  map[string]string{"qos": "gold"},
	}
	if !proto.Equal(want, got) {
		t.Errorf("Volume\n%s\nwant\n%s", prototext.Format(got), prototext.Format(want))
	}
}

// Each malformed spec is refused with the exact problems, in file order,
// each naming the file and line.
func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{
			name: "unknown key with a suggestion",
			src:  "id = \"v\"\nplugin_ids = \"p\"\n",
			want: []string{`v.hcl:2: unsupported argument "plugin_ids"; did you mean "plugin_id"?`},
		},
		{
			name: "host volume",
			src:  "id = \"v\"\ntype = \"host\"\n",
			want: []string{`v.hcl:2: type "host": csisupd manages CSI volumes only; type must be "csi"`},
		},
		{
			name: "bad size and bad access mode",
			src:  "capacity_min = \"10 gigs\"\ncapability {\n  access_mode = \"single-writer\"\n  attachment_mode = \"file-system\"\n}\n",
			want: []string{
				`v.hcl:1: capacity_min: "10 gigs" is not a size (examples: 1GiB, 500MB, 4096)`,
				`v.hcl:3: capability.access_mode "single-writer": must be one of multi-node-multi-writer, multi-node-reader-only, multi-node-single-writer, single-node-multi-writer, single-node-reader-only, single-node-single-writer, single-node-writer`,
			},
		},
		{
			name: "snapshot and clone",
			src:  "snapshot_id = \"s1\"\nclone_id = \"v0\"\n",
			want: []string{`v.hcl:2: snapshot_id and clone_id are exclusive: a volume starts from a snapshot or from another volume, not both`},
		},
		{
			name: "capability without attachment mode and a bad one",
			src:  "capability {\n  access_mode = \"single-node-writer\"\n}\ncapability {\n  access_mode = \"single-node-writer\"\n  attachment_mode = \"filesystem\"\n}\n",
			want: []string{
				`v.hcl:1: capability: attachment_mode is not set (file-system or block-device)`,
				`v.hcl:6: capability.attachment_mode "filesystem": must be file-system or block-device`,
			},
		},
		{
			name: "block written as an argument, argument as a block",
			src:  "mount_options = { fs_type = \"ext4\" }\nplugin_id {\n}\n",
			want: []string{
				`v.hcl:1: mount_options is a block: write mount_options { ... }`,
				`v.hcl:2: plugin_id is an argument: write plugin_id = ...`,
			},
		},
		{
			name: "duplicate parameters, block and argument",
			src:  "parameters {\n  a = \"1\"\n}\nparameters = { b = \"2\" }\n",
			want: []string{`v.hcl:4: duplicate parameters (first at line 1): merge them into one`},
		},
		{
			name: "topology without segments and an empty one",
			src:  "topology_request {\n  required {\n    topology {}\n    topology { segments = {} }\n  }\n}\n",
			want: []string{
				`v.hcl:3: topology_request.required.topology: segments is not set (write segments = { zone = "z1" })`,
				`v.hcl:4: topology_request.required.topology.segments: empty; a segment names at least one topology key`,
			},
		},
		{
			name: "Nomad's one-line HCL 1 segments, with an HCL 1 syntax error",
			src:  "topology_request {\n  required {\n    topology { segments { rack = \"R1\", zone = \"z\" } }\n  }\n",
			want: []string{`v.hcl:5: object expected closing RBRACE got: EOF`},
		},
		{
			name: "namespace, list value, labels, mount flags",
			src:  "namespace = \"prod\"\nplugin_id = [\"a\"]\ncapability \"x\" {\n}\nmount_options {\n  mount_flags = \"noatime\"\n}\n",
			want: []string{
				`v.hcl:1: namespace "prod": csisupd has no namespaces; remove namespace or set it to "default"`,
				`v.hcl:2: plugin_id: expected a string, got a list`,
				`v.hcl:3: block capability takes no labels`,
				`v.hcl:6: mount_options.mount_flags: expected a list of strings, got string "noatime"`,
			},
		},
		{
			name: "capacity out of order, variable",
			src:  "capacity_min = \"2GiB\"\ncapacity_max = \"1GiB\"\nplugin_id = var.plugin\n",
			want: []string{
				`v.hcl:2: capacity_max: 1073741824 bytes is less than capacity_min's 2147483648`,
				`v.hcl:3: plugin_id: Variables not allowed: Variables may not be used here`,
			},
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

// The keys one operation takes are refused by the other, naming the line.
func TestOperationKeys(t *testing.T) {
	tests := []struct {
		name     string
		src      string
		register bool
		want     string
	}{
		{"external_id on create", "id = \"v\"\nplugin_id = \"p\"\nexternal_id = \"e\"\n", false,
			"v.hcl:3: external_id: volume create does not take it: the plugin names a new volume; use volume register for a volume that exists"},
		{"context on create", "id = \"v\"\nplugin_id = \"p\"\ncontext {\n  a = \"b\"\n}\n", false,
			"v.hcl:3: context: volume create does not take it: the plugin returns a new volume's context; use volume register for a volume that exists"},
		{"secrets on register", "id = \"v\"\nplugin_id = \"p\"\nexternal_id = \"e\"\nsecrets { k = \"s3cr3t\" }\n", true,
			"v.hcl:4: secrets: volume register does not take it: register records the volume without calling the plugin, and secrets are never stored"},
		{"snapshot on register", "id = \"v\"\nplugin_id = \"p\"\nexternal_id = \"e\"\nsnapshot_id = \"s\"\n", true,
			"v.hcl:4: snapshot_id: volume register does not take it: only a new volume starts from a snapshot; use volume create"},
		{"preferred on register", "id = \"v\"\nplugin_id = \"p\"\nexternal_id = \"e\"\ntopology_request {\n  preferred {\n    topology { segments = { z = \"1\" } }\n  }\n}\n", true,
			"v.hcl:5: topology_request.preferred: volume register does not take it: preferences choose where a new volume is made; say where this one is accessible with required"},
		{"register without external id", "id = \"v\"\nplugin_id = \"p\"\n", true,
			"v.hcl: external_id is not set: register records a volume by its id in the storage provider"},
		{"create without plugin", "id = \"v\"\n", false,
			"v.hcl: plugin_id is not set: the volume needs a plugin"},
		{"mount options on block only", "id = \"v\"\nplugin_id = \"p\"\ncapability {\n  access_mode = \"single-node-writer\"\n  attachment_mode = \"block-device\"\n}\nmount_options { fs_type = \"xfs\" }\n", false,
			"v.hcl:7: mount_options: every capability is block-device; mount options apply to file-system capabilities only"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse("v.hcl", []byte(tt.src))
			if err != nil {
				t.Fatal(err)
			}
			if tt.register {
				_, err = s.Volume()
			} else {
				_, err = s.CreateRequest()
			}
			if err == nil || err.Error() != tt.want {
				t.Errorf("error = %v\nwant    %s", err, tt.want)
			}
			if err != nil && strings.Contains(err.Error(), "s3cr3t") {
				t.Errorf("error %q shows a secret", err)
			}
		})
	}
}

// A spec without capability blocks gets the default capability, with the
// mount options on it; without topology or a content source the request
// has none.
func TestDefaults(t *testing.T) {
	s, err := Parse("v.hcl", []byte("id = \"v\"\nplugin_id = \"p\"\nmount_options { fs_type = \"xfs\" }\n"))
	if err != nil {
		t.Fatal(err)
	}
	req, err := s.CreateRequest()
	if err != nil {
		t.Fatal(err)
	}
	want := &csisupdv1.VolumeCreateRequest{Id: "v", PluginId: "p", Capabilities: []*csisupdv1.VolumeCapability{
		{AccessType: "mount", AccessMode: "SINGLE_NODE_WRITER", FsType: "xfs"},
	}}
	if !proto.Equal(req, want) {
		t.Errorf("request %v, want %v", req, want)
	}
}

// Secrets never show when a spec is formatted.
func TestSecretsRedacted(t *testing.T) {
	s, err := Parse("v.hcl", []byte("id = \"v\"\nsecrets {\n  token = \"s3cr3t\"\n}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
		out := fmt.Sprintf(verb, s)
		if strings.Contains(out, "s3cr3t") || !strings.Contains(out, "token") {
			t.Errorf("%s of the spec = %s: want the key, not the value", verb, out)
		}
	}
	if got := s.Secrets.String(); got != "map[token:[redacted]]" {
		t.Errorf("Secrets.String() = %q", got)
	}
}

// uncomment removes "# " from the commented-out keys of an example: lines
// whose text is HCL (an argument, a block, a closing brace), not prose.
func uncomment(src string) string {
	code := regexp.MustCompile(`^# ( *(?:[a-z_]+ *=|[a-z_]+ *\{|\}))`)
	lines := strings.Split(src, "\n")
	for i, l := range lines {
		lines[i] = code.ReplaceAllString(l, "$1")
	}
	return strings.Join(lines, "\n")
}

// The examples volume init prints parse as they are, and with every key
// uncommented; the create example then sets every create key.
func TestExamples(t *testing.T) {
	for name, ex := range map[string]string{"create": ExampleCreate, "register": ExampleRegister} {
		s, err := Parse(name+".hcl", []byte(ex))
		if err != nil {
			t.Fatalf("%s example: %v", name, err)
		}
		if name == "create" {
			_, err = s.CreateRequest()
		} else {
			_, err = s.Volume()
		}
		if err != nil {
			t.Fatalf("%s example: %v", name, err)
		}
	}

	full := uncomment(ExampleCreate)
	if _, err := Parse("create.hcl", []byte(full)); err == nil || !strings.Contains(err.Error(), "exclusive") {
		t.Fatalf("create example with snapshot_id and clone_id: %v, want them refused as exclusive", err)
	}
	full = regexp.MustCompile(`(?m)^clone_id.*\n`).ReplaceAllString(full, "")
	s, err := Parse("create.hcl", []byte(full))
	if err != nil {
		t.Fatalf("create example, uncommented:\n%s\n%v", full, err)
	}
	req, err := s.CreateRequest()
	if err != nil {
		t.Fatal(err)
	}
	if req.GetCapacityMinBytes() != 10<<30 || req.GetCapacityMaxBytes() != 20<<30 || len(req.GetCapabilities()) != 2 ||
		req.GetCapabilities()[1].GetFsType() != "ext4" || len(req.GetAccessibilityRequirements().GetRequisite()) != 2 ||
		len(req.GetAccessibilityRequirements().GetPreferred()) != 1 || req.GetContentSource().GetSnapshotId() != "database-nightly" ||
		req.GetParameters()["type"] != "gp3" || req.GetMutableParameters()["iops"] != "3000" || req.GetSecrets()["api_key"] == "" ||
		req.GetId() != "database" || req.GetName() != "orders-database" {
		t.Errorf("create example, uncommented, does not set every key: %v", req)
	}

	s, err = Parse("register.hcl", []byte(uncomment(ExampleRegister)))
	if err != nil {
		t.Fatalf("register example, uncommented: %v", err)
	}
	v, err := s.Volume()
	if err != nil {
		t.Fatal(err)
	}
	if v.GetExternalId() == "" || v.GetCapacityLimitBytes() != 20<<30 || len(v.GetAccessibleTopology()) != 1 ||
		v.GetContext()["endpoint"] == "" || v.GetMutableParameters()["iops"] != "3000" {
		t.Errorf("register example, uncommented, does not set every key: %v", v)
	}
}

func TestParseSize(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr bool
	}{
		{in: "4096", want: 4096},
		{in: "1GiB", want: 1 << 30},
		{in: "1Gi", want: 1 << 30},
		{in: "1.5GiB", want: 3 << 29},
		{in: "500MB", want: 500e6},
		{in: "10G", want: 10e9},
		{in: "1G", want: 1e9},
		{in: "2 MiB", want: 2 << 20},
		{in: "1KiB", want: 1024},
		{in: "7B", want: 7},
		{in: "", wantErr: true},
		{in: "GiB", wantErr: true},
		{in: "-1GiB", wantErr: true},
		{in: "1XB", wantErr: true},
		{in: "99999999PiB", wantErr: true},
		{in: "8EiB", wantErr: true},
		{in: "9223372036854775807", wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParseSize(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}
