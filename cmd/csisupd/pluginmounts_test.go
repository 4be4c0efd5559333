package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/csisupd/csisupd/internal/testutil"
)

// mountsConfig writes an agent configuration with the given plugin blocks
// and returns its path. The paths do not exist: validation does not need
// them to.
func mountsConfig(t *testing.T, plugins string) string {
	t.Helper()
	for _, env := range []string{"CSISUPD_DATA_DIR", "CSISUPD_PLUGIN_DIR", "CSISUPD_NAME"} {
		t.Setenv(env, "")
	}
	path := filepath.Join(t.TempDir(), "agent.hcl")
	src := "name = \"n1\"\ndata_dir = \"/srv/csisupd\"\nclient {\n  plugin_dir = \"/srv/csisupd/plugins\"\n}\n" + plugins
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// argLines returns the lines of out that are not comments, and fails the
// test when one is not preceded by a comment saying why.
func argLines(t *testing.T, out string) []string {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	var args []string
	for i, l := range lines {
		if strings.HasPrefix(l, "#") {
			continue
		}
		if i == 0 || !strings.HasPrefix(lines[i-1], "#") {
			t.Errorf("line %d %q is not preceded by a comment:\n%s", i+1, l, out)
		}
		args = append(args, l)
	}
	return args
}

func TestPluginMountsFormats(t *testing.T) {
	const (
		mapped     = "plugin \"ebs\" {\n  type = \"node\"\n  plugin_mount_dir = \"/csi/volumes\"\n}\n"
		socket     = "plugin \"nfs\" {\n  socket = \"/run/nfs-csi/plugin.sock\"\n  type = \"monolith\"\n  required = true\n}\n"
		controller = "plugin \"ctl\" {\n  type = \"controller\"\n}\n"
	)
	tests := []struct {
		name, blocks, id string
		podman           []string
		docker           []string
		systemd          []string // directives
		notes            []string // substrings of the JSON notes
		comment          string   // a substring of the podman comments
	}{
		{
			name: "plugin_mount_dir", blocks: mapped, id: "ebs",
			podman: []string{
				"--volume=/srv/csisupd/plugins/ebs:/srv/csisupd/plugins/ebs",
				"--volume=/srv/csisupd/volumes/ebs:/csi/volumes:rshared",
				"--volume=/dev:/dev:rshared",
			},
			docker: []string{
				"--mount type=bind,source=/srv/csisupd/plugins/ebs,target=/srv/csisupd/plugins/ebs",
				"--mount type=bind,source=/srv/csisupd/volumes/ebs,target=/csi/volumes,bind-propagation=rshared",
				"--mount type=bind,source=/dev,target=/dev,bind-propagation=rshared",
			},
			systemd: []string{"PrivateMounts=no"},
			notes:   []string{},
			comment: "# The container must run --privileged",
		},
		{
			name: "no plugin_mount_dir, no plugin block", blocks: "", id: "ebs",
			podman: []string{
				"--volume=/srv/csisupd/plugins/ebs:/srv/csisupd/plugins/ebs",
				"--volume=/srv/csisupd/volumes/ebs:/srv/csisupd/volumes/ebs:rshared",
				"--volume=/dev:/dev:rshared",
			},
			docker: []string{
				"--mount type=bind,source=/srv/csisupd/plugins/ebs,target=/srv/csisupd/plugins/ebs",
				"--mount type=bind,source=/srv/csisupd/volumes/ebs,target=/srv/csisupd/volumes/ebs,bind-propagation=rshared",
				"--mount type=bind,source=/dev,target=/dev,bind-propagation=rshared",
			},
			systemd: []string{"PrivateMounts=no"},
			notes:   []string{`no plugin "ebs" block declares this plugin`},
			comment: "/srv/csisupd/plugins/ebs/csi.sock; csisupd finds and dials it there",
		},
		{
			name: "declared socket outside plugin_dir", blocks: socket, id: "nfs",
			podman: []string{
				"--volume=/run/nfs-csi:/run/nfs-csi",
				"--volume=/srv/csisupd/volumes/nfs:/srv/csisupd/volumes/nfs:rshared",
				"--volume=/dev:/dev:rshared",
			},
			docker: []string{
				"--mount type=bind,source=/run/nfs-csi,target=/run/nfs-csi",
				"--mount type=bind,source=/srv/csisupd/volumes/nfs,target=/srv/csisupd/volumes/nfs,bind-propagation=rshared",
				"--mount type=bind,source=/dev,target=/dev,bind-propagation=rshared",
			},
			systemd: []string{"PrivateMounts=no"},
			notes:   []string{},
			comment: "/run/nfs-csi/plugin.sock; csisupd dials it there",
		},
		{
			name: "controller", blocks: controller, id: "ctl",
			podman: []string{
				"--volume=/srv/csisupd/plugins/ctl:/srv/csisupd/plugins/ctl",
				"--volume=/srv/csisupd/volumes/ctl:/srv/csisupd/volumes/ctl:rshared",
			},
			docker: []string{
				"--mount type=bind,source=/srv/csisupd/plugins/ctl,target=/srv/csisupd/plugins/ctl",
				"--mount type=bind,source=/srv/csisupd/volumes/ctl,target=/srv/csisupd/volumes/ctl,bind-propagation=rshared",
			},
			systemd: []string{"ReadWritePaths=/srv/csisupd/plugins/ctl", "ReadWritePaths=/srv/csisupd/volumes/ctl"},
			notes:   []string{"a controller never stages or publishes, so it needs no /dev"},
			comment: "# A controller mounts nothing: it needs no --privileged.",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := mountsConfig(t, tt.blocks)
			run := func(format string) string {
				t.Helper()
				out, err := execute(t, "plugin", "mounts", tt.id, "--config", cfg, "--format", format)
				if err != nil {
					t.Fatalf("--format %s: %v", format, err)
				}
				return out
			}

			podman := run("podman")
			if got := argLines(t, podman); !slices.Equal(got, tt.podman) {
				t.Errorf("podman arguments\n  %q\nwant\n  %q", got, tt.podman)
			}
			if !strings.Contains(podman, tt.comment) {
				t.Errorf("podman output does not say %q:\n%s", tt.comment, podman)
			}
			// The default format is podman's.
			if out, err := execute(t, "plugin", "mounts", tt.id, "--config", cfg); err != nil || out != podman {
				t.Errorf("no --format: %v\n%s\nwant the podman output", err, out)
			}

			if got := argLines(t, run("docker")); !slices.Equal(got, tt.docker) {
				t.Errorf("docker arguments\n  %q\nwant\n  %q", got, tt.docker)
			}

			systemd := run("systemd")
			var directives []string
			for l := range strings.Lines(systemd) {
				if l = strings.TrimSuffix(l, "\n"); !strings.HasPrefix(l, "#") {
					directives = append(directives, l)
				}
			}
			if !slices.Equal(directives, tt.systemd) {
				t.Errorf("systemd directives %q, want %q:\n%s", directives, tt.systemd, systemd)
			}
			if tt.blocks == mapped && !strings.Contains(systemd, "Remove plugin_mount_dir for this plugin") {
				t.Errorf("systemd output for a mapped node plugin does not say to drop the mapping:\n%s", systemd)
			}

			js := run("json")
			var doc struct {
				PluginID string `json:"plugin_id"`
				Mounts   []struct {
					Source, Target, Propagation, Reason string
					ReadOnly                            bool `json:"read_only"`
				} `json:"mounts"`
				Notes []string `json:"notes"`
			}
			if err := json.Unmarshal([]byte(js), &doc); err != nil {
				t.Fatalf("json: %v\n%s", err, js)
			}
			var generic map[string]any
			if err := json.Unmarshal([]byte(js), &generic); err != nil {
				t.Fatal(err)
			}
			checkKeys(t, "plugin mounts", generic, documentedKeys()["plugin mounts"])
			if doc.PluginID != tt.id || len(doc.Mounts) != len(tt.podman) || doc.Notes == nil || len(doc.Notes) != len(tt.notes) {
				t.Fatalf("json document %+v, want plugin %s, %d mounts, notes like %q", doc, tt.id, len(tt.podman), tt.notes)
			}
			for i, n := range tt.notes {
				if !strings.Contains(doc.Notes[i], n) {
					t.Errorf("note %q does not say %q", doc.Notes[i], n)
				}
			}
			for i, m := range doc.Mounts {
				// The podman line is the same mount, spelled its way.
				want := "--volume=" + m.Source + ":" + m.Target
				if m.Propagation != "" {
					want += ":" + m.Propagation
				}
				if want != tt.podman[i] || m.Reason == "" || m.ReadOnly {
					t.Errorf("json mount %d %+v does not match %s", i, m, tt.podman[i])
				}
			}
			if out, err := execute(t, "plugin", "mounts", tt.id, "--config", cfg, "--json"); err != nil || out != js {
				t.Errorf("--json: %v\n%s\nwant the --format json output", err, out)
			}
		})
	}
}

