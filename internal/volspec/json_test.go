package volspec

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
)

// A JSON volume file, as Nomad takes one, parses to the same request as
// the HCL file that says the same.
func TestParseJSON(t *testing.T) {
	tests := []struct {
		name     string
		filename string
		json     string
		hcl      string
	}{
		{
			name:     "create with every block",
			filename: "create.json",
			json: `{
  "id": "orders",
  "name": "Orders database",
  "type": "csi",
  "namespace": "default",
  "plugin_id": "disks",
  "capacity_min": "10GiB",
  "capacity_max": "20GiB",
  "snapshot_id": "snap-7",
  "capability": [
    {"access_mode": "single-node-writer", "attachment_mode": "file-system"},
    {"access_mode": "multi-node-reader-only", "attachment_mode": "block-device"}
  ],
  "mount_options": {"fs_type": "ext4", "mount_flags": ["noatime", "discard"]},
  "topology_request": {
    "required": {"topology": [{"segments": {"rack": "R1"}}, {"segments": {"rack": "R2", "zone": "z1"}}]},
    "preferred": {"topology": {"segments": {"rack": "R2", "zone": "z1"}}}
  },
  "parameters": {"csi.storage.k8s.io/fstype": "ext4", "replicas": 3, "thin": true},
  "mutable_parameters": {"iops": "3000"},
  "secrets": {"token": "t0k3n"}
}
`,
			hcl: `id           = "orders"
name         = "Orders database"
type         = "csi"
namespace    = "default"
plugin_id    = "disks"
capacity_min = "10GiB"
capacity_max = "20GiB"
snapshot_id  = "snap-7"
capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}
capability {
  access_mode     = "multi-node-reader-only"
  attachment_mode = "block-device"
}
mount_options {
  fs_type     = "ext4"
  mount_flags = ["noatime", "discard"]
}
topology_request {
  required {
    topology {
      segments = { rack = "R1" }
    }
    topology {
      segments = { rack = "R2", zone = "z1" }
    }
  }
  preferred {
    topology {
      segments = { rack = "R2", zone = "z1" }
    }
  }
}
parameters = { "csi.storage.k8s.io/fstype" = "ext4", replicas = 3, thin = true }
mutable_parameters = { iops = "3000" }
secrets = { token = "t0k3n" }
`,
		},
		{
			name:     "one line, one capability as an object",
			filename: "v.json",
			json: `{"id": "v", "name": "v", "type": "csi", "plugin_id": "p", "capacity_min": "10GiB", "capability": {"access_mode": "single-node-writer",` +
				` "attachment_mode": "file-system"}, "mount_options": {"fs_type": "ext4"}, "topology_request": {"required": {"topology": [{"segments": {"rack": "R1"}}]}}, "parameters": {"a": "b"}}`,
			hcl: `id = "v"
name = "v"
type = "csi"
plugin_id = "p"
capacity_min = "10GiB"
capability {
  access_mode = "single-node-writer"
  attachment_mode = "file-system"
}
mount_options {
  fs_type = "ext4"
}
topology_request {
  required {
    topology {
      segments = { rack = "R1" }
    }
  }
}
parameters = { a = "b" }
`,
		},
		{
			name:     "a .json name, white space first, Unicode",
			filename: "vol.JSON",
			json:     "\n\t {\"id\": \"scratch\", \"name\": \"Données\", \"plugin_id\": \"p\", \"clone_id\": \"golden\", \"parameters\": {\"größe\": \"1\\u00e9\\n\"}, \"capability\": []}",
			hcl:      "id = \"scratch\"\nname = \"Données\"\nplugin_id = \"p\"\nclone_id = \"golden\"\nparameters = { \"größe\" = \"1é\\n\" }\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			js, err := Parse(tt.filename, []byte(tt.json))
			if err != nil {
				t.Fatal(err)
			}
			hs, err := Parse("v.hcl", []byte(tt.hcl))
			if err != nil {
				t.Fatalf("the HCL file: %v", err)
			}
			got, err := js.CreateRequest()
			if err != nil {
				t.Fatal(err)
			}
			want, err := hs.CreateRequest()
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(want, got) {
				t.Errorf("CreateRequest of the JSON file\n%s\nwant the HCL file's\n%s", prototext.Format(got), prototext.Format(want))
			}
			if len(got.GetCapabilities()) == 0 || got.GetId() == "" {
				t.Errorf("CreateRequest %v: want an id and a capability", got)
			}
		})
	}
}

