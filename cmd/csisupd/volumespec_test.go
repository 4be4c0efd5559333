package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	csisupdv1 "github.com/csisupd/csisupd/api/csisupd/v1"
	"github.com/csisupd/csisupd/internal/volspec"
)

func TestParseSegments(t *testing.T) {
	tests := []struct {
		in      []string
		want    []map[string]string
		wantErr string
	}{
		{in: []string{"zone=a"}, want: []map[string]string{{"zone": "a"}}},
		{in: []string{"zone=a,rack=r1", "zone = b "}, want: []map[string]string{{"zone": "a", "rack": "r1"}, {"zone": "b"}}},
		{in: []string{"topology.kubernetes.io/zone=eu-1a"}, want: []map[string]string{{"topology.kubernetes.io/zone": "eu-1a"}}},
		{in: []string{"zone"}, wantErr: `--topology-required "zone": "zone" is not K=V; want K=V[,K=V...]`},
		{in: []string{"=a"}, wantErr: `--topology-required "=a": "=a" is not K=V; want K=V[,K=V...]`},
		{in: []string{"zone=a,"}, wantErr: `--topology-required "zone=a,": empty K=V pair; want K=V[,K=V...]`},
		{in: []string{""}, wantErr: `--topology-required "": empty K=V pair; want K=V[,K=V...]`},
		{in: []string{"zone="}, wantErr: `--topology-required "zone=": topology key "zone" has no value`},
		{in: []string{"zone=a,zone=b"}, wantErr: `--topology-required "zone=a,zone=b": topology key "zone" given twice in one segment`},
	}
	for _, tt := range tests {
		got, err := parseSegments("topology-required", tt.in)
		if tt.wantErr != "" {
			if err == nil || err.Error() != tt.wantErr || !errors.As(err, new(usageError)) {
				t.Errorf("parseSegments(%q) = %v, %v; want the usage error %s", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || len(got) != len(tt.want) {
			t.Errorf("parseSegments(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
			continue
		}
		for i := range got {
			if !mapsEqual(got[i], tt.want[i]) {
				t.Errorf("parseSegments(%q)[%d] = %v, want %v", tt.in, i, got[i], tt.want[i])
			}
		}
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// specFile is a create specification the override tests start from.
const specFile = `id = "from-file"
plugin_id = "ebs"
capacity_min = "1GiB"
clone_id = "template"
capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}
capability {
  access_mode     = "multi-node-reader-only"
  attachment_mode = "file-system"
}
mount_options {
  fs_type     = "ext4"
  mount_flags = ["noatime"]
}
topology_request {
  required {
    topology { segments = { zone = "a" } }
  }
}
parameters {
  a = "1"
  b = "2"
}
secrets {
  token = "s3cr3t"
}
`

func segs(ms ...map[string]string) []*csisupdv1.TopologySegment {
	out := make([]*csisupdv1.TopologySegment, len(ms))
	for i, m := range ms {
		out[i] = &csisupdv1.TopologySegment{Segments: m}
	}
	return out
}

// volume create builds its request from the flags, or from -f with the
// flags given beside it overriding the file's keys.
func TestCreateRequest(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "volume.hcl")
	if err := os.WriteFile(file, []byte(specFile), 0o600); err != nil {
		t.Fatal(err)
	}
	noPlugin := filepath.Join(dir, "noplugin.hcl")
	if err := os.WriteFile(noPlugin, []byte("id = \"v\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.hcl")
	if err := os.WriteFile(bad, []byte("id = \"v\"\nplugin_id = \"p\"\ncapacity_min = \"lots\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sw := func(fs string, flags ...string) *csisupdv1.VolumeCapability {
		return &csisupdv1.VolumeCapability{AccessType: "mount", AccessMode: "SINGLE_NODE_WRITER", FsType: fs, MountFlags: flags}
	}
	tests := []struct {
		name    string
		args    []string
		stdin   string
		want    *csisupdv1.VolumeCreateRequest
		wantErr string
		usage   bool
	}{
		{
			name: "flags only",
			args: []string{"data", "--plugin", "ebs", "--capacity", "10GiB", "--topology-required", "zone=a,rack=r1",
				"--topology-required", "zone=b", "--topology-preferred", "zone=b", "--snapshot", "nightly", "--mutable-parameter", "iops=3000"},
			want: &csisupdv1.VolumeCreateRequest{Id: "data", PluginId: "ebs", CapacityMinBytes: 10 << 30,
				Capabilities: []*csisupdv1.VolumeCapability{sw("")},
				AccessibilityRequirements: &csisupdv1.TopologyRequirement{
					Requisite: segs(map[string]string{"zone": "a", "rack": "r1"}, map[string]string{"zone": "b"}),
					Preferred: segs(map[string]string{"zone": "b"}),
				},
				ContentSource:     &csisupdv1.VolumeContentSource{Source: &csisupdv1.VolumeContentSource_SnapshotId{SnapshotId: "nightly"}},
				MutableParameters: map[string]string{"iops": "3000"},
			},
		},
		{
			name: "clone",
			args: []string{"copy", "--plugin", "ebs", "--clone", "data", "--access-type", "block", "--access-mode", "multi-node-multi-writer"},
			want: &csisupdv1.VolumeCreateRequest{Id: "copy", PluginId: "ebs",
				Capabilities:  []*csisupdv1.VolumeCapability{{AccessType: "block", AccessMode: "MULTI_NODE_MULTI_WRITER"}},
				ContentSource: &csisupdv1.VolumeContentSource{Source: &csisupdv1.VolumeContentSource_VolumeId{VolumeId: "data"}},
			},
		},
		{
			name: "file as it is",
			args: []string{"-f", file},
			want: &csisupdv1.VolumeCreateRequest{Id: "from-file", PluginId: "ebs", CapacityMinBytes: 1 << 30,
				Capabilities: []*csisupdv1.VolumeCapability{sw("ext4", "noatime"),
					{AccessType: "mount", AccessMode: "MULTI_NODE_READER_ONLY", FsType: "ext4", MountFlags: []string{"noatime"}}},
				AccessibilityRequirements: &csisupdv1.TopologyRequirement{Requisite: segs(map[string]string{"zone": "a"})},
				ContentSource:             &csisupdv1.VolumeContentSource{Source: &csisupdv1.VolumeContentSource_VolumeId{VolumeId: "template"}},
				Parameters:                map[string]string{"a": "1", "b": "2"},
				Secrets:                   map[string]string{"token": "s3cr3t"},
			},
		},
		{
			name: "flags override the file",
			args: []string{"renamed", "--file", file, "--plugin", "ebs2", "--capacity", "5GiB", "--capacity-max", "6GiB",
				"--parameter", "b=3", "--secret", "other=x", "--snapshot", "nightly", "--access-mode", "single-node-writer",
				"--fs-type", "xfs", "--topology-required", "zone=c", "--topology-preferred", "zone=c"},
			want: &csisupdv1.VolumeCreateRequest{Id: "renamed", PluginId: "ebs2", CapacityMinBytes: 5 << 30, CapacityMaxBytes: 6 << 30,
				// --access-mode replaces the file's two capabilities; --fs-type
				// changes the file's mount options, which keep their flags.
				Capabilities: []*csisupdv1.VolumeCapability{sw("xfs", "noatime")},
				AccessibilityRequirements: &csisupdv1.TopologyRequirement{
					Requisite: segs(map[string]string{"zone": "c"}), Preferred: segs(map[string]string{"zone": "c"}),
				},
				// --snapshot replaces the file's clone_id.
				ContentSource: &csisupdv1.VolumeContentSource{Source: &csisupdv1.VolumeContentSource_SnapshotId{SnapshotId: "nightly"}},
				Parameters:    map[string]string{"a": "1", "b": "3"},
				Secrets:       map[string]string{"token": "s3cr3t", "other": "x"},
			},
		},
		{
			name:  "stdin",
			args:  []string{"-f", "-"},
			stdin: "id = \"in\"\nplugin_id = \"p\"\n",
			want:  &csisupdv1.VolumeCreateRequest{Id: "in", PluginId: "p", Capabilities: []*csisupdv1.VolumeCapability{sw("")}},
		},
		{
			name:  "JSON on stdin, a flag over it",
			args:  []string{"-f", "-", "--capacity", "2GiB"},
			stdin: `{"id": "in", "plugin_id": "p", "capacity_min": "1GiB", "mount_options": {"fs_type": "ext4"}, "parameters": {"a": "1"}}`,
			want: &csisupdv1.VolumeCreateRequest{Id: "in", PluginId: "p", CapacityMinBytes: 2 << 30,
				Capabilities: []*csisupdv1.VolumeCapability{sw("ext4")}, Parameters: map[string]string{"a": "1"}},
		},
		{name: "snapshot and clone", args: []string{"v", "--plugin", "p", "--snapshot", "s", "--clone", "c"}, usage: true,
			wantErr: "--snapshot and --clone are exclusive: a volume starts from a snapshot or from another volume, not both"},
		{name: "empty snapshot", args: []string{"v", "--plugin", "p", "--snapshot", ""}, usage: true, wantErr: "--snapshot: empty id"},
		{name: "no name", args: []string{"--plugin", "p"}, usage: true, wantErr: "give the volume's NAME, or -f SPEC.hcl"},
		{name: "no plugin", args: []string{"v"}, usage: true, wantErr: "required flag(s) --plugin not set"},
		{name: "file without plugin", args: []string{"-f", noPlugin}, usage: true,
			wantErr: noPlugin + " sets no plugin_id: set it in the file or give --plugin"},
		{name: "file without plugin, given as a flag", args: []string{"-f", noPlugin, "--plugin", "p"},
			want: &csisupdv1.VolumeCreateRequest{Id: "v", PluginId: "p", Capabilities: []*csisupdv1.VolumeCapability{sw("")}}},
		{name: "bad file", args: []string{"-f", bad}, wantErr: bad + `:3: capacity_min: "lots" is not a size (examples: 1GiB, 500MB, 4096)`},
		{name: "bad topology", args: []string{"v", "--plugin", "p", "--topology-preferred", "zone"}, usage: true,
			wantErr: `--topology-preferred "zone": "zone" is not K=V; want K=V[,K=V...]`},
		{name: "bad capacity", args: []string{"v", "--plugin", "p", "--capacity", "big"}, usage: true,
			wantErr: `--capacity: "big" is not a size (examples: 1GiB, 500MB, 4096)`},
		{name: "capacity over the file's maximum", args: []string{"-f", file, "--capacity-max", "512MiB"}, usage: true,
			wantErr: "--capacity, --capacity-max: the capacity, 1 GiB, is more than the maximum, 512 MiB"},
		{name: "bad mutable parameter", args: []string{"v", "--plugin", "p", "--mutable-parameter", "iops"}, usage: true,
			wantErr: `--mutable-parameter "iops": want key=value`},
		{name: "fs type of a block file", args: []string{"-f", file, "--access-type", "block"},
			wantErr: file + ":13: mount_options: every capability is block-device; mount options apply to file-system capabilities only"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var f createFlags
			fs := pflag.NewFlagSet("create", pflag.ContinueOnError)
			f.register(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			got, err := f.request(fs, fs.Args(), strings.NewReader(tt.stdin))
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("error = %v\nwant    %s", err, tt.wantErr)
				}
				if isUsage := errors.As(err, new(usageError)); isUsage != tt.usage {
					t.Errorf("usage error = %v, want %v", isUsage, tt.usage)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, tt.want) {
				t.Errorf("request\n%s\nwant\n%s", prototext.Format(got), prototext.Format(tt.want))
			}
		})
	}
}

// volume register -f takes the file's keys, with the flags given beside
// it over them.
func TestRegisterVolume(t *testing.T) {
	file := filepath.Join(t.TempDir(), "register.hcl")
	src := "id = \"old\"\nplugin_id = \"nfs\"\nexternal_id = \"srv:/a\"\ncapacity_min = \"1GiB\"\ncontext {\n  server = \"10.0.0.1\"\n}\n"
	if err := os.WriteFile(file, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    []string
		want    *csisupdv1.Volume
		wantErr string
	}{
		{name: "file", args: []string{"-f", file}, want: &csisupdv1.Volume{Id: "old", PluginId: "nfs", ExternalId: "srv:/a",
			CapacityBytes: 1 << 30, Context: map[string]string{"server": "10.0.0.1"},
			Capabilities: []*csisupdv1.VolumeCapability{{AccessType: "mount", AccessMode: "SINGLE_NODE_WRITER"}}}},
		{name: "overrides", args: []string{"new", "-f", file, "--external-id", "srv:/b", "--context", "share=/b", "--capacity-max", "2GiB"},
			want: &csisupdv1.Volume{Id: "new", PluginId: "nfs", ExternalId: "srv:/b", CapacityBytes: 1 << 30, CapacityLimitBytes: 2 << 30,
				Context:      map[string]string{"server": "10.0.0.1", "share": "/b"},
				Capabilities: []*csisupdv1.VolumeCapability{{AccessType: "mount", AccessMode: "SINGLE_NODE_WRITER"}}}},
		{name: "flags", args: []string{"v", "--plugin", "p", "--external-id", "e", "--access-type", "block"},
			want: &csisupdv1.Volume{Id: "v", PluginId: "p", ExternalId: "e",
				Capabilities: []*csisupdv1.VolumeCapability{{AccessType: "block", AccessMode: "SINGLE_NODE_WRITER"}}}},
		{name: "no external id", args: []string{"v", "--plugin", "p"}, wantErr: "required flag(s) --external-id not set"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var f registerFlags
			fs := pflag.NewFlagSet("register", pflag.ContinueOnError)
			f.register(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			got, err := f.volume(fs, fs.Args(), strings.NewReader(""))
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr || !errors.As(err, new(usageError)) {
					t.Fatalf("error = %v, want the usage error %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, tt.want) {
				t.Errorf("volume\n%s\nwant\n%s", prototext.Format(got), prototext.Format(tt.want))
			}
		})
	}
}

// volume init prints the examples of volspec, which volume create -f
// and volume register -f read back.
func TestVolumeInit(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"volume", "init"}, volspec.ExampleCreate},
		{[]string{"volume", "init", "--register"}, volspec.ExampleRegister},
	}
	for _, tt := range tests {
		out, err := execute(t, tt.args...)
		if err != nil || out != tt.want {
			t.Fatalf("%v: %v\n%s", tt.args, err, out)
		}
		file := filepath.Join(t.TempDir(), "volume.hcl")
		if err := os.WriteFile(file, []byte(out), 0o600); err != nil {
			t.Fatal(err)
		}
		fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
		if len(tt.args) == 2 {
			var f createFlags
			f.register(fs)
			_ = fs.Parse([]string{"-f", file})
			if _, err := f.request(fs, nil, nil); err != nil {
				t.Errorf("volume create -f of volume init's output: %v", err)
			}
		} else {
			var f registerFlags
			f.register(fs)
			_ = fs.Parse([]string{"-f", file})
			if _, err := f.volume(fs, nil, nil); err != nil {
				t.Errorf("volume register -f of volume init --register's output: %v", err)
			}
		}
	}
	if got := run([]string{"volume", "init", "--json"}); got != exitUsage {
		t.Errorf("volume init --json: exit code %d, want %d", got, exitUsage)
	}
}

func TestExpandAndModifyRequests(t *testing.T) {
	tests := []struct {
		name    string
		build   func() (proto.Message, error)
		want    proto.Message
		wantErr string
	}{
		{"expand", func() (proto.Message, error) { return expandRequest("v", "20GiB", "", []string{"k=v"}) },
			&csisupdv1.VolumeExpandRequest{Id: "v", CapacityMinBytes: 20 << 30, Secrets: map[string]string{"k": "v"}}, ""},
		{"expand with a limit", func() (proto.Message, error) { return expandRequest("v", "20GiB", "30GiB", nil) },
			&csisupdv1.VolumeExpandRequest{Id: "v", CapacityMinBytes: 20 << 30, CapacityMaxBytes: 30 << 30}, ""},
		{"expand without capacity", func() (proto.Message, error) { return expandRequest("v", "", "", nil) },
			nil, "required flag(s) --capacity not set"},
		{"expand to 0", func() (proto.Message, error) { return expandRequest("v", "0", "", nil) },
			nil, "--capacity: the size to grow to must be more than 0"},
		{"expand limit below", func() (proto.Message, error) { return expandRequest("v", "2GiB", "1GiB", nil) },
			nil, "--capacity-max 1GiB is less than --capacity 2GiB"},
		{"expand bad size", func() (proto.Message, error) { return expandRequest("v", "2 bytes", "", nil) },
			nil, `--capacity: "2 bytes" is not a size (examples: 1GiB, 500MB, 4096)`},
		{"modify", func() (proto.Message, error) {
			return modifyRequest("v", []string{"iops=6000", "tier=gold"}, []string{"k=v"})
		},
			&csisupdv1.VolumeModifyRequest{Id: "v", MutableParameters: map[string]string{"iops": "6000", "tier": "gold"}, Secrets: map[string]string{"k": "v"}}, ""},
		{"modify nothing", func() (proto.Message, error) { return modifyRequest("v", nil, nil) },
			nil, "required flag(s) --parameter not set: give the mutable parameters to change"},
		{"modify bad parameter", func() (proto.Message, error) { return modifyRequest("v", []string{"iops"}, nil) },
			nil, `--parameter "iops": want key=value`},
		{"snapshot", func() (proto.Message, error) {
			return snapshotCreateRequest("v", "s", []string{"a=b"}, []string{"k=v"})
		},
			&csisupdv1.VolumeSnapshotCreateRequest{VolumeId: "v", Id: "s", Parameters: map[string]string{"a": "b"}, Secrets: map[string]string{"k": "v"}}, ""},
		{"snapshot bad secret", func() (proto.Message, error) { return snapshotCreateRequest("v", "s", nil, []string{"k"}) },
			nil, `--secret "k": want key=value`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.build()
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr || !errors.As(err, new(usageError)) {
					t.Fatalf("error = %v, want the usage error %s", err, tt.wantErr)
				}
				return
			}
			if err != nil || !proto.Equal(got, tt.want) {
				t.Errorf("= %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

// The README's example specification parses and makes a request.
func TestREADMEVolumeSpecExample(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "commands.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "### Volume specification files\n")
	if !ok {
		t.Fatal(`docs/commands.md has no "### Volume specification files" section`)
	}
	_, example, ok := strings.Cut(section, "```hcl\n")
	if !ok {
		t.Fatal("the volume specification section of docs/commands.md has no hcl example")
	}
	example, _, _ = strings.Cut(example, "```")
	s, err := volspec.Parse("docs/commands.md", []byte(example))
	if err != nil {
		t.Fatal(err)
	}
	req, err := s.CreateRequest()
	if err != nil {
		t.Fatal(err)
	}
	if req.GetId() != "database" || req.GetCapacityMinBytes() != 100<<30 || len(req.GetAccessibilityRequirements().GetRequisite()) != 2 ||
		req.GetContentSource().GetSnapshotId() != "database-nightly" || req.GetCapabilities()[0].GetFsType() != "ext4" {
		t.Errorf("README example: %v", req)
	}
}