// The exact podman output of a plugin with a plugin_mount_dir: what an
// operator reads and pastes.
func TestPluginMountsPodmanText(t *testing.T) {
	cfg := mountsConfig(t, "plugin \"ebs\" {\n  type = \"node\"\n  plugin_mount_dir = \"/csi/volumes\"\n}\n")
	out, err := execute(t, "plugin", "mounts", "ebs", "--config", cfg)
	if err != nil {
		t.Fatal(err)
	}
	const want = `# podman run arguments for CSI plugin "ebs" beside csisupd (csisupd plugin mounts).
# The container must run --privileged: the plugin calls mount(2) inside it, and its mounts reach the
# host only through the rshared mounts below.
# socket directory (<client.plugin_dir>/ebs): the plugin must create its socket as
# /srv/csisupd/plugins/ebs/csi.sock; csisupd finds and dials it there.
--volume=/srv/csisupd/plugins/ebs:/srv/csisupd/plugins/ebs
# mount root, bidirectional: the plugin stages and publishes volumes below it, and its mounts must
# appear on the host, where csisupd and the workloads see them; mounted at /csi/volumes (plugin
# "ebs" { plugin_mount_dir }), csisupd translates the paths it sends.
--volume=/srv/csisupd/volumes/ebs:/csi/volumes:rshared
# /dev, bidirectional: a plugin serving block volumes attaches devices and publishes device nodes;
# only a plugin declared type = "controller" goes without.
--volume=/dev:/dev:rshared
`
	if out != want {
		t.Errorf("output\n%s\nwant\n%s", out, want)
	}
	for l := range strings.Lines(out) {
		if len(strings.TrimSuffix(l, "\n")) > commentWidth && strings.HasPrefix(l, "#") {
			t.Errorf("comment line longer than %d: %q", commentWidth, l)
		}
	}
}