// A JSON register file parses to the volume the HCL file records.
func TestParseJSONRegister(t *testing.T) {
	const (
		jsonSrc = `{"id": "share", "plugin_id": "nfs", "external_id": "srv1:/export/share",
 "capability": [{"access_mode": "multi-node-multi-writer", "attachment_mode": "file-system"}],
 "topology_request": {"required": {"topology": {"segments": {"zone": "a"}}}},
 "context": {"server": "10.1.2.3", "share": "/export/share"}}`
		hclSrc = `id = "share"
plugin_id = "nfs"
external_id = "srv1:/export/share"
capability {
  access_mode = "multi-node-multi-writer"
  attachment_mode = "file-system"
}
topology_request {
  required {
    topology {
      segments = { zone = "a" }
    }
  }
}
context = { server = "10.1.2.3", share = "/export/share" }
`
	)
	js, err := Parse("register.json", []byte(jsonSrc))
	if err != nil {
		t.Fatal(err)
	}
	hs, err := Parse("register.hcl", []byte(hclSrc))
	if err != nil {
		t.Fatal(err)
	}
	got, err := js.Volume()
	if err != nil {
		t.Fatal(err)
	}
	want, err := hs.Volume()
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(want, got) || got.GetExternalId() != "srv1:/export/share" || len(got.GetAccessibleTopology()) != 1 {
		t.Errorf("Volume of the JSON file\n%s\nwant the HCL file's\n%s", prototext.Format(got), prototext.Format(want))
	}
}

// A JSON file keeps the checks of an HCL file, each problem at its
// file:line; a file that is not JSON gets the line of its syntax error.
func TestParseJSONErrors(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want []string
	}{
		{
			name: "unknown keys with suggestions",
			src:  "{\n\"plugin_ids\": \"p\",\n\"capability\": [{\"access_mode\": \"single-node-writer\",\n  \"attachment_mod\": \"file-system\"}]\n}\n",
			want: []string{
				`v.json:2: unsupported argument "plugin_ids"; did you mean "plugin_id"?`,
				`v.json:3: capability: attachment_mode is not set (file-system or block-device)`,
				`v.json:4: unsupported argument "attachment_mod" in block capability; did you mean "attachment_mode"?`,
			},
		},
		{
			name: "bad values",
			src: "{\"plugin_id\": \"p\",\n\"capacity_min\": \"10 gigs\",\n\"type\": \"host\",\n\"id\": \"a\",\n\"id\": \"b\",\n" +
				"\"mount_options\": {\"mount_flags\": \"noatime\"},\n\"snapshot_id\": null}",
			want: []string{
				`v.json:2: capacity_min: "10 gigs" is not a size (examples: 1GiB, 500MB, 4096)`,
				`v.json:3: type "host": csisupd manages CSI volumes only; type must be "csi"`,
				`v.json:5: duplicate id (first at line 4): set it once`,
				`v.json:6: mount_options.mount_flags: expected a list of strings, got string "noatime"`,
				`v.json:7: snapshot_id: null is not a value: leave the key out`,
			},
		},
		{
			name: "a block as a string, duplicate map keys",
			src:  "{\"plugin_id\": \"p\",\n\"mount_options\": \"ext4\",\n\"secrets\": {\"k\": \"v\",\n \"k\": \"w\"}}",
			want: []string{
				`v.json:2: mount_options is a block: write mount_options { ... }`,
				`v.json:4: secrets: duplicate key "k" (first at line 3)`,
			},
		},
		{
			name: "control character in a key",
			src:  "{\"plugin_id\": \"p\",\n\"parameters\": {\"a\\u0007\": \"b\"}}",
			want: []string{`v.json:2: parameters: key "a\a" contains the control character U+0007 (at byte 1): give printable text`},
		},
		{
			name: "missing comma",
			src:  "{\"id\": \"v\",\n\"plugin_id\": \"p\"\n\"name\": \"n\"}",
			want: []string{`v.json:3: not JSON: invalid character '"' after object key:value pair`},
		},
		{
			name: "ends inside an object",
			src:  "{\"id\": \"v\",\n\"parameters\": {\"a\": \"b\"\n",
			want: []string{`v.json:3: not JSON: the file ends inside an object or a list`},
		},
		{
			name: "more after the object",
			src:  "{\"id\": \"v\", \"plugin_id\": \"p\"}\n{}",
			want: []string{`v.json:2: more after the object that holds the volume specification`},
		},
		{
			name: "not an object",
			src:  "[{\"id\": \"v\"}]",
			want: []string{`v.json:1: not a volume specification: a JSON file holds one object`},
		},
		{
			name: "invalid UTF-8",
			src:  "{\"id\": \"v\",\n\"name\": \"\xff\"}",
			want: []string{`v.json:2: not valid UTF-8 (at byte 21)`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Parse("v.json", []byte(tt.src))
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