func TestPluginMountsErrors(t *testing.T) {
	good := mountsConfig(t, "")
	bad := filepath.Join(t.TempDir(), "bad.hcl")
	if err := os.WriteFile(bad, []byte("plugin \"ebs\" {\n  type = \"nodes\"\n}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args  []string
		want  string
		usage bool
	}{
		{[]string{"ebs", "--config", bad}, bad + `:2: plugin.ebs.type: "nodes" is not a plugin type`, false},
		{[]string{"ebs", "--config", filepath.Join(t.TempDir(), "missing.hcl")}, "missing.hcl", false},
		{[]string{"../etc", "--config", good}, `plugin id "../etc": must match`, true},
		{[]string{"ebs", "--config", good, "--format", "yaml"}, `--format "yaml"`, true},
		{[]string{"ebs", "--config", good, "--format", "docker", "--json"}, "--json and --format docker disagree", true},
		{[]string{"--config", good}, "accepts between 1 and 1 arg(s), received 0", true},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, err := execute(t, append([]string{"plugin", "mounts"}, tt.args...)...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
			if got := errors.As(err, new(usageError)); got != tt.usage {
				t.Errorf("usage error = %v, want %v", got, tt.usage)
			}
		})
	}
}

// The systemd output is a set of [Service] settings systemd accepts: each
// is verified inside a unit whose ExecStart runs a stub.
func TestPluginMountsSystemdVerifies(t *testing.T) {
	testutil.SystemdAnalyze(t)
	for _, tt := range []struct{ name, blocks, id string }{
		{"node with plugin_mount_dir", "plugin \"ebs\" {\n  type = \"node\"\n  plugin_mount_dir = \"/csi/volumes\"\n}\n", "ebs"},
		{"controller", "plugin \"ctl\" {\n  type = \"controller\"\n  plugin_mount_dir = \"/csi/volumes\"\n}\n", "ctl"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, err := execute(t, "plugin", "mounts", tt.id, "--config", mountsConfig(t, tt.blocks), "--format", "systemd")
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			stub := filepath.Join(dir, "plugin")
			if err := os.WriteFile(stub, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			unit := filepath.Join(dir, "csi-plugin-test.service")
			text := "[Unit]\nDescription=test\n\n[Service]\nExecStart=" + stub + "\n" + out + "\n[Install]\nWantedBy=multi-user.target\n"
			if err := os.WriteFile(unit, []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
			testutil.SystemdVerify(t, unit)
			if t.Failed() {
				t.Logf("unit:\n%s", text)
			}
		})
	}
}

// The README shows the command's output for deploy/plugins/plugin.hcl
// (with the default data_dir of deploy/agent.hcl); it must be the real
// output.
func TestREADMEShowsPluginMounts(t *testing.T) {
	for _, env := range []string{"CSISUPD_DATA_DIR", "CSISUPD_PLUGIN_DIR"} {
		t.Setenv(env, "")
	}
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	const prompt = "$ csisupd plugin mounts csi.example.com --config /etc/csisupd.d\n"
	_, shown, ok := strings.Cut(string(data), prompt)
	if !ok {
		t.Fatalf("docs/operations.md shows no %q", prompt)
	}
	shown, _, _ = strings.Cut(shown, "```")
	out, err := execute(t, "plugin", "mounts", "csi.example.com", "--config", filepath.Join("..", "..", "deploy", "plugins", "plugin.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	if out != shown {
		t.Errorf("docs/operations.md shows\n%s\nthe command prints\n%s", shown, out)
	}
}
